"""Seeded synthetic data: hierarchical point clouds in the Poincaré ball.

Used by the tests and by ``benchmarks/ann.py``.  The generator builds a tree of
directions (a coarse-to-fine hierarchy, like a taxonomy) and samples points
around its nodes; deeper nodes sit closer to the boundary of the ball, as
hyperbolic embeddings of hierarchies do.  Most norms fall in
``[0.9, 0.999] / sqrt(c)``; a fraction ``boundary_fraction`` lies beyond
``0.999 / sqrt(c)`` (up to ``1 - 1e-5``), which is where float32 arithmetic
starts to hurt.
"""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass, field

import numpy as np

__all__ = ["HierarchicalCloud", "hierarchical_cloud"]


@dataclass
class HierarchicalCloud:
    """A fixed random hierarchy of directions; ``sample`` draws points from it.

    ``depth`` levels of ``branching`` children per node; ``seed`` fixes the
    hierarchy (``sample`` takes its own seed for the points)."""

    dim: int
    _: KW_ONLY
    curvature: float = 1.0
    seed: int = 0
    depth: int = 4
    branching: int = 6
    boundary_fraction: float = 0.05
    #: ``levels[l]``: the unit directions of the nodes of level ``l``, ``(n_l, dim)``
    levels: list[np.ndarray] = field(init=False, repr=False)
    #: ``parents[l]``: the index in ``levels[l - 1]`` of each node's parent (-1 at the top)
    parents: list[np.ndarray] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.dim < 2:
            raise ValueError("dim must be >= 2")
        self.dim = dim = int(self.dim)
        self.curvature = float(self.curvature)
        self.depth = depth = int(self.depth)
        self.boundary_fraction = float(self.boundary_fraction)
        branching = int(self.branching)
        rng = np.random.default_rng(self.seed)
        levels = []
        parents = []
        cur = rng.standard_normal((branching, dim))
        cur /= np.linalg.norm(cur, axis=1, keepdims=True)
        levels.append(cur)
        parents.append(np.full(branching, -1))
        spread = 0.6
        for _ in range(1, depth):
            par = np.repeat(np.arange(len(cur)), branching)
            child = cur[par] + spread * rng.standard_normal((len(par), dim)) / np.sqrt(dim)
            child /= np.linalg.norm(child, axis=1, keepdims=True)
            levels.append(child)
            parents.append(par)
            cur = child
            spread *= 0.6
        self.levels = levels
        self.parents = parents

    def sample(self, n: int, seed: int | np.random.Generator = 1) -> np.ndarray:
        """``n`` float64 points of the ball of curvature ``c`` (norm < 1/sqrt(c))."""
        rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
        level = rng.integers(0, self.depth, size=n)
        out = np.empty((n, self.dim))
        u = np.empty(n)
        for lv in range(self.depth):
            sel = np.nonzero(level == lv)[0]
            if len(sel) == 0:
                continue
            nodes = self.levels[lv]
            pick = rng.integers(0, len(nodes), size=len(sel))
            noise = 0.25 * (0.6**lv) * rng.standard_normal((len(sel), self.dim)) / np.sqrt(self.dim)
            d = nodes[pick] + noise
            out[sel] = d / np.linalg.norm(d, axis=1, keepdims=True)
            # deeper levels closer to the boundary: 1 - r = 10**-u, u in [1, 3]
            lo = 1.0 + 2.0 * lv / self.depth
            hi = 1.0 + 2.0 * (lv + 1) / self.depth
            u[sel] = rng.uniform(lo, hi, size=len(sel))
        far = rng.random(n) < self.boundary_fraction
        u[far] = rng.uniform(3.0, 5.0, size=int(far.sum()))
        r = 1.0 - 10.0 ** (-u)
        return out * (r / np.sqrt(self.curvature))[:, None]


def hierarchical_cloud(
    n: int, dim: int, *, curvature: float = 1.0, seed: int = 0, n_queries: int = 0, **kw
) -> tuple[np.ndarray, np.ndarray]:
    """``(points, queries)``: ``n`` points and ``n_queries`` fresh queries of one cloud."""
    cloud = HierarchicalCloud(dim, curvature=curvature, seed=seed, **kw)
    rng = np.random.default_rng(seed + 1_000_003)
    pts = cloud.sample(n, rng)
    qs = cloud.sample(n_queries, rng) if n_queries else np.empty((0, dim))
    return pts, qs
