r"""Hyperbolic entailment cones (Ganea et al. 2018) in the ball of curvature :math:`-c`.

The cone of a point :math:`x` holds the points :math:`y` whose geodesic from
:math:`x` leaves within the half-aperture :math:`\psi(x)` of the ray from the
origin through :math:`x`. Ganea et al. work in the unit ball; for curvature
:math:`-c` everything is evaluated on :math:`z = \sqrt c\,x` (the map
:math:`x \mapsto \sqrt c\,x` is a similarity of the two balls, so angles are the
same), as ``tests/data/geometry_reference.json`` does:

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

Cone families
-------------
Two families share one membership interface (:func:`membership_margin`:
:math:`\ge 0` inside; :func:`contains`; :func:`pairwise_membership_margin`;
:func:`membership_margin_np`, the numpy float64 twin, and
:func:`margin_targets_np` / :func:`margin_to_targets_np`, the same with the
targets' own parts computed once; :func:`aperture`), named
by a family string and its parameters (:data:`FAMILIES`):

* ``ganea`` (``K``): the cones above, margin :math:`\psi(x) - \Xi(x, y)`.
* ``cap`` (``theta0``, ``beta``): each point owns a cap of the sphere at
  infinity seen from the origin, centred on its direction, of angular radius

  .. math::

      \theta(x) = \min\left(\pi,\; \theta_0 e^{-\beta\rho(x)}\right)
        = \min\left(\pi,\; \theta_0
          \left(\frac{1 - \sqrt c\|x\|}{1 + \sqrt c\|x\|}\right)^{\beta}\right),
      \qquad \rho(x) = 2\operatorname{artanh}(\sqrt c\|x\|)

  (:math:`\rho` is the distance to the origin in units of the curvature
  radius), and :math:`y` is in the cone of :math:`x` iff the cap of :math:`y`
  lies in the cap of :math:`x`:

  .. math::

      m(x, y) = \theta(x) - \angle(x, y) - \theta(y) \ge 0,\qquad
      \angle(x, y) = 2\operatorname{atan2}(\|\hat x - \hat y\|, \|\hat x + \hat y\|)

  with :math:`\hat x = x/\|x\|` and :math:`\angle = 0` when either point is the
  origin. Cap inclusion is a partial order (transitive by the triangle
  inequality on the sphere; for :math:`\theta_0 \le \pi` also through the
  origin), so nested caps hold a whole hierarchy. With :math:`\beta = 1/2`
  the caps shrink at the rate at which distances resolve directions (two
  points at radius :math:`\rho` and angle :math:`\varphi` are at distance
  about :math:`2\rho + 2\log\sin(\varphi/2)`): a child can sit a fixed
  fraction of its parent's cap away from the parent's direction at a constant
  radial step, so descendants and siblings stay farther than ancestors, where
  Ganea's apertures (:math:`\sim e^{-\rho}`) force descendants almost exactly
  behind their ancestor. The half-angle form of :math:`\angle` keeps full
  relative accuracy at small angles, where caps of deep points live.

References
----------
* O.-E. Ganea, G. Bécigneul, T. Hofmann, "Hyperbolic Entailment Cones for
  Learning Hierarchical Embeddings", ICML 2018.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from . import numerics as nm
from . import poincare, poincare_np

__all__ = [
    "DEFAULT_PARAMS",
    "FAMILIES",
    "aperture",
    "aperture_np",
    "cap_aperture",
    "cap_margin",
    "cone_spec",
    "contains",
    "format_cone",
    "membership_margin",
    "membership_margin_np",
    "margin_targets_np",
    "margin_to_targets_np",
    "apex_parts_np",
    "margin_of_parts_np",
    "origin_angle",
    "pairwise_membership_margin",
    "parse_cone",
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


# ---------------------------------------------------------------- cone families

#: parameters of each family, in the order the export header writes them
FAMILIES: dict[str, tuple[str, ...]] = {"ganea": ("K",), "cap": ("theta0", "beta")}
#: the parameters a family gets when none are given
DEFAULT_PARAMS: dict[str, dict[str, float]] = {
    "ganea": {"K": 0.1},
    "cap": {"theta0": 2.5, "beta": 0.5},
}


def cone_spec(family: str = "ganea", **params: Any) -> dict[str, Any]:
    """A validated cone description ``{"family": ..., <param>: float, ...}``.

    Missing parameters take :data:`DEFAULT_PARAMS`; unknown families or
    parameters and out-of-range values raise ``ValueError``.
    """
    if family not in FAMILIES:
        raise ValueError(f"unknown cone family {family!r} (known: {', '.join(FAMILIES)})")
    extra = set(params) - set(FAMILIES[family])
    if extra:
        raise ValueError(f"cone family {family!r} has no parameter {sorted(extra)[0]!r}")
    out: dict[str, Any] = {"family": family}
    for k in FAMILIES[family]:
        v = float(params.get(k, DEFAULT_PARAMS[family][k]))
        if not math.isfinite(v):
            raise ValueError(f"cone parameter {k} must be finite, got {v}")
        out[k] = v
    if family == "ganea" and not out["K"] > 0:
        raise ValueError(f"cone constant K must be positive, got {out['K']}")
    if family == "cap":
        if not 0 < out["theta0"] <= math.pi:
            raise ValueError(f"theta0 must be in (0, pi], got {out['theta0']}")
        if not out["beta"] > 0:
            raise ValueError(f"beta must be positive, got {out['beta']}")
    return out


def _params(spec: dict[str, Any]) -> dict[str, float]:
    spec = cone_spec(**spec)
    return {k: spec[k] for k in FAMILIES[spec["family"]]}


def format_cone(spec: dict[str, Any]) -> str:
    """``cone=<family> <param>=<value>…`` (the export header's tail; repr floats)."""
    spec = cone_spec(**spec)
    return " ".join(
        [f"cone={spec['family']}"] + [f"{k}={spec[k]!r}" for k in FAMILIES[spec["family"]]]
    )


def parse_cone(fields: list[str] | str) -> dict[str, Any]:
    """Inverse of :func:`format_cone`: ``["cone=cap", "theta0=2.5", "beta=0.5"]`` -> spec.

    Fields that are not ``key=value`` or precede ``cone=`` are ignored (so a
    whole header line can be passed); no ``cone=`` field raises ``ValueError``.
    """
    if isinstance(fields, str):
        fields = fields.lstrip("#").split()
    kv = [f.split("=", 1) for f in fields if "=" in f]
    keys = [k for k, _ in kv]
    if "cone" not in keys:
        raise ValueError("no cone=<family> field")
    tail = kv[keys.index("cone") :]
    return cone_spec(tail[0][1], **{k: float(v) for k, v in tail[1:]})


def cap_aperture(x: torch.Tensor, *, c: Curvature, theta0: float, beta: float) -> torch.Tensor:
    r"""Angular radius :math:`\theta(x) = \min(\pi, \theta_0((1 - t)/(1 + t))^\beta)`,
    :math:`t = \sqrt c\|x\|`, of the cap of ``x``; (..., d) -> (...).

    :math:`(1 - t)/(1 + t) = g(x)/(1 + t)^2` with the accurate gap, so the
    value keeps its digits up to the boundary.
    """
    c_t = nm.as_curvature(c, x)
    t = c_t.sqrt() * nm.safe_norm(x)
    ratio = poincare.gap(x, c=c) / (1 + t) ** 2
    return (theta0 * ratio.pow(beta)).clamp_max(math.pi)


def origin_angle(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    r"""Angle at the origin between ``x`` and ``y`` (broadcasting), 0 if either is the origin.

    :math:`2\operatorname{atan2}(\|\hat x - \hat y\|, \|\hat x + \hat y\|)`: full
    relative accuracy at every angle.
    """
    tiny = nm.eps(x.dtype, "tiny")
    nx = nm.safe_norm(x, keepdim=True)
    ny = nm.safe_norm(y, keepdim=True)
    ux = x / nx.clamp_min(tiny)
    uy = y / ny.clamp_min(tiny)
    a = 2 * _atan2(nm.safe_norm(ux - uy), nm.safe_norm(ux + uy))
    at_origin = (nx.squeeze(-1) <= tiny) | (ny.squeeze(-1) <= tiny)
    return torch.where(at_origin, torch.zeros_like(a), a)


def cap_margin(
    x: torch.Tensor, y: torch.Tensor, *, c: Curvature, theta0: float, beta: float
) -> torch.Tensor:
    r""":math:`\theta(x) - \angle(x, y) - \theta(y)`: :math:`\ge 0` iff y's cap is in x's."""
    return (
        cap_aperture(x, c=c, theta0=theta0, beta=beta)
        - origin_angle(x, y)
        - cap_aperture(y, c=c, theta0=theta0, beta=beta)
    )


def aperture(x: torch.Tensor, spec: dict[str, Any], *, c: Curvature) -> torch.Tensor:
    r"""Size of the cone at ``x``: Ganea's :math:`\psi(x)` or the cap radius :math:`\theta(x)`."""
    p = _params(spec)
    if spec["family"] == "ganea":
        return half_aperture(x, c=c, K=p["K"])
    return cap_aperture(x, c=c, **p)


def membership_margin(
    x: torch.Tensor, y: torch.Tensor, spec: dict[str, Any], *, c: Curvature
) -> torch.Tensor:
    r"""Signed membership margin of ``y`` in the cone of ``x`` (broadcasting): :math:`\ge 0` inside.

    ``ganea``: :math:`\psi(x) - \Xi(x, y)`; ``cap``: :func:`cap_margin`.
    Differentiable in both points (zero gradient where a norm is exactly 0).
    """
    p = _params(spec)
    if spec["family"] == "ganea":
        return half_aperture(x, c=c, K=p["K"]) - cone_angle(x, y, c=c)
    return cap_margin(x, y, c=c, **p)


def contains(
    x: torch.Tensor, y: torch.Tensor, spec: dict[str, Any], *, c: Curvature, tol: float = 0.0
) -> torch.Tensor:
    """Whether ``y`` is in the cone of ``x``: :func:`membership_margin` ``>= -tol`` (bool)."""
    return membership_margin(x, y, spec, c=c) >= -tol


def pairwise_membership_margin(
    x: torch.Tensor, y: torch.Tensor, spec: dict[str, Any], *, c: Curvature, block: int = 1 << 21
) -> torch.Tensor:
    """:func:`membership_margin` of every pair, (n, d) apexes, (m, d) -> (n, m), float64.

    ``cap`` forms every :math:`\\hat x_i - \\hat y_j` (blocks of at most
    ``block`` values), so each entry equals :func:`membership_margin` of its
    pair; ``ganea`` uses :func:`pairwise_cone_angle`.
    """
    p = _params(spec)
    x = x.to(torch.float64)
    y = y.to(torch.float64)
    if spec["family"] == "ganea":
        return half_aperture(x, c=c, K=p["K"])[:, None] - pairwise_cone_angle(x, y, c=c)
    tx = cap_aperture(x, c=c, **p)
    ty = cap_aperture(y, c=c, **p)
    rows = max(1, block // max(1, y.shape[0] * y.shape[1]))
    out = torch.empty(x.shape[0], y.shape[0], dtype=torch.float64)
    for s in range(0, x.shape[0], rows):
        ang = origin_angle(x[s : s + rows, None, :], y[None, :, :])
        out[s : s + rows] = tx[s : s + rows, None] - ang - ty[None, :]
    return out


# numpy float64 twins (the service's per-request paths; same formulas, same order)


def _np_points(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


def _np_norm(x: np.ndarray) -> np.ndarray:
    return np.sqrt((x * x).sum(-1))


def _np_cap_aperture(x: np.ndarray, c: float, theta0: float, beta: float) -> np.ndarray:
    t = math.sqrt(c) * _np_norm(x)
    ratio = poincare_np.gap(x, c=c) / (1 + t) ** 2
    return np.minimum(theta0 * ratio**beta, math.pi)


def _np_unit(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(x / |x|, |x| <= tiny)``: the direction of each point, and where it has none."""
    tiny = np.finfo(np.float64).tiny
    nx = _np_norm(x)[..., None]
    return x / np.maximum(nx, tiny), nx[..., 0] <= tiny


def _np_unit_angle(ux, zx, uy, zy) -> np.ndarray:
    a = 2 * np.arctan2(_np_norm(ux - uy), _np_norm(ux + uy))
    return np.where(zx | zy, 0.0, a)


def _np_ganea_psi(x: np.ndarray, c: float, K: float) -> np.ndarray:
    rz = _inner_z(K)
    t = math.sqrt(c) * _np_norm(x)
    inside = t < rz
    g = np.where(inside, 1 - rz * rz, poincare_np.gap(x, c=c))
    t = np.where(inside, rz, t)
    return np.arcsin(np.minimum(K * g / t, 1 - nm.eps(torch.float64, "angle")))


def _np_ganea_angle(x: np.ndarray, y: np.ndarray, c: float) -> np.ndarray:
    gx = poincare_np.gap(x, c=c)
    nx = _np_norm(x)[..., None]
    xhat = x / np.maximum(nx, nm.eps(torch.float64, "norm"))
    delta = y - x
    par = (delta * xhat).sum(-1, keepdims=True)
    perp = _np_norm(delta - par * xhat)
    sq = (delta * delta).sum(-1)
    s = gx * perp
    cp = gx * par[..., 0] - c * sq * nx[..., 0]
    ok = s * s + cp * cp > nm.eps(torch.float64, "tiny")
    return np.where(ok, np.arctan2(s, np.where(ok, cp, 1.0)), 0.0)


def aperture_np(x, spec: dict[str, Any], *, c: float) -> np.ndarray:
    """numpy float64 twin of :func:`aperture`."""
    p = _params(spec)
    x = _np_points(x)
    if spec["family"] == "ganea":
        return _np_ganea_psi(x, float(c), p["K"])
    return _np_cap_aperture(x, float(c), **p)


def membership_margin_np(x, y, spec: dict[str, Any], *, c: float) -> np.ndarray:
    """numpy float64 twin of :func:`membership_margin` (broadcasting over leading dims):
    :func:`margin_to_targets_np` of ``y``'s :func:`margin_targets_np`."""
    return margin_to_targets_np(x, margin_targets_np(y, spec, c=c), spec, c=c)


def margin_targets_np(y, spec: dict[str, Any], *, c: float) -> tuple:
    """The parts of :func:`membership_margin_np` that depend on the points ``y``
    alone, for :func:`margin_to_targets_np`: one set of points tested against the
    cones of many apexes computes them once (``cap``: the directions and the caps of
    ``y``; ``ganea``: nothing)."""
    p = _params(spec)
    y = _np_points(y)
    if spec["family"] == "ganea":
        return (y,)
    return (*_np_unit(y), _np_cap_aperture(y, float(c), **p))


def margin_to_targets_np(x, targets: tuple, spec: dict[str, Any], *, c: float) -> np.ndarray:
    """:func:`membership_margin_np` of ``x`` and the points ``y`` of ``targets =
    margin_targets_np(y, spec, c=c)``: the same values, by the same operations."""
    return margin_of_parts_np(apex_parts_np(x, spec, c=c), targets, spec, c=c)


def apex_parts_np(x, spec: dict[str, Any], *, c: float) -> tuple:
    """The parts of :func:`membership_margin_np` that depend on the apexes ``x``
    alone, for :func:`margin_of_parts_np` (``cap``: the apertures and the
    directions; ``ganea``: the half-apertures and the points). Row by row: the
    parts of ``x[rows]`` are those of ``x`` indexed by ``rows``, so a fixed set of
    apexes (the labels) computes them once."""
    p = _params(spec)
    x = _np_points(x)
    c = float(c)
    if spec["family"] == "ganea":
        return (_np_ganea_psi(x, c, p["K"]), x)
    return (_np_cap_aperture(x, c, **p), *_np_unit(x))


def margin_of_parts_np(apex: tuple, targets: tuple, spec: dict[str, Any], *, c: float):
    """:func:`membership_margin_np` from the apexes' :func:`apex_parts_np` and the
    points' :func:`margin_targets_np` (broadcasting): the same values, by the same
    operations."""
    if spec["family"] == "ganea":
        psi, x = apex
        return psi - _np_ganea_angle(x, targets[0], float(c))
    ap, ux, zx = apex
    uy, zy, ty = targets
    return ap - _np_unit_angle(ux, zx, uy, zy) - ty
