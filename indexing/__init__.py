"""hypsearch indexing: the durable store and hyperbolic nearest-neighbour search.

Quick start::

    from indexing import HyperbolicIndex
    index = HyperbolicIndex(dim=16, curvature=1.0)      # points of the Poincaré ball
    index.add(vectors, ids)            # vectors: (n, dim) ball points; ids: n strings
    ids, distances = index.search(queries, k=10)
    # ids: (q, k) str array; distances: (q, k) float64, ascending geodesic distance
    index.save(path); index = HyperbolicIndex.load(path)

with ``d(x, y) = arcosh(1 + 2c|x-y|^2 / ((1-c|x|^2)(1-c|y|^2))) / sqrt(c)``
(computed by ``models.geometry``; every distance returned is exact float64).

API
---
``HyperbolicIndex(dim=None, curvature=1.0, *, space=None, backend="auto", path=None,
cones=None, **backend_params)``
    ``backend``: ``"exact"`` (full scan: float32 ranking proxy, ``max(4k, k+32)``
    candidates re-ranked in float64), ``"graph"`` (a proximity graph built and
    searched with the hyperbolic metric in compiled kernels, exact re-ranking;
    see :mod:`indexing.backends.graph` for its parameters ``R``,
    ``ef_construction``, ``alpha``, ``ef``, ``n_entries``, ...), ``"hnsw"``
    (hnswlib ``l2`` graph on the Poincaré coordinates, re-centred multi-pass
    search, exact re-ranking; see :mod:`indexing.backends.hnsw` for ``M``,
    ``ef_construction``, ``ef``, ``passes``, ``num_threads``,
    ``filter_exact_threshold``, ``seed``) or ``"auto"`` (exact up to
    ``auto_threshold`` = 20,000 live items, ``graph`` above -- the faster at
    recall@10 >= 0.99 in ``benchmarks/ann.py``; back to exact below half of it).
    ``path``: a folder; the index is then
    durable (created, or opened if it holds a store with the same space).
    Without a path the index lives in memory until :meth:`save`.
``add(vectors, ids, labels=None, payloads=None) -> None``
    Upsert: an existing id is replaced.  ``labels``: one str or None per
    vector; ``payloads``: one JSON value per vector.  The whole batch becomes
    visible to searches at once, and with a path it is committed to SQLite
    before ``add`` returns.
``delete(ids) -> int``
    Deletes (ignoring unknown ids); returns how many were deleted.
``get(id) -> Item | None``
    ``Item(id, vector, label, payload, holder)``.
``len(index)``, ``id in index``, ``ids() -> list[str]``
``get_many(ids, *, vectors=True) -> list[Item]``, ``count(where=None) -> int``,
``scroll(where=None, limit=100, after=None) -> (ids, next_after)``, ``delete_where(where) -> ids``
    ``where``: a filter expression (:mod:`.filters`: must / should / must_not
    of match, in, range and under conditions on ``label``, ``id`` and
    ``payload.<field>``); ``search`` and ``search_hierarchical`` take it too.
    ``scroll`` lists ids in id order after ``after``; every item living
    through a whole scroll is listed once.
``search(queries, k=10, *, filter_ids=None, labels=None, under=None, ef=None) -> (ids, distances)``
    ``queries``: ``(q, dim)`` (or one ``(dim,)`` vector, answered as ``q = 1``).
    Shapes ``(q, min(k, m))`` with ``m`` the number of live items passing the
    filters -- a filter leaving fewer than ``k`` items returns what there is.
    ``filter_ids``: only these ids; ``labels``: items whose label is in the
    set; ``under``: items whose *holding label* is in the set (pass all the
    descendants-or-self of a taxonomy node).  Filters combine by intersection.
    ``ef``: the graph's beam width (default 48) or hnsw's candidates of a
    re-centred pass (default 256).
``search_hierarchical(query, chain, descendants_of, k=10, offset=0, *, ef=None)``
``-> list[HierarchicalHit]``
    ``chain = [l0, parent(l0), ..., root]`` (for a DAG the caller picks one
    parent chain), ``descendants_of(label) -> iterable of labels``.  Level
    ``i`` = items whose holding label is a descendant-or-self of ``l_i`` but
    not of ``l_(i-1)``; levels are filled in order with filtered k-NN by
    distance; ``offset`` pages through the (level, distance) order.  Each hit
    is ``HierarchicalHit(id, distance, level, via=l_i)``.
``set_cones(LabelCones(prototypes, parent, curvature=c, K=0.1))``
    Holding labels: at insert time each item gets its *deepest holding label*
    -- start at the nearest label prototype, walk up the ancestor chain to the
    first label whose entailment cone holds the item (``models.geometry.cones``);
    the root of the chain if none does (:mod:`indexing.cones`).  Without cones
    the holding label is the item's own label.  Cones are persisted in the
    store; setting different cones recomputes every item's holding label.
``save(path=None) -> Path``, ``close()``,
``HyperbolicIndex.load(path, *, backend=None, cones=None, **backend_params)`` (alias ``open``)
    A folder holds ``store.sqlite3`` (the source of truth), ``manifest.json``
    and one ``snapshot-*.bin`` (a cache of the backend state).  ``load`` uses
    the snapshot when the manifest matches the store, replays later writes,
    and rebuilds from the store -- logging a warning on the ``indexing``
    logger -- when the snapshot is missing, stale or corrupt.

Errors: :class:`IndexInputError` (a ``ValueError``) for bad input -- NaN,
infinite, wrong-dimension or outside-the-ball vectors, non-str, empty or
duplicate ids, ``k < 1`` -- with a message that starts with the input's name,
e.g. ``vectors[3]: norm 1.0000002 is outside the ball of curvature 1.0 (must
be < 1.0)``; :class:`IndexStoreError` for a store of another format or space.

Precision: candidates are ranked with a float32 proxy and re-ranked exactly in
float64.  Points deeper than hyperbolic radius ~12.9/sqrt(c) (gap ``1 - c|x|^2``
below ``indexing.geometry.DEEP_GAP`` = 1e-5), where float32 cannot tell
neighbours apart, are ranked in float64 (deep queries) and kept out of the
float32 graphs (scanned exactly); results stay exact up to the float64
limit (radius ~37).

Concurrency: searches run in parallel; writes are serialised and never run
during a search (a writer-preferring readers-writer lock).  Compaction (when
more than 30% of the slots are deleted) and the switch to a graph rebuild the
backend while holding the write lock: searches wait for it.

Modules
-------
:mod:`.index` (the public class, locks), :mod:`.interface` (``Index``: the
Protocol every index implements, :mod:`.sharded` included), :mod:`.validation` (input checks),
:mod:`.backend_choice` (``auto`` and the backend parameters), :mod:`.store`
(SQLite), :mod:`.table` (the in-memory items), :mod:`.live` (applying writes,
compaction, k-NN), :mod:`.snapshot` (snapshot files, manifest, restore),
:mod:`.holding` (label cones kept in the store), :mod:`.hierarchical` (the
level-by-level search), :mod:`.cones`, :mod:`.geometry`, :mod:`.backends`.

Space strings
-------------
``space`` is either ``"poincare:D"`` -- the Poincaré ball of dimension ``D``
with the ``curvature`` argument (the default, built from ``dim`` and
``curvature``) -- or a product of factors handed to
``models.geometry.product.ProductSpace.parse``::

    space   := factor ("," factor)*
    factor  := kind ":" D          (whatever else ProductSpace.parse accepts,
    kind    := "poincare" | "sphere" | "euclidean"       e.g. curvatures)

e.g. ``"poincare:8,sphere:4,euclidean:4"`` (dimension 16).  The product
distance is ``sqrt(sum_i d_i^2)``; a vector is the concatenation of its
factors' coordinates and must satisfy ``ProductSpace.contains``.  For product
spaces the index's ``curvature`` argument is not used by the distance (the
factors carry their own).  Product spaces always use the exact backend
(``auto`` stays exact; ``backend="graph"`` or ``"hnsw"`` is refused): ``l2`` on
concatenated coordinates does not order items like the product distance, and
its recall stays far from usable at any ``ef`` (see :mod:`indexing.backends.hnsw`).
"""

from .cones import HierarchicalHit, LabelCones
from .errors import IndexInputError, IndexStoreError
from .index import HyperbolicIndex, Item
from .interface import Index

__all__ = [
    "HyperbolicIndex",
    "Index",
    "IndexInputError",
    "IndexStoreError",
    "Item",
    "LabelCones",
    "HierarchicalHit",
]
