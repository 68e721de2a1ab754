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
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from ..taxonomy.graph import Taxonomy

__all__ = [
    "CapPlacement",
    "cap_construction",
    "moved_outward",
    "spherical_code",
    "tree_parents",
    "tree_plan",
]


def tree_parents(taxonomy: Taxonomy, *, general: bool = False) -> tuple[np.ndarray, list[int]]:
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
    tree, order, _ = tree_plan(taxonomy, general=general)
    return tree, order


def tree_plan(taxonomy: Taxonomy, *, general: bool = False) -> tuple[np.ndarray, list[int], int]:
    """:func:`tree_parents` and the number of pairs its folds hold falsely.

    ``general``: a folded chain node may have children besides the one it
    leads to (e.g. ``causal_agent.n.01``, the second parent of
    ``person.n.01``, with the agents beside the persons); its other
    descendants come along into the chosen parent's cap, as false
    descendants of the chosen parent's tree ancestors below the chain's top.
    The count returned is exact (tree-ancestor pairs that are not closure
    pairs).
    """
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

    def tree_chain(m: int) -> list[int]:
        out = [m]
        while tree[out[-1]] >= 0:
            out.append(int(tree[out[-1]]))
        return out

    def pass_through(q: int, v: int, m: int) -> tuple[list[int], int] | None:
        """The chain from ``q`` up to below an ancestor of ``m``, and its cost.

        With ``general`` folds a chain node may have other children: they
        and their descendants come along, each a false descendant of the
        tree ancestors of ``m`` below the chain's top ``a`` (counted in the
        cost, so the fold is made only where the pairs gained outnumber them).
        """
        up = set(taxonomy.ancestor_ids(m).tolist()) | {m}
        on_tree = set(tree_chain(m))
        chain, below = [], v
        while (
            len(parents[q]) == 1
            and (children[q] == (below,) or (general and below in children[q]))
            and not folded[q]
            and q not in up
            and q not in on_tree
        ):
            chain.append(q)
            a = parents[q][0]
            if a in up:
                top = set(taxonomy.ancestor_ids(a).tolist()) | {a}
                along = int(n_desc[chain[-1]]) - int(n_desc[v])  # nodes that come along
                return chain, along * sum(t not in top for t in tree_chain(m))
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
    held, tree_pairs = _held_pairs(tree, out, edges)
    return tree, out, int(tree_pairs - held.sum())


