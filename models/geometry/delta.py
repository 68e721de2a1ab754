r"""Gromov δ-hyperbolicity of a finite metric space, as Khrulkov et al. 2020 and Hyp-ViT compute it.

With a base point :math:`w`, the Gromov product is

.. math::

    (x|y)_w = \tfrac12\left(d(x, w) + d(y, w) - d(x, y)\right),

and with :math:`A_{ij} = (x_i|x_j)_w` the (max, min) matrix product
:math:`(A \otimes A)_{ij} = \max_k \min(A_{ik}, A_{kj})` gives

.. math::

    \delta_w = \max_{ij}\left((A \otimes A)_{ij} - A_{ij}\right),

the smallest δ for which every quadruple containing :math:`w` satisfies the
four-point condition (:math:`\delta_w \le \delta \le 2\delta_w`). Trees give
0. The scale-free :math:`\delta_{rel} = 2\delta/\operatorname{diam}` is about
0.144 for points sampled in a Poincaré ball; Khrulkov et al. suggest the
curvature :math:`c = (0.144/\delta_{rel})^2` for embedding data with a given
:math:`\delta_{rel}`.

References
----------
* V. Khrulkov, L. Mirvakhabova, E. Ustinova, I. Oseledets, V. Lempitsky,
  "Hyperbolic Image Embeddings", CVPR 2020.
* A. Ermolov, L. Mirvakhabova, V. Khrulkov, N. Sebe, I. Oseledets,
  "Hyperbolic Vision Transformers: Combining Improvements in Metric
  Learning", CVPR 2022.
* M. Gromov, "Hyperbolic groups", 1987.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch

from . import numerics as nm
from . import poincare

__all__ = ["delta_hyperbolicity", "gromov_delta"]

# Elements of one (b, b, n) block of the max-min product: 2**20 float64 = 8 MiB (cache-sized).
_BLOCK_ELEMS = 1 << 20

#: delta_rel of points sampled in a Poincaré ball (Khrulkov et al. 2020).
POINCARE_DELTA_REL = 0.144


def _as_tensor(a) -> torch.Tensor:
    if torch.is_tensor(a):
        return a.detach()
    return torch.as_tensor(np.asarray(a))


def gromov_delta(dist_matrix, base: int = 0) -> float:
    r"""δ of a distance matrix w.r.t. the base point ``base`` (see the module docstring).

    .. math::

        \delta = \max_{ij}\left(\max_k \min(A_{ik}, A_{kj}) - A_{ij}\right),\qquad
        A_{ij} = \tfrac12(D_{iw} + D_{jw} - D_{ij})

    ``dist_matrix``: (n, n) array or tensor, symmetric with a zero diagonal.
    The max-min product is formed in (b, b, n) blocks of about 2**20 elements
    over the upper triangle, so memory stays :math:`O(n^2)`; time is
    :math:`O(n^3/2)` (a few seconds for n = 1500 on two cores).
    """
    D = _as_tensor(dist_matrix)
    if not D.is_floating_point():
        D = D.to(torch.float64)
    if D.dim() != 2 or D.shape[0] != D.shape[1]:
        raise ValueError(f"dist_matrix must be square (n, n), got {tuple(D.shape)}")
    n = D.shape[0]
    if not 0 <= base < n:
        raise ValueError(f"base {base} out of range for {n} points")
    with torch.no_grad():
        D = 0.5 * (D + D.T)  # exact for a symmetric matrix
        row = D[base]
        A = (0.5 * (row[:, None] + row[None, :] - D)).contiguous()
        # M = A (x) A is symmetric (A is): blocks (i, j >= i) cover every pair once.
        # Since A_ij = A_ji, M_ij = max_k min(A_ik, A_jk): both reductions run along rows.
        b = min(256, max(8, math.isqrt(_BLOCK_ELEMS // n)))
        delta = float("-inf")
        for i in range(0, n, b):
            rows = A[i : i + b]
            for j in range(i, n, b):
                maxmin = torch.minimum(rows[:, None, :], A[None, j : j + b, :]).amax(-1)
                delta = max(delta, float((maxmin - A[i : i + b, j : j + b]).max()))
    return float(delta)


def delta_hyperbolicity(
    points,
    *,
    n_samples: int = 1500,
    seed: int = 0,
    metric: str | Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = "euclidean",
    c: float = 1.0,
) -> dict[str, float]:
    r"""δ-hyperbolicity of a point set (Khrulkov et al. 2020).

    Parameters
    ----------
    points : array or tensor (n, d)
        Sampled without replacement down to ``n_samples`` rows when larger
        (``numpy.random.default_rng(seed)``).
    metric : "euclidean", "poincare" or callable
        "poincare" uses :func:`models.geometry.poincare.pairwise_dist` with
        curvature ``c``; a callable gets two (n, d) float64 tensors and returns
        the (n, n) distance matrix.

    Returns
    -------
    dict
        ``delta`` (:func:`gromov_delta`, base point 0 of the sample),
        ``diameter`` (largest distance), ``delta_rel`` :math:`= 2\delta/\operatorname{diam}`,
        ``suggested_curvature`` :math:`= (0.144/\delta_{rel})^2` (inf when
        :math:`\delta_{rel} = 0`).
    """
    X = _as_tensor(points).to(torch.float64)
    if X.dim() != 2 or X.shape[0] < 1:
        raise ValueError(f"points must be (n, d) with n >= 1, got {tuple(X.shape)}")
    if X.shape[0] > n_samples:
        idx = np.random.default_rng(seed).choice(X.shape[0], size=n_samples, replace=False)
        X = X[torch.as_tensor(idx)]
    with torch.no_grad():
        if callable(metric):
            D = torch.as_tensor(metric(X, X), dtype=torch.float64)
        elif metric == "euclidean":
            D = nm.safe_sqrt(nm.pairwise_sqdist(X, X))
        elif metric == "poincare":
            D = poincare.pairwise_dist(X, X, c=c)
        else:
            raise ValueError(
                f"unknown metric {metric!r} (expected 'euclidean', 'poincare' or a callable)"
            )
    delta = max(gromov_delta(D), 0.0)
    diameter = float(D.max())
    delta_rel = 2 * delta / diameter if diameter > 0 else 0.0
    suggested = (POINCARE_DELTA_REL / delta_rel) ** 2 if delta_rel > 0 else float("inf")
    return {
        "delta": delta,
        "diameter": diameter,
        "delta_rel": delta_rel,
        "suggested_curvature": suggested,
    }
