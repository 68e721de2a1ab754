r"""The κ-stereographic model: one chart for κ < 0 (Poincaré ball), κ = 0, κ > 0 (sphere).

Thin wrappers with keyword-only curvature ``k`` (python float or 0-d tensor),
continuous through :math:`\kappa = 0`. For :math:`\kappa < 0` every function is
:mod:`models.geometry.poincare` at :math:`c = -\kappa` (accurate up to the
boundary); for :math:`\kappa \ge 0` expmap0, logmap0 and mobius_add are
geoopt's ``geoopt.manifolds.stereographic.math`` (whose ``tan_k`` and
``artan_k`` switch to Taylor series at :math:`\kappa = 0`; imported on first
use), project is the identity, and dist is the kernel below.

The metric is :math:`\left(\frac{2}{1 + \kappa\|x\|^2}\right)^2` times the
Euclidean one, so at :math:`\kappa = 0` it is *4 times* the Euclidean metric:
``dist(x, y, k=0) = 2|x - y|`` and ``expmap0(v, k=0) = v`` (geoopt's
convention, and the limit of the Poincaré formulas as :math:`c \to 0`). A
plain Euclidean factor of a product space is the "euclidean" kind of
:class:`models.geometry.product.ProductSpace`, not this model at κ = 0.

For :math:`\kappa > 0` the coordinates are the stereographic projection of the
sphere of radius :math:`1/\sqrt\kappa` (from its "south pole"); every point of
:math:`\mathbb R^d` is valid and distances reach :math:`\pi/\sqrt\kappa` at
antipodes.

One distance kernel for every κ (with :math:`A_x = 1 + \kappa\|x\|^2`):

.. math::

    d_\kappa(x, y) = 2\sqrt{\frac{\|x-y\|^2}{A_x A_y}}\;
        F_\kappa\!\left(\frac{|\kappa|\,\|x-y\|^2}{A_x A_y}\right),\qquad
    F_\kappa(q) = \begin{cases}
        \operatorname{arsinh}(\sqrt q)/\sqrt q & \kappa < 0\\
        1 & \kappa = 0\\
        \arcsin(\sqrt q)/\sqrt q & \kappa > 0\end{cases}

i.e. :math:`\sinh^2`, resp. :math:`\sin^2`, of :math:`\sqrt{|\kappa|}d/2` is
:math:`|\kappa|\|x-y\|^2/(A_xA_y)`; for κ > 0 this equals geoopt's
:math:`2\tan_\kappa^{-1}\|(-x)\oplus_\kappa y\|`, and it also has a
memory-friendly pairwise form. Near antipodes (q → 1) the spherical distance
keeps only about 8 digits in float64.

References
----------
* G. Bachmann, G. Bécigneul, O.-E. Ganea, "Constant Curvature Graph
  Convolutional Networks", ICML 2020 (κ-stereographic model).
* A. Gu, F. Sala, B. Gunel, C. Ré, "Learning Mixed-Curvature Representations
  in Product Spaces", ICLR 2019.
"""

from __future__ import annotations

import torch

from . import numerics as nm
from . import poincare

__all__ = ["dist", "expmap0", "logmap0", "mobius_add", "pairwise_dist", "project"]

Curvature = float | torch.Tensor


def _gmath():
    # geoopt is imported on first use (κ >= 0): it costs ~0.7 s and its
    # torch.jit.script decorators warn at import; the Poincaré path needs none of it
    from geoopt.manifolds.stereographic import math as gmath

    return gmath


def _k(k: Curvature, like: torch.Tensor) -> tuple[torch.Tensor, float]:
    """k as a 0-d tensor of ``like``'s dtype and device, and its python value (for the branch)."""
    if torch.is_tensor(k):
        if k.dim() != 0:
            raise ValueError("curvature k must be a python float or a 0-d tensor")
        k_val = float(k.detach())
        k_t = k.to(dtype=like.dtype, device=like.device)
    else:
        k_val = float(k)
        k_t = torch.tensor(k_val, dtype=like.dtype, device=like.device)
    if k_val != k_val or abs(k_val) == float("inf"):
        raise ValueError(f"curvature k must be finite, got {k_val}")
    return k_t, k_val


def _neg(k: Curvature, k_t: torch.Tensor):
    # -k for 1 + k|x|^2 = one_minus_c_sqnorm(x, -k): a python k keeps its float64 value
    return -k_t if torch.is_tensor(k) else -float(k)


