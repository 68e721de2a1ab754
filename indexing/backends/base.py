"""The interface between :class:`indexing.HyperbolicIndex` and a search backend.

A backend indexes the live slots of an :class:`~indexing.table.ItemTable` and
answers k-nearest-neighbour queries with **exact float64 geodesic distances**:
whatever proxy ranks candidates inside the backend, the returned distances come
from :meth:`indexing.geometry.IndexSpace.dist_rows` (``models.geometry``).

The index calls every method with its lock held: mutations (``build``, ``add``,
``remove``, ``restore``) under the write lock, ``search``/``state`` under a read
lock, so several searches may run at once but never alongside a mutation.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

import numpy as np

from ..geometry import IndexSpace, PoincareIndexSpace
from ..table import ItemTable

__all__ = [
    "Backend",
    "ProxyCache",
    "ball_only_params",
    "empty_answer",
    "search_size",
    "rerank",
    "merge_topk",
    "exact_dists",
    "EMPTY",
]

EMPTY = -1  # padding slot


class Backend(ABC):
    name: ClassVar[str]

    def __init__(self, space: IndexSpace, **params: Any) -> None:
        self.space = space

    @property
    @abstractmethod
    def params(self) -> dict[str, Any]:
        """The backend's parameters (JSON-serialisable, written to the manifest)."""

    @abstractmethod
    def build(self, table: ItemTable) -> None:
        """(Re)index every live slot of ``table``, discarding previous state."""

    @abstractmethod
    def add(self, table: ItemTable, slots: np.ndarray) -> None:
        """Index new slots (their vectors are already in ``table``)."""

    @abstractmethod
    def remove(self, table: ItemTable, slots: np.ndarray) -> None:
        """Forget slots (already marked dead in ``table``)."""

    @abstractmethod
    def search(
        self,
        table: ItemTable,
        queries: np.ndarray,
        k: int,
        *,
        allowed: np.ndarray | None = None,
        ef: int | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """``(slots, distances)``, both ``(q, k)``, ascending exact distances.

        ``k`` never exceeds the number of live (allowed) slots; ``allowed`` is a
        sorted array of live slots or ``None`` for all.
        """

    def state(self) -> dict[str, bytes]:
        """Blobs to snapshot (empty when rebuilding from the table is cheap)."""
        return {}

    def restore(self, table: ItemTable, state: dict[str, bytes]) -> None:
        """Inverse of :meth:`state` (``table`` already holds the snapshot's items)."""
        self.build(table)

    def nbytes(self) -> int:
        """Approximate memory held by the backend beyond the table."""
        return 0


def ball_only_params(
    name: str, space: IndexSpace, params: dict[str, Any], defaults: dict[str, Any]
) -> dict[str, Any]:
    """``defaults`` updated with ``params`` for a backend of the Poincaré ball only
    (``ValueError`` for another space, ``TypeError`` for an unknown parameter)."""
    if not isinstance(space, PoincareIndexSpace):
        raise ValueError(
            f"the {name} backend supports the Poincaré ball only, not {space.spec!r} "
            "(use backend='exact' or 'auto' for product spaces)"
        )
    unknown = set(params) - set(defaults)
    if unknown:
        raise TypeError(f"{name} backend: unknown parameters {sorted(unknown)}")
    return {**defaults, **params}


def empty_answer(q: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``(slots, distances)`` of ``q`` queries when nothing is returned (``k``
    columns of padding: ``k`` is 0 or there is no query)."""
    return np.full((q, k), EMPTY, dtype=np.int64), np.full((q, k), np.inf)


def search_size(table: ItemTable, k: int, allowed: np.ndarray | None) -> tuple[int, int]:
    """``(n, k)``: how many items a search ranges over (live, or ``allowed``) and
    ``k`` clamped to that."""
    n = table.n_alive if allowed is None else len(allowed)
    return n, min(k, n)


class ProxyCache:
    """The space's ranking-proxy data for every slot of a table (float32), or what
    ``prepare`` (float64 rows ``(n, d)`` -> a tuple of arrays of ``n`` rows) makes
    of them, appended to as the table grows (slots are never rewritten)."""

    def __init__(self, space: IndexSpace, prepare=None) -> None:
        self.space = space
        self.prepare = space.proxy_prepare if prepare is None else prepare
        self.data: tuple[np.ndarray, ...] | None = None
        self.n = 0

    def reset(self) -> None:
        self.data, self.n = None, 0

    def sync(self, table: ItemTable) -> tuple[np.ndarray, ...]:
        n = table.n_slots
        if self.data is None or self.n > n:
            new = self.prepare(table.vectors[:n])
            self.data = tuple(_with_capacity(a, max(n, 16)) for a in new)
        elif self.n < n:
            new = self.prepare(table.vectors[self.n : n])
            grown = []
            for old, part in zip(self.data, new, strict=True):
                if len(old) < n:
                    old = _with_capacity(old[: self.n], int(n * 1.5) + 16)
                old[self.n : n] = part
                grown.append(old)
            self.data = tuple(grown)
        self.n = n
        return tuple(a[:n] for a in self.data)

    def view(self, table: ItemTable) -> tuple[np.ndarray, ...] | None:
        """The data of every slot if the cache is in sync with ``table`` (no
        mutation: safe under a read lock), else ``None``."""
        if self.data is None or self.n != table.n_slots:
            return None
        return tuple(a[: self.n] for a in self.data)

    def keys(self, queries: np.ndarray, cand: np.ndarray) -> np.ndarray:
        """float32 proxy keys ``(q, m)`` of candidate slots (inf for padding)."""
        valid = cand >= 0
        rows = tuple(a[np.where(valid, cand, 0)] for a in self.data)
        k = self.space.proxy_rows(queries, rows)
        return np.where(valid, k, np.inf)

    def nbytes(self) -> int:
        return sum(int(a.nbytes) for a in self.data or ())


def _with_capacity(a: np.ndarray, cap: int) -> np.ndarray:
    out = np.zeros((cap,) + a.shape[1:], dtype=a.dtype)
    out[: len(a)] = a
    return out


def merge_topk(slots: np.ndarray, dists: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Per row: drop padding and duplicate slots, keep the ``k`` smallest distances
    (ties broken by slot).  Rows with fewer than ``k`` valid entries are padded
    with ``(EMPTY, inf)``."""
    slots = np.asarray(slots, dtype=np.int64)
    d = np.where(slots >= 0, np.asarray(dists, dtype=np.float64), np.inf)
    d = np.where(np.isnan(d), np.inf, d)
    order = np.argsort(slots, axis=1, kind="stable")
    s = np.take_along_axis(slots, order, axis=1)
    d = np.take_along_axis(d, order, axis=1)
    if s.shape[1] > 1:
        dup = np.zeros(s.shape, dtype=bool)
        dup[:, 1:] = s[:, 1:] == s[:, :-1]
        d[dup] = np.inf
    order = np.argsort(d, axis=1, kind="stable")[:, :k]
    s = np.take_along_axis(s, order, axis=1)
    d = np.take_along_axis(d, order, axis=1)
    s[~np.isfinite(d)] = EMPTY
    if s.shape[1] < k:
        pad = k - s.shape[1]
        s = np.pad(s, ((0, 0), (0, pad)), constant_values=EMPTY)
        d = np.pad(d, ((0, 0), (0, pad)), constant_values=np.inf)
    return s, d


def exact_dists(
    space: IndexSpace, table: ItemTable, queries: np.ndarray, cand: np.ndarray
) -> np.ndarray:
    """Exact float64 distances from ``queries[i]`` to the slots ``cand[i]`` (inf for padding)."""
    cand = np.asarray(cand, dtype=np.int64)
    out = np.full(cand.shape, np.inf)
    if cand.size == 0:
        return out
    step = max(1, 2_000_000 // max(1, cand.shape[1] * table.dim))
    for a in range(0, len(cand), step):
        c = cand[a : a + step]
        valid = c >= 0
        x = table.vectors[np.where(valid, c, 0)]
        d = space.dist_rows(queries[a : a + step], x)
        out[a : a + step] = np.where(valid, d, np.inf)
    return out


def rerank(
    space: IndexSpace, table: ItemTable, queries: np.ndarray, cand: np.ndarray, k: int
) -> tuple[np.ndarray, np.ndarray]:
    """Exact float64 re-ranking of candidate slots; ``(slots, dists)`` of shape ``(q, k)``."""
    return merge_topk(cand, exact_dists(space, table, queries, cand), k)
