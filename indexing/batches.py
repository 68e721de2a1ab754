"""Batches of vectors written into an index, durably and resumably: what the
builds of :mod:`service.ingest` (local and on Ray) share below the images::

    index = open_index(path, dim=model.dim, curvature=model.curvature)
    report = BuildReport("folder")
    with tracked(report, total, "index", progress=True) as advance:
        write_batches(batches, default_write(index), report)

* :class:`Batch`: ids, float64 vectors, labels and payloads -- one write.
* :class:`BuildReport`: what a build did (indexed, skipped by reason with the
  first examples, seconds, cancelled); the jobs route and the CLI show it.
* :func:`write_batches`: each batch written (durable: ``index.add``, or the
  caller's ``write``) before the next one is taken, so a cancelled or failed
  build keeps its written batches and the next run resumes after them
  (:func:`present`: the ids an index already holds).
* :func:`open_index`: the index stored in a folder, or a new empty one there.
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .interface import Index

log = logging.getLogger("indexing")

__all__ = [
    "Batch",
    "BuildReport",
    "Write",
    "default_write",
    "index_labels",
    "open_index",
    "present",
    "tracked",
    "write_batches",
]

MAX_EXAMPLES = 100  # skipped sources listed by name (all are counted)

#: ``write(ids, vectors, labels, payloads)``: one batch into the index, durable.
Write = Callable[[list[str], np.ndarray, list[str], list[dict]], None]


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


def index_labels(index) -> set[str]:
    """The labels the index's items carry."""
    return {lab for lab in index.item_labels().values() if lab is not None}


def present(index: Index, ids: Sequence[str]) -> set[str]:
    """The ids among ``ids`` that the index holds (one call per shard when sharded)."""
    return {i for i, f in zip(ids, index.contains_many(list(ids)), strict=True) if f}


def default_write(index) -> Write:
    """``index.add`` as a :data:`Write`."""

    def write(ids, vectors, labels, payloads):
        index.add(vectors, ids, labels=labels, payloads=payloads)

    return write


def write_batches(batches: Iterable[Batch], write: Write, report: BuildReport) -> None:
    """Write each batch (durable) before the next one is taken; ``report.indexed``
    counts the written items as it goes."""
    for batch in batches:
        write(batch.ids, batch.vectors, batch.labels, batch.payloads)
        report.indexed += len(batch.ids)


@contextmanager
def tracked(
    report: BuildReport,
    total: int,
    desc: str,
    *,
    progress: bool = False,
    on_progress: Callable[[int], None] | None = None,
    **bar_options,
) -> Iterator[Callable[[int], None]]:
    """``advance(n)``: ``n`` more sources handled -- a tqdm bar (with ``progress``)
    and ``on_progress(n)``; ``report.seconds`` is the time spent in the block."""
    t0 = time.perf_counter()
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=total, desc=desc, unit="img", **bar_options)

    def advance(n: int) -> None:
        if bar is not None:
            bar.update(n)
        if on_progress is not None:
            on_progress(n)

    try:
        yield advance
    finally:
        if bar is not None:
            bar.close()
        report.seconds = time.perf_counter() - t0
