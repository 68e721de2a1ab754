"""Exact backend: a full scan, the reference.

Every query scans the live slots (or the allowed ones) in one compiled kernel
(:func:`._graph_kernels.scan_topk`, no GIL held): the ``max(4k, k+32)`` nearest
by the ball's monotone float64 key ``|q - x|^2 / g(x)`` (a product space: the
exact distance), from coordinate differences (never the cancelling
``|x|^2 + |q|^2 - 2<x, q>``, so points at the boundary rank as well as any),
re-ranked by the compiled exact distance of ``models.geometry.kernels`` that
every backend returns.  The items' gaps ``g`` are kept per slot.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..geometry import IndexSpace
from ..table import ItemTable
from . import _graph_kernels as K
from .base import Backend, ProxyCache, empty_answer, merge_topk

__all__ = ["ExactBackend", "exact_search", "n_candidates", "with_deep_scan"]


def n_candidates(k: int, n: int) -> int:
    """How many candidates by the ranking key are re-ranked exactly."""
    return min(n, max(4 * k, k + 32))


class ExactBackend(Backend):
    name = "exact"

    def __init__(self, space: IndexSpace, **params: Any) -> None:
        super().__init__(space)
        if params:
            raise TypeError(f"exact backend: unknown parameters {sorted(params)}")
        # the gaps of every slot (models.geometry.kernels.gaps)
        self._gaps = ProxyCache(space, prepare=lambda x: (space.kernel_gaps(x),))

    @property
    def params(self) -> dict[str, Any]:
        return {}

    def build(self, table: ItemTable) -> None:
        self._gaps.reset()
        self._gaps.sync(table)

    def add(self, table: ItemTable, slots: np.ndarray) -> None:
        self._gaps.sync(table)

    def remove(self, table: ItemTable, slots: np.ndarray) -> None:
        pass  # table.alive masks them

    def search(self, table, queries, k, *, allowed=None, ef=None):
        prepared = self._gaps.view(table)  # kept in sync by build/add (write lock)
        gaps = None if prepared is None else prepared[0]
        return exact_search(self.space, table, gaps, queries, k, allowed=allowed)

    def nbytes(self) -> int:
        return self._gaps.nbytes()


def exact_search(
    space: IndexSpace,
    table: ItemTable,
    gaps: np.ndarray | None,
    queries: np.ndarray,
    k: int,
    *,
    allowed: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Exact k-NN over the live slots (or ``allowed``, a sorted array of live
    slots) of ``table``: ``(slots, distances)`` of shape ``(q, k)``.

    ``gaps``: the kernel gaps of every slot (``space.kernel_gaps`` of the table's
    vectors), or ``None`` to compute those of the rows scanned.
    """
    rows = table.live_slots() if allowed is None else np.asarray(allowed, dtype=np.int64)
    q = len(queries)
    k = min(k, len(rows))
    if q == 0 or k == 0:
        return empty_answer(q, k)
    if gaps is not None:  # every slot's row and gaps: scan the slots themselves
        xt, gt, slots = table.vectors, gaps, rows
    else:  # the rows scanned only, renumbered
        xt = np.ascontiguousarray(table.vectors[rows])
        gt, slots = space.kernel_gaps(xt), np.arange(len(rows), dtype=np.int64)
    q64 = np.ascontiguousarray(queries, dtype=np.float64)
    out_s = np.empty((q, k), dtype=np.int64)
    out_d = np.empty((q, k), dtype=np.float64)
    K.scan_topk(
        q64,
        space.kernel_gaps(q64),
        xt,
        gt,
        slots,
        *space.kernel_table(),
        n_candidates(k, len(rows)),
        k,
        out_s,
        out_d,
    )
    if gaps is None:
        out_s = np.where(out_s >= 0, rows[np.maximum(out_s, 0)], out_s)
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
