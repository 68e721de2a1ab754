"""Graph backend: a proximity graph built with the hyperbolic metric itself.

hnswlib's ``l2`` graph sees Euclidean neighbours, which on hierarchical data in
the Poincaré ball are a poor proxy for the hyperbolic ones (see
:mod:`.hnsw`).  This backend builds and searches its graph with the ranking
proxy of :mod:`models.geometry.ranking`, ``key(q, x) = |q - x|^2 / (1 - c|x|^2)``
(monotone in the geodesic distance for a fixed ``q``; from coordinate
differences, accumulated in float64 whatever the coordinates' dtype, with the
weights ``1 / (1 - c|x|^2)`` held in float64) and its symmetric form between
nodes, in compiled kernels that release the GIL (:mod:`._graph_kernels`, numba):

* one flat layer; a search starts from ``n_entries`` nodes (the node nearest
  the origin and a random sample), all scored, so the beam begins next to the
  query instead of descending from a hub (more entry points: higher recall at
  the same beam width, with diminishing returns);
* out-degree up to ``R`` chosen by robust pruning (DiskANN) with ``alpha`` on
  the geodesic distance.  In this tree-like metric the pruning keeps few
  edges; a larger ``alpha`` keeps more out-edges, all pointing inward at the
  same hubs, whose reverse edges then crowd each other out, and recall falls;
* ``min_degree``: a node keeps at least that many edges, topped up with the
  nearest pruned candidates -- on a tree-like metric robust pruning leaves a
  near-tree (WordNet noun embeddings) that a beam navigates badly;
* reverse edges are added grouped by target, in parallel; a list over
  ``R + R // 2`` is pruned back to ``R`` and every edge ``v -> c`` it drops
  because a kept ``r`` is nearer ``c`` is handed to ``r`` (``handoffs``
  rounds), so nodes pruned from a crowded hub stay reachable;
* built by batch-parallel incremental insertion (batches double up to
  ``max_batch``: ParlayANN), every batch searching the graph as it was before
  it; a batch node also considers up to ``mates`` batch nodes that share its
  nearest graph node, and always keeps an edge to that node (a batch of
  near-duplicates would otherwise link only to itself and become an island);
* after every insertion a repair pass links any node the entry points cannot
  reach;
* a search is a beam search of width ``max(ef, 2k)``; the best
  ``max(4k, k + 32)`` returnable nodes it visits are re-ranked in float64 by
  ``models.geometry``; removed items stay in the graph as tombstones that
  route but are never returned, so deletion does not disconnect it
  (compaction rebuilds it when the index's table is compacted); a filter
  marks the allowed nodes and the search keeps routing through the others.

Coordinates are float32 or float64 (``precision``; ``"auto"`` picks float64
when more than :data:`AUTO_DEEP_SHARE` of the items are *deep*, gap below
:data:`models.geometry.ranking.DEEP_GAP`, where float32 cannot rank neighbours --
label embeddings of a big taxonomy are mostly that deep -- and float32, the
faster, otherwise).  In a float32 graph the deep items stay out and are
scanned exactly, as in :mod:`.hnsw`.  Keys are float64 either way.  Product
spaces are not supported (the index routes them to the exact backend).
The README's ANN benchmark has the measurements behind these choices.

Parameters: ``R`` (32), ``ef_construction`` (96), ``alpha`` (1.0), ``ef``
(48), ``n_entries`` (256), ``max_batch`` (4096), ``handoffs`` (3),
``mates`` (32), ``min_degree`` (8), ``precision`` ("auto"), ``build_threads`` (0: numba's default),
``filter_exact_threshold`` (20000), ``seed`` (100).
"""

from __future__ import annotations

import io
import threading
from typing import Any

import numpy as np

from ..geometry import IndexSpace
from ..table import ItemTable
from .base import Backend, ball_only_params, empty_answer, rerank, search_size
from .exact import exact_search, n_candidates, with_deep_scan