def _euler(tree: np.ndarray, order: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Entry and exit times of a top-down ``order`` of the forest ``tree``:
    ``a`` is a tree ancestor of ``u`` (or ``u``) iff ``tin[a] <= tin[u] < tout[a]``."""
    n = len(tree)
    kids: list[list[int]] = [[] for _ in range(n)]
    roots = []
    for i in order:
        (kids[tree[i]] if tree[i] >= 0 else roots).append(i)
    tin = np.zeros(n, dtype=np.int64)
    tout = np.zeros(n, dtype=np.int64)
    t = 0
    stack = [(r, False) for r in reversed(roots)]
    while stack:
        v, done = stack.pop()
        if done:
            tout[v] = t
            continue
        tin[v] = t
        t += 1
        stack.append((v, True))
        stack.extend((k, False) for k in reversed(kids[v]))
    return tin, tout


def _held_pairs(tree: np.ndarray, order: list[int], edges: np.ndarray) -> tuple[np.ndarray, int]:
    """Which closure pairs ``(u, a)`` the tree holds (``a`` a tree ancestor of ``u``), and
    the number of tree-ancestor pairs."""
    tin, tout = _euler(tree, order)
    depth = np.zeros(len(tree), dtype=np.int64)
    for i in order:
        if tree[i] >= 0:
            depth[i] = depth[tree[i]] + 1
    if len(edges) == 0:
        return np.zeros(0, dtype=bool), int(depth.sum())
    u, a = edges[:, 0], edges[:, 1]
    return (tin[a] <= tin[u]) & (tin[u] < tout[a]), int(depth.sum())


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
    # the cap family the caps were made for: theta(x) = theta0 exp(-beta rho(x)), and c
    theta0: float = 2.5
    beta: float = 0.5
    curvature: float = 1.0


def _assign(score: np.ndarray) -> np.ndarray:
    """Greedy assignment of rows to columns by decreasing score, (k, k) -> perm (row -> column).

    Deterministic (stable order on ties); rows of zero score take the columns left.
    """
    k = len(score)
    perm = np.full(k, -1, dtype=np.int64)
    used = np.zeros(k, dtype=bool)
    live = np.flatnonzero(np.abs(score).max(1) > 0) if k else np.zeros(0, dtype=np.int64)
    if len(live):
        sub = score[live]
        flat = np.argsort(-sub, axis=None, kind="stable")
        rows, cols = np.unravel_index(flat, sub.shape)
        left = len(live)
        for r, c in zip(rows.tolist(), cols.tolist(), strict=True):
            if perm[live[r]] < 0 and not used[c]:
                perm[live[r]] = c
                used[c] = True
                left -= 1
                if left == 0:
                    break
    free = iter(np.flatnonzero(~used).tolist())
    for r in range(k):
        if perm[r] < 0:
            perm[r] = next(free)
    return perm


def _arrange(code: np.ndarray, pull: np.ndarray, tie: np.ndarray | None, iters: int = 6):
    """Rotate a spherical code and assign its points to children, so that each child
    points where its pairs off the tree lie.

    ``code`` (k, m) unit vectors; ``pull`` (k, m): for each child the sum of unit
    directions (in the code's space) towards the nodes its subtree has pairs with
    outside the parent's subtree; ``tie`` (k, k): pairs between the children's
    subtrees (siblings pulled towards each other). Alternates the best rotation
    for an assignment (orthogonal Procrustes) and the best assignment for a
    rotation (greedy). Returns (Q, perm): child ``i`` gets ``Q @ code[perm[i]]``.
    """
    k, m = code.shape
    perm = np.arange(k)
    rot = np.eye(m)
    for _ in range(iters):
        slots = code[perm] @ rot.T
        g = pull + (tie @ slots if tie is not None else 0.0)
        u, _, vt = np.linalg.svd(g.T @ code[perm])
        rot = u @ vt
        new = _assign(g @ (code @ rot.T).T)
        if np.array_equal(new, perm):
            break
        perm = new
    g = pull + (tie @ (code[perm] @ rot.T) if tie is not None else 0.0)
    u, _, vt = np.linalg.svd(g.T @ code[perm])
    return u @ vt, perm


class _OffTree:
    """The closure pairs the spanning tree does not hold, indexed for the layout.

    Each pair ``(u, a)`` is kept twice, once from each end; ``pulls(p, kids)``
    gives, for the children of ``p``, the unit directions towards the other
    ends that lie outside ``p``'s subtree (through the deepest placed node
    above each, ``place``) and the counts of pairs between the children's
    subtrees.
    """

    def __init__(self, tree, order, edges, n):
        held, _ = _held_pairs(tree, order, edges)
        off = edges[~held] if len(edges) else np.zeros((0, 2), dtype=np.int64)
        self.tin, self.tout = _euler(tree, order)
        near = np.concatenate([off[:, 0], off[:, 1]])
        far = np.concatenate([off[:, 1], off[:, 0]])
        key = self.tin[near]
        o = np.argsort(key, kind="stable")
        self.key, self.far = key[o], far[o]
        self.count = len(off)
        # deepest placed tree ancestor (or self) of each node, by entry time
        self.placed = np.full(n, -1, dtype=np.int64)
        self.node_at = np.empty(n, dtype=np.int64)
        self.node_at[self.tin] = np.arange(n)

    def mark(self, c: int) -> None:
        self.placed[self.tin[c] : self.tout[c]] = c

    def pulls(self, p: int, kids: list[int], dirs: np.ndarray):
        k, d = len(kids), dirs.shape[1]
        lo = np.searchsorted(self.key, self.tin[p] if p >= 0 else 0, side="left")
        hi = np.searchsorted(self.key, self.tout[p] if p >= 0 else len(self.placed), side="left")
        if lo == hi:
            return None, None
        near, far = self.key[lo:hi], self.far[lo:hi]
        ktin = self.tin[np.asarray(kids)]
        kor = np.argsort(ktin, kind="stable")
        kt = ktin[kor]
        which = np.searchsorted(kt, near, side="right") - 1
        ok = which >= 0
        ok[ok] &= near[ok] < self.tout[np.asarray(kids)[kor[which[ok]]]]
        near, far, which = near[ok], far[ok], kor[which[ok]]
        ft = self.tin[far]
        inside = (ft >= self.tin[p]) & (ft < self.tout[p]) if p >= 0 else np.ones(len(ft), bool)
        pull = np.zeros((k, d))
        ext = ~inside
        if ext.any():
            to = self.placed[ft[ext]]
            keep = to >= 0
            e = dirs[to[keep]]
            if p >= 0:
                e = e - (e @ dirs[p])[:, None] * dirs[p]
            nrm = np.linalg.norm(e, axis=1)
            good = nrm > 1e-12
            np.add.at(pull, which[ext][keep][good], e[good] / nrm[good, None])
        tie = None
        if inside.any():
            wf = np.searchsorted(kt, ft[inside], side="right") - 1
            good = wf >= 0
            wf_k = kor[wf[good]]
            wn = which[inside][good]
            diff = wf_k != wn
            if diff.any():
                tie = np.zeros((k, k))
                np.add.at(tie, (wn[diff], wf_k[diff]), 1.0)
        if not pull.any() and tie is None:
            return None, None
        return pull, tie


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
    layout: str = "pull",
    folds: str = "general",
    outward: float = 0.0,
    max_radius: float = 32.0,
    toward: float = 0.98,
    widen: float = 0.6,
) -> CapPlacement:
    """Place every node so that caps nest along a spanning tree (see the module docstring).

    ``layout``: ``"pull"`` (the default) turns and assigns each node's
    children so that every subtree lies towards the nodes it has closure
    pairs with off the tree (second parents and their ancestors, pulled from
    both ends; :func:`_arrange`), ``"random"`` a random rotation (the layout
    before). ``folds``: ``"general"`` (the default) or ``"pass-through"``
    (:func:`tree_plan`'s ``general``).

    Returns a :class:`CapPlacement`; ``info`` has the largest radius, the
    smallest step, the number of closure pairs the spanning tree cannot
    hold (pairs reached only through a second parent: ``pairs_off_tree``) and
    the number of pairs its folds hold though they are not closure pairs
    (``pairs_folded``, :func:`tree_parents`).

    ``outward`` (> 0): then (:mod:`models.labels.outward`) the open children
    of every open node are widened in its cap (``widen``: the share of the way
    their weighted centre moves to the cap's centre; 0 skips it), and every
    closed subtree (no node outside it has an ancestor off the tree inside
    it) moves outward by up to ``outward`` in radius, shrinking towards its
    off-tree partners' side (``toward``: how far from its root's direction
    to the rim of its cap; 0 shrinks towards its root's direction), top down,
    no radius past ``max_radius``: the ancestors reached through second
    parents rank far better, the caps still nest as they did
    (``outward_moved``, ``outward_mean_push``, ``outward_widened`` in ``info``).
    """
    if dim < 2:
        raise ValueError(f"dim must be at least 2, got {dim}")
    if layout not in ("pull", "random"):
        raise ValueError(f"layout must be 'pull' or 'random', got {layout!r}")
    if folds not in ("general", "pass-through"):
        raise ValueError(f"folds must be 'general' or 'pass-through', got {folds!r}")
    if not (outward >= 0 and math.isfinite(outward)):
        raise ValueError(f"outward must be a finite number >= 0, got {outward}")
    if not (0 < max_radius <= 36.0):
        raise ValueError(f"max_radius must be in (0, 36], got {max_radius}")
    if not 0 <= toward < 1:
        raise ValueError(f"toward must be in [0, 1), got {toward}")
    if not 0 <= widen <= 1:
        raise ValueError(f"widen must be in [0, 1], got {widen}")
    rng = np.random.default_rng(seed)
    n = len(taxonomy)
    edges = taxonomy.closure_edges()
    tree, order, false_pairs = tree_plan(taxonomy, general=folds == "general")
    kids: list[list[int]] = [[] for _ in range(n)]
    roots = []
    for i in order:
        (kids[tree[i]] if tree[i] >= 0 else roots).append(i)
    dirs = np.zeros((n, dim))
    rho = np.zeros(n)
    theta = np.zeros(n)
    steps = []
    off = _OffTree(tree, order, edges, n) if layout == "pull" else None

    def arranged(p: int, children: list[int], code: np.ndarray, basis: np.ndarray):
        """Unit vectors (in the basis' space) of the children: pulled, or the code as drawn."""
        if off is not None:
            pull, tie = off.pulls(p, children, dirs)
            if pull is not None:
                rot, perm = _arrange(code, pull @ basis, tie)
                out = code[perm] @ rot.T
                for c in children:
                    off.mark(c)
                return out
            for c in children:
                off.mark(c)
        return code

    def place_from_origin(children: list[int], p: int) -> None:
        code = spherical_code(len(children), dim, seed=seed)
        q, _ = np.linalg.qr(rng.standard_normal((dim, dim)))
        cap = min(_min_angle(code) / (2 * separation), theta0 * math.exp(-beta * min_step))
        r0 = math.log(theta0 / cap) / beta
        steps.append(r0)
        vec = arranged(p, children, code, q)
        for j, ch in enumerate(children):
            dirs[ch] = q @ vec[j]
            rho[ch] = r0
            theta[ch] = cap

    if len(roots) == 1:
        theta[roots[0]] = theta0
        if off is not None:
            off.mark(roots[0])
        place_from_origin(kids[roots[0]], roots[0])
        todo = [i for i in order if i != roots[0]]
    else:
        place_from_origin(roots, -1)
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
        vec = arranged(p, ch, code, basis)
        for j, c in enumerate(ch):
            t = basis @ vec[j]
            v = math.cos(alpha) * dirs[p] + math.sin(alpha) * t
            dirs[c] = v / np.linalg.norm(v)
            rho[c] = rho[p] + step
            theta[c] = theta[p] * r
    held, _ = _held_pairs(tree, order, edges)
    norm = np.tanh(rho / 2) / math.sqrt(curvature)
    points = torch.from_numpy(dirs * norm[:, None])
    info = {
        "max_radius": float(rho.max()) if n else 0.0,
        "min_step": float(min(steps)) if steps else 0.0,
        "max_step": float(max(steps)) if steps else 0.0,
        "pairs_off_tree": int(len(edges) - held.sum()),
        "pairs_folded": int(false_pairs),
        "layout": layout,
        "folds": folds,
    }
    placed = CapPlacement(points, rho, tree, info, theta0, beta, curvature)
    if outward > 0:
        placed = moved_outward(
            taxonomy, placed, outward=outward, max_radius=max_radius, toward=toward, widen=widen
        )
    return placed


def moved_outward(
    taxonomy: Taxonomy,
    placed: CapPlacement,
    *,
    outward: float,
    max_radius: float = 32.0,
    toward: float = 0.98,
    widen: float = 0.6,
) -> CapPlacement:
    """A cap construction with its closed subtrees moved outward (:mod:`models.labels.outward`;
    ``cap_construction(..., outward=...)`` in one call): first, with ``widen`` > 0, the
    open children widened in their parents' caps (``widen_open``), then the closed
    subtrees pushed (``push_outward``, towards their off-tree partners by ``toward``)."""
    from .outward import crossing_pairs, push_outward, widen_open

    tree = placed.tree_parent
    order = _top_down(tree)
    edges = taxonomy.closure_edges()
    held, _ = _held_pairs(tree, order, edges)
    tin, tout = _euler(tree, order)
    off = edges[~held] if len(edges) else edges
    crossing = crossing_pairs(tree, tin, tout, off)
    x = placed.points.numpy()
    nrm = np.linalg.norm(x, axis=1)
    dirs = x / np.maximum(nrm, 1e-300)[:, None]
    dirs, rho, wide = widen_open(
        dirs, placed.radius, tree, order, crossing, tin, tout,
        theta0=placed.theta0, beta=placed.beta, share=widen, max_radius=max_radius,
    )  # fmt: skip
    dirs, rho, moved = push_outward(
        dirs, rho, tree, order, crossing == 0, tin, tout,
        theta0=placed.theta0, beta=placed.beta, room=outward, max_radius=max_radius,
        off=off, toward=toward,
    )  # fmt: skip
    norm = np.tanh(rho / 2) / math.sqrt(placed.curvature)
    info = dict(placed.info, max_radius=float(rho.max()) if len(rho) else 0.0, outward=outward)
    info.update(outward_moved=moved["moved"], outward_mean_push=moved["mean_push"])
    info.update(outward_toward=toward, outward_widen=widen, outward_widened=wide["widened"])
    return replace(placed, points=torch.from_numpy(dirs * norm[:, None]), radius=rho, info=info)


def _top_down(tree: np.ndarray) -> list[int]:
    """A top-down order of the forest ``tree`` (breadth first)."""
    kids: list[list[int]] = [[] for _ in range(len(tree))]
    out = []
    for i in range(len(tree)):
        (kids[tree[i]] if tree[i] >= 0 else out).append(i)
    head = 0
    while head < len(out):
        out.extend(kids[out[head]])
        head += 1
    return out
