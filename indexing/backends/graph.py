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
* after every insertion one flood fill from the entry points checks that
  every node is reachable, and a repair pass (only then) links any node they
  cannot reach; a small insertion keeps the entry points unless a new node
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

Parameters: ``R`` (32; 48 on deep data, :data:`DEEP_DEFAULTS`),
``ef_construction`` (:func:`construction_default`: 48 up to 20-d in the
ball, 128 above 40-d, else 96), ``alpha`` (1.0), ``ef``
(``None``: calibrated to ``target_recall`` (0.99, recall@10) on the data;
:func:`default_ef` of the dimension and depth before a calibration), ``n_entries`` (256),
``max_batch`` (4096), ``handoffs`` (3), ``mates`` (32), ``min_degree`` (8; 16
on deep data),
``precision`` ("auto"), ``build_threads`` (0: the CPUs),
``filter_exact_threshold`` (20000), ``seed`` (100).
"""

from __future__ import annotations

import io
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from ..geometry import IndexSpace, PoincareIndexSpace
from ..table import ItemTable
from .base import Backend, empty_answer, search_size
from .exact import exact_search, n_candidates, with_deep_scan

__all__ = ["GraphBackend", "search_threads", "set_search_threads", "warm_kernels"]

_DEFAULTS: dict[str, Any] = {
    "R": 32,
    "ef_construction": 96,
    "alpha": 1.0,
    "ef": None,
    "max_batch": 4096,
    "build_threads": 0,
    "filter_exact_threshold": 20000,
    "seed": 100,
    "n_entries": 256,
    "handoffs": 3,
    "mates": 32,
    "min_degree": 8,
    "precision": "auto",
    "target_recall": 0.99,
}
#: ``precision="auto"``: float64 coordinates when more than this share of the
#: items is deep (label embeddings of a big taxonomy), else float32 with the
#: deep items scanned exactly.
AUTO_DEEP_SHARE = 0.01
#: the defaults that change when ``precision="auto"`` picks float64 for deep
#: data (unless given): on the WordNet noun embeddings (30,000 x 10-d) R = 48
#: and a minimum degree of 16 took recall@10 at ef 96 from 0.962 to 0.992 and
#: the build from 79 s to 12 s (a near-tree graph makes every beam long)
DEEP_DEFAULTS: dict[str, int] = {"R": 48, "min_degree": 16, "ef_construction": 96}
#: ``ef_construction`` by dimension (:func:`construction_default`): up to
#: ``NARROW_DIM`` in the ball :data:`NARROW_EF_CONSTRUCTION` (the 200,000 x
#: 16-d cloud: built in 7.3 s instead of 11.8 s, recall@10 0.9943 at ef 48
#: where 96 gave 0.9915 at ef 32 and 0.9966 at 48), above ``WIDE_DIM``
#: :data:`WIDE_EF_CONSTRUCTION` (the 64-d cloud: 96 built a graph that
#: needed a beam of 192-320 for 0.99, 128 one that needs 96-128: 8,700
#: queries/s instead of about 3,000, built in about the same time), 96
#: between, on products and on deep data (the noun embeddings lost recall
#: with 48: 0.986 at ef 512; :data:`DEEP_DEFAULTS`)
NARROW_DIM, WIDE_DIM = 20, 40
NARROW_EF_CONSTRUCTION, WIDE_EF_CONSTRUCTION = 48, 128
_INT_PARAMS = ("R", "ef_construction", "max_batch", "n_entries")
#: the beam widths the calibration tries, smallest first; none below 16: on a
#: 5,000-point cloud a width of 8 passed the calibration yet missed 4 of 50
#: exact-match queries for items added later in an empty region of the ball
EF_LADDER = (16, 20, 24, 32, 40, 48, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384, 448, 512)
#: calibration: items of a bulk insertion searched as fresh queries and as near
#: copies (:meth:`GraphBackend._first_passing`), and the fewest nodes worth it
CALIBRATION_QUERIES = 500
CALIBRATION_MIN_NODES = 2000
#: the calibration asks this much more recall of its own queries than
#: ``target_recall``: on the 1,000,000-point cloud they passed at ef 48
#: where the benchmark's 1,000 fresh queries reached 0.9884 (0.9932 at 64)
CALIBRATION_MARGIN = 0.003
#: a bulk insertion renews the breadth-first node layout when the graph has
#: doubled, from this many nodes on
RELAYOUT_MIN = 8192
#: queries per search thread at least (below that one thread answers them all)
_MIN_CHUNK = 16

_threads_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
_search_threads = 0


def search_threads() -> int:
    """Threads the queries of one search call are spread over (the kernels
    release the GIL): :func:`set_search_threads`, else ``HYPSEARCH_SEARCH_THREADS``,
    else the CPUs of the process."""
    if _search_threads:
        return _search_threads
    env = os.environ.get("HYPSEARCH_SEARCH_THREADS", "")
    if env.strip().isdigit() and int(env) > 0:
        return int(env)
    return _cpus()


def set_search_threads(n: int) -> None:
    """Spread every later search call over ``n`` threads (0: back to the default)."""
    global _search_threads
    _search_threads = max(0, int(n))


def _executor(n: int) -> ThreadPoolExecutor:
    global _pool
    with _threads_lock:
        if _pool is None or _pool._max_workers < n:
            _pool = ThreadPoolExecutor(max_workers=n, thread_name_prefix="hypsearch-graph")
        return _pool


def default_ef(dim: int, n: int, *, deep: bool = False, product: bool = False) -> int:
    """The beam width a search uses when neither the call nor the parameters set
    one, for ``n`` items of dimension ``dim`` (``deep``: ball data deep enough
    for float64 coordinates, such as label embeddings; ``product``: a product
    space): the smallest that
    reached recall@10 >= 0.99 on the benchmark datasets of that size (benchmarks/results/ann.md,
    "The index"); a bigger graph needs a wider beam."""
    big = n > 300_000
    if product and n > 100_000:  # poincare:8,sphere:4,euclidean:4 at 200,000: 0.9923 at 48
        return 64
    if deep:  # WordNet nouns: 0.9937 at ef 96 on 30,000; 0.9908 at ef 192 on all 82,115
        return 96 if n <= 50_000 else 192
    if dim <= 20:
        return 64 if big else 40
    if dim <= 40:
        return 96 if big else 64
    if big:
        return 256
    return 192 if n > 100_000 else 128  # 64-d cloud at 200,000: 0.9861 at 128, 0.9901 at 192


def construction_default(dim: int, *, product: bool = False) -> int:
    """The ``ef_construction`` a graph of dimension ``dim`` builds with unless
    given (see :data:`NARROW_EF_CONSTRUCTION`; deep data: :data:`DEEP_DEFAULTS`)."""
    if dim > WIDE_DIM:
        return WIDE_EF_CONSTRUCTION
    if dim <= NARROW_DIM and not product:
        return NARROW_EF_CONSTRUCTION
    return _DEFAULTS["ef_construction"]


def _kernels():
    from . import _graph_kernels

    return _graph_kernels


class _VisitedPool:
    """Per-call visited buffers (uint8 stamps, cleared every 255 searches:
    :func:`._graph_kernels.search_batch`) so concurrent searches never share one."""

    def __init__(self) -> None:
        self._free: list[list] = []  # [buffer, stamp]
        self._lock = threading.Lock()

    def take(self, n: int) -> list:
        with self._lock:
            while self._free:
                item = self._free.pop()
                if len(item[0]) >= n:
                    return item
        return [np.zeros(max(n, 1024) + n // 4, dtype=np.uint8), 0]

    def give(self, item: list) -> None:
        with self._lock:
            self._free.append(item)

    def clear(self) -> None:
        with self._lock:
            self._free.clear()


def _check_params(space: IndexSpace, params: dict[str, Any]) -> dict[str, Any]:
    unknown = set(params) - set(_DEFAULTS)
    if unknown:
        raise TypeError(f"graph backend: unknown parameters {sorted(unknown)}")
    p = {**_DEFAULTS, **params}
    for key in _INT_PARAMS + (() if p["ef"] is None else ("ef",)):
        if int(p[key]) < 1:
            raise ValueError(f"graph backend: {key} must be >= 1, got {p[key]!r}")
    if int(p["R"]) < 2:
        raise ValueError(f"graph backend: R must be >= 2, got {p['R']!r}")
    if not float(p["alpha"]) >= 1.0:
        raise ValueError(f"graph backend: alpha must be >= 1, got {p['alpha']!r}")
    if not 0.0 <= float(p["target_recall"]) <= 1.0:
        raise ValueError(
            f"graph backend: target_recall must be in [0, 1], got {p['target_recall']!r}"
        )
    for key in ("filter_exact_threshold", "build_threads", "handoffs", "mates", "min_degree"):
        if int(p[key]) < 0:
            raise ValueError(f"graph backend: {key} must be >= 0, got {p[key]!r}")
    if p["precision"] not in ("auto", "float32", "float64"):
        raise ValueError(
            "graph backend: precision must be 'auto', 'float32' or 'float64', "
            f"got {p['precision']!r}"
        )
    if not isinstance(space, PoincareIndexSpace) and p["precision"] == "float32":
        raise ValueError("graph backend: a product space is indexed in float64 only")
    return {
        k: (
            float(v)
            if k in ("alpha", "target_recall")
            else v
            if k == "precision" or v is None
            else int(v)
        )
        for k, v in p.items()
    }


class GraphBackend(Backend):
    name = "graph"

    def __init__(self, space: IndexSpace, **params: Any) -> None:
        super().__init__(space)
        self._p = _check_params(space, params)
        self._given = set(params)
        self._ball = isinstance(space, PoincareIndexSpace)
        if "ef_construction" not in self._given:
            self._p["ef_construction"] = construction_default(space.dim, product=not self._ball)
        K = _kernels()
        self._table = space.kernel_table()
        self._met = K.metric(self._ball, self._table)
        self._n_aux = 1 if self._ball else len(self._table[0])
        self._dtype = np.float32
        if not self._ball or self._p["precision"] == "float64":
            self._dtype = np.float64
        self._visited = _VisitedPool()
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
        plain = {"ef_construction": construction_default(self.space.dim, product=not self._ball)}
        for key, value in DEEP_DEFAULTS.items():
            if key not in self._given:
                self._p[key] = value if self._deep_tuned() else plain.get(key, _DEFAULTS[key])

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
        # every node reachable from the entry points? (one flood fill); the
        # repair, and its order of all nodes by centrality, only when not:
        # both are O(n) and were most of a small upsert's time on a large graph
        seen = K.reachable(self._adj, self._deg, self._flags, self._entries)
        if ((self._flags != 0) & ~seen).any():
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
        threads = self._p["build_threads"] or _cpus()
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

    def _first_passing(
        self, table: ItemTable, qs: np.ndarray, *, copies: bool, start: int = 0, k: int = 10
    ) -> int:
        """Calibration of the default beam width: the position in
        :data:`EF_LADDER` (from ``start``) of the first width whose recall@``k``
        for the items ``qs`` (slots) reaches ``target_recall`` (plus
        :data:`CALIBRATION_MARGIN`) against the exact
        brute-force truth (the last position if none does).

        ``ef=None`` searches use the width both kinds of query pass with (the
        larger of the two positions), each measured on
        :data:`CALIBRATION_QUERIES` items of a bulk insertion:

        * *fresh queries* (``copies=False``): the items, kept out until the
          graph of the others is built, search that graph -- as a query
          the graph has never seen does;
        * *near copies* (``copies=True``): the same items once in the graph,
          each asking for ``k + 1`` with itself left out -- a query next to
          an indexed item (query by example).

        Neither alone predicted the recall of the benchmark's own fresh
        queries on every dataset (near copies were too optimistic on the 16-d
        cloud and the mixed-curvature cloud; fresh queries on the WordNet noun
        embeddings, whose benchmark queries are nouns moved by a small step).
        Easy data get a narrow beam (ef 8 on the preferential-attachment cloud,
        where the table per dimension, :func:`default_ef`, gave 64) and hard
        data a wide one.  ``target_recall=0`` keeps the table.  (Called under
        the index's write lock.)"""
        K = _kernels()
        nodes = np.nonzero(self._flags[: self._n] == 1)[0]
        slots = np.sort(self._n2s[nodes])
        q64 = np.ascontiguousarray(table.vectors[qs])
        gq = self.space.kernel_gaps(q64)
        kk = k + 1 if copies else k
        truth = np.empty((len(qs), kk), dtype=np.int64)

        def brute(a: int, b: int) -> None:
            K.brute_topk(
                q64[a:b], gq[a:b], table.vectors, self._g, slots, *self._table, kk, truth[a:b]
            )

        self._spread(len(qs), brute, min_chunk=8)
        want = [set(r[r != q].tolist()[:k]) for r, q in zip(truth, qs, strict=True)]
        if not copies:  # mid-insertion: entries from the graph as it is (repair
            # and the final entries come after; a copy query keeps those)
            self._pick_entries()
        # a margin over the target: 500 queries are one draw of the hard ones
        target = min(1.0, self._p["target_recall"] + CALIBRATION_MARGIN) * k * len(qs)

        def passes(i: int) -> bool:
            found, _ = self._graph_search(table, q64, kk, len(slots), None, EF_LADDER[i])
            hits = sum(
                len(w & set(r[r != q].tolist()[:k]))
                for w, r, q in zip(want, found, qs, strict=True)
            )
            return hits >= target

        return _first_true(passes, start, len(EF_LADDER) - 1)

    def _spread(self, n: int, fn, *, threads: int = 0, min_chunk: int = _MIN_CHUNK) -> None:
        """``fn(a, b)`` over ``[0, n)`` split across ``threads`` threads
        (default :func:`search_threads`; ``fn`` runs a nogil kernel)."""
        threads = min(threads or search_threads(), max(1, n // min_chunk))
        if threads <= 1:
            fn(0, n)
            return
        bounds = np.linspace(0, n, threads + 1).astype(int)
        futures = [
            _executor(threads).submit(fn, int(bounds[t]), int(bounds[t + 1]))
            for t in range(threads)
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
        """Entry points, with a dense copy of their coordinates and aux data."""
        self._entries = entries
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


def _first_true(passes, lo: int, hi: int) -> int:
    """The first ``i`` in ``[lo, hi]`` with ``passes(i)`` (``hi`` if none does),
    for a ``passes`` that is monotone (recall grows with the beam width):
    galloping steps from ``lo`` (1, 2, 4, ...), then bisection.  A search's
    cost grows with its width, so the probes stay near the answer: the noun
    embeddings, calibrated to the last width of :data:`EF_LADDER`, took 19
    probes one by one and take 6."""
    if passes(lo):
        return lo
    fail, step = lo, 1
    while fail + step < hi:
        if passes(fail + step):
            hi = fail + step
            break
        fail += step
        step *= 2
    # passes(fail) is false; the answer is in (fail, hi]
    while hi - fail > 1:
        mid = (fail + hi) // 2
        if passes(mid):
            hi = mid
        else:
            fail = mid
    return hi


def _cpus() -> int:
    """The CPUs this process may run on."""
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1)


def warm_kernels(dim: int = 8) -> float:
    """Load (or compile) the compiled kernels of this backend now, on a few hundred
    random points of the ball, both coordinate precisions; returns the seconds
    it took.

    numba loads its on-disk cache at a kernel's first call: about 1.3 s on a
    2-core machine, which otherwise lands on the write that makes ``auto``
    switch an exact-scan index to this backend (benchmarks/results/writes.md).
    The service calls this in the background once it is serving."""
    import time

    from ..geometry import PoincareIndexSpace
    from ..table import ItemTable

    t0 = time.perf_counter()
    rng = np.random.default_rng(0)
    space = PoincareIndexSpace(dim, 1.0)
    x = rng.standard_normal((600, dim))
    x *= rng.uniform(0.05, 0.8, (600, 1)) / np.linalg.norm(x, axis=1, keepdims=True)
    for precision in ("float32", "float64"):
        table = ItemTable(dim, capacity=1024)
        table.upsert([f"w{i}" for i in range(400)], x[:400], [None] * 400, [None] * 400)
        g = GraphBackend(space, precision=precision, n_entries=16, build_threads=1)
        g.build(table)
        more = [f"w{i}" for i in range(400, 600)]
        new, _ = table.upsert(more, x[400:], [None] * 200, [None] * 200)
        g.add(table, new)
        g.search(table, x[:4], 5)
        g.search(table, x[:4], 5, allowed=np.arange(0, 600, 2, dtype=np.int64))
        g.remove(table, new[:10])
    return time.perf_counter() - t0
