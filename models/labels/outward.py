r"""Closed subtrees moved outward, open children widened: second parents' ancestors nearer.

A pair ``(u, a)`` that the spanning tree of the cap construction does not hold
(``a`` reached through a second parent) ranks behind every non-ancestor ``v``
of ``u`` with :math:`\rho_v - \rho_{w}` below :math:`\rho_a - \rho_{w_a}`
(``w`` where ``v``'s branch leaves ``u``'s tree path): mostly nodes of other
branches that are no deeper than ``a``. Far from the origin a node ``u`` is at
distance about :math:`\rho_u + 2\log(\varphi_{uv}/\theta_v) + c` from a
node ``v`` of cap :math:`\theta_v` at angle :math:`\varphi_{uv}`, so ``a``
ranks behind every ``v`` with a smaller :math:`\varphi_{uv}/\theta_v`.

Two moves lower that count, both exact on the caps (Möbius maps of the sphere
at infinity map caps to caps, so nested caps stay nested and disjoint caps
disjoint; each node's new direction is its image cap's centre and its new
radius the one whose cap, :math:`\theta_0 e^{-\beta\rho}`, is the image's):

* **Open children widened** (:func:`widen_open`). A node is *open* when a
  pair ``(u, a)`` crosses it (``a`` in its subtree, ``u`` outside). Within
  the cap of each open node, top down, a hyperbolic translation of the cap
  seen as a Poincaré ball of one dimension less moves the open children's
  weighted centre part of the way to the cap's centre: their caps grow (the
  ``a``'s below them come nearer to every node), their closed siblings'
  shrink.
* **Closed subtrees moved outward** (:func:`push_outward`). A subtree ``S``
  is *closed* when no pair crosses it; shrinking its caps by
  :math:`e^{-\beta L}` moves it outward by ``L``, leaves every rank inside it
  as it was and puts its nodes behind the ancestors of every node outside.
  The shrink is a scaling in stereographic coordinates from the antipode of
  ``S``'s root direction about a point of ``S``'s cap near its rim, on the
  side of the ancestors outside ``S`` of its nodes' pairs (``toward``), so
  its nodes keep as near those ancestors as their cap allows. Subtrees move
  top down (a closed node inside a moved closed subtree moves again), each
  by at most ``room``, no radius past ``max_radius`` (float64 coordinates
  resolve the caps' margins up to about there). A leaf is a closed subtree:
  leaves move outward the most.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["closed_nodes", "crossing_pairs", "push_outward", "widen_open"]


def crossing_pairs(
    tree: np.ndarray, tin: np.ndarray, tout: np.ndarray, off: np.ndarray
) -> np.ndarray:
    """Per node: the pairs ``(u, a)`` of ``off`` (closure pairs the tree does not hold)
    with ``a`` in its subtree and ``u`` outside."""
    count = np.zeros(len(tree), dtype=np.int64)
    if len(off) == 0:
        return count
    u, w = off[:, 0].copy(), off[:, 1].copy()
    live = np.ones(len(u), dtype=bool)
    while live.any():
        # w not a tree ancestor of u (u outside w's subtree): the pair crosses w; go up
        out = live & ~((tin[w] <= tin[u]) & (tin[u] < tout[w]))
        np.add.at(count, w[out], 1)
        up = tree[w]
        live = out & (up >= 0)
        w = np.where(live, up, w)
    return count


def closed_nodes(
    tree: np.ndarray, tin: np.ndarray, tout: np.ndarray, off: np.ndarray
) -> np.ndarray:
    """Which nodes root a closed subtree: no pair ``(u, a)`` of ``off`` (closure pairs the
    tree does not hold) with ``a`` in the subtree and ``u`` outside."""
    return crossing_pairs(tree, tin, tout, off) == 0


def _to_plane(dirs, theta, centre, scale):
    """Caps (rows ``dirs``, ``theta``) as balls (centres, radii) in stereographic
    coordinates from the antipodes of the unit rows ``centre``, divided by ``scale``."""
    cos_psi = np.clip((dirs * centre).sum(-1), -1.0, 1.0)
    psi = np.arccos(cos_psi)
    t = dirs - cos_psi[:, None] * centre
    tn = np.linalg.norm(t, axis=-1)
    t = np.where(tn[:, None] > 1e-300, t / np.maximum(tn, 1e-300)[:, None], 0.0)
    lo = np.tan((psi - theta) / 2) / scale
    hi = np.tan(np.minimum(psi + theta, math.pi - 1e-12) / 2) / scale
    return ((lo + hi) / 2)[:, None] * t, (hi - lo) / 2


def _from_plane(m, rad, centre, scale):
    """The inverse of :func:`_to_plane`: balls back to caps (dirs, theta)."""
    nm = np.linalg.norm(m, axis=-1)
    t = np.where(nm[:, None] > 1e-300, m / np.maximum(nm, 1e-300)[:, None], 0.0)
    lo = 2 * np.arctan(scale * (nm - rad))
    hi = 2 * np.arctan(scale * (nm + rad))
    c = (lo + hi) / 2
    new = np.cos(c)[:, None] * centre + np.sin(c)[:, None] * t
    new /= np.linalg.norm(new, axis=-1, keepdims=True)
    return new, (hi - lo) / 2


def _pulls(dirs, roots, off, tin, tout) -> np.ndarray:
    """For each of ``roots`` (disjoint subtrees): the unit tangent direction at the
    root's direction towards the ancestors outside its subtree of the pairs ``off``
    (``(u, a)``, ``u`` inside), each pair one unit vector; zero rows where none."""
    out = np.zeros((len(roots), dirs.shape[1]))
    if len(off) == 0 or len(roots) == 0:
        return out
    by = np.argsort(tin[roots], kind="stable")
    rt = tin[roots][by]
    u, a = off[:, 0], off[:, 1]
    i = np.searchsorted(rt, tin[u], side="right") - 1
    ok = i >= 0
    i = np.where(ok, i, 0)
    v = roots[by][i]
    ok &= tin[u] < tout[v]
    ok &= ~((tin[v] <= tin[a]) & (tin[a] < tout[v]))  # the ancestor lies outside
    v, a, i = v[ok], a[ok], by[i[ok]]
    e = dirs[a] - (dirs[a] * dirs[v]).sum(-1, keepdims=True) * dirs[v]
    nrm = np.linalg.norm(e, axis=-1)
    good = nrm > 1e-300
    np.add.at(out, i[good], e[good] / nrm[good, None])
    nrm = np.linalg.norm(out, axis=-1)
    return np.where(nrm[:, None] > 1e-12, out / np.maximum(nrm, 1e-300)[:, None], 0.0)


def _ratios(want, scale, x0):
    """Scaling ``k`` about ``x0`` (distance from the origin, in the unit ball of the
    root's cap) that makes the root's cap ``want`` (bisection; monotone in ``k``)."""
    lo, hi = np.zeros(len(want)), np.ones(len(want))
    for _ in range(64):
        k = (lo + hi) / 2
        c = x0 * (1 - k)
        big = np.arctan(scale * (c + k)) - np.arctan(scale * (c - k)) > want
        hi, lo = np.where(big, k, hi), np.where(big, lo, k)
    return (lo + hi) / 2


def _working_copy(dirs, rho, tree, order, tin):
    """Copies of ``dirs`` and ``rho`` (float64) to move, the number of nodes, the nodes
    in Euler-tour order and each node's depth in the spanning ``tree``."""
    n = len(tree)
    depth = np.zeros(n, dtype=np.int64)
    for i in order:
        if tree[i] >= 0:
            depth[i] = depth[tree[i]] + 1
    return dirs.copy(), rho.astype(np.float64).copy(), n, np.argsort(tin), depth


def push_outward(
    dirs: np.ndarray,
    rho: np.ndarray,
    tree: np.ndarray,
    order: list[int],
    closed: np.ndarray,
    tin: np.ndarray,
    tout: np.ndarray,
    *,
    theta0: float,
    beta: float,
    room: float,
    max_radius: float,
    off: np.ndarray | None = None,
    toward: float = 0.98,
) -> tuple[np.ndarray, np.ndarray, dict]:
    """Move every closed subtree outward, top down (see the module docstring).

    ``dirs`` (n, d) unit directions (zero for a root at the origin), ``rho``
    hyperbolic radii (curvature units), ``tree``/``order`` the spanning
    forest and a top-down order, ``closed`` from :func:`closed_nodes`,
    ``tin``/``tout`` the forest's Euler entry and exit times (a subtree is
    the nodes entered in ``[tin, tout)``). ``off``: the closure pairs the
    tree does not hold; each subtree then shrinks towards the point at
    ``toward`` of the way from its root's direction to the rim of its cap,
    on the side of the ancestors outside it of its nodes' pairs (``toward``
    0, or no pairs: towards its root's direction).
    Returns new directions, radii and ``{"moved", "mean_push"}``.
    """
    if not 0 <= toward < 1:
        raise ValueError(f"toward must be in [0, 1), got {toward}")
    dirs, rho, n, by_tin, depth = _working_copy(dirs, rho, tree, order, tin)
    start = rho.copy()
    moved = 0
    off = np.zeros((0, 2), dtype=np.int64) if off is None else off
    for d in range(int(depth.max()) + 1 if n else 0):
        roots = np.flatnonzero((depth == d) & closed & (rho > 0))
        if len(roots) == 0 or room <= 0:
            continue
        # deepest radius in each subtree: a running max over the Euler order
        r_sorted = rho[by_tin]
        deepest = np.array([r_sorted[tin[v] : tout[v]].max() for v in roots])
        push = np.minimum(room, max_radius - deepest)
        keep = push > 1e-9
        roots, push = roots[keep], push[keep]
        if len(roots) == 0:
            continue
        x0 = toward * _pulls(dirs, roots, off, tin, tout)
        # every node of the moved subtrees, with its subtree root
        spans = [by_tin[tin[v] : tout[v]] for v in roots]
        nodes = np.concatenate(spans)
        which = np.repeat(np.arange(len(roots)), [len(s) for s in spans])
        firsts = np.concatenate([[0], np.cumsum([len(s) for s in spans])[:-1]])
        theta_r = theta0 * np.exp(-beta * rho[roots])
        scale = np.tan(np.minimum(theta_r, math.pi - 1e-12) / 2)
        centre = dirs[roots][which]
        m, rad = _to_plane(dirs[nodes], theta0 * np.exp(-beta * rho[nodes]), centre, scale[which])
        for _ in range(8):
            # a scaling by k about x0 in the plane maps caps to caps (nested stay nested);
            # off the root's direction the sphere's scale varies: radii checked after
            k = _ratios(theta_r * np.exp(-beta * push), scale, np.linalg.norm(x0, axis=1))
            kw = k[which][:, None]
            new_dirs, new_theta = _from_plane(
                x0[which] + kw * (m - x0[which]), kw[:, 0] * rad, centre, scale[which]
            )
            new_rho = np.log(theta0 / new_theta) / beta
            over = np.maximum.reduceat(new_rho, firsts) - max_radius
            if (over <= 1e-9).all():
                break
            push = np.where(over > 1e-9, push - over - 1e-6, push)
        good = (push > 1e-9) & (np.maximum.reduceat(new_rho, firsts) <= max_radius + 1e-9)
        ok = good[which]
        dirs[nodes[ok]] = new_dirs[ok]
        rho[nodes[ok]] = new_rho[ok]
        moved += int(good.sum())
    info = {"moved": moved, "mean_push": float((rho - start).mean()) if n else 0.0}
    return dirs, rho, info


def _to_hyperbolic(m, rad):
    """Balls inside the unit ball (Euclidean centres, radii) as hyperbolic balls of its
    Poincaré model: hyperbolic centres (points of the unit ball) and radii."""
    nm = np.linalg.norm(m, axis=-1)
    t = np.where(nm[:, None] > 1e-300, m / np.maximum(nm, 1e-300)[:, None], 0.0)
    lim = 1 - 1e-16
    h1 = 2 * np.arctanh(np.clip(nm - rad, -lim, lim))
    h2 = 2 * np.arctanh(np.clip(nm + rad, -lim, lim))
    return np.tanh((h1 + h2) / 4)[:, None] * t, (h2 - h1) / 2


def _from_hyperbolic(q, rh):
    nq = np.linalg.norm(q, axis=-1)
    t = np.where(nq[:, None] > 1e-300, q / np.maximum(nq, 1e-300)[:, None], 0.0)
    dist = 2 * np.arctanh(np.minimum(nq, 1 - 1e-16))
    lo, hi = np.tanh((dist - rh) / 2), np.tanh((dist + rh) / 2)
    return ((lo + hi) / 2)[:, None] * t, (hi - lo) / 2


def _mobius_add(s, q):
    """``s ⊕ q`` in the Poincaré ball (rows): the isometry taking 0 to ``s``, at ``q``."""
    sq = (s * q).sum(-1, keepdims=True)
    ns = (s * s).sum(-1, keepdims=True)
    nq = (q * q).sum(-1, keepdims=True)
    return ((1 + 2 * sq + nq) * s + (1 - ns) * q) / (1 + 2 * sq + ns * nq)


def widen_open(
    dirs: np.ndarray,
    rho: np.ndarray,
    tree: np.ndarray,
    order: list[int],
    crossing: np.ndarray,
    tin: np.ndarray,
    tout: np.ndarray,
    *,
    theta0: float,
    beta: float,
    share: float,
    max_radius: float,
) -> tuple[np.ndarray, np.ndarray, dict]:
    """Open children widened: within the cap of every open node ``p`` with open
    children (``crossing`` > 0, :func:`crossing_pairs`), top down, a Möbius map of the sphere that
    keeps ``p``'s cap (a hyperbolic translation of the cap seen as a Poincaré ball)
    brings the open children's mean hyperbolic centre (weighted by ``crossing``)
    ``share`` of the way to the cap's centre. The open children's caps grow (the
    ancestors of pairs off the tree come nearer to every node), the others shrink
    (they move outward), nested caps stay nested and disjoint caps disjoint;
    ``p`` and everything outside its cap stay. Where a radius would pass
    ``max_radius`` the share is cut (by 0.7 at a time).
    Returns new directions, radii and ``{"widened"}``.
    """
    dirs, rho, n, by_tin, depth = _working_copy(dirs, rho, tree, order, tin)
    has_open = np.zeros(n, dtype=bool)
    kid = np.flatnonzero((tree >= 0) & (crossing > 0))
    has_open[tree[kid]] = True
    widened = 0
    for d in range(int(depth.max()) + 1 if n and share > 0 else 0):
        ps = np.flatnonzero((depth == d) & has_open & (crossing > 0) & (rho > 0))
        if len(ps) == 0:
            continue
        spans = [by_tin[tin[p] + 1 : tout[p]] for p in ps]
        nodes = np.concatenate(spans)
        which = np.repeat(np.arange(len(ps)), [len(s) for s in spans])
        theta_p = theta0 * np.exp(-beta * rho[ps])
        scale = np.tan(np.minimum(theta_p, math.pi - 1e-12) / 2)
        centre = dirs[ps][which]
        old = rho[nodes]
        m, rad = _to_plane(dirs[nodes], theta0 * np.exp(-beta * old), centre, scale[which])
        q, rh = _to_hyperbolic(m, rad)
        # the open children's weighted mean centre, per p
        kids = (tree[nodes] == ps[which]) & (crossing[nodes] > 0)
        w = crossing[nodes[kids]].astype(np.float64)
        target = np.zeros((len(ps), dirs.shape[1]))
        np.add.at(target, which[kids], w[:, None] * q[kids])
        target /= np.bincount(which[kids], weights=w, minlength=len(ps))[:, None]
        norm = np.linalg.norm(target, axis=1)
        live = norm > 1e-12
        unit = target / np.maximum(norm, 1e-300)[:, None]
        h = np.arctanh(np.minimum(norm, 1 - 1e-16))
        a = np.where(live, share, 0.0)
        for _ in range(24):
            s = -np.tanh(a * h)[:, None] * unit
            m2, rad2 = _from_hyperbolic(_mobius_add(s[which], q), rh)
            new_dirs, new_theta = _from_plane(m2, rad2, centre, scale[which])
            new_rho = np.log(theta0 / new_theta) / beta
            bad = np.zeros(len(ps), dtype=bool)
            np.logical_or.at(bad, which, new_rho > np.maximum(max_radius, old) + 1e-9)
            if not bad.any():
                break
            a = np.where(bad, a * 0.7, a)
        ok = ~bad[which] & (a > 0)[which]
        dirs[nodes[ok]] = new_dirs[ok]
        rho[nodes[ok]] = new_rho[ok]
        widened += int(((a > 0) & ~bad).sum())
    return dirs, rho, {"widened": widened}
