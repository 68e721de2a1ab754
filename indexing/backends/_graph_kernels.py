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

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic, overload

from models.geometry.kernels import POINCARE as _POINCARE
from models.geometry.kernels import dist as _exact_dist
from models.geometry.ranking import arcosh1p

_FLAGS_LIVE = 1


#: metric modes: the Poincaré ranking proxy (``aux[:, 0]`` = w) or an exact
#: product distance (``aux`` = the factors' gaps of models.geometry.kernels).
#: :func:`metric` makes the ``met`` tuple the kernels take; its *type* says the
#: mode (the ball's is the 1-tuple ``(MODE_BALL,)``), so every kernel is
#: compiled once per mode with the other mode's code absent: with one kernel
#: branching on the mode at run time, the product branch in the loop made
#: the ball's beam search twice as slow.
MODE_BALL, MODE_PRODUCT = 0, 1


def metric(ball: bool, table) -> tuple:
    """The ``met`` argument of the kernels: ``(MODE_BALL,)`` or
    ``(MODE_PRODUCT, kinds, starts, curvatures)``."""
    return (MODE_BALL,) if ball else (MODE_PRODUCT, *table)


def _is_ball(met) -> bool:
    """Typing time: is ``met`` the ball's tuple?"""
    return isinstance(met, types.BaseTuple) and len(met) == 1


def _key(x, aux, i, q, qa, met):
    """Ranking key of row ``i`` of ``x`` from the point ``q`` (row 0 of ``q``,
    its aux data ``qa``): the proxy ``|x_i - q|^2 w_i`` in the ball, the exact
    distance in a product.  (Compiled code only.)"""
    raise NotImplementedError


def _sym(x, aux, i, j, met):
    """Symmetric key between nodes: ``K(i, j) = |x_i - x_j|^2 w_i w_j`` in the
    ball, the exact distance in a product.  (Compiled code only.)"""
    raise NotImplementedError


def _to_sym(kk, aux, node, met):
    """The symmetric key of a pair from the key of ``node``'s point to the other.
    (Compiled code only.)"""
    raise NotImplementedError


def _arc(kk, two_c, met):
    """A monotone stand-in for the distance: ``sqrt(c) d = arcosh(1 + 2cK)`` in
    the ball, the distance itself in a product.  (Compiled code only.)"""
    raise NotImplementedError


@intrinsic
def _prefetch(typingctx, arr, i, j):
    """Ask the CPU to bring the cache line of ``arr[i, j]`` in (``llvm.prefetch``,
    read, high locality): a beam expansion reads the rows of ~16 random nodes,
    and issuing every row's loads before using any of them overlaps their
    cache misses (hnswlib's ``_mm_prefetch``).  (Compiled code only.)"""
    if not isinstance(arr, types.Array) or arr.ndim != 2:
        return None
    sig = types.void(arr, i, j)

    def codegen(context, builder, signature, args):
        aryty = signature.args[0]
        ary = context.make_array(aryty)(context, builder, args[0])
        idx = [
            context.cast(builder, a, t, types.intp)
            for a, t in zip(args[1:], signature.args[1:], strict=True)
        ]
        ptr = cgutils.get_item_pointer(context, builder, aryty, ary, idx, wraparound=False)
        i8p = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0")
        flags = [ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)]
        builder.call(fn, [builder.bitcast(ptr, i8p), *flags])
        return context.get_dummy_value()

    return sig, codegen


