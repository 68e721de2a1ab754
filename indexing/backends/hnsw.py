"""HNSW backend: hnswlib's ``l2`` graph on Poincaré coordinates + exact re-ranking.

Plain Euclidean neighbours are a poor proxy for hyperbolic ones on
hierarchical data (the hyperbolic neighbours of a deep point are mostly
*ancestors*, radially inward and Euclidean-farther than its siblings): on
hierarchical clouds the recall of "l2 top-ef, re-ranked" stalls below the
target however large ef is.  This backend therefore *re-centres* its search:
a hyperbolic ball ``B(q, r)`` of the Poincaré model is a Euclidean ball with
another centre, so after a first pass around ``q`` (``max(ef/4, 2k, 32)``
candidates) gives ``r`` = the current k-th distance, the next pass asks the
graph for the ``ef`` Euclidean neighbours of the centre of ``B(q, r)`` --
which hold exactly the items within hyperbolic distance ``r`` of ``q``.  Up
to ``passes`` passes run (a query stops as soon as its k-th distance stops
improving).  Candidates are pooled and ranked with the float32 proxy of
:mod:`models.geometry.ranking` (the arcosh argument up to a per-query
factor); the best ``max(4k, k+32)`` are re-ranked exactly in float64 by
``models.geometry``.  ``passes=1`` is the plain "l2 top-ef + exact re-rank"
search.

An exact Euclidean kNN from the re-centred point finds the hyperbolic
neighbours after two re-centrings, so what remains is hnswlib's own
approximation, which is worse around the (off-manifold) centres than around
the queries -- hence the larger candidate count of the re-centred passes
(``benchmarks/ann.py`` measures it).

*Deep* items (gap ``1 - c|x|^2`` below :data:`models.geometry.ranking.DEEP_GAP`,
hyperbolic radius above about 12.9/sqrt(c)) stay out of the graph: hnswlib
holds float32 coordinates, which cannot tell such points apart.  They are
scanned exactly (float64 proxy for deep queries) at every search and merged.

Product spaces are not supported (the index routes them to the exact
backend): ``l2`` on the concatenated coordinates of a product is dominated by
the Euclidean factors while the hyperbolic factor dominates the distance, so
recall stays low even after exact re-ranking, and a product ball is not a
Euclidean ball, so re-centring does not apply.

Parameters: ``M`` (16), ``ef_construction`` (200), ``ef`` (candidates of a
re-centred pass; the first pass takes ``max(ef/4, 2k, 32)``; 256), ``passes`` (2),
``num_threads`` (threads per knn_query, 1: the service's parallelism is its
concurrent requests), ``filter_exact_threshold``
(20000: a filtered search over at most that many items is an exact scan),
``seed`` (100).
"""

from __future__ import annotations

import logging
import os
import tempfile
from typing import Any

import numpy as np

from ..geometry import IndexSpace
from ..table import ItemTable
from .base import (
    Backend,
    ProxyCache,
    ball_only_params,
    empty_answer,
    merge_topk,
    rerank,
    search_size,
)
from .exact import exact_search, n_candidates, with_deep_scan

__all__ = ["HnswBackend"]

log = logging.getLogger(__name__)

_DEFAULTS = {
    "M": 16,
    "ef_construction": 200,
    "ef": 256,
    "passes": 2,
    "num_threads": 1,
    "build_threads": -1,
    "filter_exact_threshold": 20000,
    "seed": 100,
}


