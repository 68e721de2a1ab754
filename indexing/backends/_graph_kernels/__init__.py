"""Compiled kernels of the graph backend (numba, no GIL held).

The graph ranks with the Poincaré ranking proxy of :mod:`models.geometry.ranking`
(``key(q, x) = |q - x|^2 * w(x)``, ``w(x) = 1 / (1 - c|x|^2)`` in float64 from
:func:`~models.geometry.ranking.proxy_weight`, coordinates in float64 or
float32, from coordinate differences, summed in float64), which orders the
items like the geodesic distance to ``q`` does, and with its symmetric form
``K(x, y) = |x - y|^2 w(x) w(y)`` (``cosh sqrt(c) d(x, y) - 1 = 2c K(x, y)``,
:func:`~models.geometry.ranking.arcosh1p` compiled in) between graph nodes.
No exact distance is computed here: the backend re-ranks the candidates with
``models.geometry``.

Node flags: ``0`` not in the graph, ``1`` live, ``2`` tombstone (a removed item:
it still routes searches, it is never returned).

* :func:`search_batch` -- beam search ("greedy search" of DiskANN / the base
  layer of HNSW): a sorted beam of ``L`` nodes, expand the nearest unexpanded
  one until none is left; every visited node that may be returned (live and,
  with a filter, allowed) goes into a separate result list, so tombstones and
  filtered-out nodes route without being returned.
* :func:`insert_batch` -- incremental insertion of a batch of nodes in
  parallel (each searches the graph as it was before the batch, its
  out-edges chosen by robust pruning with ``alpha`` on the geodesic
  distance), then the reverse edges, grouped by target so targets are updated
  in parallel; a neighbour list that overflows its slack is pruned again.
  Every kernel is serial and releases the GIL; the parallel steps are
  serial kernels over index ranges that the caller spreads over its own
  threads (no numba threading layer: ``parallel=True`` compiled the same
  loops 2.5 times slower per node, and OpenMP's workers spun next to
  torch's).
"""

from .insert import insert_batch, link_groups, region_order
from .proxy import MODE_BALL, MODE_PRODUCT, metric, rerank_bound
from .repair import bfs_order, reachable, repair
from .search import brute_topk, scan_topk, search_batch

__all__ = [
    "MODE_BALL",
    "MODE_PRODUCT",
    "bfs_order",
    "brute_topk",
    "insert_batch",
    "link_groups",
    "metric",
    "reachable",
    "region_order",
    "repair",
    "rerank_bound",
    "scan_topk",
    "search_batch",
]