@njit(inline="always")
def _prefetch_row(a, i):
    """Prefetch every cache line of row ``i`` of the 2-d array ``a``."""
    step = max(1, 64 // a.itemsize)
    for t in range(0, a.shape[1], step):
        _prefetch(a, i, t)


_arcosh1p = njit(inline="always")(arcosh1p)
_FAST = {"fastmath": True}


def _sqdist(a, i, b, j):
    """``|a_i - b_j|^2`` from the coordinate differences, summed in the
    coordinates' dtype (float32 rows: float32 sums, within the re-rank bound of
    :func:`rerank_bound`), returned as float64.  (Compiled code only.)"""
    raise NotImplementedError


@overload(_sqdist, jit_options=_FAST, inline="always")
def _sqdist_impl(a, i, b, j):
    if a.dtype == types.float32:

        def f32(a, i, b, j):
            s = np.float32(0.0)
            for t in range(a.shape[1]):
                d = a[i, t] - b[j, t]
                s += d * d
            return np.float64(s)

        return f32

    def f64(a, i, b, j):
        s = 0.0
        for t in range(a.shape[1]):
            d = a[i, t] - b[j, t]
            s += d * d
        return s

    return f64


@overload(_key, jit_options=_FAST)
def _key_impl(x, aux, i, q, qa, met):
    if _is_ball(met):
        return lambda x, aux, i, q, qa, met: _sqdist(x, i, q, 0) * aux[i, 0]

    def product(x, aux, i, q, qa, met):
        return _exact_dist(x, i, aux, q, 0, qa, met[1], met[2], met[3])

    return product


@overload(_sym, jit_options=_FAST)
def _sym_impl(x, aux, i, j, met):
    if _is_ball(met):
        return lambda x, aux, i, j, met: _sqdist(x, i, x, j) * aux[i, 0] * aux[j, 0]

    def product(x, aux, i, j, met):
        return _exact_dist(x, i, aux, x, j, aux, met[1], met[2], met[3])

    return product


@overload(_to_sym)
def _to_sym_impl(kk, aux, node, met):
    if _is_ball(met):
        return lambda kk, aux, node, met: kk * aux[node, 0]
    return lambda kk, aux, node, met: kk


@overload(_arc)
def _arc_impl(kk, two_c, met):
    if _is_ball(met):
        return lambda kk, two_c, met: _arcosh1p(two_c * np.float64(kk))
    return lambda kk, two_c, met: kk


def _lower(kk, aux, node, qa, met, lb):
    """A lower bound of the exact float64 distance from the query (aux row
    ``qa``) to ``node``, from its ranking key ``kk``: ``lb = (eps_rel,
    eps_abs, c)`` bound the key's rounding (float32 coordinates: see
    :func:`rerank_bound`).  (Compiled code only.)"""
    raise NotImplementedError


@overload(_lower)
def _lower_impl(kk, aux, node, qa, met, lb):
    if _is_ball(met):

        def ball(kk, aux, node, qa, met, lb):
            eps_rel, eps_abs, c = lb
            w = aux[node, 0]
            e = max(0.0, np.sqrt(kk / w) * (1.0 - eps_rel) - eps_abs)
            return _arcosh1p(2.0 * c * e * e * w * qa[0, 0]) / np.sqrt(c) * (1.0 - 1e-9)

        return ball
    # a product's key is the exact distance itself (float64 coordinates)
    return lambda kk, aux, node, qa, met, lb: kk * (1.0 - 1e-12)


def rerank_bound(ball: bool, float32: bool, dim: int, c: float) -> tuple:
    """``lb`` of :func:`search_batch`: how far a ranking key may be from the
    exact one.  Float32 ball coordinates: every coordinate of a point and of
    the query is rounded by at most ``2^-24`` of itself, so their difference
    by ``2^-24 (|q| + |x|) <= 2^-23 / sqrt(c)`` in norm (``eps_abs``, doubled),
    and the float32 sum of ``dim`` squares by ``(dim + 2) 2^-24`` relative
    (``eps_rel``, doubled).  A product graph ranks with the exact distance
    (``(0, 0, 1)``).  Float64 ball graphs (deep data, where the weights of
    :func:`~models.geometry.ranking.fast_gap` are not exact enough): ``None``,
    every candidate is re-ranked."""
    if not ball:
        return (0.0, 0.0, 1.0)
    if not float32:
        return None
    return ((dim + 2) * 2.0**-23, 2.0**-22 / np.sqrt(c), float(c))


@njit(inline="always", cache=True)
def _stamp_max(visited):
    """The last stamp a visited buffer holds before it is cleared: a search
    takes one stamp, so uint8 buffers are cleared every 255 searches (a memset
    of one byte a node, where uint32 stamps made the buffer four times larger:
    4 MB a thread on a million nodes, beyond L2)."""
    if visited.itemsize == 1:
        return 255
    if visited.itemsize == 2:
        return 65535
    return 4294967295


@njit(inline="always", cache=True)
def _append_unique(arr, n, v):
    """Append ``v`` to ``arr[:n]`` unless it is already there; the new length."""
    for r in range(n):
        if arr[r] == v:
            return n
    arr[n] = v
    return n + 1


@njit(inline="always", cache=True)
def _beam_buffers(L, R_out):
    """Work arrays of one beam search: beam ``(ids, keys, expanded)`` of width
    ``L`` and results ``(ids, keys)`` of width ``R_out``."""
    return (
        np.empty(L, dtype=np.int64),
        np.empty(L, dtype=np.float64),
        np.empty(L, dtype=np.bool_),
        np.empty(R_out, dtype=np.int64),
        np.empty(R_out, dtype=np.float64),
    )


@njit(inline="always", cache=True)
def _into_beam(beam_i, beam_k, expd, n, L, kk, node):
    """Insert ``node`` (key ``kk``, not yet expanded) into the sorted beam of
    size ``n <= L`` (the caller checked it belongs there).  Returns the new
    size and the position taken."""
    pos = n if n < L else L - 1
    while pos > 0 and beam_k[pos - 1] > kk:
        beam_i[pos] = beam_i[pos - 1]
        beam_k[pos] = beam_k[pos - 1]
        expd[pos] = expd[pos - 1]
        pos -= 1
    beam_i[pos] = node
    beam_k[pos] = kk
    expd[pos] = False
    return (n + 1 if n < L else n), pos


@njit(inline="always", cache=True)
def _into_results(res_i, res_k, n, R_out, kk, node):
    """Insert ``node`` into the sorted result list of size ``n <= R_out``."""
    pos = n if n < R_out else R_out - 1
    while pos > 0 and res_k[pos - 1] > kk:
        res_i[pos] = res_i[pos - 1]
        res_k[pos] = res_k[pos - 1]
        pos -= 1
    res_i[pos] = node
    res_k[pos] = kk
    return n + 1 if n < R_out else n


@njit(inline="always", cache=True)
def _into_topk(top_d, top_s, m, k, d, s):
    """Merge slot ``s`` at distance ``d`` into the ascending top list
    ``top_d/top_s[:m]`` of at most ``k`` (ties by slot); the new length."""
    if m == k and (d > top_d[m - 1] or (d == top_d[m - 1] and s > top_s[m - 1])):
        return m
    pos = m if m < k else k - 1
    while pos > 0 and (top_d[pos - 1] > d or (top_d[pos - 1] == d and top_s[pos - 1] > s)):
        top_d[pos] = top_d[pos - 1]
        top_s[pos] = top_s[pos - 1]
        pos -= 1
    top_d[pos] = d
    top_s[pos] = s
    return m + 1 if m < k else m


@njit(nogil=True, cache=True)
def _beam(graph, met, ok, q, qa, start, L, R_out, visited, stamp, bufs, track):
    """One beam search for the point ``q`` (a ``(1, d)`` row, aux row ``qa``)
    from the entry points of ``start = (entries, ex, eaux)`` (their coordinates
    and aux data copied to the dense ``ex``, ``eaux``: scoring them reads memory
    in order) over ``graph = (x, aux, adj, deg, flags)`` with the metric ``met``
    and the work arrays ``bufs`` of :func:`_beam_buffers`.  Fills
    ``res_i/res_k`` (sorted, ``R_out`` wide) with the nearest returnable nodes
    visited; returns how many, and the size of the final beam
    (``beam_i/beam_k[:n_beam]``, sorted).  ``track=False`` (no filter, no
    tombstones: every node of the beam may be returned) keeps no separate
    result list -- the results are the head of the final beam, which halved
    the cost of a search."""
    x, aux, adj, deg, flags = graph
    entries, ex, eaux = start
    beam_i, beam_k, expd, res_i, res_k = bufs
    fresh = np.empty(adj.shape[1], dtype=np.int64)
    n_beam = 0
    n_res = 0
    for j in range(entries.shape[0]):
        e = entries[j]
        kk = _key(ex, eaux, j, q, qa, met)
        if n_beam == L and kk >= beam_k[n_beam - 1]:
            continue
        if visited[e] == stamp or flags[e] == 0:
            continue
        visited[e] = stamp
        if n_beam < L or kk < beam_k[n_beam - 1]:
            n_beam, _ = _into_beam(beam_i, beam_k, expd, n_beam, L, kk, e)
        if track and flags[e] == _FLAGS_LIVE and (ok.shape[0] == 0 or ok[e]):
            if n_res < R_out or kk < res_k[n_res - 1]:
                n_res = _into_results(res_i, res_k, n_res, R_out, kk, e)
    p = 0
    while p < n_beam:
        if expd[p]:
            p += 1
            continue
        expd[p] = True
        node = beam_i[p]
        nxt = n_beam  # the smallest position changed by this expansion
        # the neighbours not seen yet, their rows' loads issued before any
        # is used (their misses overlap; hnswlib's _mm_prefetch)
        n_fresh = 0
        for j in range(deg[node]):
            nb = adj[node, j]
            if visited[nb] == stamp:
                continue
            visited[nb] = stamp
            if flags[nb] == 0:
                continue
            fresh[n_fresh] = nb
            n_fresh += 1
            _prefetch_row(x, nb)
            _prefetch(aux, nb, 0)
        for j in range(n_fresh):
            nb = fresh[j]
            kk = _key(x, aux, nb, q, qa, met)
            if n_beam < L or kk < beam_k[n_beam - 1]:
                n_beam, pos = _into_beam(beam_i, beam_k, expd, n_beam, L, kk, nb)
                if pos < nxt:
                    nxt = pos
                # its edges are read when it is expanded: fetch them now
                # (two cache lines: 32 int32 edges, R's default)
                _prefetch(adj, nb, 0)
                if adj.shape[1] > 16:
                    _prefetch(adj, nb, 16)
            if track and flags[nb] == _FLAGS_LIVE and (ok.shape[0] == 0 or ok[nb]):
                if n_res < R_out or kk < res_k[n_res - 1]:
                    n_res = _into_results(res_i, res_k, n_res, R_out, kk, nb)
        if nxt < p:
            p = nxt
    if not track:
        n_res = min(R_out, n_beam)
        for j in range(n_res):
            res_i[j] = beam_i[j]
            res_k[j] = beam_k[j]
    return n_res, n_beam


@njit(nogil=True, cache=True)
def search_batch(
    graph,
    met,
    ok,
    queries,
    qaux,
    start,
    L,
    R_out,
    visited,
    stamp0,
    exact,
    k,
    out_s,
    out_d,
    track,
    lb,
):
    """Beam searches of ``queries`` (``(q, d)``, ``x``'s dtype; aux rows ``qaux``),
    each followed by the exact float64 re-ranking of its ``R_out`` best
    returnable nodes: ``exact = (q64, gq, xt, gt, n2s, kinds, starts, curv)``,
    the queries in float64 and their gaps, the table's float64 vectors and
    gaps (slot order), the slot of every node and the factor table
    (:mod:`models.geometry.kernels`).  Writes the ``k`` nearest
    slots and distances (ascending, ties by slot; ``-1``/``inf`` padded) to
    ``out_s``/``out_d``; returns the last visited stamp used.  ``lb`` (of
    :func:`rerank_bound`; ``eps_rel < 0``: none) skips the exact distance of
    a candidate whose key proves it farther than the ``k``-th found: the
    answer is the same as with every candidate re-ranked, at about ``k``
    exact distances a query instead of ``R_out`` (each a cache miss on the
    slot-ordered float64 rows: 6 of the 23 us of a query at width 20 on the
    preferential-attachment cloud)."""
    q64, gq, xt, gt, n2s, kinds, starts, curv = exact
    aux = graph[1]
    bounded = lb[0] >= 0.0
    nq = queries.shape[0]
    bufs = _beam_buffers(L, R_out)
    beam_i, beam_k, expd, res_i, res_k = bufs
    top_s = np.empty(k, dtype=np.int64)
    top_d = np.empty(k, dtype=np.float64)
    stamp = stamp0
    for i in range(nq):
        stamp += 1
        if stamp >= _stamp_max(visited):
            visited[:] = 0
            stamp = 1
        qa1 = qaux[i : i + 1]
        n, _ = _beam(
            graph,
            met,
            ok,
            queries[i : i + 1],
            qaux[i : i + 1],
            start,
            L,
            R_out,
            visited,
            np.uint32(stamp),
            bufs,
            track,
        )
        # the float64 rows are read in slot order: fetch the likely ones first
        for j in range(min(n, k + 8) if bounded else n):
            s = n2s[res_i[j]]
            _prefetch_row(xt, s)
            _prefetch(gt, s, 0)
        m = 0
        for j in range(n):
            if bounded and m == k and _lower(res_k[j], aux, res_i[j], qa1, met, lb) > top_d[k - 1]:
                continue
            s = n2s[res_i[j]]
            d = _exact_dist(q64, i, gq, xt, s, gt, kinds, starts, curv)
            if d != d:
                continue
            m = _into_topk(top_d, top_s, m, k, d, s)
        for j in range(k):
            if j < m:
                out_s[i, j] = top_s[j]
                out_d[i, j] = top_d[j]
            else:
                out_s[i, j] = -1
                out_d[i, j] = np.inf
    return stamp


@njit(nogil=True, cache=True)
def _prune(x, aux, met, node, cand, ck, n_cand, R, alpha, two_c, out, occ, min_deg):
    """Robust prune of ``cand[:n_cand]`` (symmetric keys ``ck`` to ``node``):
    candidates in increasing distance; ``c`` is kept unless a kept ``r`` has
    ``alpha d(r, c) <= d(node, c)``.  Writes at most ``R`` ids to ``out``;
    returns how many.  ``occ[i]`` becomes the occluder ``r`` of a dropped
    ``cand[i]`` (``-1`` if kept or a duplicate; for a candidate dropped for want of
    room, the kept node nearest to it)."""
    order = np.argsort(ck[:n_cand])
    occ[:n_cand] = -1
    n_out = 0
    last = -1
    for oi in range(n_cand):
        ci = order[oi]
        c = cand[ci]
        if c == node or c == last:
            continue
        last = c
        if n_out >= R:
            # no room: hand it to the kept node nearest to it
            best = np.inf
            for r in range(n_out):
                kr = _sym(x, aux, out[r], c, met)
                if kr < best:
                    best = kr
                    occ[ci] = out[r]
            continue
        dpc = _arc(ck[ci], two_c, met)
        keep = True
        for r in range(n_out):
            o = out[r]
            if o == c:
                keep = False
                break
            kr = _sym(x, aux, o, c, met)
            if alpha == 1.0:
                if kr <= ck[ci]:
                    keep = False
                    occ[ci] = o
                    break
            elif alpha * _arc(kr, two_c, met) <= dpc:
                keep = False
                occ[ci] = o
                break
        if keep:
            out[n_out] = c
            n_out += 1
    if n_out < min_deg:
        # a tree-like metric leaves a near-tree (mean degree 2 on WordNet noun
        # embeddings), which a beam cannot navigate: top up with the nearest
        # pruned candidates
        last = -1
        for oi in range(n_cand):
            if n_out >= min_deg:
                break
            ci = order[oi]
            c = cand[ci]
            if c == node or c == last or occ[ci] < 0:
                continue
            last = c
            m = _append_unique(out, n_out, c)
            if m > n_out:
                n_out = m
                occ[ci] = -1
    return n_out


@njit(nogil=True, cache=True)
def insert_search(graph, met, nodes, seq, start, L, visited, lo, hi, cand_i, cand_k, n_cand, top1):
    """Beam searches of ``nodes[seq[lo:hi]]`` over the graph as it is: node
    ``nodes[b]``'s candidates (the live nodes of its final beam, symmetric
    keys) go to row ``b`` of ``cand_i``/``cand_k``/``n_cand``, its nearest
    graph node to ``top1[b]``.  ``visited`` is this call's own zeroed stamp
    buffer."""
    x, aux, adj, deg, flags = graph
    bufs = _beam_buffers(L, L)
    beam_i, beam_k = bufs[0], bufs[1]
    empty_ok = np.zeros(0, dtype=np.bool_)
    stamp = 0
    for t in range(lo, hi):
        b = seq[t]
        node = nodes[b]
        stamp += 1
        # route over every node in the graph (tombstones too)
        nr, n_beam = _beam(
            graph,
            met,
            empty_ok,
            x[node : node + 1],
            aux[node : node + 1],
            start,
            L,
            1,
            visited,
            np.uint32(stamp),
            bufs,
            False,
        )
        m = 0
        for j in range(n_beam):
            bi = beam_i[j]
            if bi == node or flags[bi] != _FLAGS_LIVE:
                continue
            cand_i[b, m] = bi
            cand_k[b, m] = _to_sym(beam_k[j], aux, node, met)
            m += 1
        n_cand[b] = m
        top1[b] = beam_i[0] if n_beam > 0 else -1


@njit(nogil=True, cache=True)
def batch_groups(top1):
    """Batch mates: ``(order, pos, grp_start, grp_end)`` -- the batch sorted by
    nearest graph node, each node's position in that order and the bounds of
    its group (the nodes sharing its nearest graph node)."""
    nb_ = top1.shape[0]
    order = np.argsort(top1, kind="mergesort")
    pos = np.empty(nb_, dtype=np.int64)
    grp_start = np.empty(nb_, dtype=np.int64)
    grp_end = np.empty(nb_, dtype=np.int64)
    a = 0
    while a < nb_:
        e = a + 1
        while e < nb_ and top1[order[e]] == top1[order[a]]:
            e += 1
        for p in range(a, e):
            pos[order[p]] = p
            grp_start[order[p]] = a
            grp_end[order[p]] = e
        a = e
    return order, pos, grp_start, grp_end


@njit(nogil=True, cache=True)
def insert_prune(
    graph, met, nodes, cands, groups, R, alpha, two_c, mates, min_deg, lo, hi, new_adj, new_deg
):
    """Out-edges of ``nodes[lo:hi]``: robust pruning of each node's beam
    candidates and batch mates (``cands = (cand_i, cand_k, n_cand, top1)`` of
    :func:`insert_search`, ``groups`` of :func:`batch_groups`), written to rows
    of ``new_adj``/``new_deg``."""
    x, aux, adj, deg, flags = graph
    cand_i, cand_k, n_cand, top1 = cands
    order, pos, grp_start, grp_end = groups
    L = cand_i.shape[1]
    ci = np.empty(L + mates, dtype=np.int64)
    ck = np.empty(L + mates, dtype=np.float64)
    occ = np.empty(L + mates, dtype=np.int64)
    out = np.empty(R, dtype=np.int64)
    for b in range(lo, hi):
        node = nodes[b]
        m = n_cand[b]
        for j in range(m):
            ci[j] = cand_i[b, j]
            ck[j] = cand_k[b, j]
        if top1[b] >= 0:
            g_lo = max(grp_start[b], pos[b] - mates // 2)
            g_hi = min(grp_end[b], g_lo + mates + 1)
            for p in range(g_lo, g_hi):
                o = nodes[order[p]]
                if o != node:
                    ci[m] = o
                    ck[m] = _sym(x, aux, node, o, met)
                    m += 1
        k_out = _prune(x, aux, met, node, ci, ck, m, R, alpha, two_c, out, occ, min_deg)
        # always an edge to the nearest graph node: batch mates may occlude
        # every older node, which would leave the batch an island
        if n_cand[b] > 0:
            first = cand_i[b, 0]
            have = False
            for j in range(k_out):
                if out[j] == first:
                    have = True
                    break
            if not have:
                if k_out < R:
                    k_out += 1
                out[k_out - 1] = first
        new_deg[b] = k_out
        new_adj[b, :k_out] = out[:k_out]


@njit(nogil=True, cache=True)
def insert_write(graph, nodes, new_adj, new_deg):
    """Write the batch's out-edges into the graph; returns the reverse edges
    ``(targets, sources)`` for :func:`link_groups`."""
    x, aux, adj, deg, flags = graph
    nb_ = nodes.shape[0]
    total = 0
    for b in range(nb_):
        node = nodes[b]
        deg[node] = new_deg[b]
        adj[node, : new_deg[b]] = new_adj[b, : new_deg[b]]
        total += new_deg[b]
    tgt = np.empty(total, dtype=np.int64)
    src = np.empty(total, dtype=np.int64)
    p = 0
    for b in range(nb_):
        for j in range(new_deg[b]):
            tgt[p] = new_adj[b, j]
            src[p] = nodes[b]
            p += 1
    return tgt, src


@njit(nogil=True, cache=True)
def _cells(graph, met, nodes, start, rank, lo, hi, out):
    """``out[b]`` for ``b`` in ``lo .. hi``: the cell of node ``nodes[b]`` in the
    order-2 Voronoi diagram of the entry points (``rank``: each entry's place)."""
    x, aux = graph[0], graph[1]
    entries, ex, eaux = start
    n_e = entries.shape[0]
    for b in range(lo, hi):
        node = nodes[b]
        q = x[node : node + 1]
        qa = aux[node : node + 1]
        best = np.inf
        best2 = np.inf
        r = 0
        r2 = 0
        for j in range(n_e):
            kk = _key(ex, eaux, j, q, qa, met)
            if kk < best:
                best2 = best
                r2 = r
                best = kk
                r = j
            elif kk < best2:
                best2 = kk
                r2 = j
        out[b] = rank[r] * n_e + rank[r2]


def region_order(graph, met, nodes, start, entry_keys, spread=None):
    """The positions of ``nodes`` grouped by their nearest entry point and, within
    that, by their second nearest (cells of the order-2 Voronoi diagram of the
    entries, in the order of ``entry_keys``: one key per entry, their slots, so
    the order does not depend on the node layout), the order within a cell as
    given: the insertion searches run in this order, so consecutive ones walk
    the same part of the graph and find its rows still in cache (the 64-d
    cloud: about 28 -> 23 thread-seconds of insertion search, benchmarks/results/ann.md).
    Their results do not depend on it (every node of a batch
    searches the graph as it was before the batch, and its row of the
    results is its position in ``nodes``).  ``spread`` as in
    :func:`insert_batch` (``None``: this thread)."""
    n_e = len(entry_keys)
    rank = np.empty(n_e, dtype=np.int64)  # the entries' places by key: cell ids stay small
    rank[np.argsort(entry_keys, kind="stable")] = np.arange(n_e)
    cells = np.empty(len(nodes), dtype=np.int64)

    def run(lo, hi):
        _cells(graph, met, nodes, start, rank, lo, hi, cells)

    if spread is None:
        run(0, len(nodes))
    else:
        spread(len(nodes), run)
    return np.argsort(cells, kind="stable")


def insert_batch(graph, met, nodes, start, L, R, alpha, two_c, spread, mates, min_deg, entry_keys):
    """Link ``nodes`` (not yet in the graph: ``flags`` 0; the caller sets them
    to 1 afterwards).

    The nodes of a batch search the graph as it was before the batch, so they
    cannot find each other; a batch node therefore also considers up to
    ``mates`` nodes of the batch whose nearest graph node is the same as its own
    (a tight cluster of near-duplicates inserted together shares it).  Without
    that, such a cluster is linked only through reverse edges and hand-offs
    and a later prune can leave most of it unreachable.

    ``spread(n, fn)`` runs ``fn(lo, hi)`` over ``[0, n)`` in chunks, on as many
    threads as it likes: the searches and the prunes are serial nogil kernels
    over index ranges (numba's ``parallel=True`` made the same code 2.5 times
    slower per node, benchmarks/results/ann.md), and every node's result depends on
    the graph before the batch only, so the graph is the same whatever the
    threads.  ``adj`` has ``R + R // 2`` columns (the slack).  The batch is
    searched in the order of :func:`region_order` (``entry_keys``: a sort key
    per entry point).  Returns the reverse edges ``(targets, sources)`` for
    :func:`link_groups`."""
    flags = graph[4]
    seq = region_order(graph, met, nodes, start, entry_keys, spread)
    nb_ = nodes.shape[0]
    cand_i = np.full((nb_, L), -1, dtype=np.int64)
    cand_k = np.full((nb_, L), np.inf, dtype=np.float64)
    n_cand = np.zeros(nb_, dtype=np.int64)
    top1 = np.full(nb_, -1, dtype=np.int64)

    def search(lo, hi):
        vis = np.zeros(len(flags), dtype=np.uint32)
        insert_search(graph, met, nodes, seq, start, L, vis, lo, hi, cand_i, cand_k, n_cand, top1)

    spread(nb_, search)
    groups = batch_groups(top1)
    new_adj = np.full((nb_, R), -1, dtype=np.int64)
    new_deg = np.zeros(nb_, dtype=np.int64)
    cands = (cand_i, cand_k, n_cand, top1)

    def prune(lo, hi):
        args = (R, alpha, two_c, mates, min_deg, lo, hi, new_adj, new_deg)
        insert_prune(graph, met, nodes, cands, groups, *args)

    spread(nb_, prune)
    return insert_write(graph, nodes, new_adj, new_deg)


@njit(nogil=True, cache=True)
def reverse_groups(tgt, slack):
    """The reverse edges grouped by target: ``(order, starts, offs)`` --
    ``tgt`` sorted, the ``n_groups + 1`` bounds of each target's run in that
    order, and each group's offset in the hand-off buffers (``slack`` plus
    its size)."""
    total = tgt.shape[0]
    order = np.argsort(tgt, kind="mergesort")
    starts = np.empty(total + 1, dtype=np.int64)
    n_groups = 0
    for p in range(total):
        if p == 0 or tgt[order[p]] != tgt[order[p - 1]]:
            starts[n_groups] = p
            n_groups += 1
    starts[n_groups] = total
    offs = np.empty(n_groups + 1, dtype=np.int64)
    offs[0] = 0
    for gi in range(n_groups):
        offs[gi + 1] = offs[gi] + slack + (starts[gi + 1] - starts[gi])
    return order, starts[: n_groups + 1], offs


@njit(nogil=True, cache=True)
def link_range(graph, met, tgt, src, groups, R, alpha, two_c, min_deg, g_lo, g_hi, h_t, h_s):
    """Add the reverse edges of the target groups ``g_lo .. g_hi`` of
    :func:`reverse_groups` (a list over its slack is pruned back to ``R``),
    writing each group's hand-offs to its stretch of ``h_t``/``h_s``."""
    x, aux, adj, deg, flags = graph
    order, starts, offs = groups
    slack = adj.shape[1]
    for gi in range(g_lo, g_hi):
        a = starts[gi]
        e = starts[gi + 1]
        v = tgt[order[a]]
        cap = slack + (e - a)
        cand = np.empty(cap, dtype=np.int64)
        m = 0
        for j in range(deg[v]):
            cand[m] = adj[v, j]
            m += 1
        for p in range(a, e):
            u = src[order[p]]
            if u != v:
                m = _append_unique(cand, m, u)
        if m <= slack:
            for j in range(m):
                adj[v, j] = cand[j]
            deg[v] = m
        else:
            ck = np.empty(m, dtype=np.float64)
            for j in range(m):
                ck[j] = _sym(x, aux, v, cand[j], met)
            out = np.empty(R, dtype=np.int64)
            occ = np.empty(m, dtype=np.int64)
            k_out = _prune(x, aux, met, v, cand, ck, m, R, alpha, two_c, out, occ, min_deg)
            for j in range(k_out):
                adj[v, j] = out[j]
            deg[v] = k_out
            o = offs[gi]
            for j in range(m):
                if occ[j] >= 0:
                    h_t[o] = occ[j]
                    h_s[o] = cand[j]
                    o += 1


def link_groups(graph, met, tgt, src, R, alpha, two_c, min_deg, spread):
    """Add the edges ``tgt[i] -> src[i]``, grouped by target so targets are
    updated in parallel (``spread`` as in :func:`insert_batch`); a list over
    its slack is pruned back to ``R``.
    Returns the hand-offs ``(r, c)``: an edge ``v -> c`` pruned because ``r``
    (kept by ``v``) is nearer ``c`` is offered to ``r`` instead, so a node
    pruned from a crowded hub stays reachable through the node that occluded
    it (in a tree-like metric the hubs near the origin are everybody's nearest
    neighbours and would otherwise drop most of their reverse edges)."""
    groups = reverse_groups(tgt, graph[2].shape[1])
    n_groups = len(groups[1]) - 1
    h_t = np.full(int(groups[2][n_groups]), -1, dtype=np.int64)
    h_s = np.full(len(h_t), -1, dtype=np.int64)
    spread(
        n_groups,
        lambda lo, hi: link_range(
            graph, met, tgt, src, groups, R, alpha, two_c, min_deg, lo, hi, h_t, h_s
        ),
    )
    keep = h_t >= 0
    return h_t[keep], h_s[keep]


@njit(nogil=True, cache=True)
def _flood(adj, deg, flags, seen, stack, top):
    """Mark ``seen`` every in-graph node reachable from ``stack[:top]`` (already seen)."""
    while top > 0:
        top -= 1
        v = stack[top]
        for j in range(deg[v]):
            u = adj[v, j]
            if not seen[u] and flags[u] != 0:
                seen[u] = True
                stack[top] = u
                top += 1


@njit(nogil=True, cache=True)
def reachable(adj, deg, flags, entries):
    """Mask of the nodes reachable from ``entries`` (in-graph nodes only)."""
    n = flags.shape[0]
    seen = np.zeros(n, dtype=np.bool_)
    stack = np.empty(n, dtype=np.int64)
    top = 0
    for e in entries:
        if e >= 0 and flags[e] != 0 and not seen[e]:
            seen[e] = True
            stack[top] = e
            top += 1
    _flood(adj, deg, flags, seen, stack, top)
    return seen


@njit(nogil=True, cache=True)
def repair(graph, met, start, L, order):
    """Give every in-graph node no search can reach an in-edge: from its nearest
    reachable out-neighbour, or else (an island: a group of near-duplicates
    whose edges all point at each other) from the nearest node a beam search
    from the entry points finds.  The edge takes a free slack column, else
    replaces the host's last edge.  Nodes are handled in ``order`` (from the
    origin outwards).  Returns how many edges were added."""
    x, aux, adj, deg, flags = graph
    entries = start[0]
    n = flags.shape[0]
    slack = adj.shape[1]
    seen = reachable(adj, deg, flags, entries)
    stack = np.empty(n, dtype=np.int64)
    visited = np.zeros(n, dtype=np.uint32)
    bufs = _beam_buffers(L, 1)
    beam_i, beam_k, expd, res_i, res_k = bufs
    no_filter = np.zeros(0, dtype=np.bool_)
    stamp = 0
    added = 0
    for _rounds in range(8):
        progress = False
        for oi in range(order.shape[0]):
            u = order[oi]
            if flags[u] == 0 or seen[u]:
                continue
            # the nearest reachable out-neighbour, preferring one with room
            best = -1
            best_k = np.inf
            roomy = -1
            roomy_k = np.inf
            for j in range(deg[u]):
                v = adj[u, j]
                if seen[v]:
                    kk = _sym(x, aux, u, v, met)
                    if kk < best_k:
                        best_k = kk
                        best = v
                    if deg[v] < slack and kk < roomy_k:
                        roomy_k = kk
                        roomy = v
            if roomy >= 0:
                best = roomy
            else:
                stamp += 1
                _, n_beam = _beam(
                    graph,
                    met,
                    no_filter,
                    x[u : u + 1],
                    aux[u : u + 1],
                    start,
                    L,
                    1,
                    visited,
                    np.uint32(stamp),
                    bufs,
                    False,
                )
                for j in range(n_beam):
                    v = beam_i[j]
                    if v != u and seen[v] and deg[v] < slack:
                        best = v
                        break
                if best < 0:
                    for j in range(n_beam):
                        if beam_i[j] != u and seen[beam_i[j]]:
                            best = beam_i[j]
                            break
            if best < 0:
                continue
            if deg[best] < slack:
                adj[best, deg[best]] = u
                deg[best] += 1
            else:
                adj[best, slack - 1] = u
            added += 1
            progress = True
            # everything reachable from u is reachable now
            seen[u] = True
            stack[0] = u
            _flood(adj, deg, flags, seen, stack, 1)
        if not progress:
            break
        # replacing a last edge may have cut something off: look again
        seen = reachable(adj, deg, flags, entries)
    return added


@njit(nogil=True, cache=True)
def bfs_order(adj, deg, flags, entries):
    """In-graph nodes in breadth-first order from ``entries`` (then any node not
    reached, in slot order): the layout that puts a node's neighbours next to
    it in memory."""
    n = flags.shape[0]
    seen = np.zeros(n, dtype=np.bool_)
    out = np.empty(n, dtype=np.int64)
    head = 0
    tail = 0
    scan = 0
    for e in entries:
        if e >= 0 and flags[e] != 0 and not seen[e]:
            seen[e] = True
            out[tail] = e
            tail += 1
    while True:
        while head < tail:
            v = out[head]
            head += 1
            for j in range(deg[v]):
                u = adj[v, j]
                if not seen[u] and flags[u] != 0:
                    seen[u] = True
                    out[tail] = u
                    tail += 1
        more = False
        while scan < n:
            u = scan
            scan += 1
            if flags[u] != 0 and not seen[u]:
                seen[u] = True
                out[tail] = u
                tail += 1
                more = True
                break
        if not more:
            break
    return out[:tail]


@njit(nogil=True, cache=True, fastmath=True)
def _ball_block(q64, i, xt, gt, slots, b0, b1, td, ts, mi, k):
    """Query ``i`` against the rows ``slots[b0:b1]`` of the ball: the keys
    ``|q - x|^2 / g(x)`` (the float64 sum vectorised: ``fastmath``, the order
    of a ranking truth, not a returned distance) merged into its top list
    ``td/ts[:mi]``; the new length."""
    for j in range(b0, b1):
        s = slots[j]
        d = _sqdist(q64, i, xt, s) / gt[s, 0]
        if mi == k and d > td[k - 1]:
            continue
        mi = _into_topk(td, ts, mi, k, d, s)
    return mi


#: rows of the table scanned by every query of a chunk before the next rows
#: (:func:`brute_topk`): a block of 512 rows of 64 float64 stays in L2, so the
#: table is read from memory once per chunk instead of once per query
_BRUTE_BLOCK = 512


@njit(nogil=True, cache=True)
def brute_topk(q64, gq, xt, gt, slots, kinds, starts, curv, k, out_s):
    """Exact top ``k`` slots (ascending distance, ties by slot) of every query
    among ``slots``: the truth the automatic beam width is calibrated against.
    The compiled float64 distance, or in the ball its monotone float64 form
    ``|q - x|^2 / g(x)`` (the same order, without the ``arsinh``).  The
    queries scan the rows block by block (:data:`_BRUTE_BLOCK`): one query at
    a time over the whole table read 100 MB from memory per query on
    200,000 x 64-d, 4.5 s for 500 queries."""
    nq = q64.shape[0]
    top_d = np.empty((nq, k), dtype=np.float64)
    top_s = np.empty((nq, k), dtype=np.int64)
    m = np.zeros(nq, dtype=np.int64)
    ball = kinds.shape[0] == 1 and kinds[0] == _POINCARE
    n = slots.shape[0]
    for b0 in range(0, n, _BRUTE_BLOCK):
        b1 = min(n, b0 + _BRUTE_BLOCK)
        for i in range(nq):
            td = top_d[i]
            ts = top_s[i]
            mi = m[i]
            if ball:
                mi = _ball_block(q64, i, xt, gt, slots, b0, b1, td, ts, mi, k)
            else:
                for j in range(b0, b1):
                    s = slots[j]
                    d = _exact_dist(q64, i, gq, xt, s, gt, kinds, starts, curv)
                    if mi == k and d > td[k - 1]:
                        continue
                    mi = _into_topk(td, ts, mi, k, d, s)
            m[i] = mi
    for i in range(nq):
        for j in range(k):
            out_s[i, j] = top_s[i, j] if j < m[i] else -1