class HnswBackend(Backend):
    name = "hnsw"

    def __init__(self, space: IndexSpace, **params: Any) -> None:
        super().__init__(space)
        p = ball_only_params("hnsw", space, params, _DEFAULTS)
        for key in ("M", "ef_construction", "ef", "passes", "filter_exact_threshold"):
            if int(p[key]) < (0 if key == "filter_exact_threshold" else 1):
                raise ValueError(f"hnsw backend: {key} must be >= 1, got {p[key]!r}")
        self._p = {k: int(v) for k, v in p.items()}
        self._index = None
        self._count = 0  # elements in the graph, deleted ones included
        self._deleted = 0
        self._proxy = ProxyCache(space)
        self._deep: set[int] = set()  # live deep slots, kept out of the graph

    @property
    def params(self) -> dict[str, Any]:
        return dict(self._p)

    def set_num_threads(self, n: int) -> None:
        """Threads per ``knn_query`` from now on (the ``num_threads`` parameter)."""
        if int(n) < 1:
            raise ValueError(f"hnsw backend: num_threads must be >= 1, got {n!r}")
        self._p["num_threads"] = int(n)

    # -- mutations ------------------------------------------------------------------
    def _new_index(self, capacity: int):
        import hnswlib

        idx = hnswlib.Index(space="l2", dim=self.space.dim)
        idx.init_index(
            max_elements=max(capacity, 64),
            M=self._p["M"],
            ef_construction=self._p["ef_construction"],
            random_seed=self._p["seed"],
        )
        # searches ask for max(ef, k) results: hnswlib uses max(ef_, k), so the
        # shared ef_ stays small and concurrent searches need not set it.
        idx.set_ef(1)
        return idx

    def build(self, table: ItemTable) -> None:
        live = table.live_slots()
        self._index = self._new_index(int(len(live) * 1.25) + 64)
        self._count = 0
        self._deleted = 0
        self._deep = set()
        self._proxy.reset()
        self._proxy.sync(table)
        if len(live):
            self._insert(table, live)

    def _insert(self, table: ItemTable, slots: np.ndarray) -> None:
        deep = self.space.deep(table.vectors[slots])
        if deep.any():
            self._deep.update(slots[deep].tolist())
            slots = slots[~deep]
            if len(slots) == 0:
                return
        need = self._count + len(slots)
        cap = self._index.get_max_elements()
        if need > cap:
            self._index.resize_index(max(need, int(cap * 1.5)))
        self._index.add_items(
            table.vectors[slots].astype(np.float32),
            slots,
            num_threads=self._p["build_threads"],
        )
        self._count = need

    def add(self, table: ItemTable, slots: np.ndarray) -> None:
        if self._index is None:
            self.build(table)
            return
        if len(slots):
            self._insert(table, np.asarray(slots, dtype=np.int64))
        self._proxy.sync(table)

    def remove(self, table: ItemTable, slots: np.ndarray) -> None:
        if self._index is None:
            return
        for s in np.asarray(slots, dtype=np.int64).tolist():
            if s in self._deep:
                self._deep.discard(s)
                continue
            try:
                self._index.mark_deleted(s)
                self._deleted += 1
            except RuntimeError:  # not in the graph (already deleted)
                pass

    @property
    def deleted_fraction(self) -> float:
        return self._deleted / self._count if self._count else 0.0

    # -- search -----------------------------------------------------------------------
    def search(self, table, queries, k, *, allowed=None, ef=None):
        n, k = search_size(table, k, allowed)
        if len(queries) == 0 or k == 0:
            return empty_answer(len(queries), k)
        ef = self._p["ef"] if ef is None else int(ef)
        m = min(max(ef, k), n)
        if (
            self._index is None
            or n <= 2 * m
            or (allowed is not None and n <= self._p["filter_exact_threshold"])
        ):
            return exact_search(self.space, table, None, queries, k, allowed=allowed)
        deep = self._deep
        if deep:
            if allowed is None:
                deep_rows = np.fromiter(sorted(deep), dtype=np.int64, count=len(deep))
            else:
                deep_rows = allowed[
                    np.fromiter((s in deep for s in allowed.tolist()), bool, len(allowed))
                ]
                allowed = np.setdiff1d(allowed, deep_rows, assume_unique=True)
        else:
            deep_rows = np.empty(0, dtype=np.int64)
        n_graph = n - len(deep_rows)
        parts = []
        if n_graph:
            kg = min(k, n_graph)
            try:
                parts.append(self._graph_search(table, queries, kg, min(m, n_graph), allowed))
            except RuntimeError as exc:
                # hnswlib: "Cannot return the results in a contiguous 2D array.
                # Probably ef or M is too small" -- fewer than m reachable results
                log.debug("hnsw search fell back to an exact scan: %s", exc)
                if allowed is None:
                    allowed = np.setdiff1d(table.live_slots(), deep_rows, assume_unique=True)
                parts.append(exact_search(self.space, table, None, queries, kg, allowed=allowed))
        # the deep items: an exact scan (float64 for deep queries)
        return with_deep_scan(self.space, table, queries, k, parts, deep_rows)

    def _knn(self, x: np.ndarray, m: int, filt) -> np.ndarray:
        threads = 1 if filt is not None else self._p["num_threads"]
        labels, _ = self._index.knn_query(
            np.ascontiguousarray(x, dtype=np.float32), k=m, num_threads=threads, filter=filt
        )
        return labels.astype(np.int64, copy=False)

    def _graph_search(self, table, queries, k, m, allowed):
        """Multi-pass graph search.  Candidates of all passes are pooled and
        ranked with the float32 proxy; the re-centring radius is the proxy's
        k-th distance; the best ``max(4k, k+32)`` of the pool are re-ranked
        exactly."""
        space = self.space
        proxy = self._proxy
        if proxy.view(table) is None:  # not in sync (never expected): stay correct
            return exact_search(space, table, None, queries, k, allowed=allowed)
        filt = None if allowed is None else set(np.asarray(allowed).tolist()).__contains__
        n = table.n_alive - len(self._deep) if allowed is None else len(allowed)
        keep = n_candidates(k, n)
        passes = self._p["passes"]
        first = m if passes == 1 else min(n, max(2 * k, 32, m // 4))
        cand = self._knn(queries, first, filt)
        pool_s, pool_k = merge_topk(cand, proxy.keys(queries, cand), keep)
        active = np.arange(len(queries))
        for _ in range(1, passes):
            qa = queries[active]
            kth = pool_k[active, k - 1]
            centres, _ = space.euclidean_ball(qa, space.radius_from_key(qa, kth))
            cand = self._knn(centres, m, filt)
            s = np.concatenate([pool_s[active], cand], axis=1)
            d = np.concatenate([pool_k[active], proxy.keys(qa, cand)], axis=1)
            s, d = merge_topk(s, d, keep)
            improved = d[:, k - 1] < kth
            pool_s[active], pool_k[active] = s, d
            active = active[improved]
            if len(active) == 0:
                break
        best_s, best_d = rerank(space, table, queries, pool_s, k)
        bad = (best_s < 0).any(axis=1)
        if bad.any():  # graph could not reach k allowed items for some queries
            rows = np.nonzero(bad)[0]
            s, d = exact_search(space, table, None, queries[rows], k, allowed=allowed)
            best_s[rows], best_d[rows] = s, d
        return best_s, best_d

    # -- snapshot ---------------------------------------------------------------------
    def state(self) -> dict[str, bytes]:
        if self._index is None:
            return {}
        fd, tmp = tempfile.mkstemp(prefix="hnsw-", suffix=".bin")
        os.close(fd)
        try:
            self._index.save_index(tmp)
            with open(tmp, "rb") as f:
                graph = f.read()
        finally:
            os.unlink(tmp)
        meta = f"{self._count} {self._deleted}".encode()
        return {"graph": graph, "counts": meta}

    def restore(self, table: ItemTable, state: dict[str, bytes]) -> None:
        if "graph" not in state:
            self.build(table)
            return
        import hnswlib

        fd, tmp = tempfile.mkstemp(prefix="hnsw-", suffix=".bin")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(state["graph"])
            idx = hnswlib.Index(space="l2", dim=self.space.dim)
            idx.load_index(tmp)
        finally:
            os.unlink(tmp)
        idx.set_ef(1)
        count, deleted = (int(v) for v in state["counts"].decode().split())
        if idx.get_current_count() != count:
            raise ValueError("hnsw snapshot: element count does not match")
        self._index, self._count, self._deleted = idx, count, deleted
        live = table.live_slots()
        self._deep = set(live[self.space.deep(table.vectors[live])].tolist())
        self._proxy.reset()
        self._proxy.sync(table)

    def nbytes(self) -> int:
        if self._index is None:
            return 0
        # hnswlib level-0 record: links (2M ints + count) + float32 vector + label
        per = (2 * self._p["M"] + 1) * 4 + self.space.dim * 4 + 8
        return int(self._index.get_max_elements() * per) + self._proxy.nbytes()