def _dist_sq(sq: torch.Tensor, ax: torch.Tensor, ay: torch.Tensor, k: torch.Tensor):
    # k >= 0: d = 2 sqrt(sq / (A_x A_y)) * asin(sqrt(q))/sqrt(q), q = k sq / (A_x A_y)
    r2 = sq / (ax * ay)
    return 2 * nm.safe_sqrt(r2) * nm.asinc((k * r2).clamp(0, 1))


def dist(x: torch.Tensor, y: torch.Tensor, *, k: Curvature, keepdim: bool = False) -> torch.Tensor:
    r"""Geodesic distance of the κ-stereographic model (see the module docstring).

    .. math::

        d_\kappa(x, y) = 2\tan_\kappa^{-1}\|(-x)\oplus_\kappa y\|

    κ < 0: :func:`models.geometry.poincare.dist` at :math:`c = -\kappa`;
    κ = 0: :math:`2\|x - y\|`; κ > 0: the sphere's great-circle distance.
    """
    k_t, k_val = _k(k, x)
    if k_val < 0:
        return poincare.dist(x, y, c=_neg(k, k_t), keepdim=keepdim)
    diff = x - y
    sq = (diff * diff).sum(-1, keepdim=keepdim)
    ax = nm.one_minus_c_sqnorm(x, _neg(k, k_t), keepdim=keepdim)
    ay = nm.one_minus_c_sqnorm(y, _neg(k, k_t), keepdim=keepdim)
    return _dist_sq(sq, ax, ay, k_t)


def pairwise_dist(x: torch.Tensor, y: torch.Tensor, *, k: Curvature) -> torch.Tensor:
    r""":func:`dist` of every pair, (..., n, d), (..., m, d) -> (..., n, m), from Gram products.

    κ < 0: :func:`models.geometry.poincare.pairwise_dist`. Otherwise the same
    kernel as :func:`dist` on :func:`~models.geometry.numerics.pairwise_sqdist`.
    """
    k_t, k_val = _k(k, x)
    if k_val < 0:
        return poincare.pairwise_dist(x, y, c=_neg(k, k_t))
    sq = nm.pairwise_sqdist(x, y).to(x.dtype)
    ax = nm.one_minus_c_sqnorm(x, _neg(k, k_t))[..., :, None]
    ay = nm.one_minus_c_sqnorm(y, _neg(k, k_t))[..., None, :]
    return _dist_sq(sq, ax, ay, k_t)


def expmap0(v: torch.Tensor, *, k: Curvature) -> torch.Tensor:
    r"""Exponential map at the origin, :math:`\exp_0^\kappa(v) = \tan_\kappa(\|v\|)\,v/\|v\|`.

    :math:`\tan_\kappa(r) = \tan(\sqrt\kappa r)/\sqrt\kappa` for κ > 0, :math:`r`
    for κ = 0, :math:`\tanh(\sqrt{-\kappa} r)/\sqrt{-\kappa}` for κ < 0 (then
    :func:`models.geometry.poincare.expmap0`).
    """
    k_t, k_val = _k(k, v)
    if k_val < 0:
        return poincare.expmap0(v, c=_neg(k, k_t))
    return _gmath().expmap0(v, k=k_t)


def logmap0(y: torch.Tensor, *, k: Curvature) -> torch.Tensor:
    r"""Logarithmic map at the origin, :math:`\log_0^\kappa(y) = \tan_\kappa^{-1}(\|y\|)\,y/\|y\|`.

    κ < 0: :func:`models.geometry.poincare.logmap0`.
    """
    k_t, k_val = _k(k, y)
    if k_val < 0:
        return poincare.logmap0(y, c=_neg(k, k_t))
    return _gmath().logmap0(y, k=k_t)


def mobius_add(x: torch.Tensor, y: torch.Tensor, *, k: Curvature) -> torch.Tensor:
    r"""κ-Möbius addition.

    .. math::

        x \oplus_\kappa y = \frac{(1 - 2\kappa\langle x,y\rangle - \kappa\|y\|^2)x
                                  + (1 + \kappa\|x\|^2)y}
                                 {1 - 2\kappa\langle x,y\rangle + \kappa^2\|x\|^2\|y\|^2}

    κ < 0: :func:`models.geometry.poincare.mobius_add`; κ = 0: :math:`x + y`.
    """
    k_t, k_val = _k(k, x)
    if k_val < 0:
        return poincare.mobius_add(x, y, c=_neg(k, k_t))
    return _gmath().mobius_add(x, y, k=k_t)


def project(x: torch.Tensor, *, k: Curvature) -> torch.Tensor:
    """Into the model: κ < 0 :func:`models.geometry.poincare.project`; κ ≥ 0 identity."""
    k_t, k_val = _k(k, x)
    if k_val < 0:
        return poincare.project(x, c=_neg(k, k_t))
    return x
