r"""Poincaré distance with its analytic gradient, for sparse embedding training.

Training label embeddings touches a few rows of a large table per step; taking
the gradient by hand (instead of through autograd) halves the cost of a step.
The value is the arsinh form of :func:`models.geometry.poincare.dist`; this
module adds the derivative:

.. math::

    d = \frac{2}{\sqrt c}\operatorname{arsinh}\sqrt{q},\quad
    q = \frac{c\|x-y\|^2}{g_x g_y},\quad g_x = 1 - c\|x\|^2

    \frac{\partial d}{\partial x} = \frac{2c}{\sqrt c\,\sqrt{q(1+q)}\,g_x g_y}
        \left((x - y) + \frac{c\|x-y\|^2}{g_x}\,x\right)

(and symmetrically for :math:`y`). At :math:`x = y` the gradient is set to 0
(the distance is not differentiable there; 0 is a subgradient).
"""

from __future__ import annotations

import math

import torch

from . import numerics as nm

__all__ = ["dist_and_grad", "fast_gap"]


def fast_gap(x: torch.Tensor, *, c: float) -> torch.Tensor:
    r"""The plain gap :math:`1 - c\|x\|^2`, floored at eps "boundary" (in float64
    :data:`models.geometry.ranking.GAP_FLOOR`); the torch twin of
    :func:`models.geometry.ranking.fast_gap`.

    A few ulp of 1 (1e-5 relative at a hyperbolic radius of 26): ample for SGD
    steps and cheaper than the error-free :func:`models.geometry.poincare.gap`,
    which evaluation and the exact distances use.
    """
    return (1 - c * (x * x).sum(-1)).clamp_min(nm.eps(x.dtype, "boundary"))


def dist_and_grad(x: torch.Tensor, y: torch.Tensor, *, c: float):
    r"""Distances of ``x`` (B, d) to ``y`` (B, m, d) and their gradients.

    Returns
    -------
    d : (B, m)
        geodesic distances, as :func:`poincare.dist`.
    gx : (B, m, d)
        :math:`\partial d_{bj}/\partial x_b`.
    gy : (B, m, d)
        :math:`\partial d_{bj}/\partial y_{bj}`.
    """
    gapx = fast_gap(x, c=c)[:, None]  # (B, 1)
    gapy = fast_gap(y, c=c)  # (B, m)
    diff = x[:, None, :] - y  # (B, m, d)
    sq = (diff * diff).sum(-1)  # (B, m)
    q = c * sq / (gapx * gapy)
    d = 2 * torch.asinh(nm.safe_sqrt(q)) / math.sqrt(c)
    # dd/dq = 1/(sqrt(c) sqrt(q (1 + q))); dq/dx = 2c/(gx gy) (diff + c sq/gx x)
    tiny = nm.eps(x.dtype, "tiny")
    k = torch.where(
        q > tiny,
        2 * c / (math.sqrt(c) * torch.sqrt((q * (1 + q)).clamp_min(tiny)) * gapx * gapy),
        torch.zeros_like(q),
    )
    csq = c * sq
    gx = k[..., None] * (diff + (csq / gapx)[..., None] * x[:, None, :])
    gy = k[..., None] * (-diff + (csq / gapy)[..., None] * y)
    return d, gx, gy
