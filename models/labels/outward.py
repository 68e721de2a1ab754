r"""Closed subtrees moved outward: fewer strangers before a second parent's ancestors.

A pair ``(u, a)`` that the spanning tree of the cap construction does not hold
(``a`` reached through a second parent) ranks behind every non-ancestor ``v``
of ``u`` with :math:`\rho_v - \rho_{w}` below :math:`\rho_a - \rho_{w_a}`
(``w`` where ``v``'s branch leaves ``u``'s tree path): mostly nodes of other
branches that are no deeper than ``a``. A subtree ``S`` is *closed* when no
node outside it has an ancestor off the tree inside it; moving a closed
subtree outward by ``L`` (its radii up by about ``L``) then leaves every rank
inside it as it was (all its distances grow by about ``L``: to the outside,
and within, the angles shrinking with the caps) and puts its nodes behind the
ancestors of every node outside, whose ancestors it does not hold.

The move is exact on the caps: a conformal dilation of the sphere at
infinity about the subtree root's direction (in stereographic coordinates
from the antipode, a scaling by ``k``) maps caps to caps, so nested caps stay
nested and disjoint caps disjoint; each node's new direction is its image
cap's centre and its new radius the one whose cap (:math:`\theta_0
e^{-\beta\rho}`) is the image's. ``k`` shrinks the root's cap by
:math:`e^{-\beta L}`. Subtrees are moved top down (a closed node inside a
moved closed subtree moves again), each by at most ``room`` and so that no
radius passes ``max_radius`` (float64 coordinates resolve radii up to about
37; the default keeps a margin). A leaf is a closed subtree: leaves move
outward the most.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["closed_nodes", "push_outward"]


def closed_nodes(
    tree: np.ndarray, tin: np.ndarray, tout: np.ndarray, off: np.ndarray
) -> np.ndarray:
    """Which nodes root a closed subtree: no pair ``(u, a)`` of ``off`` (closure pairs the
    tree does not hold) with ``a`` in the subtree and ``u`` outside."""
    closed = np.ones(len(tree), dtype=bool)
    if len(off) == 0:
        return closed
    u, w = off[:, 0].copy(), off[:, 1].copy()
    live = np.ones(len(u), dtype=bool)
    while live.any():
        # w not a tree ancestor of u (u outside w's subtree): w is open; go up
        out = live & ~((tin[w] <= tin[u]) & (tin[u] < tout[w]))
        closed[w[out]] = False
        up = tree[w]
        live = out & (up >= 0)
        w = np.where(live, up, w)
    return closed


def _dilate(dirs, theta, anchor, k):
    """Image caps under the dilation by ``k`` about unit ``anchor`` (rows): (dirs, theta)."""
    cos_psi = np.clip((dirs * anchor).sum(-1), -1.0, 1.0)
    psi = np.arccos(cos_psi)
    t = dirs - cos_psi[:, None] * anchor
    tn = np.linalg.norm(t, axis=-1)
    t = np.where(tn[:, None] > 1e-300, t / np.maximum(tn, 1e-300)[:, None], 0.0)
    hi = 2 * np.arctan(k * np.tan(np.minimum(psi + theta, math.pi - 1e-12) / 2))
    lo = 2 * np.arctan(k * np.tan((psi - theta) / 2))
    centre, radius = (hi + lo) / 2, (hi - lo) / 2
    new = np.cos(centre)[:, None] * anchor + np.sin(centre)[:, None] * t
    new /= np.linalg.norm(new, axis=-1, keepdims=True)
    return new, radius


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
) -> tuple[np.ndarray, np.ndarray, dict]:
    """Move every closed subtree outward, top down (see the module docstring).

    ``dirs`` (n, d) unit directions (zero for a root at the origin), ``rho``
    hyperbolic radii (curvature units), ``tree``/``order`` the spanning
    forest and a top-down order, ``closed`` from :func:`closed_nodes`,
    ``tin``/``tout`` the forest's Euler entry and exit times (a subtree is
    the nodes entered in ``[tin, tout)``).
    Returns new directions, radii and ``{"moved", "mean_push"}``.
    """
    dirs, rho = dirs.copy(), rho.astype(np.float64).copy()
    n = len(tree)
    by_tin = np.argsort(tin)
    depth = np.zeros(n, dtype=np.int64)
    for i in order:
        if tree[i] >= 0:
            depth[i] = depth[tree[i]] + 1
    start = rho.copy()
    moved = 0
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
        theta_r = theta0 * np.exp(-beta * rho[roots])
        want = theta_r * np.exp(-beta * push)
        k = np.tan(want / 2) / np.tan(np.minimum(theta_r, math.pi - 1e-12) / 2)
        # every node of the moved subtrees, with its subtree root
        spans = [by_tin[tin[v] : tout[v]] for v in roots]
        nodes = np.concatenate(spans)
        which = np.repeat(np.arange(len(roots)), [len(s) for s in spans])
        theta = theta0 * np.exp(-beta * rho[nodes])
        new_dirs, new_theta = _dilate(dirs[nodes], theta, dirs[roots][which], k[which])
        dirs[nodes] = new_dirs
        rho[nodes] = np.log(theta0 / new_theta) / beta
        moved += len(roots)
    info = {"moved": moved, "mean_push": float((rho - start).mean()) if n else 0.0}
    return dirs, rho, info
