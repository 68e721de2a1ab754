"""Pictures -> vectors -> an index: the one durable, resumable build of
``hypsearch index build``, ``hypsearch embed``, the index jobs
(``POST /v1/index/jobs``) and the demo::

    plan = plan_dataset("fashion-mnist", "test", data_dir)        # or plan_folder / plan_manifest
    index = open_index(path, dim=model.dim, curvature=model.curvature)
    report = build_index(model, index, plan, workers=2, progress=True)

* Pictures are decoded by :func:`models.images.decode.decode` (the decoder of
  training and queries) in a multi-worker ``torch.utils.data.DataLoader`` and
  embedded in batches (``model.embed``) by :func:`embed_plan`; an unreadable
  picture is *skipped* and reported (with the reason), never fatal.
* An item without a label gets the nearest prototype among the labels that
  indexed items carry (:mod:`models.prototypes`: the index's labels when the
  build starts and the labels the build's sources are given; every taxonomy
  node when there are none), with ``payload["label_source"] = "predicted"``.
* ``build_index`` is durable and resumable (:mod:`indexing.batches`): the ids
  to embed are those not in the index when it starts (so an item deleted while
  it runs stays deleted), and every batch is written (durable) before the next
  one is read; a cancelled or failed build keeps its written batches, and the
  next run resumes after them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TypedDict

import numpy as np

from indexing.batches import (
    Batch,
    BuildReport,
    Write,
    default_write,
    index_labels,
    tracked,
    write_batches,
)
from models.images.decode import DEFAULT_MAX_PIXELS, ImageDecodeError, decode

from .plans import Plan, Source

__all__ = [
    "BuildOptions",
    "build_index",
    "build_options",
    "embed_plan",
    "pending_sources",
    "read_picture",
]


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
    """Decode and embed the plan's pictures; yields one :class:`~indexing.batches.Batch`
    at a time.

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


class BuildOptions(TypedDict, total=False):
    """The keyword options of :func:`build_index` that every build takes (the Ray
    build of :mod:`service.ingest.ray_build` too); defaults in
    :data:`BUILD_DEFAULTS`."""

    batch_size: int
    workers: int
    progress: bool
    resume: bool
    write: Write | None
    labels_in_use: Callable[[], Iterable[str]] | None
    report: BuildReport | None
    cancel: threading.Event | None
    on_progress: Callable[[int], None] | None
    max_pixels: int


BUILD_DEFAULTS: BuildOptions = {
    "batch_size": 256,
    "workers": 2,
    "progress": False,
    "resume": True,
    "write": None,
    "labels_in_use": None,
    "report": None,
    "cancel": None,
    "on_progress": None,
    "max_pixels": DEFAULT_MAX_PIXELS,
}


def build_options(options: Mapping) -> dict:
    """``options`` over :data:`BUILD_DEFAULTS`; a name that is not an option is a
    ``TypeError``, as for a function's keywords."""
    unknown = sorted(set(options) - set(BUILD_DEFAULTS))
    if unknown:
        raise TypeError(f"unknown build option(s): {', '.join(unknown)}")
    return {**BUILD_DEFAULTS, **options}


def build_index(
    model,
    index,
    plan: Plan,
    *,
    batch_size: int = 256,
    workers: int = 2,
    progress: bool = False,
    resume: bool = True,
    write: Write | None = None,
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
    total = len(plan.sources) + len(plan.skipped)
    with tracked(
        report,
        total,
        "index",
        progress=progress,
        on_progress=on_progress,
        dynamic_ncols=True,
        smoothing=0.1,
    ) as advance:
        batches = embed_plan(
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
            labels_in_use=labels_in_use or (lambda: index_labels(index)),
        )
        write_batches(batches, write or default_write(index), report)
    return report
