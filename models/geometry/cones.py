r"""Hyperbolic entailment cones (Ganea et al. 2018) in the ball of curvature :math:`-c`.

The cone of a point :math:`x` holds the points :math:`y` whose geodesic from
:math:`x` leaves within the half-aperture :math:`\psi(x)` of the ray from the
origin through :math:`x`. Ganea et al. work in the unit ball; for curvature
:math:`-c` everything is evaluated on :math:`z = \sqrt c\,x` (the map
:math:`x \mapsto \sqrt c\,x` is a similarity of the two balls, so angles are the
same), as ``shared/testdata/geometry_reference.json`` does:

.. math::

    \psi(x) = \arcsin\left(K\frac{1 - \|z\|^2}{\|z\|}\right),\qquad
    \Xi(x, y) = \arccos\frac{\langle z_x, z_y\rangle(1 + \|z_x\|^2) - \|z_x\|^2(1 + \|z_y\|^2)}
        {\|z_x\|\,\|z_x - z_y\|\sqrt{1 + \|z_x\|^2\|z_y\|^2 - 2\langle z_x, z_y\rangle}}

and the energy :math:`E(x, y) = \max(0, \Xi(x, y) - \psi(x))`.

Accuracy. The arccos form loses half the digits near 0 and π (an angle of
1e-9 comes out with an error of about 1e-8), and near the boundary the
apertures are that small (:math:`\psi \approx K(1 - \|z\|^2)`, 2e-13 at a
hyperbolic radius of 30). So :math:`\Xi` is computed as the angle between
:math:`x` and the initial direction of the geodesic to :math:`y`, i.e. the
numerator :math:`n = g\,\delta - c\|\delta\|^2 x` of :math:`(-x)\oplus y`
(:math:`\delta = y - x`, :math:`g = 1 - c\|x\|^2`):

.. math::

    \Xi(x, y) = \operatorname{atan2}\left(g\,\|\delta_\perp\|,\;
        g\langle\delta, \hat x\rangle - c\|\delta\|^2\|x\|\right),
    \qquad \delta_\perp = \delta - \langle\delta, \hat x\rangle\hat x

which is algebraically Ganea's closed form (the cosine's numerator is
:math:`\langle n, x\rangle`) with an absolute error of a few ulp at every
angle. :math:`\Xi(x, x) = 0` (the apex belongs to its cone).

References
----------
* O.-E. Ganea, G. Bécigneul, T. Hofmann, "Hyperbolic Entailment Cones for
  Learning Hierarchical Embeddings", ICML 2018.
"""

from __future__ import annotations

import math

import torch

from . import numerics as nm
from . import poincare

__all__ = [
    "cone_angle",
    "cone_energy",
    "half_aperture",
    "in_cone",
    "inner_radius",
    "pairwise_cone_angle",
    "pairwise_cone_energy",
]

Curvature = float | torch.Tensor


def _inner_z(K: float) -> float:
    # root of K(1 - r^2) = r, in the form without cancellation
    if not K > 0:
        raise ValueError(f"cone constant K must be positive, got {K}")
    return 2 * K / (1 + math.sqrt(1 + 4 * K * K))


def inner_radius(*, c: Curvature, K: float = 0.1):
    r"""Smallest norm where the half-aperture is defined.

    .. math::

        K\frac{1 - r_z^2}{r_z} = 1 \iff r_z = \frac{2K}{1 + \sqrt{1 + 4K^2}},
        \qquad r = r_z/\sqrt c

    Python float for a python ``c``, tensor for a tensor ``c``.
    """
    rz = _inner_z(K)
    if torch.is_tensor(c):
        return rz / c.sqrt()
    nm.max_norm(c)  # validates a python curvature
    return rz / math.sqrt(float(c))


def half_aperture(x: torch.Tensor, *, c: Curvature, K: float = 0.1) -> torch.Tensor:
    r"""Half-aperture of the cone at ``x``, (..., d) -> (...).

    .. math::

        \psi(x) = \arcsin\left(K\frac{1 - c\|x\|^2}{\sqrt c\|x\|}\right)

    with :math:`\sqrt c\|x\|` clamped up to :func:`inner_radius` (where
    :math:`\psi = \pi/2`; the arcsin argument is kept below 1 by eps
    "angle" so the gradient stays finite).
    """
    c_t = nm.as_curvature(c, x)
    rz = _inner_z(K)
    t = c_t.sqrt() * nm.safe_norm(x)
    inside = t < rz
    g = torch.where(inside, torch.full_like(t, 1 - rz * rz), poincare.gap(x, c=c))
    t = torch.where(inside, torch.full_like(t, rz), t)
    return torch.asin((K * g / t).clamp_max(1 - nm.eps(x.dtype, "angle")))


