"""Batch embedding of a data set split, a folder or a manifest into an index:
the one durable, resumable build of ``hypsearch index build``, the service's
index jobs and the demo::

    plan = plan_dataset("fashion-mnist", "test", data_dir)        # or plan_folder / plan_manifest
    index = open_index(path, dim=model.dim, curvature=model.curvature)
    report = build_index(model, index, plan, workers=2, progress=True)

* Sources: a built-in split (ids ``fashion-mnist-<split>-<row>``), a folder
  ``DIR/<class>/<images>`` (ids: paths relative to ``DIR``) or a CSV manifest
  ``id,path[,label]`` (ids: the ``id`` column), listed by
  :func:`models.images.datasets.list_folder` / :func:`models.images.datasets.list_manifest`. A class
  name becomes a taxonomy node through :func:`models.images.datasets.map_class`.
* Reading is forgiving: an unreadable picture, a row naming an unknown class or
  a file outside the allowed roots is *skipped* and reported (with the reason),
  never fatal. A folder or manifest that cannot be read at all is an error.
* Pictures are decoded by :func:`models.images.decode.decode` (the decoder of
  training and queries) in a multi-worker ``torch.utils.data.DataLoader`` and
  embedded in batches (``model.embed``).
* An item without a label gets the nearest prototype among the labels that
  indexed items carry (:mod:`models.prototypes`: the index's labels when the
  build starts and the labels the build's sources are given; every taxonomy
  node when there are none), with ``payload["label_source"] = "predicted"``.
* ``build_index`` is durable and resumable: the ids to embed are those not in
  the index when it starts (so an item deleted while it runs stays deleted),
  and every batch is written (durable) before the next one is read; a
  cancelled or failed build keeps its written batches, and the next run
  resumes after them.
* Roots: with ``roots``, every path must lie under one of them after symlinks
  are resolved, and a path with a ``..`` component is refused.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from models.images.datasets import (
    DataError,
    Listing,
    list_folder,
    list_manifest,
    list_photos,
    map_class,
)
from models.images.decode import DEFAULT_MAX_PIXELS, ImageDecodeError, decode

log = logging.getLogger("indexing")

__all__ = [
    "BuildInputError",
    "OutsideRootsError",
    "Plan",
    "Source",
    "BuildReport",
    "check_under_roots",
    "open_index",
    "plan_dataset",
    "plan_folder",
    "plan_manifest",
    "plan_path",
    "plan_photos",
    "read_picture",
    "embed_plan",
    "build_index",
    "pending_sources",
]

MAX_EXAMPLES = 100  # skipped sources listed by name (all are counted)


class BuildInputError(ValueError):
    """A source that cannot be read at all (missing folder, bad manifest header, path
    outside the roots); the message names it."""


class OutsideRootsError(BuildInputError):
    """A path outside the allowed data roots (or no roots are configured)."""


@dataclass(frozen=True)
class Source:
    """One picture to index."""

    id: str
    label: str | None  # taxonomy node, or None (predicted at embedding time)
    path: str | None = None  # a file (folder, manifest), or
    row: int | None = None  # a row of the plan's in-memory images (built-in data set)


@dataclass
class Plan:
    """What to read: the sources, and what was skipped while listing them."""

    name: str
    sources: list[Source]
    images: np.ndarray | None = None  # in-memory pictures of a built-in split
    payload: dict[str, Any] = field(default_factory=dict)  # common payload (data set, split)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (source, reason)


@dataclass
class Batch:
    ids: list[str]
    vectors: np.ndarray  # (n, D) float64
    labels: list[str]
    payloads: list[dict]


@dataclass
class BuildReport:
    source: str
    total: int = 0
    indexed: int = 0
    skipped: Counter = field(default_factory=Counter)  # reason -> count
    examples: list[tuple[str, str]] = field(default_factory=list)  # first skipped (source, reason)
    seconds: float = 0.0
    cancelled: bool = False

    def skip(self, source: str, reason: str) -> None:
        self.skipped[reason] += 1
        if len(self.examples) < MAX_EXAMPLES:
            self.examples.append((source, reason))

    @property
    def images_per_second(self) -> float:
        return self.indexed / self.seconds if self.seconds > 0 else 0.0

    def as_dict(self) -> dict:
        return {
            "source": self.source,
            "total": self.total,
            "indexed": self.indexed,
            "skipped": dict(self.skipped),
            "skipped_examples": [{"source": s, "reason": r} for s, r in self.examples],
            "seconds": round(self.seconds, 3),
            "images_per_second": round(self.images_per_second, 1),
            "cancelled": self.cancelled,
        }


# ---------------------------------------------------------------- roots, the index


def check_under_roots(
    path: str | os.PathLike, roots: Sequence[str | os.PathLike], what: str = "path"
) -> Path:
    """The real path of ``path`` if it lies under one of ``roots`` (after
    symlinks); refuses relative paths, ``..`` components, NUL bytes and anything
    else."""
    if "\0" in os.fspath(path):
        raise BuildInputError(f"{what}: {str(path)!r} contains a NUL byte (not allowed)")
    p = Path(path)
    if ".." in p.parts:
        raise BuildInputError(f"{what}: {path} contains '..' (not allowed)")
    if not p.is_absolute():
        raise BuildInputError(f"{what}: {path} is not an absolute path")
    if not roots:
        raise OutsideRootsError(f"{what}: no data roots are configured (HYPSEARCH_DATA_ROOTS)")
    try:
        real = Path(os.path.realpath(p))
    except (OSError, ValueError) as e:
        raise BuildInputError(f"{what}: {path} cannot be resolved ({e})") from None
    for r in roots:
        root = Path(os.path.realpath(r))
        if real == root or root in real.parents:
            return real
    raise OutsideRootsError(f"{what}: {path} is outside the data roots")


def open_index(path: str | os.PathLike, *, dim: int, curvature: float, **kw):
    """The index stored at ``path``, or a new empty one of that space there.

    An existing index is opened as it is (its own space: the caller compares it
    with what it will add), after :func:`indexing.swap.recover` has finished a
    swap of that folder that a crash interrupted. Raises :class:`indexing.IndexStoreError` /
    :class:`indexing.IndexInputError` when it cannot be opened."""
    from .index import HyperbolicIndex
    from .store import STORE_FILE
    from .swap import recover

    folder = Path(path)
    done = recover(folder)  # a restore in place that a crash interrupted
    if done:
        log.warning("%s", done)
    if (folder / STORE_FILE).exists():
        kw.pop("space", None)  # it has its own space
        return HyperbolicIndex.load(folder, **kw)
    return HyperbolicIndex(dim=dim, curvature=curvature, path=folder, **kw)


# ---------------------------------------------------------------- plans


def plan_dataset(dataset: str, split: str, data_dir: str | os.PathLike) -> Plan:
    from models.images.datasets import load_fashion_mnist

    if dataset != "fashion-mnist":
        raise BuildInputError(f"dataset {dataset!r}: unknown (built in: fashion-mnist)")
    try:
        data = load_fashion_mnist(split, data_dir)
    except DataError as e:
        raise BuildInputError(str(e)) from None
    labels = data.labels
    sources = [Source(data.ids[i], labels[i], row=i) for i in range(len(data.ids))]
    return Plan(
        f"{dataset}:{split}",
        sources,
        images=data.images,
        payload={"dataset": dataset, "split": split},
    )


def _plan(listing: Listing, taxonomy, class_map, manifest: bool) -> Plan:
    """A listing -> sources; problems and classes that do not map are skipped."""
    plan = Plan(listing.source, [])
    name = Path(listing.source).name
    for where, reason, item_id in listing.problems:
        if manifest:  # rows by their line, or by their id once it is known
            where = item_id if item_id is not None else f"{name}:{where.rsplit(':', 1)[1]}"
        plan.skipped.append((where, reason))
    nodes: dict[str, str | None] = {}
    for e in listing.entries:
        node = None
        if e.label:
            if e.label not in nodes:
                try:
                    nodes[e.label] = map_class(e.label, class_map, taxonomy)
                except DataError:
                    nodes[e.label] = None
            node = nodes[e.label]
            if node is None:
                plan.skipped.append((e.id, f"class {e.label!r} is not in the taxonomy"))
                continue
        plan.sources.append(Source(e.id, node, path=e.path))
    return plan


def _listed(lister, path, taxonomy, class_map, roots, manifest: bool) -> Plan:
    try:
        return _plan(lister(path, roots), taxonomy, class_map, manifest=manifest)
    except DataError as e:
        raise BuildInputError(str(e)) from None


def plan_folder(
    folder: str | os.PathLike, *, taxonomy=None, class_map: dict[str, str] | None = None, roots=None
) -> Plan:
    return _listed(list_folder, folder, taxonomy, class_map, roots, manifest=False)


def plan_manifest(
    path: str | os.PathLike, *, taxonomy=None, class_map: dict[str, str] | None = None, roots=None
) -> Plan:
    return _listed(list_manifest, path, taxonomy, class_map, roots, manifest=True)


def plan_photos(folder: str | os.PathLike) -> Plan:
    """Every picture under ``folder``, unlabelled (:func:`models.images.datasets.list_photos`): each
    gets the model's nearest label."""
    try:
        return _plan(list_photos(folder), None, None, manifest=False)
    except DataError as e:
        raise BuildInputError(str(e)) from None


