"""Exact backend: a full scan, the reference.

Candidates are selected with the space's float32 ranking proxy (for the
Poincaré ball the arcosh argument up to a per-query factor, from coordinate
differences) -- in float64 for *deep* queries (gap below
:data:`models.geometry.ranking.DEEP_GAP`, where float32 cannot rank) --
``max(4k, k+32)`` per query, then re-ranked in float64 with
``models.geometry``.  The scan runs in chunks of queries so the key matrix stays
around 64 MB.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..geometry import IndexSpace
from ..table import ItemTable
from .base import EMPTY, Backend, ProxyCache, empty_answer, merge_topk, rerank

__all__ = ["ExactBackend", "exact_search", "n_candidates", "with_deep_scan"]

_KEY_BUDGET = 1 << 24  # float32 keys per chunk (64 MB)


def n_candidates(k: int, n: int) -> int:
    """How many proxy-ranked candidates are re-ranked exactly."""
    return min(n, max(4 * k, k + 32))


def _smallest(keys: np.ndarray, m: int) -> np.ndarray:
    """Column indices of the ``m`` smallest keys of each row (unordered)."""
    import torch

    from ..geometry import torch_threads

    with torch_threads():
        return torch.topk(torch.from_numpy(keys), m, dim=1, largest=False, sorted=False)[1].numpy()


class ExactBackend(Backend):
    name = "exact"

    def __init__(self, space: IndexSpace, **params: Any) -> None:
        super().__init__(space)
        if params:
            raise TypeError(f"exact backend: unknown parameters {sorted(params)}")
        self._proxy = ProxyCache(space)

    @property
    def params(self) -> dict[str, Any]:
        return {}

    def build(self, table: ItemTable) -> None:
        self._proxy.reset()
        self._proxy.sync(table)

    def add(self, table: ItemTable, slots: np.ndarray) -> None:
        self._proxy.sync(table)

    def remove(self, table: ItemTable, slots: np.ndarray) -> None:
        pass  # table.alive masks them

    def search(self, table, queries, k, *, allowed=None, ef=None):
        prepared = self._proxy.view(table)  # kept in sync by build/add (write lock)
        return exact_search(self.space, table, prepared, queries, k, allowed=allowed)

    def nbytes(self) -> int:
        return self._proxy.nbytes()


def exact_search(
    space: IndexSpace,
    table: ItemTable,
    prepared: tuple[np.ndarray, ...] | None,
    queries: np.ndarray,
    k: int,
    *,
    allowed: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Exact k-NN over the live slots (or ``allowed``, a sorted array of live
    slots) of ``table``.

    ``prepared``: the proxy data of every slot (:class:`ProxyCache`), or
    ``None`` to prepare just the rows scanned.
    """
    q = len(queries)
    dead = None
    full = allowed is None and prepared is not None
    if full:
        # scan every slot, masking the holes (no copy of the prepared data)
        n_slots = table.n_slots
        rows = np.arange(n_slots, dtype=np.int64)
        sub = tuple(p[:n_slots] for p in prepared)
        n_live = table.n_alive
        if n_live < n_slots:
            dead = ~table.alive[:n_slots]
    else:
        rows = table.live_slots() if allowed is None else np.asarray(allowed, dtype=np.int64)
        n_live = len(rows)
        if prepared is not None:
            sub = space.proxy_take(prepared, rows)
        else:
            sub = space.proxy_prepare(table.vectors[rows])
    n = len(rows)
    k = min(k, n_live)
    if q == 0 or k == 0:
        return empty_answer(q, k)
    m = n_candidates(k, n_live)
    out_s = np.empty((q, k), dtype=np.int64)
    out_d = np.empty((q, k), dtype=np.float64)
    deep_q = space.deep(queries)
    groups = [(np.nonzero(~deep_q)[0], False), (np.nonzero(deep_q)[0], True)]
    for sel, wide in groups:
        if len(sel) == 0:
            continue
        qb = max(1, min(len(sel), (_KEY_BUDGET // (2 if wide else 1)) // max(n, 1)))
        x64 = None
        if wide:
            x64 = table.vectors[:n] if full else table.vectors[rows]
        for a in range(0, len(sel), qb):
            part_q = queries[sel[a : a + qb]]
            if wide:  # a deep query: float32 cannot rank its neighbourhood
                keys = space.proxy_keys64(part_q, x64)
            else:
                keys = space.proxy_keys(part_q, sub)
            if dead is not None:
                keys[:, dead] = np.inf
            if m < n:
                part = _smallest(keys, m)
            else:
                part = np.broadcast_to(np.arange(n), (len(keys), n))
            cand = rows[part]
            if dead is not None:
                cand = np.where(table.alive[cand], cand, EMPTY)
            s, d = rerank(space, table, part_q, cand, k)
            out_s[sel[a : a + qb]] = s
            out_d[sel[a : a + qb]] = d
    return out_s, out_d


def with_deep_scan(space, table, queries, k, parts, deep_rows):
    """The answers ``parts`` (a list of ``(slots, distances)`` of a graph) merged
    with an exact scan of ``deep_rows``, the deep items a float32 graph leaves
    out; the ``k`` nearest of all."""
    if len(deep_rows):
        kd = min(k, len(deep_rows))
        parts = [*parts, exact_search(space, table, None, queries, kd, allowed=deep_rows)]
    if len(parts) == 1:
        return parts[0]
    return merge_topk(
        np.concatenate([p[0] for p in parts], axis=1),
        np.concatenate([p[1] for p in parts], axis=1),
        k,
    )
