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
  a batch's searches run cell by cell of the entry points' order-2 Voronoi
  diagram, so consecutive ones share cached rows (the graph does not depend
  on that order);
* after an insertion one flood fill from the entry points checks that every
  node is reachable, and a repair pass (only then) links any node they cannot
  reach -- skipped when the insertion provably kept every node reachable (the
  same entry points, every dropped edge handed on, every new node with edges:
  the flood fill was most of a single insert's time on a large graph); a small
  insertion keeps the entry points unless a new node
  lies nearer the origin than the hub (picking them is O(n): with the repair's
  ordering of all nodes it was 60% of a single upsert into 50,000 items, 38 ms
  against 15 ms now on the loaded 2-core machine); after a bulk insertion
  (at least a quarter of the graph) the nodes are renumbered in breadth-first
  order from the entry points, so a node's neighbours lie near it in memory
  (node <-> slot maps: slots, hence ids, never move; the maps go into
  snapshots);
* a search is a beam search of width ``max(ef, k)``, and the best
  ``max(4k, k + 32)`` returnable nodes it visits are re-ranked by the exact
  float64 distance of :mod:`models.geometry.kernels` and merged into the top
  ``k`` in the same compiled call (no per-query Python); those distances are
  the answer (``IndexSpace.dist_rows`` of every backend computes the same
  compiled formula, so the backends agree bit for bit).  The default width
  (``ef=None``) is calibrated on the data of each bulk insertion
  (:meth:`GraphBackend._first_passing`: the narrowest of :data:`EF_LADDER`
  reaching ``target_recall`` plus a margin for held-back items and near
  copies).  The queries of one call are
  split over :func:`search_threads` threads (a thread pool over the nogil
  kernel, each with its own visited buffer: no numba threading layer, so
  nothing spins next to torch's pool); removed items stay in the graph as
  tombstones that route but are never returned, so deletion does not
  disconnect it (compaction rebuilds it when the index's table is compacted);
  a filter marks the allowed nodes and the search keeps routing through the
  others.

Coordinates are float32 or float64 (``precision``; ``"auto"`` picks float64
when more than :data:`AUTO_DEEP_SHARE` of the items are *deep*, gap below
:data:`models.geometry.ranking.DEEP_GAP`, where float32 cannot rank neighbours --
label embeddings of a big taxonomy are mostly that deep -- and float32, the
faster, otherwise).  In a float32 graph the deep items stay out and are
scanned exactly, as in :mod:`.hnsw`.  Keys are float64 either way.

Product spaces (``poincare:8,sphere:4,euclidean:4``) are graphs too: float64
coordinates, ranked, pruned and re-ranked with the product distance of
:mod:`models.geometry.kernels` (the kernels take a metric mode: the ball's
proxy or the exact product distance).
benchmarks/results/ann.md (docs/index.md) has the measurements behind these choices.

Parameters and their defaults: :mod:`.graph_params`.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np

from ..geometry import IndexSpace, PoincareIndexSpace
from ..table import ItemTable
from .base import Backend, empty_answer, search_size
from .exact import exact_search, n_candidates, with_deep_scan
from .graph_calibrate import CalibrationMixin
from .graph_params import (
    AUTO_DEEP_SHARE,
    CALIBRATION_MIN_NODES,
    CALIBRATION_QUERIES,
    DEEP_DEFAULTS,
    DEFAULTS,
    EF_LADDER,
    check_params,
    construction_default,
    default_ef,
    degree_default,
)
from .graph_threads import (
    MIN_CHUNK,
    VisitedPool,
    cpus,
    executor,
    search_threads,
    set_search_threads,
)

__all__ = ["GraphBackend", "search_threads", "set_search_threads"]

#: a bulk insertion renews the breadth-first node layout when the graph has
#: doubled, from this many nodes on
RELAYOUT_MIN = 8192


def _kernels():
    from . import _graph_kernels

    return _graph_kernels


class GraphBackend(CalibrationMixin, Backend):
    name = "graph"

    def __init__(self, space: IndexSpace, **params: Any) -> None:
        super().__init__(space)
        self._p = check_params(space, params)
        self._given = set(params)
        self._ball = isinstance(space, PoincareIndexSpace)
        if "ef_construction" not in self._given:
            self._p["ef_construction"] = construction_default(space.dim, product=not self._ball)
        if "R" not in self._given:
            self._p["R"] = degree_default(space.dim, product=not self._ball)
        K = _kernels()
        self._table = space.kernel_table()
        self._met = K.metric(self._ball, self._table)
        self._n_aux = 1 if self._ball else len(self._table[0])
        self._dtype = np.float32
        if not self._ball or self._p["precision"] == "float64":
            self._dtype = np.float64
        self._visited = VisitedPool()
        self._reset(0)

    @property
    def params(self) -> dict[str, Any]:
        return dict(self._p)

    @property
    def ef(self) -> int:
        """The default beam width of a search: ``ef`` if given, else the width
        calibrated on the graph's own items (:meth:`_first_passing`), else (a graph
        too small or never calibrated) :func:`default_ef`."""
        n = self._in_graph - self._deleted
        if self._p["ef"]:
            return self._p["ef"]
        if self._ef_auto:
            return self._ef_auto
        return default_ef(self.space.dim, n, deep=self._deep_tuned(), product=not self._ball)

    @property
    def ef_auto(self) -> int | None:
        """The calibrated beam width (``None``: not calibrated)."""
        return self._ef_auto

    def _deep_tuned(self) -> bool:
        """Ball data deep enough that ``precision="auto"`` chose float64."""
        return self._ball and self._p["precision"] == "auto" and self._dtype == np.float64

    def _tune_for_depth(self) -> None:
        """:data:`DEEP_DEFAULTS` on deep data, the plain defaults otherwise (the
        parameters given to the constructor stay as given)."""
        product = not self._ball
        plain = {
            "ef_construction": construction_default(self.space.dim, product=product),
            "R": degree_default(self.space.dim, product=product),
        }
        for key, value in DEEP_DEFAULTS.items():
            if key not in self._given:
                self._p[key] = value if self._deep_tuned() else plain.get(key, DEFAULTS[key])

    # -- state ------------------------------------------------------------------------
    def _reset(self, capacity: int) -> None:
        cap = max(16, int(capacity))
        slack = self._p["R"] + self._p["R"] // 2
        self._x = np.zeros((cap, self.space.dim), dtype=self._dtype)
        # ranking data: the proxy weight w (ball) or the factors' gaps (product)
        self._aux = np.zeros((cap, self._n_aux), dtype=np.float64)
        # exact gaps of the table's float64 vectors (the re-ranking)
        self._g = np.ones((cap, len(self._table[0])), dtype=np.float64)
        self._adj = np.full((cap, slack), -1, dtype=np.int32)
        self._deg = np.zeros(cap, dtype=np.int32)
        self._flags = np.zeros(cap, dtype=np.uint8)
        # node <-> slot: the node arrays (x, aux, adj, deg, flags) are in node
        # order, a breadth-first order of the graph after a bulk insertion
        # (:meth:`_renumber`); slots past the last renumbering map to themselves
        self._n2s = np.arange(cap, dtype=np.int64)
        self._s2n = np.arange(cap, dtype=np.int64)
        self._n = 0  # slots covered by the arrays' contents
        self._in_graph = 0
        self._deleted = 0
        self._set_entries(np.empty(0, dtype=np.int64))
        self._deep: set[int] = set()
        self._ef_auto: int | None = None
        self._visited.clear()

    def _grow(self, need: int) -> None:
        cap = len(self._flags)
        if need <= cap:
            return
        new = max(need, int(cap * 1.5) + 16)

        def grown(a, fill):
            out = np.full((new,) + a.shape[1:], fill, dtype=a.dtype)
            out[:cap] = a
            return out

        self._x = grown(self._x, 0)
        self._aux = grown(self._aux, 0)
        self._g = grown(self._g, 1)
        self._adj = grown(self._adj, -1)
        self._deg = grown(self._deg, 0)
        self._flags = grown(self._flags, 0)
        ident = np.arange(cap, new, dtype=np.int64)
        self._n2s = np.concatenate([self._n2s[:cap], ident])
        self._s2n = np.concatenate([self._s2n[:cap], ident])
        self._visited.clear()

    def _aux_of(self, v: np.ndarray, g: np.ndarray) -> np.ndarray:
        if self._ball:
            return self.space.proxy_weight(v)[:, None]
        return g

    def _sync_vectors(self, table: ItemTable) -> None:
        n = table.n_slots
        if n > self._n:
            self._grow(n)
            v = table.vectors[self._n : n]
            g = self.space.kernel_gaps(v)
            nodes = self._s2n[self._n : n]
            self._x[nodes] = v
            self._g[self._n : n] = g  # the re-ranking's gaps: slot order
            self._aux[nodes] = self._aux_of(v, g)
            self._n = n

    @property
    def _graph(self):
        return (self._x, self._aux, self._adj, self._deg, self._flags)

    @property
    def _start(self):
        return (self._entries, self._ex, self._eaux)

    # -- mutations ------------------------------------------------------------------
    def _choose_dtype(self, table: ItemTable, slots: np.ndarray) -> bool:
        """``precision="auto"`` on an empty graph: float64 if the items coming in
        are deep enough to need it.  True if the dtype changed."""
        if not self._ball or self._p["precision"] != "auto" or self._in_graph or not len(slots):
            return False
        deep = float(self.space.deep(table.vectors[slots]).mean())
        want = np.float64 if deep > AUTO_DEEP_SHARE else np.float32
        changed = want != self._dtype
        self._dtype = want
        self._tune_for_depth()
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
            elif s < self._n and self._flags[self._s2n[s]] == 1:
                self._flags[self._s2n[s]] = 2
                self._deleted += 1

    @property
    def deleted_fraction(self) -> float:
        return self._deleted / self._in_graph if self._in_graph else 0.0

    def _centrality(self, slots: np.ndarray) -> np.ndarray:
        """Squared norms: the node nearest the origin is the hub searches start from."""
        x = self._x[slots].astype(np.float64)
        return np.einsum("ij,ij->i", x, x)

    def _insert(self, table: ItemTable, slots: np.ndarray) -> None:
        K = _kernels()
        if self._dtype == np.float64:  # float64 coordinates rank deep points too
            deep = np.zeros(len(slots), dtype=bool)
        else:
            deep = self.space.deep(table.vectors[slots])
        if deep.any():
            self._deep.update(slots[deep].tolist())
            slots = slots[~deep]
        slots = self._s2n[slots]  # nodes from here on
        slots = slots[self._flags[slots] == 0]
        bulk = len(slots) >= max(1, self._in_graph) // 4
        if len(slots) == 0:
            return
        rng = np.random.default_rng(self._p["seed"] + self._in_graph)
        slots = slots[rng.permutation(len(slots))]
        if self._in_graph == 0:
            # the point nearest the origin first: the hub every search starts from
            first = int(np.argmin(self._centrality(slots)))
            slots[[0, first]] = slots[[first, 0]]
            self._flags[slots[0]] = 1
            self._in_graph = 1
            self._set_entries(np.array([slots[0]], dtype=np.int64))
            slots = slots[1:]
        # calibration queries: the last items of this bulk insertion are kept
        # out until the graph of the others is built, so they meet it as fresh
        # queries do (see _first_passing)
        held = np.empty(0, dtype=np.int64)
        n_after = self._in_graph - self._deleted + len(slots)
        if bulk and self._p["target_recall"] > 0 and n_after >= CALIBRATION_MIN_NODES:
            m = min(CALIBRATION_QUERIES, len(slots) // 10, n_after // 10)
            held, slots = slots[len(slots) - m :], slots[: len(slots) - m]
        held_slots = self._n2s[held]  # the nodes are renumbered below
        # the new nodes' nearest approach to the origin (numbering-free)
        new_min = float(self._centrality(slots).min()) if len(slots) else np.inf
        self._link(slots)
        novel = self._first_passing(table, held_slots, copies=False) if len(held) else None
        self._link(self._s2n[held_slots])
        if bulk or not self._entries_still_good(new_min):
            self._pick_entries()
        # every node reachable from the entry points? One flood fill (O(n): most of
        # a single upsert into a large graph), unless that held before and this
        # insertion kept it: the same entry points, and every edge a pruned list
        # dropped handed on (``v -> c`` dropped for a kept ``r``, and ``r -> c``
        # added: a path ``v -> r -> c`` replaces it, and the new nodes are
        # reached through their reverse edges or those hand-offs). The repair,
        # and its order of all nodes by centrality, only when some node is not.
        if not self._reach_ok:
            seen = K.reachable(self._adj, self._deg, self._flags, self._entries)
            self._reach_ok = not ((self._flags != 0) & ~seen).any()
            if not self._reach_ok:
                order = np.argsort(self._centrality(np.arange(self._n)), kind="stable")
                K.repair(self._graph, self._met, self._start, self._p["ef_construction"], order)
        if bulk:
            self._renumber()
        if novel is not None:
            copies = self._first_passing(table, held_slots, copies=True, start=novel)
            self._ef_auto = EF_LADDER[max(novel, copies)]

    def _link(self, slots: np.ndarray) -> None:
        """Insert the nodes ``slots`` (not in the graph yet) in doubling batches."""
        K = _kernels()
        threads = self._p["build_threads"] or cpus()
        two_c = 2.0 * self.space.c if self._ball else 0.0

        def spread(n, fn):
            self._spread(n, fn, threads=threads, min_chunk=64)

        # in slots: the nodes are renumbered on the way
        slot_ids = self._n2s[slots]
        relayout = max(RELAYOUT_MIN, 2 * self._in_graph)
        a = 0
        while a < len(slot_ids):
            size = min(self._p["max_batch"], max(1, self._in_graph), len(slot_ids) - a)
            batch = np.ascontiguousarray(self._s2n[slot_ids[a : a + size]])
            tgt, src = K.insert_batch(
                self._graph,
                self._met,
                batch,
                self._start,
                self._p["ef_construction"],
                self._p["R"],
                self._p["alpha"],
                two_c,
                spread,
                self._p["mates"],
                self._p["min_degree"],
                self._n2s[self._entries],
            )
            for _ in range(self._p["handoffs"] + 1):
                if len(tgt) == 0:
                    break
                tgt, src = K.link_groups(
                    self._graph,
                    self._met,
                    tgt,
                    src,
                    self._p["R"],
                    self._p["alpha"],
                    two_c,
                    self._p["min_degree"],
                    spread,
                )
            if len(tgt) or (self._deg[batch] == 0).any():
                # hand-offs left over (an edge dropped for good), or a new node
                # without edges (nothing links to it): check reachability again
                self._reach_ok = False
            self._flags[batch] = 1
            self._in_graph += size
            a += size
            if len(self._entries) < self._p["n_entries"]:
                self._pick_entries()
            if self._in_graph >= relayout and a < len(slot_ids):
                # a graph in insertion order reads its rows at random: a beam
                # took 92 instead of 62 us per node before the breadth-first
                # layout, so the layout is renewed each time the graph doubles
                self._renumber()
                relayout = 2 * self._in_graph

    def _spread(self, n: int, fn, *, threads: int = 0, min_chunk: int = MIN_CHUNK) -> None:
        """``fn(a, b)`` over ``[0, n)`` split across ``threads`` threads
        (default :func:`search_threads`; ``fn`` runs a nogil kernel)."""
        threads = min(threads or search_threads(), max(1, n // min_chunk))
        if threads <= 1:
            fn(0, n)
            return
        bounds = np.linspace(0, n, threads + 1).astype(int)
        futures = [
            executor(threads).submit(fn, int(bounds[t]), int(bounds[t + 1])) for t in range(threads)
        ]
        for f in futures:
            f.result()

    def _renumber(self) -> None:
        """Put the nodes in breadth-first order from the entry points, so a
        node's neighbours lie near it in memory (slots, hence ids, unchanged)."""
        n = self._n
        order = _kernels().bfs_order(self._adj[:n], self._deg[:n], self._flags[:n], self._entries)
        perm = np.concatenate([order, np.nonzero(self._flags[:n] == 0)[0]])
        if len(perm) != n or (perm == np.arange(n)).all():
            return
        inv = np.empty(n, dtype=np.int64)
        inv[perm] = np.arange(n)
        for name in ("_x", "_aux", "_deg", "_flags"):
            a = getattr(self, name)
            a[:n] = a[:n][perm]
        adj = self._adj[:n][perm]
        edge = adj >= 0
        adj[edge] = inv[adj[edge]]
        self._adj[:n] = adj
        self._n2s[:n] = self._n2s[:n][perm]
        self._s2n[self._n2s[:n]] = np.arange(n)
        self._set_entries(inv[self._entries])
        self._visited.clear()

    def _set_entries(self, entries: np.ndarray) -> None:
        """Entry points, with a dense copy of their coordinates and aux data (new
        entry points: reachability from them is checked again at the next insert)."""
        self._entries = entries
        self._reach_ok = False
        self._ex = np.ascontiguousarray(self._x[entries])
        self._eaux = np.ascontiguousarray(self._aux[entries])

    def _entries_still_good(self, new_min: float) -> bool:
        """After a small insertion: the entry points :meth:`_pick_entries` chose are
        kept (picking them again is O(n) per upsert) while the sample is full,
        the hub is live and no new node lies nearer the origin than the hub."""
        e = self._entries
        if len(e) < self._p["n_entries"] or self._flags[e[0]] != 1:
            return False
        return new_min >= float(self._centrality(e[:1])[0])

    def _pick_entries(self) -> None:
        """The live node nearest the origin and a few random live nodes."""
        live = np.nonzero(self._flags[: self._n] == 1)[0]
        if len(live) == 0:
            route = np.nonzero(self._flags[: self._n] != 0)[0]
            self._set_entries(route[:1].astype(np.int64))
            return
        hub = live[np.argmin(self._centrality(live))]
        rng = np.random.default_rng(self._p["seed"])
        # drawn from the slots, so the sample does not depend on the node layout
        pool = np.sort(self._n2s[live])
        extra = rng.choice(pool, size=min(len(live), self._p["n_entries"] - 1), replace=False)
        rest = np.unique(self._s2n[extra]).astype(np.int64)
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
        width = max(self.ef if ef is None else int(ef), k)
        if allowed is not None:
            ok = np.zeros(len(self._flags), dtype=np.bool_)
            ok[self._s2n[allowed]] = True
            # a filter leaves fewer returnable nodes near the query: widen the beam
            frac = n_graph / max(1, self._in_graph - self._deleted)
            width = int(min(max(width, width / max(frac, 1e-3)), 4 * width + 1024))
        else:
            ok = np.zeros(0, dtype=np.bool_)
        q64 = np.ascontiguousarray(queries, dtype=np.float64)
        nq = len(q64)
        out_s = np.empty((nq, k), dtype=np.int64)
        out_d = np.empty((nq, k), dtype=np.float64)
        graph, start, met = self._graph, self._start, self._met
        # no filter and no tombstones: the beam itself is the result list
        track = allowed is not None or self._deleted > 0
        # skip the exact distance of candidates the keys prove too far (not
        # for deep queries, whose float64 weight is not exact enough)
        f32 = self._dtype == np.float32
        lb = K.rerank_bound(self._ball, f32, self.space.dim, getattr(self.space, "c", 1.0))
        if lb is None or (self._ball and f32 and self.space.deep(q64).any()):
            lb = (-1.0, 0.0, 1.0)
        rest = (table.vectors, self._g, self._n2s, *self._table)

        def run(a: int, b: int) -> None:
            # the queries' own data per chunk, in the chunk's thread (numpy
            # releases the GIL): done once for the batch, it was an eighth of
            # a 1,000-query call on the preferential-attachment cloud
            qa = q64[a:b]
            qx = qa if self._dtype == np.float64 else np.ascontiguousarray(qa, dtype=self._dtype)
            gq = self.space.kernel_gaps(qa)
            qaux = np.ascontiguousarray(self._aux_of(qa, gq))
            item = self._visited.take(len(self._flags))
            try:
                item[1] = K.search_batch(
                    graph,
                    met,
                    ok,
                    qx,
                    qaux,
                    start,
                    width,
                    keep,
                    item[0],
                    item[1],
                    (qa, gq, *rest),
                    k,
                    out_s[a:b],
                    out_d[a:b],
                    track,
                    lb,
                )
            finally:
                self._visited.give(item)

        self._spread(nq, run)
        # the kernel ranked and returned the compiled float64 distance of
        # models.geometry.kernels (IndexSpace.dist_rows: the exact backend's, bit for bit)
        bad = (out_s < 0).any(axis=1)
        if bad.any():  # the graph did not reach k returnable items: stay exact
            rows = np.nonzero(bad)[0]
            if allowed is None:
                allowed = self._n2s[np.nonzero(self._flags[: self._n] == 1)[0]]
            s, d = exact_search(self.space, table, None, queries[rows], k, allowed=allowed)
            out_s[rows], out_d[rows] = s, d
        return out_s, out_d

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
        tomb = self._flags[:n] == 2
        np.savez(
            buf,
            adj=self._adj[:n],
            deg=self._deg[:n],
            flags=self._flags[:n],
            entries=self._entries,
            deep=np.fromiter(sorted(self._deep), dtype=np.int64, count=len(self._deep)),
            counts=np.array([self._in_graph, self._deleted], dtype=np.int64),
            # tombstones route searches but the table no longer holds their vectors
            tomb_x=self._x[:n][tomb],
            tomb_w=self._aux[:n][tomb][:, 0] if self._ball else np.zeros(0),
            tomb_aux=self._aux[:n][tomb],
            wide=np.array([self._dtype == np.float64]),
            n2s=self._n2s[:n],
            ef_auto=np.array([self._ef_auto or 0], dtype=np.int64),
        )
        return {"graph": buf.getvalue()}

    def restore(self, table: ItemTable, state: dict[str, bytes]) -> None:
        if "graph" not in state:
            self.build(table)
            return
        with np.load(io.BytesIO(state["graph"]), allow_pickle=False) as z:
            adj, deg, flags = z["adj"], z["deg"], z["flags"]
            entries, deep, counts = z["entries"], z["deep"], z["counts"]
            tomb_x, wide = z["tomb_x"], bool(z["wide"][0])
            # snapshots before product graphs kept the ball's weights only
            tomb_aux = z["tomb_aux"] if "tomb_aux" in z.files else z["tomb_w"][:, None]
            # snapshots before the renumbering kept the nodes in slot order
            n2s = z["n2s"] if "n2s" in z.files else np.arange(len(flags), dtype=np.int64)
            # snapshots before the calibration: the table of default_ef
            ef_auto = int(z["ef_auto"][0]) if "ef_auto" in z.files else 0
        n = len(flags)
        self._dtype = np.float64 if wide else np.float32
        self._tune_for_depth()
        if "R" not in self._given and adj.ndim == 2:
            # a graph saved under another default degree (R 32 above 40-d before
            # WIDE_R) keeps its own: its rows hold R + R // 2 edges
            r = (2 * adj.shape[1] + 2) // 3
            if r >= 2 and r + r // 2 == adj.shape[1]:
                self._p["R"] = r
        slack = self._p["R"] + self._p["R"] // 2
        if adj.shape != (n, slack) or len(deg) != n or n > table.n_slots:
            raise ValueError("graph snapshot: shapes do not match the table or the parameters")
        if n and (adj.max(initial=-1) >= n or deg.max(initial=0) > slack):
            raise ValueError("graph snapshot: edges out of range")
        if n2s.shape != (n,) or not (np.sort(n2s) == np.arange(n)).all():
            raise ValueError("graph snapshot: the node order is not a permutation")
        alive = table.alive[n2s]
        if ((flags == 1) & ~alive).any():
            raise ValueError("graph snapshot: a live node is not live in the table")
        tomb = np.nonzero(flags == 2)[0]
        if tomb_x.shape != (len(tomb), self.space.dim) or tomb_aux.shape != (
            len(tomb),
            self._n_aux,
        ):
            raise ValueError("graph snapshot: tombstone coordinates do not match")
        if not self._ball and not wide:
            raise ValueError("graph snapshot: a product graph must be float64")
        self._reset(max(table.n_slots, 16))
        self._n2s[:n] = n2s
        self._s2n[n2s] = np.arange(n)
        self._sync_vectors(table)
        self._x[tomb] = tomb_x
        self._aux[tomb] = tomb_aux
        self._adj[:n] = adj
        self._deg[:n] = deg
        self._flags[:n] = flags
        self._set_entries(entries.astype(np.int64))
        self._deep = set(deep.tolist())
        self._in_graph, self._deleted = (int(v) for v in counts)
        self._ef_auto = ef_auto or None
        live = table.live_slots()
        missing = live[(self._flags[self._s2n[live]] == 0)]
        missing = missing[~np.isin(missing, deep)]
        if len(missing):  # never expected: a snapshot covers its table
            self._insert(table, missing)

    def nbytes(self) -> int:
        return int(
            self._x.nbytes
            + self._aux.nbytes
            + self._g.nbytes
            + self._adj.nbytes
            + self._deg.nbytes
            + self._flags.nbytes
            + self._n2s.nbytes
            + self._s2n.nbytes
        )