def plan_path(path: str | os.PathLike, *, taxonomy=None, class_map=None, roots=None) -> Plan:
    """A folder, or a manifest (``.csv``)."""
    p = Path(path)
    if p.suffix.lower() == ".csv" and not p.is_dir():
        return plan_manifest(p, taxonomy=taxonomy, class_map=class_map, roots=roots)
    return plan_folder(p, taxonomy=taxonomy, class_map=class_map, roots=roots)


# ---------------------------------------------------------------- reading


class _Pictures:
    """``torch.utils.data.Dataset`` of (position, pixels or None, error or None)."""

    def __init__(self, sources: list[Source], images: np.ndarray | None, max_pixels: int) -> None:
        self.sources = sources
        self.images = images
        self.max_pixels = max_pixels

    def __len__(self) -> int:
        return len(self.sources)

    def __getitem__(self, i: int):
        s = self.sources[i]
        if s.row is not None:
            return i, self.images[s.row], None
        return (i, *read_picture(s.path, self.max_pixels))


def read_picture(
    path: str, max_pixels: int = DEFAULT_MAX_PIXELS
) -> tuple[np.ndarray | None, str | None]:
    """Decode one file (:func:`models.images.decode.decode`): (uint8 pixels, None) or
    (None, why not)."""
    try:
        return decode(path, max_pixels=max_pixels), None
    except ImageDecodeError as e:
        return None, e.reason


