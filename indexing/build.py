"""Batch embedding of a data set split, a folder or a manifest into an index.

Used by ``hypsearch index build`` and by the service's index jobs::

    plan = plan_dataset("fashion-mnist", "test", data_dir)        # or plan_folder / plan_manifest
    report = build_index(model, index, plan, workers=2, progress=True)

* Sources: a built-in split (ids ``fashion-mnist-<split>-<row>``), a folder
  ``DIR/<class>/<images>`` (ids: paths relative to ``DIR``) or a CSV manifest
  ``id,path[,label]`` (ids: the ``id`` column). A class name becomes a taxonomy
  node through ``class_map`` or by resolving the name itself (``sneaker``).
* Reading is forgiving: an unreadable picture, a row naming an unknown class or
  a file outside the allowed roots is *skipped* and reported (with the reason),
  never fatal. A folder or manifest that cannot be read at all is an error.
* Pictures are decoded by a multi-worker ``torch.utils.data.DataLoader`` and
  embedded in batches (``model.embed``).
* An item without a label gets the nearest prototype among the model's class
  labels as its label (``payload["label_source"] = "predicted"``).
* ``build_index`` is resumable: ids already in the index are skipped, and every
  batch is committed (durable) before the next one is read.
* Roots: with ``roots``, every path must lie under one of them after symlinks
  are resolved, and a path with a ``..`` component is refused.
"""

from __future__ import annotations

import csv
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "BuildInputError",
    "OutsideRootsError",
    "Plan",
    "Source",
    "BuildReport",
    "check_under_roots",
    "plan_dataset",
    "plan_folder",
    "plan_manifest",
    "plan_path",
    "embed_plan",
    "build_index",
]

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff")
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


# ---------------------------------------------------------------- roots


def check_under_roots(
    path: str | os.PathLike, roots: Sequence[str | os.PathLike], what: str = "path"
) -> Path:
    """The real path of ``path`` if it lies under one of ``roots`` (after
    symlinks); refuses relative paths, ``..`` components and anything else."""
    p = Path(path)
    if ".." in p.parts:
        raise BuildInputError(f"{what}: {path} contains '..' (not allowed)")
    if not p.is_absolute():
        raise BuildInputError(f"{what}: {path} is not an absolute path")
    if not roots:
        raise OutsideRootsError(f"{what}: no data roots are configured (HYPSEARCH_DATA_ROOTS)")
    real = Path(os.path.realpath(p))
    for r in roots:
        root = Path(os.path.realpath(r))
        if real == root or root in real.parents:
            return real
    raise OutsideRootsError(f"{what}: {path} is outside the data roots")


def _inside(real: Path, roots: Sequence[Path] | None) -> bool:
    if roots is None:
        return True
    return any(real == r or r in real.parents for r in roots)


def _real_roots(roots) -> list[Path] | None:
    return None if roots is None else [Path(os.path.realpath(r)) for r in roots]


# ---------------------------------------------------------------- plans


def _class_node(name: str, class_map: dict[str, str] | None, taxonomy) -> str | None:
    """Class name -> taxonomy node, or None when it does not resolve (``taxonomy``: anything
    with a ``resolve(text)`` method)."""
    node = class_map.get(name, None) if class_map is not None else name
    if node is None:
        return None
    if taxonomy is None:
        return node
    try:
        return taxonomy.resolve(node)
    except Exception:  # noqa: BLE001 - UnknownLabelError, TypeError
        return None


def plan_dataset(dataset: str, split: str, data_dir: str | os.PathLike) -> Plan:
    from models.data import DataError, load_fashion_mnist

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


def plan_folder(
    folder: str | os.PathLike, *, taxonomy=None, class_map: dict[str, str] | None = None, roots=None
) -> Plan:
    folder = Path(folder)
    roots = _real_roots(roots)
    if not folder.is_dir():
        raise BuildInputError(f"{folder}: no such folder")
    plan = Plan(str(folder), [])
    try:
        class_dirs = sorted(
            p for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")
        )
    except OSError as e:
        raise BuildInputError(f"{folder}: cannot list ({e.strerror})") from None
    if not class_dirs:
        raise BuildInputError(f"{folder}: no class folders (expected DIR/<class name>/<images>)")
    for d in class_dirs:
        if not _inside(Path(os.path.realpath(d)), roots):
            plan.skipped.append((d.relative_to(folder).as_posix() + "/", "outside the data roots"))
            continue
        node = _class_node(d.name, class_map, taxonomy)
        files = []
        for dirpath, dirnames, filenames in os.walk(d):  # symlinked folders are not followed
            dirnames[:] = sorted(n for n in dirnames if not n.startswith("."))
            for n in sorted(filenames):
                if Path(n).suffix.lower() in IMAGE_SUFFIXES and not n.startswith("."):
                    files.append(Path(dirpath) / n)
        for f in files:
            rel = f.relative_to(folder).as_posix()
            if node is None:
                plan.skipped.append((rel, f"class {d.name!r} is not in the taxonomy"))
                continue
            real = Path(os.path.realpath(f))
            if not _inside(real, roots):
                plan.skipped.append((rel, "outside the data roots"))
                continue
            plan.sources.append(Source(rel, node, path=str(real)))
    return plan


