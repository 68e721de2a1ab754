r"""The hierarchical start: points that respect the hierarchy before any training.

Nodes do not start at random: each node sits at a hyperbolic radius that
grows with its depth, in a direction drawn close to its first parent's
direction (closer the deeper), so descendants begin inside their ancestors'
angular sector. The loss then only has to repair local structure (the
docs/labels.md has the measurements).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ..geometry import poincare
from ..taxonomy.graph import Taxonomy

__all__ = ["hierarchical_start"]


def hierarchical_start(
    taxonomy: Taxonomy,
    dim: int,
    *,
    curvature: float = 1.0,
    step: float = 1.5,
    spread: float = 1.5,
    decay: float = 0.5,
    seed: int = 0,
) -> torch.Tensor:
    r"""Starting points that already respect the hierarchy.

    A root sits at the origin (several roots: at radius ``step`` in random
    directions). A node of depth :math:`\ell \ge 1` sits at hyperbolic radius
    :math:`\text{step}\cdot\ell` in the direction of its first parent's
    direction plus Gaussian noise of scale
    :math:`\text{spread}\cdot\text{decay}^{\ell-1}/\sqrt{d}`.
    """
    rng = np.random.default_rng(seed)
    n = len(taxonomy)
    depth = taxonomy.depths.astype(np.int64)
    parents = [taxonomy.parent_ids(i) for i in range(n)]
    multi_root = len(taxonomy.roots()) > 1
    dirs = np.zeros((n, dim))
    radius = np.zeros(n)
    noise = rng.standard_normal((n, dim))
    for i in np.argsort(depth, kind="stable"):
        g = noise[i]
        ps = [p for p in parents[i] if depth[p] < depth[i]]
        if not ps:  # a root
            dirs[i] = g / np.linalg.norm(g)
            radius[i] = step if multi_root else 0.0
            continue
        p = ps[0]
        base = dirs[p] if radius[p] > 0 else np.zeros(dim)
        level = depth[i] if not multi_root else depth[i] + 1
        v = base + spread * decay ** max(level - 1, 0) * g / math.sqrt(dim)
        dirs[i] = v / np.linalg.norm(v)
        radius[i] = step * level
    x = torch.from_numpy(dirs) * poincare.radius_to_norm(
        torch.from_numpy(radius), c=curvature
    ).unsqueeze(-1)
    return poincare.project(x, c=curvature)