def _collate(batch):
    return batch


def _stack(images: list[np.ndarray]):
    if images and all(im.shape == images[0].shape for im in images):
        return np.stack(images)
    return images


def _index_labels(index) -> set[str]:
    """The labels the index's items carry."""
    return {lab for lab in index.item_labels().values() if lab is not None}


def pending_sources(
    plan: Plan, skip_ids: Callable[[str], bool] | None, report: BuildReport
) -> tuple[list[Source], int]:
    """``(sources to embed, how many are already indexed)``; the plan's skipped
    sources and the already indexed ones are counted in ``report``."""
    for src, reason in plan.skipped:
        report.skip(src, reason)
    todo = []
    already = 0
    for s in plan.sources:
        if skip_ids is not None and skip_ids(s.id):
            already += 1
            report.skipped["already indexed"] += 1
        else:
            todo.append(s)
    report.total = len(plan.sources) + len(plan.skipped)
    return todo, already


def embed_plan(
    model,
    plan: Plan,
    *,
    batch_size: int = 256,
    workers: int = 2,
    skip_ids: Callable[[str], bool] | None = None,
    report: BuildReport | None = None,
    cancel: threading.Event | None = None,
    on_progress: Callable[[int], None] | None = None,
    mp_context: str | None = None,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    labels_in_use: Callable[[], Iterable[str]] | None = None,
) -> Iterator[Batch]:
    """Decode and embed the plan's pictures; yields one :class:`Batch` at a time.

    ``skip_ids(id)`` true (asked once per source, before anything is read): the
    source is skipped as "already indexed". ``on_progress(n)`` is called with
    the number of sources handled (embedded or skipped) after each batch.
    ``cancel`` stops between batches (``report.cancelled``). Unlabelled sources
    get the nearest prototype among ``labels_in_use()`` (asked only when one is
    unlabelled) and the labels the plan gives (:mod:`models.prototypes`).
    """
    import torch
    from torch.utils.data import DataLoader

    from models.prototypes import Prototypes, prediction_labels

    report = report if report is not None else BuildReport(plan.name)
    todo, already = pending_sources(plan, skip_ids, report)
    if on_progress is not None and (already or plan.skipped):
        on_progress(already + len(plan.skipped))
    if not todo:
        return
    candidates = None
    if any(s.label is None for s in todo):
        in_use = set(labels_in_use() if labels_in_use is not None else ())
        in_use |= {s.label for s in plan.sources if s.label is not None}
        # a model may name what its predictions choose among (an unsupervised model: its
        # finest clusters, not their ancestors); else every taxonomy node
        every = getattr(model, "prediction_nodes", None) or model.labels.taxonomy.names
        names = prediction_labels(in_use, every)
        candidates = Prototypes.of_model(model).subset(names)
    workers = 0 if plan.images is not None else workers
    loader = DataLoader(
        _Pictures(todo, plan.images, max_pixels),
        batch_size=batch_size,
        shuffle=False,
        num_workers=workers,
        collate_fn=_collate,
        multiprocessing_context=mp_context if workers > 0 else None,
        persistent_workers=False,
    )
    for chunk in loader:
        if cancel is not None and cancel.is_set():
            report.cancelled = True
            return
        good, pixels = [], []
        for i, px, err in chunk:
            if px is None:
                report.skip(todo[i].path or todo[i].id, err or "unreadable")
            else:
                good.append(todo[i])
                pixels.append(px)
        if good:
            z = model.embed(_stack(pixels)).to(torch.float64).numpy()
            missing = [j for j, s in enumerate(good) if s.label is None]
            predicted = (
                dict(zip(missing, candidates.nearest(z[missing]), strict=True)) if missing else {}
            )
            labels: list[str] = []
            payloads: list[dict] = []
            for j, s in enumerate(good):
                image = {"path": s.path} if s.path is not None else {**plan.payload, "row": s.row}
                labels.append(s.label if s.label is not None else predicted[j])
                payloads.append(
                    {"image": image, "label_source": "given" if s.label else "predicted"}
                )
            yield Batch([s.id for s in good], z, labels, payloads)
        if on_progress is not None:
            on_progress(len(chunk))
    if cancel is not None and cancel.is_set():
        report.cancelled = True


