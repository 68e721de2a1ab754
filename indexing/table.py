"""In-memory table of the live items: slots, float64 vectors, labels, holders.

A *slot* is the row of an item in the table and its label in the backend
(hnswlib's integer label).  Slots are handed out in increasing order; an
upsert or delete leaves a hole, and :meth:`ItemTable.compacted` renumbers the
live items ``0..n-1`` (the index then rebuilds its backend).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

__all__ = ["ItemTable"]


class ItemTable:
    def __init__(self, dim: int, capacity: int = 1024) -> None:
        self.dim = int(dim)
        cap = max(16, int(capacity))
        self.vectors = np.zeros((cap, self.dim), dtype=np.float64)
        self.alive = np.zeros(cap, dtype=bool)
        self.ids: list[str | None] = []
        self.labels: list[str | None] = []
        self.holders: list[str | None] = []
        self.slot_of: dict[str, int] = {}
        self.by_label: dict[str, set[int]] = {}
        self.by_holder: dict[str, set[int]] = {}
        self.n_alive = 0

    # -- sizes ------------------------------------------------------------------
    @property
    def n_slots(self) -> int:
        return len(self.ids)

    @property
    def n_holes(self) -> int:
        return self.n_slots - self.n_alive

    def live_slots(self) -> np.ndarray:
        return np.nonzero(self.alive[: self.n_slots])[0].astype(np.int64)

    def _grow(self, need: int) -> None:
        cap = len(self.alive)
        if need <= cap:
            return
        new = max(need, int(cap * 1.5) + 16)
        v = np.zeros((new, self.dim), dtype=np.float64)
        v[:cap] = self.vectors
        a = np.zeros(new, dtype=bool)
        a[:cap] = self.alive
        self.vectors, self.alive = v, a

    # -- mutations (the caller holds the index's write lock) ----------------------
    def _kill(self, slot: int) -> None:
        self.alive[slot] = False
        self.n_alive -= 1
        lab, hol = self.labels[slot], self.holders[slot]
        if lab is not None:
            s = self.by_label[lab]
            s.discard(slot)
            if not s:
                del self.by_label[lab]
        if hol is not None:
            s = self.by_holder[hol]
            s.discard(slot)
            if not s:
                del self.by_holder[hol]
        self.ids[slot] = None
        self.labels[slot] = None
        self.holders[slot] = None

    def upsert(
        self,
        ids: Sequence[str],
        vectors: np.ndarray,
        labels: Sequence[str | None],
        holders: Sequence[str | None],
    ) -> tuple[np.ndarray, np.ndarray]:
        """Add items (ids unique within the call); returns ``(new_slots, replaced_slots)``."""
        replaced = []
        for i in ids:
            old = self.slot_of.pop(i, None)
            if old is not None:
                self._kill(old)
                replaced.append(old)
        start = self.n_slots
        n = len(ids)
        self._grow(start + n)
        self.vectors[start : start + n] = vectors
        self.alive[start : start + n] = True
        self.ids.extend(ids)
        self.labels.extend(labels)
        self.holders.extend(holders)
        for j, i in enumerate(ids):
            slot = start + j
            self.slot_of[i] = slot
            if labels[j] is not None:
                self.by_label.setdefault(labels[j], set()).add(slot)
            if holders[j] is not None:
                self.by_holder.setdefault(holders[j], set()).add(slot)
        self.n_alive += n
        return np.arange(start, start + n, dtype=np.int64), np.asarray(replaced, dtype=np.int64)

    def remove(self, ids: Iterable[str]) -> np.ndarray:
        out = []
        for i in ids:
            slot = self.slot_of.pop(i, None)
            if slot is not None:
                self._kill(slot)
                out.append(slot)
        return np.asarray(out, dtype=np.int64)

    def relabel(self, slot: int, label: str | None, holder: str | None) -> None:
        """Change the label and holding label of a live slot."""
        old = self.labels[slot]
        if old != label:
            if old is not None:
                s = self.by_label[old]
                s.discard(slot)
                if not s:
                    del self.by_label[old]
            self.labels[slot] = label
            if label is not None:
                self.by_label.setdefault(label, set()).add(slot)
        if self.holders[slot] != holder:
            self.set_holders(np.array([slot]), [holder])

    def set_holders(self, slots: np.ndarray, holders: Sequence[str | None]) -> None:
        for slot, h in zip(slots.tolist(), holders, strict=True):
            old = self.holders[slot]
            if old is not None:
                s = self.by_holder[old]
                s.discard(slot)
                if not s:
                    del self.by_holder[old]
            self.holders[slot] = h
            if h is not None:
                self.by_holder.setdefault(h, set()).add(slot)

    @classmethod
    def from_slots(
        cls,
        n_slots: int,
        slots: np.ndarray,
        ids: Sequence[str],
        vectors: np.ndarray,
        labels: Sequence[str | None],
        holders: Sequence[str | None],
    ) -> ItemTable:
        """A table with the given items at the given slots (the rest are holes)."""
        slots = np.asarray(slots, dtype=np.int64)
        if len(slots) and (slots.min() < 0 or slots.max() >= n_slots):
            raise ValueError("slot out of range")
        if len(np.unique(slots)) != len(slots):
            raise ValueError("duplicate slots")
        if len(set(ids)) != len(ids):
            raise ValueError("duplicate ids")
        t = cls(
            vectors.shape[1] if vectors.ndim == 2 else 0, capacity=max(1024, int(n_slots * 1.25))
        )
        t._grow(n_slots)
        t.vectors[slots] = vectors
        t.alive[slots] = True
        t.ids = [None] * n_slots
        t.labels = [None] * n_slots
        t.holders = [None] * n_slots
        for j, slot in enumerate(slots.tolist()):
            i, lab, hol = ids[j], labels[j], holders[j]
            if not isinstance(i, str):
                raise ValueError("ids must be str")
            t.ids[slot], t.labels[slot], t.holders[slot] = i, lab, hol
            t.slot_of[i] = slot
            if lab is not None:
                t.by_label.setdefault(lab, set()).add(slot)
            if hol is not None:
                t.by_holder.setdefault(hol, set()).add(slot)
        t.n_alive = len(slots)
        return t

    def compacted(self) -> ItemTable:
        """A new table holding the live items in slots ``0..n_alive-1`` (same order)."""
        live = self.live_slots()
        t = ItemTable(self.dim, capacity=max(1024, int(len(live) * 1.25)))
        if len(live):
            t.upsert(
                [self.ids[s] for s in live],
                self.vectors[live],
                [self.labels[s] for s in live],
                [self.holders[s] for s in live],
            )
        return t

    # -- filters -------------------------------------------------------------------
    def slots_for_ids(self, ids: Iterable[str]) -> set[int]:
        get = self.slot_of.get
        return {s for s in (get(i) for i in ids) if s is not None}

    def slots_for_labels(self, labels: Iterable[str]) -> set[int]:
        out: set[int] = set()
        for lab in labels:
            s = self.by_label.get(lab)
            if s:
                out |= s
        return out

    def slots_for_holders(self, holders: Iterable[str]) -> set[int]:
        out: set[int] = set()
        for h in holders:
            s = self.by_holder.get(h)
            if s:
                out |= s
        return out

    def count_for_holders(self, holders: Iterable[str]) -> int:
        return sum(len(self.by_holder.get(h, ())) for h in holders)

    def nbytes(self) -> int:
        return int(self.vectors.nbytes + self.alive.nbytes)