def plan_manifest(
    path: str | os.PathLike, *, taxonomy=None, class_map: dict[str, str] | None = None, roots=None
) -> Plan:
    path = Path(path)
    roots = _real_roots(roots)
    if not path.is_file():
        raise BuildInputError(f"{path}: no such manifest file")
    try:
        with open(path, newline="", encoding="utf-8") as f:
            rows = list(csv.reader(f))
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise BuildInputError(f"{path}: unreadable manifest ({e})") from None
    if not rows:
        raise BuildInputError(f"{path}: empty manifest (expected a header id,path[,label])")
    header = [h.strip().lower() for h in rows[0]]
    if (
        header[:2] != ["id", "path"]
        or len(header) > 3
        or (len(header) == 3 and header[2] != "label")
    ):
        raise BuildInputError(f"{path}: header must be id,path[,label], got {','.join(rows[0])}")
    plan = Plan(str(path), [])
    seen: set[str] = set()
    for line, row in enumerate(rows[1:], start=2):
        where = f"{path.name}:{line}"
        if not row or all(not c.strip() for c in row):
            continue
        if len(row) < 2 or len(row) > len(header):
            plan.skipped.append((where, f"expected {len(header)} columns, got {len(row)}"))
            continue
        item_id, rel = row[0].strip(), row[1].strip()
        if not item_id:
            plan.skipped.append((where, "empty id"))
            continue
        if item_id in seen:
            plan.skipped.append((where, f"duplicate id {item_id!r}"))
            continue
        label = row[2].strip() if len(row) > 2 else ""
        node = None
        if label:
            node = _class_node(label, class_map, taxonomy)
            if node is None:
                plan.skipped.append((item_id, f"class {label!r} is not in the taxonomy"))
                continue
        p = Path(rel)
        if roots is not None and ".." in p.parts:
            plan.skipped.append((item_id, "path contains '..'"))
            continue
        p = p if p.is_absolute() else path.parent / p
        real = Path(os.path.realpath(p))
        if not _inside(real, roots):
            plan.skipped.append((item_id, "outside the data roots"))
            continue
        seen.add(item_id)
        plan.sources.append(Source(item_id, node, path=str(real)))
    return plan


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


def read_picture(path: str, max_pixels: int = 40_000_000) -> tuple[np.ndarray | None, str | None]:
    """Decode one file: (uint8 pixels, None) or (None, why not)."""
    import warnings

    from PIL import Image

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(path) as im:
                if im.size[0] * im.size[1] > max_pixels:
                    return None, f"too many pixels ({im.size[0]}x{im.size[1]})"
                if im.format == "JPEG":
                    im.draft("RGB" if im.mode not in ("L", "1") else "L", (512, 512))
                im.load()
                if max(im.size) > 512:
                    im.thumbnail((512, 512))
                mode = "L" if im.mode in ("1", "L", "I", "I;16", "F") else "RGB"
                return np.asarray(im.convert(mode), dtype=np.uint8).copy(), None
    except FileNotFoundError:
        return None, "no such file"
    except Exception as e:  # noqa: BLE001 - any decoding failure skips the file
        return None, f"unreadable ({type(e).__name__})"


def _collate(batch):
    return batch


def _stack(images: list[np.ndarray]):
    if images and all(im.shape == images[0].shape for im in images):
        return np.stack(images)
    return images


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
    max_pixels: int = 40_000_000,
) -> Iterator[Batch]:
    """Decode and embed the plan's pictures; yields one :class:`Batch` at a time.

    ``skip_ids(id)`` true: the source is skipped as "already indexed".
    ``on_progress(n)`` is called with the number of sources handled (embedded
    or skipped) after each batch. ``cancel`` stops between batches.
    """
    import torch
    from torch.utils.data import DataLoader

    from models.geometry import poincare

    report = report if report is not None else BuildReport(plan.name)
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
    if on_progress is not None and (already or plan.skipped):
        on_progress(already + len(plan.skipped))
    if not todo:
        return
    class_nodes = [node for _, node in getattr(model, "classes", [])] or list(model.labels.names)
    protos = model.prototypes(class_nodes)
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
            z = model.embed(_stack(pixels)).to(torch.float64)
            labels: list[str] = []
            payloads: list[dict] = []
            missing = [j for j, s in enumerate(good) if s.label is None]
            predicted = {}
            if missing:
                d = poincare.pairwise_dist(z[missing], protos, c=model.curvature)
                for j, r in zip(missing, torch.argmin(d, dim=1).tolist(), strict=True):
                    predicted[j] = class_nodes[r]
            for j, s in enumerate(good):
                image = {"path": s.path} if s.path is not None else {**plan.payload, "row": s.row}
                labels.append(s.label if s.label is not None else predicted[j])
                payloads.append(
                    {"image": image, "label_source": "given" if s.label else "predicted"}
                )
            yield Batch([s.id for s in good], z.numpy(), labels, payloads)
        if on_progress is not None:
            on_progress(len(chunk))


def build_index(
    model,
    index,
    plan: Plan,
    *,
    batch_size: int = 256,
    workers: int = 2,
    progress: bool = False,
    resume: bool = True,
) -> BuildReport:
    """Embed ``plan`` into ``index`` batch by batch (each batch durable before the
    next); ids already in the index are skipped when ``resume``."""
    report = BuildReport(plan.name)
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
    try:
        for batch in embed_plan(
            model,
            plan,
            batch_size=batch_size,
            workers=workers,
            skip_ids=(lambda i: i in index) if resume else None,
            report=report,
            on_progress=bar.update if bar is not None else None,
        ):
            index.add(batch.vectors, batch.ids, labels=batch.labels, payloads=batch.payloads)
            report.indexed += len(batch.ids)
    finally:
        if bar is not None:
            bar.close()
        report.seconds = time.perf_counter() - t0
    return report
