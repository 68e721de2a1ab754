r"""Cap construction: label points whose caps nest along the taxonomy, placed, not trained.

Every node gets a point whose cap (:func:`models.geometry.cones.cap_margin`:
the angular radius :math:`\theta(x) = \theta_0 e^{-\beta\rho(x)}` of a cap of
the sphere at infinity, centred on the point's direction) lies inside the cap
of its parent, and the caps of siblings are disjoint. So by construction:

* every ancestor's cone holds its descendants along the spanning tree
  (recall), and no cone holds a node of another branch (precision);
* the distances rank well: a child sits at a fixed fraction ``a`` of its
  parent's cap away from the parent's direction, one radial step
  :math:`\Delta` farther out (:math:`r = e^{-\beta\Delta}` is the ratio of
  the child's cap to the parent's). With :math:`\beta = 1/2`, a node ``u``
  at radius :math:`\rho_u` is at distance about :math:`\rho_u + 2\log(a\theta_0/2)`
  from each of its ancestors and at least :math:`\Delta` more from its
  children, siblings and cousins, at every depth.

The placement, node by node from the roots down (a spanning tree of the DAG):

1. **Tree parent.** A node of several parents goes under the parent that
   makes the caps hold the most of its closure pairs (its and its
   descendants' ancestors), net of pairs held falsely, ties to the parent
   with the most descendants (:func:`tree_parents`; a point can lie in two
   caps only where they overlap, and the caps of distinct branches do not).
   A second parent that is only a *pass-through chain* (one parent, one
   child each, up to an ancestor of the chosen parent) is folded inside the
   chosen parent's cap, so the node keeps both parents' ancestors.
2. **Children of a node** ``p`` (``k`` of them, direction :math:`\hat p`, cap
   :math:`\theta_p`): ``k`` tangent directions at :math:`\hat p` from a
   spherical code (repulsion on :math:`S^{d-2}`, cached by ``k``, randomly
   rotated per node); the largest ratio ``r`` such that the children, at
   angle :math:`a\theta_p` from :math:`\hat p` with :math:`a = 1 - r(1 + m)`,
   have caps separated by a factor ``separation`` and keep the parent's
   direction outside their caps (exact spherical trigonometry); children at
   radius :math:`\rho_p - \ln(r)/\beta`.
3. **Roots.** A single root sits at the origin (its cap is all
   :math:`\theta_0`); several roots hang under a virtual root at the origin.
   The root's children get directions from a spherical code on
   :math:`S^{d-1}` and a cap radius half their smallest angle (over
   ``separation``), at the radius where the formula gives that cap (at least
   ``min_step``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from ..taxonomy import Taxonomy

__all__ = ["CapPlacement", "cap_construction", "spherical_code", "tree_parents", "tree_plan"]


def tree_parents(taxonomy: Taxonomy) -> tuple[np.ndarray, list[int]]:
    """A spanning forest: ``parent[i]`` (-1 for roots) and a top-down order of it.

    The rule for a node ``v`` of several parents (``tree_plan`` has the
    details): every parent ``M`` is scored by the closure pairs of ``v`` and
    its descendants that the caps would hold with ``v`` under ``M``, minus the
    pairs they would hold falsely; the best score wins, ties to the parent
    with the most descendants (the service's taxonomy chains continue through
    the parent with the most items under it), then to the first listed. The
    pairs held are ``M``'s tree ancestors and ``M``; with a *fold* also the
    nodes of another parent's *pass-through chain*: a parent ``Q`` of one
    parent and one child whose chain of such nodes upwards ends below an
    ancestor ``a`` of ``M`` (the ancestors an induced taxonomy adds, e.g.
    ``clothing.n.01``'s ``consumer_goods.n.01`` and ``commodity.n.01``, which
    hold nothing but clothing). The chain is then hung under ``M`` and ``v``
    under ``Q``: every ancestor of ``v`` holds it, at the price of the pairs
    (``M``'s tree ancestors below ``a``, chain node), which are counted
    against the fold (it is made only where it gains more than it costs).
    """
    tree, order, _ = tree_plan(taxonomy)
    return tree, order


def tree_plan(taxonomy: Taxonomy) -> tuple[np.ndarray, list[int], int]:
    """:func:`tree_parents` and the number of pairs its folds hold falsely."""
    n = len(taxonomy)
    parents = [taxonomy.parent_ids(i) for i in range(n)]
    children = [taxonomy.child_ids(i) for i in range(n)]
    indeg = np.array([len(p) for p in parents])
    order = [i for i in range(n) if indeg[i] == 0]
    head = 0
    while head < len(order):
        for ch in children[order[head]]:
            indeg[ch] -= 1
            if indeg[ch] == 0:
                order.append(ch)
        head += 1
    edges = taxonomy.closure_edges()
    n_desc = np.bincount(edges[:, 1], minlength=n) if len(edges) else np.zeros(n, np.int64)
    tree = np.full(n, -1, dtype=np.int64)
    n_anc = np.zeros(n, dtype=np.int64)  # tree ancestors of each node
    folded = np.zeros(n, dtype=bool)
    false_pairs = 0

    def tree_chain(m: int) -> list[int]:
        out = [m]
        while tree[out[-1]] >= 0:
            out.append(int(tree[out[-1]]))
        return out

    def pass_through(q: int, v: int, m: int) -> tuple[list[int], int] | None:
        """The chain from ``q`` up to below an ancestor of ``m``, and its cost."""
        up = set(taxonomy.ancestor_ids(m).tolist()) | {m}
        chain, below = [], v
        while len(parents[q]) == 1 and children[q] == (below,) and not folded[q]:
            chain.append(q)
            a = parents[q][0]
            if a in up:
                top = set(taxonomy.ancestor_ids(a).tolist()) | {a}
                return chain, len(chain) * sum(t not in top for t in tree_chain(m))
            below, q = q, a
        return None

    for v in order:
        ps = parents[v]
        if not ps:
            continue
        unit = 1 + int(n_desc[v])
        best = None
        for rank, m in enumerate(ps):
            score, fold = unit * (int(n_anc[m]) + 1), None
            if len(ps) > 1:
                for q in ps:
                    got = None if q == m else pass_through(q, v, m)
                    if got is not None:
                        s = unit * (int(n_anc[m]) + 1 + len(got[0])) - got[1]
                        if s > score:
                            score, fold = s, got
            key = (score, int(n_desc[m]), -rank)
            if best is None or key > best[0]:
                best = (key, m, fold)
        _, m, fold = best
        if fold is None:
            tree[v] = m
            n_anc[v] = n_anc[m] + 1
            continue
        chain, cost = fold
        false_pairs += cost
        tree[chain[-1]] = m
        for q in reversed(chain):  # top down
            n_anc[q] = n_anc[tree[q]] + 1
            folded[q] = True
        tree[v] = chain[0]
        n_anc[v] = n_anc[chain[0]] + 1
    # top-down order of the tree (a fold can hang a node under one placed later)
    kids: list[list[int]] = [[] for _ in range(n)]
    out = []
    for i in order:
        (kids[tree[i]] if tree[i] >= 0 else out).append(i)
    head = 0
    while head < len(out):
        out.extend(kids[out[head]])
        head += 1
    return tree, out, false_pairs


_CODES: dict[tuple[int, int, int], np.ndarray] = {}


def spherical_code(k: int, m: int, *, seed: int = 0, iters: int = 300) -> np.ndarray:
    """``k`` unit vectors of :math:`\\mathbb R^m` spread by repulsion, (k, m), cached.

    ``k <= 2`` are antipodal; ``k <= m + 1`` start from a regular simplex
    (already optimal); others from random points, then projected gradient
    steps on a steep Riesz energy (which approaches the max-min angle).
    """
    key = (k, m, seed)
    if key in _CODES:
        return _CODES[key]
    if k == 1:
        pts = np.zeros((1, m))
        pts[0, 0] = 1.0
    elif k <= m + 1:
        # regular simplex of k points in the first k-1 coordinates
        e = np.eye(k) - 1.0 / k
        q, _ = np.linalg.qr(e[:, : k - 1])  # orthonormal basis of the sum-zero plane
        pts = np.zeros((k, m))
        pts[:, : k - 1] = e @ q
        pts /= np.linalg.norm(pts, axis=1, keepdims=True)
    else:
        rng = np.random.default_rng(seed)
        pts = rng.standard_normal((k, m))
        pts /= np.linalg.norm(pts, axis=1, keepdims=True)
        s = 2.0 * m
        for it in range(iters):
            diff = pts[:, None, :] - pts[None, :, :]
            d2 = (diff * diff).sum(-1) + np.eye(k)
            w = d2 ** (-(s + 2) / 2)
            np.fill_diagonal(w, 0.0)
            force = (w[..., None] * diff).sum(1)
            force -= (force * pts).sum(1, keepdims=True) * pts  # tangent part
            fn = np.linalg.norm(force, axis=1, keepdims=True)
            dmin = math.sqrt(d2[~np.eye(k, dtype=bool)].min())
            step = 0.1 * dmin * (1 - it / iters) + 1e-3 * dmin
            pts = pts + step * force / np.maximum(fn, 1e-300)
            pts /= np.linalg.norm(pts, axis=1, keepdims=True)
    _CODES[key] = pts
    return pts


def _min_angle(code: np.ndarray) -> float:
    if len(code) < 2:
        return math.pi
    g = np.clip(code @ code.T, -1.0, 1.0)
    np.fill_diagonal(g, -1.0)
    return float(np.arccos(g.max()))


def _ratio(gamma: float, theta_p: float, separation: float, margin: float) -> float:
    """Largest child/parent cap ratio ``r`` for children with tangent directions ``gamma`` apart."""

    def ok(r: float) -> bool:
        a = 1 - r * (1 + margin)
        if a < separation * r:  # the parent's direction stays outside the children's caps
            return False
        alpha = a * theta_p
        cos_w = math.cos(alpha) ** 2 + math.sin(alpha) ** 2 * math.cos(gamma)
        w = math.acos(max(-1.0, min(1.0, cos_w)))
        return w >= separation * 2 * r * theta_p

    lo, hi = 1e-6, 0.5
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo


def _tangent_basis(u: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """(d, d-1) orthonormal basis of the complement of unit ``u``, randomly rotated."""
    d = len(u)
    g = rng.standard_normal((d, d - 1))
    g -= np.outer(u, u @ g)
    q, _ = np.linalg.qr(g)
    return q


@dataclass
class CapPlacement:
    """What :func:`cap_construction` placed: points and the spanning tree."""

    points: torch.Tensor  # (n, d) float64 in the ball of curvature -c
    radius: np.ndarray  # hyperbolic radius of each node (curvature units)
    tree_parent: np.ndarray  # -1 for roots
    info: dict = field(default_factory=dict)


def cap_construction(
    taxonomy: Taxonomy,
    dim: int,
    *,
    curvature: float = 1.0,
    theta0: float = 2.5,
    beta: float = 0.5,
    separation: float = 1.1,
    margin: float = 0.02,
    min_step: float = 1.0,
    seed: int = 0,
) -> CapPlacement:
    """Place every node so that caps nest along a spanning tree (see the module docstring).

    Returns a :class:`CapPlacement`; ``info`` has the largest radius, the
    smallest step, the number of closure pairs the spanning tree cannot
    hold (pairs reached only through a second parent: ``pairs_off_tree``) and
    the number of pairs its folds hold though they are not closure pairs
    (``pairs_folded``, :func:`tree_parents`).
    """
    if dim < 2:
        raise ValueError(f"dim must be at least 2, got {dim}")
    rng = np.random.default_rng(seed)
    n = len(taxonomy)
    tree, order, false_pairs = tree_plan(taxonomy)
    kids: list[list[int]] = [[] for _ in range(n)]
    roots = []
    for i in order:
        (kids[tree[i]] if tree[i] >= 0 else roots).append(i)
    dirs = np.zeros((n, dim))
    rho = np.zeros(n)
    theta = np.zeros(n)
    steps = []

    def place_from_origin(children: list[int]) -> None:
        code = spherical_code(len(children), dim, seed=seed)
        q, _ = np.linalg.qr(rng.standard_normal((dim, dim)))
        cap = min(_min_angle(code) / (2 * separation), theta0 * math.exp(-beta * min_step))
        r0 = math.log(theta0 / cap) / beta
        steps.append(r0)
        for j, ch in enumerate(children):
            dirs[ch] = q @ code[j]
            rho[ch] = r0
            theta[ch] = cap

    if len(roots) == 1:
        theta[roots[0]] = theta0
        place_from_origin(kids[roots[0]])
        todo = [i for i in order if i != roots[0]]
    else:
        place_from_origin(roots)
        todo = list(order)
    for p in todo:
        ch = kids[p]
        if not ch:
            continue
        code = spherical_code(len(ch), dim - 1, seed=seed)
        r = _ratio(_min_angle(code), theta[p], separation, margin)
        a = 1 - r * (1 + margin)
        alpha = a * theta[p]
        basis = _tangent_basis(dirs[p], rng)
        step = -math.log(r) / beta
        steps.append(step)
        for j, c in enumerate(ch):
            t = basis @ code[j]
            v = math.cos(alpha) * dirs[p] + math.sin(alpha) * t
            dirs[c] = v / np.linalg.norm(v)
            rho[c] = rho[p] + step
            theta[c] = theta[p] * r
    norm = np.tanh(rho / 2) / math.sqrt(curvature)
    points = torch.from_numpy(dirs * norm[:, None])
    # closure pairs outside the spanning tree's ancestor chains
    tree_anc = np.zeros(n, dtype=np.int64)
    for i in order:
        if tree[i] >= 0:
            tree_anc[i] = tree_anc[tree[i]] + 1
    lost = int(len(taxonomy.closure_edges()) - (tree_anc.sum() - false_pairs))
    info = {
        "max_radius": float(rho.max()) if n else 0.0,
        "min_step": float(min(steps)) if steps else 0.0,
        "max_step": float(max(steps)) if steps else 0.0,
        "pairs_off_tree": lost,
        "pairs_folded": int(false_pairs),
    }
    return CapPlacement(points=points, radius=rho, tree_parent=tree, info=info)
