"""The in-memory side of an index: the item table, the backend over it, upkeep.

:class:`LiveIndex` applies writes that the store has already committed, keeps
the table compact and the backend the one the configuration wants, and answers
k-NN over a set of allowed slots.  It takes no locks and touches no store: the
:class:`~indexing.HyperbolicIndex` holding it does both.

Compaction: once more than ``COMPACT_FRACTION`` of the slots (and at least
``COMPACT_MIN_SLOTS``) are holes left by deletes and upserts, the live items
are renumbered and the backend is rebuilt.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable

import numpy as np

from .backend_choice import AUTO_BACKEND, BackendChoice
from .backends import Backend
from .backends.base import EMPTY
from .backends.exact import exact_search
from .geometry import IndexSpace
from .table import ItemBatch, ItemTable

__all__ = ["COMPACT_FRACTION", "COMPACT_MIN_SLOTS", "LiveIndex"]

log = logging.getLogger("indexing")

COMPACT_FRACTION = 0.30
COMPACT_MIN_SLOTS = 1_000


#: once an ``auto`` index holds this share of its switch threshold, the graph
#: backend's compiled kernels are loaded in the background (once a process)
WARM_AHEAD = 0.5
_warm_started = threading.Event()


def _warm_ahead(choice: BackendChoice, n_alive: int) -> None:
    """Load the graph kernels in a daemon thread when an ``auto`` index nears the
    switch, so that the write that switches pays the build alone, not numba's
    cache load as well (:func:`indexing.backends.graph_warm.warm_kernels`)."""
    if (
        choice.config != "auto"
        or n_alive < WARM_AHEAD * choice.auto_threshold
        or _warm_started.is_set()
    ):
        return
    _warm_started.set()

    def warm() -> None:
        from .backends.graph_warm import warm_kernels

        try:
            log.info("graph kernels loaded ahead of the switch in %.1f s", warm_kernels())
        except Exception:  # noqa: BLE001 - only a head start; the switch loads them anyway
            log.exception("loading the graph kernels ahead failed")

    threading.Thread(target=warm, name="graph-warm", daemon=True).start()


class LiveIndex:
    """``table`` + ``backend`` (built over it) + ``applied_seq``, the store
    sequence number of the last write applied."""

    def __init__(
        self,
        space: IndexSpace,
        choice: BackendChoice,
        table: ItemTable,
        backend: Backend,
        applied_seq: int,
    ) -> None:
        self.space = space
        self.choice = choice
        self.table = table
        self.backend = backend
        self.applied_seq = applied_seq

    @classmethod
    def build(
        cls,
        space: IndexSpace,
        choice: BackendChoice,
        batches: Iterable[ItemBatch],
        applied_seq: int,
        capacity: int = 1024,
    ) -> LiveIndex:
        """A table of ``batches`` and the backend the configuration wants for it."""
        table = ItemTable(space.dim, capacity=capacity)
        for items in batches:
            table.upsert(*items)
        backend = choice.make(choice.desired(table.n_alive))
        backend.build(table)
        return cls(space, choice, table, backend, applied_seq)

    # -- writes (already committed to the store) -----------------------------------------
    def upsert(self, items: ItemBatch) -> None:
        t = self.table
        changed = []
        for j, i in enumerate(items.ids):
            s = t.slot_of.get(i)
            if s is not None and np.array_equal(t.vectors[s], items.vectors[j]):
                # same vector: metadata only, the backend keeps its slot
                t.relabel(s, items.labels[j], items.holders[j])
            else:
                changed.append(j)
        if not changed:
            return
        if len(changed) < len(items.ids):
            items = items.take(changed)
        new, old = t.upsert(*items)
        if len(old):
            self.backend.remove(t, old)
        self.backend.add(t, new)

    def delete(self, ids: Iterable[str]) -> None:
        slots = self.table.remove(ids)
        if len(slots):
            self.backend.remove(self.table, slots)

    def replay(self, rows: Iterable[tuple[ItemBatch, list[bool]]]) -> None:
        """Apply store rows in sequence order (``Store.iter_after``): tombstones
        delete, the other rows upsert."""
        for items, deleted in rows:
            dead = [i for i, d in zip(items.ids, deleted, strict=True) if d]
            if dead:
                self.delete(dead)
            if len(dead) < len(deleted):
                self.upsert(items.take([j for j, d in enumerate(deleted) if not d]))

    def maintain(self) -> None:
        """Compaction and the backend switch of ``auto``."""
        t = self.table
        rebuild = False
        if t.n_slots >= COMPACT_MIN_SLOTS and t.n_holes > COMPACT_FRACTION * t.n_slots:
            log.info("compacting: %d of %d slots are deleted", t.n_holes, t.n_slots)
            self.table = t.compacted()
            rebuild = True
        want = self.choice.desired(self.table.n_alive, self.backend.name)
        if want != AUTO_BACKEND and self.backend.name != AUTO_BACKEND:
            _warm_ahead(self.choice, self.table.n_alive)
        if want != self.backend.name:
            log.info(
                "switching backend %s -> %s at %d items",
                self.backend.name,
                want,
                self.table.n_alive,
            )
            self.backend = self.choice.make(want)
            rebuild = True
        if rebuild:
            self.backend.build(self.table)

    # -- reads -----------------------------------------------------------------------
    def allowed(
        self, filter_ids: set[str] | None, labels: set[str] | None, under: set[str] | None
    ) -> np.ndarray | None:
        """The sorted slots passing all the filters given (``None``: no filter)."""
        t = self.table
        sets = []
        if filter_ids is not None:
            sets.append(t.slots_for_ids(filter_ids))
        if labels is not None:
            sets.append(t.slots_for_labels(labels))
        if under is not None:
            sets.append(t.slots_for_holders(under))
        if not sets:
            return None
        sets.sort(key=len)
        out = sets[0].intersection(*sets[1:]) if len(sets) > 1 else sets[0]
        return np.fromiter(sorted(out), dtype=np.int64, count=len(out))

    def search(
        self, q: np.ndarray, k: int, allowed: np.ndarray | None, ef: int | None
    ) -> tuple[np.ndarray, np.ndarray]:
        """``(slots, distances)`` of the ``min(k, m)`` nearest of the ``m`` allowed items."""
        n = self.table.n_alive if allowed is None else len(allowed)
        kk = min(k, n)
        if kk == 0 or len(q) == 0:
            return np.empty((len(q), kk), dtype=np.int64), np.empty((len(q), kk))
        slots, dists = self.backend.search(self.table, q, kk, allowed=allowed, ef=ef)
        bad = (slots == EMPTY).any(axis=1)
        if bad.any():  # never hand out padding: exact scan for those rows
            rows = np.nonzero(bad)[0]
            s, d = exact_search(self.space, self.table, None, q[rows], kk, allowed=allowed)
            slots[rows], dists[rows] = s, d
        return slots, dists

    def ids_of(self, slots: np.ndarray) -> np.ndarray:
        if slots.size == 0:
            return np.empty(slots.shape, dtype=str)
        return self.table.ids_at(slots)