__all__ = ["GraphBackend"]

_DEFAULTS: dict[str, Any] = {
    "R": 32,
    "ef_construction": 96,
    "alpha": 1.0,
    "ef": 48,
    "max_batch": 4096,
    "build_threads": 0,
    "filter_exact_threshold": 20000,
    "seed": 100,
    "n_entries": 256,
    "handoffs": 3,
    "mates": 32,
    "min_degree": 8,
    "precision": "auto",
}
#: ``precision="auto"``: float64 coordinates when more than this share of the
#: items is deep (label embeddings of a big taxonomy), else float32 with the
#: deep items scanned exactly.
AUTO_DEEP_SHARE = 0.01
_INT_PARAMS = ("R", "ef_construction", "ef", "max_batch", "n_entries")


def _kernels():
    from . import _graph_kernels

    return _graph_kernels


class _VisitedPool:
    """Per-call visited buffers (uint32 stamps) so concurrent searches never share one."""

    def __init__(self) -> None:
        self._free: list[list] = []  # [buffer, stamp]
        self._lock = threading.Lock()

    def take(self, n: int) -> list:
        with self._lock:
            while self._free:
                item = self._free.pop()
                if len(item[0]) >= n:
                    return item
        return [np.zeros(max(n, 1024) + n // 4, dtype=np.uint32), 0]

    def give(self, item: list) -> None:
        with self._lock:
            self._free.append(item)

    def clear(self) -> None:
        with self._lock:
            self._free.clear()


class GraphBackend(Backend):
    name = "graph"

    def __init__(self, space: IndexSpace, **params: Any) -> None:
        super().__init__(space)
        p = ball_only_params("graph", space, params, _DEFAULTS)
        for key in _INT_PARAMS:
            if int(p[key]) < 1:
                raise ValueError(f"graph backend: {key} must be >= 1, got {p[key]!r}")
        if int(p["R"]) < 2:
            raise ValueError(f"graph backend: R must be >= 2, got {p['R']!r}")
        if not float(p["alpha"]) >= 1.0:
            raise ValueError(f"graph backend: alpha must be >= 1, got {p['alpha']!r}")
        for key in ("filter_exact_threshold", "build_threads", "handoffs", "mates", "min_degree"):
            if int(p[key]) < 0:
                raise ValueError(f"graph backend: {key} must be >= 0, got {p[key]!r}")
        if p["precision"] not in ("auto", "float32", "float64"):
            raise ValueError(
                "graph backend: precision must be 'auto', 'float32' or 'float64', "
                f"got {p['precision']!r}"
            )
        self._p = {
            k: (float(v) if k == "alpha" else v if k == "precision" else int(v))
            for k, v in p.items()
        }
        self._dtype = np.float64 if self._p["precision"] == "float64" else np.float32
        self._visited = _VisitedPool()
        self._reset(0)

    @property
    def params(self) -> dict[str, Any]:
        return dict(self._p)

    # -- state ------------------------------------------------------------------------
    def _reset(self, capacity: int) -> None:
        cap = max(16, int(capacity))
        slack = self._p["R"] + self._p["R"] // 2
        self._x = np.zeros((cap, self.space.dim), dtype=self._dtype)
        self._w = np.zeros(cap, dtype=np.float64)
        self._adj = np.full((cap, slack), -1, dtype=np.int32)
        self._deg = np.zeros(cap, dtype=np.int32)
        self._flags = np.zeros(cap, dtype=np.uint8)
        self._n = 0  # slots covered by the arrays' contents
        self._in_graph = 0
        self._deleted = 0
        self._set_entries(np.empty(0, dtype=np.int64))
        self._deep: set[int] = set()
        self._visited.clear()

    def _grow(self, need: int) -> None:
        cap = len(self._w)
        if need <= cap:
            return
        new = max(need, int(cap * 1.5) + 16)

        def grown(a, fill):
            out = np.full((new,) + a.shape[1:], fill, dtype=a.dtype)
            out[:cap] = a
            return out

        self._x = grown(self._x, 0)
        self._w = grown(self._w, 0)
        self._adj = grown(self._adj, -1)
        self._deg = grown(self._deg, 0)
        self._flags = grown(self._flags, 0)
        self._visited.clear()

    def _sync_vectors(self, table: ItemTable) -> None:
        n = table.n_slots
        if n > self._n:
            self._grow(n)
            v = table.vectors[self._n : n]
            self._x[self._n : n] = v
            self._w[self._n : n] = self.space.proxy_weight(v)
            self._n = n

    # -- mutations ------------------------------------------------------------------
    def _choose_dtype(self, table: ItemTable, slots: np.ndarray) -> bool:
        """``precision="auto"`` on an empty graph: float64 if the items coming in
        are deep enough to need it.  True if the dtype changed."""
        if self._p["precision"] != "auto" or self._in_graph or not len(slots):
            return False
        deep = float(self.space.deep(table.vectors[slots]).mean())
        want = np.float64 if deep > AUTO_DEEP_SHARE else np.float32
        changed = want != self._dtype
        self._dtype = want
        return changed

    def build(self, table: ItemTable) -> None:
        live = table.live_slots()
        self._in_graph = 0
        self._choose_dtype(table, live)
        self._reset(max(table.n_slots, 16))
        self._sync_vectors(table)
        if len(live):
            self._insert(table, live)

    def add(self, table: ItemTable, slots: np.ndarray) -> None:
        slots = np.asarray(slots, dtype=np.int64)
        if self._choose_dtype(table, slots):
            self._reset(max(table.n_slots, 16))
        self._sync_vectors(table)
        if len(slots):
            self._insert(table, slots)

    def remove(self, table: ItemTable, slots: np.ndarray) -> None:
        for s in np.asarray(slots, dtype=np.int64).tolist():
            if s in self._deep:
                self._deep.discard(s)
            elif s < self._n and self._flags[s] == 1:
                self._flags[s] = 2
                self._deleted += 1

    @property
    def deleted_fraction(self) -> float:
        return self._deleted / self._in_graph if self._in_graph else 0.0

    def _insert(self, table: ItemTable, slots: np.ndarray) -> None:
        K = _kernels()
        if self._dtype == np.float64:  # float64 coordinates rank deep points too
            deep = np.zeros(len(slots), dtype=bool)
        else:
            deep = self.space.deep(table.vectors[slots])
        if deep.any():
            self._deep.update(slots[deep].tolist())
            slots = slots[~deep]
        slots = slots[self._flags[slots] == 0]
        if len(slots) == 0:
            return
        rng = np.random.default_rng(self._p["seed"] + self._in_graph)
        slots = slots[rng.permutation(len(slots))]
        if self._in_graph == 0:
            # the point nearest the origin first: the hub every search starts from
            first = int(np.argmin(self._w[slots]))
            slots[[0, first]] = slots[[first, 0]]
            self._flags[slots[0]] = 1
            self._in_graph = 1
            self._set_entries(np.array([slots[0]], dtype=np.int64))
            slots = slots[1:]
        threads = self._p["build_threads"] or _numba_threads()
        two_c = 2.0 * self.space.c
        a = 0
        while a < len(slots):
            size = min(self._p["max_batch"], max(1, self._in_graph), len(slots) - a)
            batch = np.ascontiguousarray(slots[a : a + size])
            vis = np.zeros((threads, len(self._w)), dtype=np.uint32)
            with K.PARALLEL_LOCK:
                tgt, src = K.insert_batch(
                    self._x,
                    self._w,
                    self._adj,
                    self._deg,
                    self._flags,
                    batch,
                    self._entries,
                    self._ex,
                    self._ew,
                    self._p["ef_construction"],
                    self._p["R"],
                    self._p["alpha"],
                    two_c,
                    vis,
                    threads,
                    self._p["mates"],
                    self._p["min_degree"],
                )
                for _ in range(self._p["handoffs"] + 1):
                    if len(tgt) == 0:
                        break
                    tgt, src = K.link_groups(
                        self._x,
                        self._w,
                        self._adj,
                        self._deg,
                        tgt,
                        src,
                        self._p["R"],
                        self._p["alpha"],
                        two_c,
                        self._p["min_degree"],
                    )
            self._flags[batch] = 1
            self._in_graph += size
            a += size
            if len(self._entries) < self._p["n_entries"]:
                self._pick_entries()
        self._pick_entries()
        K.repair(
            self._x,
            self._w,
            self._adj,
            self._deg,
            self._flags,
            self._entries,
            self._ex,
            self._ew,
            self._p["ef_construction"],
        )

    def _set_entries(self, entries: np.ndarray) -> None:
        """Entry points, with a dense copy of their coordinates and weights."""
        self._entries = entries
        self._ex = np.ascontiguousarray(self._x[entries])
        self._ew = np.ascontiguousarray(self._w[entries])

    def _pick_entries(self) -> None:
        """The live node nearest the origin and a few random live nodes."""
        live = np.nonzero(self._flags[: self._n] == 1)[0]
        if len(live) == 0:
            route = np.nonzero(self._flags[: self._n] != 0)[0]
            self._set_entries(route[:1].astype(np.int64))
            return
        hub = live[np.argmin(self._w[live])]
        rng = np.random.default_rng(self._p["seed"])
        extra = rng.choice(live, size=min(len(live), self._p["n_entries"] - 1), replace=False)
        rest = np.unique(extra).astype(np.int64)
        self._set_entries(np.concatenate([[hub], rest[rest != hub]]).astype(np.int64))

    # -- search -----------------------------------------------------------------------
    def search(self, table, queries, k, *, allowed=None, ef=None):
        n, k = search_size(table, k, allowed)
        if len(queries) == 0 or k == 0:
            return empty_answer(len(queries), k)
        if (
            self._in_graph == 0
            or self._n < table.n_slots
            or n <= 4 * n_candidates(k, n)
            or (allowed is not None and n <= self._p["filter_exact_threshold"])
        ):
            return exact_search(self.space, table, None, queries, k, allowed=allowed)
        deep_rows = np.empty(0, dtype=np.int64)
        if self._deep:
            deep_all = np.fromiter(sorted(self._deep), dtype=np.int64, count=len(self._deep))
            deep_rows = deep_all if allowed is None else np.intersect1d(deep_all, allowed)
        n_graph = n - len(deep_rows)
        parts = []
        if n_graph > 0:
            parts.append(self._graph_search(table, queries, min(k, n_graph), n_graph, allowed, ef))
        return with_deep_scan(self.space, table, queries, k, parts, deep_rows)

    def _graph_search(self, table, queries, k, n_graph, allowed, ef):
        K = _kernels()
        keep = n_candidates(k, n_graph)
        width = max(self._p["ef"] if ef is None else int(ef), 2 * k)
        if allowed is not None:
            ok = np.zeros(len(self._flags), dtype=np.bool_)
            ok[allowed] = True
            # a filter leaves fewer returnable nodes near the query: widen the beam
            frac = n_graph / max(1, self._in_graph - self._deleted)
            width = int(min(max(width, width / max(frac, 1e-3)), 4 * width + 1024))
        else:
            ok = np.zeros(0, dtype=np.bool_)
        q32 = np.ascontiguousarray(queries, dtype=self._dtype)
        item = self._visited.take(len(self._flags))
        try:
            cand, _, item[1] = K.search_batch(
                self._x,
                self._w,
                self._adj,
                self._deg,
                self._flags,
                ok,
                q32,
                self._entries,
                self._ex,
                self._ew,
                width,
                keep,
                item[0],
                item[1],
            )
        finally:
            self._visited.give(item)
        best_s, best_d = rerank(self.space, table, queries, cand, k)
        bad = (best_s < 0).any(axis=1)
        if bad.any():  # the graph did not reach k returnable items: stay exact
            rows = np.nonzero(bad)[0]
            if allowed is None:
                allowed = np.nonzero(self._flags[: self._n] == 1)[0].astype(np.int64)
            s, d = exact_search(self.space, table, None, queries[rows], k, allowed=allowed)
            best_s[rows], best_d[rows] = s, d
        return best_s, best_d

    # -- diagnostics ------------------------------------------------------------------
    def unreachable(self) -> int:
        """Live graph nodes no search can reach from the entry points."""
        if self._in_graph == 0:
            return 0
        seen = _kernels().reachable(self._adj, self._deg, self._flags, self._entries)
        return int(((self._flags == 1) & ~seen).sum())

    # -- snapshot ---------------------------------------------------------------------
    def state(self) -> dict[str, bytes]:
        buf = io.BytesIO()
        n = self._n
        np.savez(
            buf,
            adj=self._adj[:n],
            deg=self._deg[:n],
            flags=self._flags[:n],
            entries=self._entries,
            deep=np.fromiter(sorted(self._deep), dtype=np.int64, count=len(self._deep)),
            counts=np.array([self._in_graph, self._deleted], dtype=np.int64),
            # tombstones route searches but the table no longer holds their vectors
            tomb_x=self._x[:n][self._flags[:n] == 2],
            tomb_w=self._w[:n][self._flags[:n] == 2],
            wide=np.array([self._dtype == np.float64]),
        )
        return {"graph": buf.getvalue()}

    def restore(self, table: ItemTable, state: dict[str, bytes]) -> None:
        if "graph" not in state:
            self.build(table)
            return
        with np.load(io.BytesIO(state["graph"]), allow_pickle=False) as z:
            adj, deg, flags = z["adj"], z["deg"], z["flags"]
            entries, deep, counts = z["entries"], z["deep"], z["counts"]
            tomb_x, tomb_w, wide = z["tomb_x"], z["tomb_w"], bool(z["wide"][0])
        n = len(flags)
        slack = self._p["R"] + self._p["R"] // 2
        if adj.shape != (n, slack) or len(deg) != n or n > table.n_slots:
            raise ValueError("graph snapshot: shapes do not match the table or the parameters")
        if n and (adj.max(initial=-1) >= n or deg.max(initial=0) > slack):
            raise ValueError("graph snapshot: edges out of range")
        alive = table.alive[:n]
        if ((flags == 1) & ~alive).any():
            raise ValueError("graph snapshot: a live node is not live in the table")
        tomb = np.nonzero(flags == 2)[0]
        if tomb_x.shape != (len(tomb), self.space.dim) or tomb_w.shape != (len(tomb),):
            raise ValueError("graph snapshot: tombstone coordinates do not match")
        self._dtype = np.float64 if wide else np.float32
        self._reset(max(table.n_slots, 16))
        self._sync_vectors(table)
        self._x[tomb] = tomb_x
        self._w[tomb] = tomb_w
        self._adj[:n] = adj
        self._deg[:n] = deg
        self._flags[:n] = flags
        self._set_entries(entries.astype(np.int64))
        self._deep = set(deep.tolist())
        self._in_graph, self._deleted = (int(v) for v in counts)
        live = table.live_slots()
        missing = live[(self._flags[live] == 0)]
        missing = missing[~np.isin(missing, deep)]
        if len(missing):  # never expected: a snapshot covers its table
            self._insert(table, missing)

    def nbytes(self) -> int:
        return int(
            self._x.nbytes
            + self._w.nbytes
            + self._adj.nbytes
            + self._deg.nbytes
            + self._flags.nbytes
        )


def _numba_threads() -> int:
    import numba

    return int(numba.get_num_threads())