def build_index(
    model,
    index,
    plan: Plan,
    *,
    batch_size: int = 256,
    workers: int = 2,
    progress: bool = False,
    resume: bool = True,
    write: Callable[[list[str], np.ndarray, list[str], list[dict]], None] | None = None,
    labels_in_use: Callable[[], Iterable[str]] | None = None,
    report: BuildReport | None = None,
    cancel: threading.Event | None = None,
    on_progress: Callable[[int], None] | None = None,
    mp_context: str | None = None,
    max_pixels: int = DEFAULT_MAX_PIXELS,
) -> BuildReport:
    """Embed ``plan`` into ``index`` batch by batch, each batch durable before the
    next is read; with ``resume``, ids in the index when the build starts are
    skipped (an item deleted meanwhile stays deleted).

    ``write(ids, vectors, labels, payloads)`` writes one batch (default
    ``index.add``; the service passes its runtime's upsert, which keeps its
    tallies); ``labels_in_use()`` gives the labels of the index's items when
    an unlabelled source needs a prediction (default: read from ``index``).
    ``report`` is filled as the build goes (``indexed`` after each batch)."""
    report = report if report is not None else BuildReport(plan.name)
    if write is None:

        def write(ids, vectors, labels, payloads):
            index.add(vectors, ids, labels=labels, payloads=payloads)

    t0 = time.perf_counter()
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(
            total=len(plan.sources) + len(plan.skipped),
            desc="index",
            unit="img",
            dynamic_ncols=True,
            smoothing=0.1,
        )

    def advance(n: int) -> None:
        if bar is not None:
            bar.update(n)
        if on_progress is not None:
            on_progress(n)

    try:
        for batch in embed_plan(
            model,
            plan,
            batch_size=batch_size,
            workers=workers,
            skip_ids=(lambda i: i in index) if resume else None,
            report=report,
            cancel=cancel,
            on_progress=advance,
            mp_context=mp_context,
            max_pixels=max_pixels,
            labels_in_use=labels_in_use or (lambda: _index_labels(index)),
        ):
            write(batch.ids, batch.vectors, batch.labels, batch.payloads)
            report.indexed += len(batch.ids)
    finally:
        if bar is not None:
            bar.close()
        report.seconds = time.perf_counter() - t0
    return report
