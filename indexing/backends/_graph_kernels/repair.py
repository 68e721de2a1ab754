"""Reachability (:func:`reachable`), repair of nodes cut off by removals
(:func:`repair`) and the breadth-first order of a rebuilt graph (:func:`bfs_order`)."""

from __future__ import annotations

import numpy as np
from numba import njit

from .proxy import (
    _sym,
)
from .search import (
    _beam_buffers,
    _route_node,
)


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
                _, n_beam = _route_node(
                    graph, met, no_filter, x, aux, u, start, L, visited, stamp, bufs
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
