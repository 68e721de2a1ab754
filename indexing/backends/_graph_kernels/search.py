"""Beam search over the graph (:func:`search_batch`) and the exact brute-force top k
(:func:`brute_topk`) the automatic beam width is calibrated against."""

from __future__ import annotations

import numpy as np
from numba import njit

from models.geometry.kernels import POINCARE as _POINCARE
from models.geometry.kernels import dist as _exact_dist

from .proxy import (
    _FLAGS_LIVE,
    _key,
    _lower,
    _prefetch,
    _prefetch_row,
    _sqdist,
)


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
def _write_topk(top_d, top_s, m, row_s, row_d):
    """A query's row of the answer: its ``m`` entries, then ``-1`` / ``inf``."""
    for j in range(row_s.shape[0]):
        if j < m:
            row_s[j] = top_s[j]
            row_d[j] = top_d[j]
        else:
            row_s[j] = -1
            row_d[j] = np.inf


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


@njit(inline="always", cache=True)
def _route_node(graph, met, no_filter, x, aux, u, start, L, visited, stamp, bufs):
    """The beam of node ``u``'s own point over every node (``no_filter``: an empty
    mask; tombstones route too), width ``L``: ``(n results, n in the beam)``, the beam
    in ``bufs[0]`` (nodes) and ``bufs[1]`` (keys).  Insertion and repair route so."""
    return _beam(
        graph, met, no_filter, x[u : u + 1], aux[u : u + 1], start, L, 1, visited,
        np.uint32(stamp), bufs, False,
    )  # fmt: skip


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
        _write_topk(top_d, top_s, m, out_s[i], out_d[i])
    return stamp


@njit(nogil=True, cache=True)
def scan_topk(q64, gq, xt, gt, slots, kinds, starts, curv, m, k, out_s, out_d):
    """The exact backend's search: every query's ``k`` nearest ``slots`` with their
    distances (ascending, ties by slot; ``-1`` / ``inf`` past the last).  The
    ``m >= k`` nearest by the ball's monotone float64 key ``|q - x|^2 / g(x)``
    (a product space: by the exact distance, :func:`brute_topk`), then re-ranked
    by the compiled exact distance every backend returns, so a rounding
    difference between the key and the distance cannot change the answer.  The
    rows are read block by block (:data:`_BRUTE_BLOCK`) by every query, each
    block's keys computed apart from the selection (the key loop vectorises)."""
    nq = q64.shape[0]
    n = slots.shape[0]
    cand_d = np.empty((nq, m), dtype=np.float64)
    cand = np.empty((nq, m), dtype=np.int64)
    if kinds.shape[0] == 1 and kinds[0] == _POINCARE:
        mq = np.zeros(nq, dtype=np.int64)
        buf = np.empty(_BRUTE_BLOCK, dtype=np.float64)
        for b0 in range(0, n, _BRUTE_BLOCK):
            b1 = min(n, b0 + _BRUTE_BLOCK)
            for i in range(nq):
                _ball_keys(q64, i, xt, gt, slots, b0, b1, buf)
                td = cand_d[i]
                ts = cand[i]
                mi = mq[i]
                for j in range(b0, b1):
                    dk = buf[j - b0]
                    if mi == m and dk > td[m - 1]:
                        continue
                    mi = _into_topk(td, ts, mi, m, dk, slots[j])
                mq[i] = mi
        for i in range(nq):
            for j in range(mq[i], m):
                cand[i, j] = -1
    else:
        brute_topk(q64, gq, xt, gt, slots, kinds, starts, curv, m, cand)
    top_d = np.empty(k, dtype=np.float64)
    top_s = np.empty(k, dtype=np.int64)
    for i in range(nq):
        mi = 0
        for j in range(m):
            s = cand[i, j]
            if s < 0:
                break
            d = _exact_dist(q64, i, gq, xt, s, gt, kinds, starts, curv)
            if d != d:
                continue
            mi = _into_topk(top_d, top_s, mi, k, d, s)
        _write_topk(top_d, top_s, mi, out_s[i], out_d[i])


@njit(nogil=True, cache=True, fastmath=True)
def _ball_keys(q64, i, xt, gt, slots, b0, b1, buf):
    """``buf[j - b0]`` = the ball's key ``|q_i - x|^2 / g(x)`` of the rows
    ``slots[b0:b1]`` (``fastmath``: a ranking's order, re-ranked exactly after)."""
    for j in range(b0, b1):
        s = slots[j]
        buf[j - b0] = _sqdist(q64, i, xt, s) / gt[s, 0]


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
