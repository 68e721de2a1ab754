"""Experiments on the nodes of several parents of the cap construction (for noun_closure.py).

* :func:`replace_leaves`: every node of several parents with at most
  ``max_subtree`` tree descendants is tried at the centre of the cap of each
  of its other parents (its subtree laid out below it by the construction's
  recipe, caps still nested and disjoint), and moved there when that lowers
  the sum of its (and its subtree's) ancestors' ranks, the other points fixed.
* :func:`geodesic_scan`: for a node, the rank sum of its ancestors at points
  along the geodesics from its constructed point to each ancestor the tree
  does not hold (the best single position between the branches).

Ranks as ``evaluate_reconstruction``: 1 + the non-ancestors strictly nearer.
"""

from __future__ import annotations

import math

import numpy as np


def dist_arg(x: np.ndarray, pts: np.ndarray) -> np.ndarray:
    """(b, d), (n, d) -> (b, n), monotone in the Poincaré distance (c = 1)."""
    nx = (x * x).sum(-1)
    npt = (pts * pts).sum(-1)
    num = nx[:, None] + npt[None, :] - 2 * x @ pts.T
    return num / ((1 - nx)[:, None] * (1 - npt)[None, :])


class _Ranker:
    def __init__(self, tax):
        n = len(tax)
        self.edges = tax.closure_edges()
        self.starts = np.searchsorted(self.edges[:, 0], np.arange(n + 1))

    def anc(self, u: int) -> np.ndarray:
        return self.edges[self.starts[u] : self.starts[u + 1], 1]

    def ranks(self, nodes, pts: np.ndarray) -> list[np.ndarray]:
        z = dist_arg(pts[nodes], pts)
        out = []
        for r, u in enumerate(nodes):
            row, a = z[r], self.anc(u)
            za = row[a].copy()
            row[a] = np.inf
            row[u] = np.inf
            row.sort()
            out.append(np.searchsorted(row, za, side="left") + 1)
        return out


