"""Incremental insertion of a batch of nodes (:func:`insert_batch`): parallel
searches, robust pruning, then the reverse edges grouped by target
(:func:`link_groups`)."""

from __future__ import annotations

import numpy as np
from numba import njit

from .proxy import (
    _FLAGS_LIVE,
    _arc,
    _key,
    _sym,
    _to_sym,
)
from .search import (
    _append_unique,
    _beam_buffers,
    _route_node,
)


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
        nr, n_beam = _route_node(graph, met, empty_ok, x, aux, node, start, L, visited, stamp, bufs)
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