def _atan2(s: torch.Tensor, cpart: torch.Tensor) -> torch.Tensor:
    # atan2 with value 0 and zero gradient at (0, 0) (the pair x = y)
    ok = (s * s + cpart * cpart) > nm.eps(s.dtype, "tiny")
    return torch.where(
        ok,
        torch.atan2(
            torch.where(ok, s, torch.zeros_like(s)), torch.where(ok, cpart, torch.ones_like(cpart))
        ),
        torch.zeros_like(s),
    )


def cone_angle(x: torch.Tensor, y: torch.Tensor, *, c: Curvature) -> torch.Tensor:
    r"""Angle :math:`\Xi(x, y)` at ``x`` between the ray 0 -> ``x`` and the geodesic ``x`` -> ``y``.

    Broadcasts (e.g. ``x`` (n, 1, d) against ``y`` (1, m, d)); values in
    :math:`[0, \pi]`. See the module docstring for the formula.
    """
    c_t = nm.as_curvature(c, x)
    gx = poincare.gap(x, c=c)
    nx = nm.safe_norm(x, keepdim=True)
    xhat = x / nx.clamp_min(nm.eps(x.dtype, "norm"))
    delta = y - x
    par = (delta * xhat).sum(-1, keepdim=True)
    perp = nm.safe_norm(delta - par * xhat)
    sq = (delta * delta).sum(-1)
    return _atan2(gx * perp, gx * par.squeeze(-1) - c_t * sq * nx.squeeze(-1))


def cone_energy(x: torch.Tensor, y: torch.Tensor, *, c: Curvature, K: float = 0.1) -> torch.Tensor:
    r"""Cone violation :math:`E(x, y) = \max(0, \Xi(x, y) - \psi(x))` (0 inside the cone of x)."""
    return torch.relu(cone_angle(x, y, c=c) - half_aperture(x, c=c, K=K))


def in_cone(
    x: torch.Tensor, y: torch.Tensor, *, c: Curvature, K: float = 0.1, tol: float = 0.0
) -> torch.Tensor:
    r"""Whether ``y`` is in the cone of ``x``: :math:`\Xi(x, y) \le \psi(x) + \text{tol}` (bool)."""
    return cone_angle(x, y, c=c) <= half_aperture(x, c=c, K=K) + tol


def pairwise_cone_angle(x: torch.Tensor, y: torch.Tensor, *, c: Curvature) -> torch.Tensor:
    r""":func:`cone_angle` of every pair, (..., n, d) apexes, (..., m, d) -> (..., n, m).

    Built from :math:`\|x\|^2`, :math:`\|y\|^2` and :math:`xy^\top` (float64):
    :math:`\|\delta\|^2 = \|x\|^2 + \|y\|^2 - 2\langle x, y\rangle`,
    :math:`\langle\delta, \hat x\rangle = (\langle x, y\rangle - \|x\|^2)/\|x\|`,
    :math:`\|\delta_\perp\|^2 = \|y\|^2 - \langle x, y\rangle^2/\|x\|^2`. Pairs
    where these cancel (nearly equal points, or ``y`` within about 0.2° of the
    ray through ``x``: precisely the pairs that decide cone membership) are
    recomputed with :func:`cone_angle`, in bounded chunks.
    """
    xb, yb, batch = nm.flatten_pair(x, y)
    c64 = c.to(torch.float64) if torch.is_tensor(c) else c
    c_t = nm.as_curvature(c64, xb)
    gx = poincare.gap(xb, c=c64)[..., :, None]
    tau = nm.eps(torch.float64, "cancel")
    floor = nm.eps(torch.float64, "norm") ** 2

    def fast(x2, y2, xy):
        x2s = x2.clamp_min(floor)
        nx = x2s.sqrt()
        sq = (x2 + y2 - 2 * xy).clamp_min(0)
        perp2 = (y2 - xy * xy / x2s).clamp_min(0)
        angle = _atan2(gx * nm.safe_sqrt(perp2), gx * (xy - x2) / nx - c_t * sq * nx)
        flag = (sq <= tau * (x2 + y2)) | (perp2 <= tau * y2)
        return angle, flag

    def exact(b, i, j):
        return cone_angle(xb[b, i], yb[b, j], c=c64)

    out = nm.gram_pairwise(xb, yb, fast, exact)
    return out.reshape(*batch, x.shape[-2], y.shape[-2]).to(x.dtype)


def pairwise_cone_energy(
    x: torch.Tensor, y: torch.Tensor, *, c: Curvature, K: float = 0.1
) -> torch.Tensor:
    r""":func:`cone_energy` of every pair, (..., n, d) apexes, (..., m, d) -> (..., n, m).

    :math:`\max(0, \Xi(x_i, y_j) - \psi(x_i))` with :func:`pairwise_cone_angle`.
    """
    return torch.relu(pairwise_cone_angle(x, y, c=c) - half_aperture(x, c=c, K=K)[..., :, None])