def replace_leaves(
    tax,
    points: np.ndarray,
    tree: np.ndarray,
    *,
    max_subtree: int = 0,
    separation: float = 1.1,
    margin: float = 0.02,
    seed: int = 0,
):
    """Returns (points, tree, info): info has ``tried``, ``moved``, ``rank_gain`` and
    ``pairs_lost`` (closure pairs the tree held before and not after). The caps are
    the default cap family's (``models.geometry.cones.cone_spec("cap")``)."""
    from models.geometry.cones import cone_spec
    from models.labels.construct import _min_angle, _ratio, _tangent_basis, spherical_code

    cap = cone_spec("cap")
    theta0, beta = cap["theta0"], cap["beta"]

    n = len(tax)
    pts = points.copy()
    tree = tree.copy()
    nrm = np.linalg.norm(pts, axis=1)
    rho = 2 * np.arctanh(np.minimum(nrm, 1 - 1e-16))
    dirs = np.where(nrm[:, None] > 0, pts / np.maximum(nrm, 1e-300)[:, None], 0.0)
    theta = np.minimum(math.pi, theta0 * np.exp(-beta * rho))
    kids: list[list[int]] = [[] for _ in range(n)]
    for i in range(n):
        if tree[i] >= 0:
            kids[tree[i]].append(i)
    rk = _Ranker(tax)

    def subtree(v):
        out = [v]
        h = 0
        while h < len(out):
            out.extend(kids[out[h]])
            h += 1
        return out

    def tree_anc(v):
        out = []
        v = tree[v]
        while v >= 0:
            out.append(v)
            v = tree[v]
        return out

    def lay_out(v, d, rh, th, dst, rng):
        loc = {v: (d, rh, th)}
        for p in subtree(v):
            dp, rp, tp = loc[p]
            ch = kids[p]
            if not ch:
                continue
            code = spherical_code(len(ch), len(dp) - 1, seed=seed)
            r = _ratio(_min_angle(code), tp, separation, margin)
            alpha = (1 - r * (1 + margin)) * tp
            basis = _tangent_basis(dp, rng)
            for j, c in enumerate(ch):
                w = math.cos(alpha) * dp + math.sin(alpha) * (basis @ code[j])
                loc[c] = (w / np.linalg.norm(w), rp - math.log(r) / beta, tp * r)
        for u, (d_, r_, _) in loc.items():
            dst[u] = d_ * math.tanh(r_ / 2)
        return loc

    def angle(x, y):
        return 2 * math.atan2(np.linalg.norm(x - y), np.linalg.norm(x + y))

    placed: dict[int, list[tuple[np.ndarray, float]]] = {}
    tried = moved = lost = 0
    gain = 0.0
    for v in range(n):
        parents = tax.parent_ids(v)
        if len(parents) < 2:
            continue
        sub = subtree(v)
        if len(sub) - 1 > max_subtree:
            continue
        tried += 1
        rng = np.random.default_rng([seed, v])
        base = float(sum(r.sum() for r in rk.ranks(sub, pts)))
        av = set(rk.anc(v).tolist())
        held_now = sum(a in av for a in tree_anc(v))
        best = None
        for q in parents:
            if q == tree[v] or not np.any(dirs[q]):
                continue
            tq, dq = theta[q], dirs[q]
            r = theta[kids[q][0]] / tq if kids[q] else 0.3
            a = 1 - r * (1 + margin)
            basis = _tangent_basis(dq, rng)
            cand = rng.standard_normal((64, basis.shape[1])) @ basis.T
            cand /= np.linalg.norm(cand, axis=1, keepdims=True)
            others = [(dirs[c], theta[c]) for c in kids[q]] + placed.get(q, [])
            if others:
                o = np.array([x for x, _ in others])
                o = o - (o @ dq)[:, None] * dq
                o /= np.maximum(np.linalg.norm(o, axis=1, keepdims=True), 1e-300)
                t = cand[np.argmin((cand @ o.T).max(1))]
            else:
                t = cand[0]
            rc, w = r / 2, None
            for _ in range(30):
                th = rc * tq
                for g in (0.5 * a, 0.3 * a, separation * rc * 1.01):
                    g = max(g, separation * rc * 1.01)
                    x = math.cos(g * tq) * dq + math.sin(g * tq) * t
                    x /= np.linalg.norm(x)
                    if g * tq + th > tq * (1 - margin * rc):
                        continue
                    if all(angle(x, dc) >= separation * (th + tc) for dc, tc in others):
                        w = x
                        break
                if w is not None:
                    break
                rc /= 2
            if w is None:
                continue
            trial = pts.copy()
            loc = lay_out(v, w, rho[q] - math.log(rc) / beta, rc * tq, trial, rng)
            s = float(sum(r.sum() for r in rk.ranks(sub, trial)))
            if s < base and (best is None or s < best[0]):
                held_q = sum(a in av for a in [q, *tree_anc(q)])
                best = (s, q, w, rc * tq, trial, loc, (held_now - held_q) * len(sub))
        if best is None:
            continue
        s, q, w, th, trial, loc, dl = best
        pts = trial
        kids[tree[v]].remove(v)
        tree[v] = q
        placed.setdefault(q, []).append((w, th))
        for u, (d_, r_, t_) in loc.items():
            dirs[u], rho[u], theta[u] = d_, r_, t_
        moved += 1
        lost += dl
        gain += base - s
    info = {"tried": tried, "moved": moved, "rank_gain": gain, "pairs_lost": lost}
    return pts, tree, info


def geodesic_scan(tax, points: np.ndarray, u: int, targets, steps: int = 19):
    """(rank sum at the constructed point, best rank sum along the geodesics towards
    ``targets``, the target and the fraction of the way where it is best)."""
    rk = _Ranker(tax)
    nrm = np.linalg.norm(points, axis=1)

    def hyp(i):
        r = 2 * math.atanh(min(nrm[i], 1 - 1e-16))
        return np.r_[math.cosh(r), math.sinh(r) * points[i] / max(nrm[i], 1e-300)]

    def ball(h):
        r = math.acosh(max(h[0], 1.0))
        return h[1:] / np.linalg.norm(h[1:]) * math.tanh(r / 2)

    base = float(rk.ranks([u], points)[0].sum())
    best = (base, None, 0.0)
    hu = hyp(u)
    trial = points.copy()
    for a in targets:
        ha = hyp(a)
        dist = math.acosh(max(1.0, ha[0] * hu[0] - ha[1:] @ hu[1:]))
        if dist <= 0:
            continue
        for t in np.linspace(0, 1, steps + 2)[1:-1]:
            h = (math.sinh((1 - t) * dist) * hu + math.sinh(t * dist) * ha) / math.sinh(dist)
            trial[u] = ball(h)
            s = float(rk.ranks([u], trial)[0].sum())
            if s < best[0]:
                best = (s, a, float(t))
        trial[u] = points[u]
    return base, best[0], best[1], best[2]
