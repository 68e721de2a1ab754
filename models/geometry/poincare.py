r"""The Poincaré ball of curvature :math:`-c` (radius :math:`1/\sqrt c`): stateless math.

Every function takes tensors whose last dim holds the coordinates and
broadcasts over the leading dims; the curvature magnitude ``c > 0`` is
keyword-only, a python float or a 0-d tensor (which may be learnable).
float32 and float64 both work; float64 keeps points within 1e-15 relative of
the boundary (hyperbolic radius up to 35/√c), float32 within 1e-6 (14.5/√c;
see :mod:`models.geometry.numerics`).

Conventions (those of ``tests/data/geometry_reference.json``)::

    g(x)        = 1 - c|x|^2                     (the "gap", computed without cancellation)
    lambda_x    = 2 / g(x)
    x (+) y     = ((1 + 2c<x,y> + c|y|^2) x + g(x) y) / (1 + 2c<x,y> + c^2|x|^2|y|^2)
    d(x, y)     = arcosh(1 + 2c|x-y|^2 / (g(x) g(y))) / sqrt(c)
    expmap0(v)  = tanh(sqrt(c)|v|) v / (sqrt(c)|v|)
    expmap_x(v) = x (+) tanh(sqrt(c) lambda_x |v| / 2) v / (sqrt(c)|v|)
    logmap_x    = inverse of expmap_x;  logmap0 = inverse of expmap0
    M (x) x     = tanh(|Mx|/|x| artanh(sqrt(c)|x|)) Mx / (sqrt(c)|Mx|)
    lorentz(x)  = ((1 + c|x|^2) / (sqrt(c) g(x)), 2x / g(x))   (time first, <h,h>_L = -1/c)
    klein(x)    = 2x / (1 + c|x|^2)

How it stays accurate near the boundary (each formula is rewritten so that no
step subtracts nearly equal numbers; the identities are exact):

* :math:`g(x)` comes from :func:`~models.geometry.numerics.one_minus_c_sqnorm`
  (compensated float64 sum of squares);
* :math:`\operatorname{arcosh}(1 + z) = 2\operatorname{arsinh}(\sqrt{z/2})`, so
  :math:`d = \frac{2}{\sqrt c}\operatorname{arsinh}\sqrt{c\|x-y\|^2/(g(x)g(y))}`
  keeps full relative precision for small and large distances;
* with :math:`s = x + y`: :math:`x \oplus y = (g(x)\,s + c\|s\|^2 x) /
  (g(x)g(y) + c\|s\|^2)` and :math:`1 - c\|x\oplus y\|^2 = g(x)g(y)/(g(x)g(y) +
  c\|s\|^2)`;
* :math:`\log_x(y) = \frac{\operatorname{arsinh}\sqrt q}{\sqrt q}
  \sqrt{\frac{g(x)}{g(y)\,m}}\; n`, with :math:`\delta = y - x`,
  :math:`q = c\|\delta\|^2/(g(x)g(y))`, :math:`n = g(x)\delta - c\|\delta\|^2 x`
  and :math:`m = \|n\|^2/\|\delta\|^2 = g(x)^2 - 2c\,g(x)\langle\delta, x\rangle
  + c^2\|\delta\|^2\|x\|^2` (well conditioned for :math:`y` in the ball),
  which is smooth at :math:`y = x`.

geoopt's ``PoincareBall`` remains the tool for Riemannian optimisation; its
float64 ``dist`` saturates near 16.8/√c and its ``logmap`` loses up to 22 %
near the boundary (``tests/data/README.md``), so none of the functions
here delegate to it (κ ≥ 0 lives in :mod:`models.geometry.stereographic`).

References
----------
* A. A. Ungar, "Analytic Hyperbolic Geometry and Albert Einstein's Special
  Theory of Relativity", 2008 (Möbius gyrovector spaces, Einstein midpoint).
* O. Ganea, G. Bécigneul, T. Hofmann, "Hyperbolic Neural Networks", NeurIPS
  2018 (expmap/logmap, Möbius matrix-vector product).
* V. Khrulkov et al., "Hyperbolic Image Embeddings", CVPR 2020 (Einstein
  midpoint through Klein coordinates, feature-to-ball map).
* Y. Guo et al., "Clipped Hyperbolic Classifiers Are Super-Hyperbolic
  Classifiers", CVPR 2022 (feature clipping).
"""

from __future__ import annotations

import torch

from . import numerics as nm

__all__ = [
    "clip_features",
    "dist",
    "dist_arg",
    "dist_from_arg",
    "distance_to_origin",
    "einstein_midpoint",
    "euclidean_ball",
    "expmap",
    "expmap0",
    "from_klein",
    "from_lorentz",
    "gap",
    "lambda_x",
    "logmap",
    "logmap0",
    "max_norm",
    "mobius_add",
    "mobius_matvec",
    "norm_to_radius",
    "pairwise_dist",
    "pairwise_dist_arg",
    "project",
    "radius_to_norm",
    "move_outward",
    "to_klein",
    "toward",
    "to_lorentz",
]

Curvature = float | torch.Tensor


# --------------------------------------------------------------------------
# kernels: every formula lives once, here (gap is public, the rest private)


def gap(x: torch.Tensor, *, c: Curvature, keepdim: bool = False) -> torch.Tensor:
    r"""The gap :math:`g(x) = 1 - c\|x\|^2`, accurate to a few ulp of itself.

    Floored at eps "boundary" (half the gap of :func:`max_norm`), so points on
    or outside the boundary give finite (meaningless, saturated) results
    instead of nan.
    """
    nm.as_curvature(c, x)  # validates a python float
    g = nm.one_minus_c_sqnorm(x, c, keepdim=keepdim)
    return g.clamp_min(nm.eps(x.dtype, "boundary"))


def _dist_sq(sq: torch.Tensor, gx: torch.Tensor, gy: torch.Tensor, c: torch.Tensor):
    # d = 2/sqrt(c) * arsinh(sqrt(c |x-y|^2 / (g(x) g(y))))
    return 2 * torch.asinh(nm.safe_sqrt(c * sq / (gx * gy))) / c.sqrt()


def _mobius_add(x, y, gx, gy, c):
    # x (+) y = (g(x) s + c|s|^2 x) / (g(x) g(y) + c|s|^2), s = x + y; also returns its gap
    s = x + y
    cs2 = c * (s * s).sum(-1, keepdim=True)
    den = gx * gy + cs2
    return (gx * s + cs2 * x) / den, gx * gy / den


def _from_klein_parts(num: torch.Tensor, den: torch.Tensor, c: torch.Tensor):
    # Klein point num/den -> ball: k / (1 + sqrt(1 - c|k|^2))
    k = num / den
    gk = nm.one_minus_c_sqnorm(k, c, keepdim=True).clamp_min(0)  # c as given: full precision
    return k / (1 + nm.safe_sqrt(gk))


# --------------------------------------------------------------------------
# public API


def max_norm(c: Curvature, dtype: torch.dtype = torch.float64):
    r"""Largest norm allowed strictly inside the ball: :math:`(1 - \varepsilon)/\sqrt c`.

    Same as :func:`models.geometry.numerics.max_norm`.
    """
    return nm.max_norm(c, dtype)


def project(x: torch.Tensor, *, c: Curvature) -> torch.Tensor:
    r"""Pull points back strictly inside the ball.

    .. math::

        \operatorname{proj}(x) = x \min\left(1, \frac{r_{\max}}{\|x\|}\right),
        \qquad r_{\max} = \frac{1 - \varepsilon_{\text{boundary}}}{\sqrt c}

    Points already inside are returned unchanged (bitwise).
    """
    c_t = nm.as_curvature(c, x)
    r_max = (1 - nm.eps(x.dtype, "boundary")) / c_t.sqrt()
    norm = nm.safe_norm(x, keepdim=True)
    scale = r_max / norm.clamp_min(nm.eps(x.dtype, "norm"))
    return torch.where(norm > r_max, x * scale, x)


def clip_features(x: torch.Tensor, r: float) -> torch.Tensor:
    r"""Feature clipping before the exponential map (Guo et al. 2022).

    .. math::

        \operatorname{CLIP}(x; r) = \min\left(1, \frac{r}{\|x\|}\right) x

    Hyp-ViT uses :math:`r = 2.3`. Finite gradient at :math:`x = 0`.
    """
    if not r > 0:
        raise ValueError(f"clip radius must be positive, got {r}")
    norm = nm.safe_norm(x, keepdim=True)
    return x * (r / norm.clamp_min(nm.eps(x.dtype, "norm"))).clamp_max(1)


def lambda_x(x: torch.Tensor, *, c: Curvature, keepdim: bool = False) -> torch.Tensor:
    r"""Conformal factor :math:`\lambda_x = 2 / (1 - c\|x\|^2)`."""
    return 2 / gap(x, c=c, keepdim=keepdim)


def mobius_add(x: torch.Tensor, y: torch.Tensor, *, c: Curvature) -> torch.Tensor:
    r"""Möbius addition.

    .. math::

        x \oplus_c y = \frac{(1 + 2c\langle x,y\rangle + c\|y\|^2)\,x + (1 - c\|x\|^2)\,y}
                            {1 + 2c\langle x,y\rangle + c^2\|x\|^2\|y\|^2}
                     = \frac{g(x)\,s + c\|s\|^2 x}{g(x)g(y) + c\|s\|^2},\quad s = x + y

    The second form (used) has no cancellation, also for :math:`y \approx -x`
    near the boundary. Left cancellation: :math:`(-x) \oplus (x \oplus y) = y`.
    """
    c_t = nm.as_curvature(c, x)
    out, _ = _mobius_add(x, y, gap(x, c=c, keepdim=True), gap(y, c=c, keepdim=True), c_t)
    return project(out, c=c_t)


def dist_arg(x: torch.Tensor, y: torch.Tensor, *, c: Curvature) -> torch.Tensor:
    r"""The arcosh argument minus one, a monotone proxy of the distance for ranking.

    .. math::

        z(x, y) = \frac{2c\|x - y\|^2}{(1 - c\|x\|^2)(1 - c\|y\|^2)},
        \qquad d = \operatorname{arcosh}(1 + z)/\sqrt c

    See :func:`dist_from_arg`.
    """
    c_t = nm.as_curvature(c, x)
    diff = x - y
    sq = (diff * diff).sum(-1)
    return 2 * c_t * sq / (gap(x, c=c) * gap(y, c=c))


def dist_from_arg(z: torch.Tensor, *, c: Curvature) -> torch.Tensor:
    r"""Distance from :func:`dist_arg`: :math:`d = \operatorname{arcosh}(1+z)/\sqrt c`.

    .. math::

        \operatorname{arcosh}(1 + z) = \log\left(1 + z + \sqrt{z(z+2)}\right)
                                     = 2\operatorname{arsinh}\sqrt{z/2}

    (the last form, used, keeps full relative precision for tiny and huge
    :math:`z`; zero gradient at :math:`z = 0`).
    """
    z = torch.as_tensor(z, dtype=None if torch.is_tensor(z) else torch.float64)
    c_t = nm.as_curvature(c, z)
    return 2 * torch.asinh(nm.safe_sqrt(z / 2)) / c_t.sqrt()


def dist(x: torch.Tensor, y: torch.Tensor, *, c: Curvature, keepdim: bool = False) -> torch.Tensor:
    r"""Geodesic distance.

    .. math::

        d_c(x, y) = \frac{1}{\sqrt c}\operatorname{arcosh}\left(1 +
            \frac{2c\|x-y\|^2}{(1 - c\|x\|^2)(1 - c\|y\|^2)}\right)
          = \frac{2}{\sqrt c}\operatorname{arsinh}
            \sqrt{\frac{c\|x-y\|^2}{(1 - c\|x\|^2)(1 - c\|y\|^2)}}

    :math:`\|x - y\|^2` from the differences, the gaps without cancellation:
    about 1e-15 relative in the interior; at a gap :math:`\delta = 1 -
    \sqrt c\|x\|` the float64 result is within about :math:`10^{-16}/\delta`
    relative of the exact distance of the given float64 points. Exactly 0 and
    a zero (finite) gradient on the diagonal.
    """
    c_t = nm.as_curvature(c, x)
    diff = x - y
    sq = (diff * diff).sum(-1, keepdim=keepdim)
    return _dist_sq(sq, gap(x, c=c, keepdim=keepdim), gap(y, c=c, keepdim=keepdim), c_t)


def pairwise_dist_arg(x: torch.Tensor, y: torch.Tensor, *, c: Curvature) -> torch.Tensor:
    r""":func:`dist_arg` of every pair, (..., n, d), (..., m, d) -> (..., n, m).

    Same Gram form and fallback as :func:`pairwise_dist`."""
    c_t = nm.as_curvature(c, x)
    sq = nm.pairwise_sqdist(x, y).to(x.dtype)
    gx = gap(x, c=c)[..., :, None]
    gy = gap(y, c=c)[..., None, :]
    return 2 * c_t * sq / (gx * gy)


def pairwise_dist(x: torch.Tensor, y: torch.Tensor, *, c: Curvature) -> torch.Tensor:
    r"""Distances of every pair: (..., n, d), (..., m, d) -> (..., n, m).

    Same formula as :func:`dist`, with :math:`\|x_i - y_j\|^2 = \|x_i\|^2 +
    \|y_j\|^2 - 2\langle x_i, y_j\rangle` formed in float64 without
    materialising (n, m, d). Pairs where that form cancels (Euclidean
    distance below about 0.3 % of the norms) are recomputed from the
    differences, in bounded chunks (:func:`~models.geometry.numerics.pairwise_sqdist`);
    so the result agrees with :func:`dist` to about 1e-10 relative for every
    pair, at the price of extra work when many pairs are that close.
    """
    c_t = nm.as_curvature(c, x)
    sq = nm.pairwise_sqdist(x, y).to(x.dtype)
    return _dist_sq(sq, gap(x, c=c)[..., :, None], gap(y, c=c)[..., None, :], c_t)


def norm_to_radius(r_euclid, *, c: Curvature) -> torch.Tensor:
    r"""Hyperbolic distance to the origin of a point of Euclidean norm ``r_euclid``.

    .. math::

        \rho = \frac{2}{\sqrt c}\operatorname{artanh}(\sqrt c\, r)
             = \frac{2}{\sqrt c}\operatorname{arsinh}\sqrt{\frac{c r^2}{1 - c r^2}}

    Accepts python numbers, arrays or tensors; returns a tensor (float64 for
    python numbers).
    """
    r = torch.as_tensor(r_euclid, dtype=None if torch.is_tensor(r_euclid) else torch.float64)
    return distance_to_origin(r.unsqueeze(-1), c=c)


def distance_to_origin(x: torch.Tensor, *, c: Curvature, keepdim: bool = False) -> torch.Tensor:
    r"""Hyperbolic distance to the origin.

    .. math::

        d(0, x) = \frac{2}{\sqrt c}\operatorname{artanh}(\sqrt c\|x\|)


    Same kernel as :func:`dist` with :math:`y = 0`.
    """
    c_t = nm.as_curvature(c, x)
    sq = (x * x).sum(-1, keepdim=keepdim)
    return _dist_sq(sq, gap(x, c=c, keepdim=keepdim), torch.ones_like(sq), c_t)


def radius_to_norm(rho, *, c: Curvature) -> torch.Tensor:
    r"""Euclidean norm of a point at hyperbolic distance ``rho`` from the origin.

    .. math::

        r = \tanh(\sqrt c\,\rho/2)/\sqrt c

    Inverse of :func:`norm_to_radius`. Returns a tensor (float64 for python numbers).
    """
    rho = torch.as_tensor(rho, dtype=None if torch.is_tensor(rho) else torch.float64)
    sc = nm.as_curvature(c, rho).sqrt()
    return torch.tanh(sc * rho / 2) / sc


def move_outward(x: torch.Tensor, depth, *, c: Curvature) -> torch.Tensor:
    r"""The point ``depth`` farther from the origin along the geodesic ray through ``x``.

    .. math::

        x' = \hat x\,\tanh\bigl(\sqrt c\,(\rho(x) + \delta)/2\bigr)/\sqrt c

    so :math:`d(0, x') = d(0, x) + \delta` and :math:`d(x, x') = \delta`. The
    origin has no ray and stays where it is. The result is projected into the
    float64-representable ball (radius about :math:`37/\sqrt c`).
    """
    rho = distance_to_origin(x, c=c, keepdim=True)
    n = x.norm(dim=-1, keepdim=True)
    unit = torch.where(n > 0, x / n.clamp_min(torch.finfo(x.dtype).tiny), torch.zeros_like(x))
    out = unit * radius_to_norm(rho + depth, c=c).to(x.dtype)
    return project(torch.where(n > 0, out, x), c=c)


def toward(x: torch.Tensor, y: torch.Tensor, t, *, c: Curvature) -> torch.Tensor:
    r"""The point at distance ``t`` from ``x`` on the geodesic from ``x`` through ``y``.

    .. math::

        x \oplus_c \Bigl(\hat u\,\tanh(\sqrt c\,t/2)/\sqrt c\Bigr),
        \qquad \hat u = \frac{(-x) \oplus_c y}{\|(-x) \oplus_c y\|}

    (the Möbius translation by ``x`` is an isometry that maps the diameter
    through :math:`\hat u` onto that geodesic), so :math:`d(x, \cdot) = t`, and
    :math:`d(\cdot, y) = |d(x, y) - t|`. ``t`` is a number or broadcasts against
    ``x[..., :1]``; where ``y`` is ``x`` there is no direction and ``x`` is returned.
    Projected into the float64-representable ball.
    """
    u = mobius_add(-x, y, c=c)
    n = u.norm(dim=-1, keepdim=True)
    unit = torch.where(n > 0, u / n.clamp_min(torch.finfo(u.dtype).tiny), torch.zeros_like(u))
    t = torch.as_tensor(t, dtype=x.dtype)
    out = mobius_add(x, unit * radius_to_norm(t, c=c).to(x.dtype), c=c)
    return project(torch.where(n > 0, out, x), c=c)


def euclidean_ball(x: torch.Tensor, r: torch.Tensor, *, c: Curvature):
    r"""Euclidean centre and radius of the hyperbolic ball :math:`B(x, r)`.

    Hyperbolic balls of the Poincaré model are Euclidean balls. Along the ray
    through :math:`x` the ball spans the signed norms
    :math:`\tanh(\sqrt c(\rho_x \mp r)/2)/\sqrt c` (:math:`\rho_x` the
    distance to the origin), so

    .. math::

        \text{centre} = \hat x\,\frac{t_- + t_+}{2},\qquad
        \text{radius} = \frac{t_+ - t_-}{2},\qquad
        t_\pm = \tanh(\sqrt c(\rho_x \pm r)/2)/\sqrt c.

    ``x`` (..., d), ``r`` (...) -> centres (..., d), radii (...). An infinite
    radius gives ``(x, inf)``.
    """
    r = torch.as_tensor(r, dtype=x.dtype)
    rho = distance_to_origin(x, c=c)
    finite = torch.isfinite(r)
    rr = torch.where(finite, r, torch.zeros_like(r))
    lo = radius_to_norm(rho - rr, c=c)  # tanh is odd: signed along x's direction
    hi = radius_to_norm(rho + rr, c=c)
    norm = x.norm(dim=-1, keepdim=True)
    unit = torch.where(norm > 0, x / norm.clamp_min(nm.eps(x.dtype, "norm")), torch.zeros_like(x))
    centres = torch.where(finite[..., None], unit * ((lo + hi) / 2)[..., None], x)
    radii = torch.where(finite, (hi - lo) / 2, torch.full_like(r, float("inf")))
    return centres, radii


def expmap0(v: torch.Tensor, *, c: Curvature) -> torch.Tensor:
    r"""Exponential map at the origin.

    .. math::

        \exp_0(v) = \tanh(\sqrt c\|v\|)\frac{v}{\sqrt c\|v\|}
                  = \operatorname{tanhc}(c\|v\|^2)\, v

    with :math:`\operatorname{tanhc}(q) = \tanh(\sqrt q)/\sqrt q` (smooth,
    so the gradient at :math:`v = 0` is the identity). Projected into the ball
    (float64 saturates beyond :math:`\sqrt c\|v\| \approx 17.6`).
    """
    c_t = nm.as_curvature(c, v)
    return project(nm.tanhc(c_t * (v * v).sum(-1, keepdim=True)) * v, c=c_t)


def logmap0(y: torch.Tensor, *, c: Curvature) -> torch.Tensor:
    r"""Logarithmic map at the origin (inverse of :func:`expmap0`).

    .. math::

        \log_0(y) = \frac{\operatorname{artanh}(\sqrt c\|y\|)}{\sqrt c\|y\|}\, y
                  = \frac{\operatorname{arsinh}\sqrt q}{\sqrt q}\,\frac{y}{\sqrt{g(y)}},
                  \qquad q = \frac{c\|y\|^2}{g(y)}

    Accurate up to the boundary (geoopt clamps the artanh argument at
    :math:`1 - 10^{-7}`); smooth at 0.
    """
    c_t = nm.as_curvature(c, y)
    gy = gap(y, c=c, keepdim=True)
    q = c_t * (y * y).sum(-1, keepdim=True) / gy
    return nm.asinhc(q) * y / gy.sqrt()


def expmap(x: torch.Tensor, v: torch.Tensor, *, c: Curvature) -> torch.Tensor:
    r"""Exponential map at ``x`` of the tangent vector ``v``.

    .. math::

        \exp_x(v) = x \oplus_c \left(\tanh\left(\frac{\sqrt c\lambda_x\|v\|}{2}\right)
                    \frac{v}{\sqrt c\|v\|}\right)

    The second operand is :math:`u = \operatorname{tanhc}(a^2)\,v/g(x)`,
    :math:`a = \sqrt c\|v\|/g(x)`, whose gap :math:`1 - c\|u\|^2 =
    \operatorname{sech}^2 a` is passed on exactly to the Möbius addition.
    """
    c_t = nm.as_curvature(c, x)
    gx = gap(x, c=c, keepdim=True)
    a2 = c_t * (v * v).sum(-1, keepdim=True) / (gx * gx)
    u = nm.tanhc(a2) * v / gx
    e = torch.exp(-2 * nm.safe_sqrt(a2))
    gu = (4 * e / (1 + e) ** 2).clamp_min(nm.eps(x.dtype, "boundary"))  # sech^2(a)
    out, _ = _mobius_add(x, u, gx, gu, c_t)
    return project(out, c=c_t)


def logmap(x: torch.Tensor, y: torch.Tensor, *, c: Curvature) -> torch.Tensor:
    r"""Logarithmic map at ``x`` of ``y`` (inverse of :func:`expmap`).

    .. math::

        \log_x(y) = \frac{2}{\sqrt c\lambda_x}\operatorname{artanh}(\sqrt c\|w\|)\frac{w}{\|w\|},
        \qquad w = (-x)\oplus_c y

    evaluated as :math:`\log_x(y) = \frac{\operatorname{arsinh}\sqrt q}{\sqrt q}
    \sqrt{\frac{g(x)}{g(y)\,m}}\; n` with :math:`\delta = y - x`,
    :math:`q = c\|\delta\|^2/(g(x)g(y))`, :math:`n = g(x)\delta - c\|\delta\|^2x`
    (the numerator of :math:`w`) and :math:`m = g(x)^2 - 2c\,g(x)\langle\delta,
    x\rangle + c^2\|\delta\|^2\|x\|^2 = \|n\|^2/\|\delta\|^2`; its norm is
    :math:`d(x, y)/\lambda_x`. No cancellation near the boundary, smooth at
    :math:`y = x` (where it is :math:`y - x` to first order).
    """
    c_t = nm.as_curvature(c, x)
    gx = gap(x, c=c, keepdim=True)
    gy = gap(y, c=c, keepdim=True)
    delta = y - x
    sq = (delta * delta).sum(-1, keepdim=True)
    m = (
        gx * gx
        - 2 * c_t * gx * (delta * x).sum(-1, keepdim=True)
        + c_t * c_t * sq * (x * x).sum(-1, keepdim=True)
    )
    n = gx * delta - c_t * sq * x
    return nm.asinhc(c_t * sq / (gx * gy)) * (gx / (gy * m)).sqrt() * n


def mobius_matvec(M: torch.Tensor, x: torch.Tensor, *, c: Curvature) -> torch.Tensor:
    r"""Möbius matrix-vector product, ``M`` (out, in), ``x`` (..., in) -> (..., out).

    .. math::

        M \otimes_c x = \tanh\left(\frac{\|Mx\|}{\|x\|}\operatorname{artanh}(\sqrt c\|x\|)\right)
                        \frac{Mx}{\sqrt c\|Mx\|}
                      = \operatorname{tanhc}(c\|w\|^2)\, w,
        \qquad w = \frac{\operatorname{artanh}(\sqrt c\|x\|)}{\sqrt c\|x\|} Mx

    (0 when :math:`Mx = 0`; smooth at :math:`x = 0`, where it is :math:`Mx`).
    """
    c_t = nm.as_curvature(c, x)
    gx = gap(x, c=c, keepdim=True)
    artanhc = nm.asinhc(c_t * (x * x).sum(-1, keepdim=True) / gx) / gx.sqrt()
    w = artanhc * (x @ M.transpose(-1, -2))
    return project(nm.tanhc(c_t * (w * w).sum(-1, keepdim=True)) * w, c=c_t)


def to_lorentz(x: torch.Tensor, *, c: Curvature) -> torch.Tensor:
    r"""Poincaré ball -> hyperboloid :math:`\langle h, h\rangle_L = -1/c`, time coordinate first.

    .. math::

        h = \left(\frac{1 + c\|x\|^2}{\sqrt c\,(1 - c\|x\|^2)},\;
                  \frac{2x}{1 - c\|x\|^2}\right)

    (..., d) -> (..., d + 1).
    """
    c_t = nm.as_curvature(c, x)
    gx = gap(x, c=c, keepdim=True)
    return torch.cat([(2 - gx) / (c_t.sqrt() * gx), 2 * x / gx], dim=-1)


def from_lorentz(h: torch.Tensor, *, c: Curvature) -> torch.Tensor:
    r"""Hyperboloid (time first) -> Poincaré ball, inverse of :func:`to_lorentz`.

    .. math::

        x = \frac{h_{1:}}{1 + \sqrt c\, h_0},\qquad
        \sqrt c\, h_0 = \sqrt{1 + c\|h_{1:}\|^2}

    The time coordinate is recomputed from the space part (on the
    hyperboloid both agree; off it, the result stays in the ball).
    """
    c_t = nm.as_curvature(c, h)
    hs = h[..., 1:]
    return project(hs / (1 + (1 + c_t * (hs * hs).sum(-1, keepdim=True)).sqrt()), c=c_t)


def to_klein(x: torch.Tensor, *, c: Curvature) -> torch.Tensor:
    r"""Poincaré ball -> Klein model, :math:`k = 2x/(1 + c\|x\|^2)`."""
    return 2 * x / (2 - gap(x, c=c, keepdim=True))


def from_klein(k: torch.Tensor, *, c: Curvature) -> torch.Tensor:
    r"""Klein model -> Poincaré ball, :math:`x = k / (1 + \sqrt{1 - c\|k\|^2})`.

    (Klein coordinates reach the boundary quadratically faster: a Poincaré gap
    :math:`\delta` becomes about :math:`\delta^2/4`, so far points do not
    survive a round trip through float Klein coordinates.)
    """
    c_t = nm.as_curvature(c, k)
    return project(_from_klein_parts(k, torch.ones_like(k[..., :1]), c), c=c_t)


def _midpoint_once(points, w, c, g):
    # Einstein midpoint in Klein coordinates: sum_i w_i gamma_i k_i / sum_i w_i gamma_i;
    # gamma_i k_i = 2 x_i / g(x_i) and gamma_i = (1 + c|x_i|^2)/g(x_i) = (2 - g)/g.
    num = (w * 2 * points / g).sum(-2)
    den = (w * (2 - g) / g).sum(-2)
    return _from_klein_parts(num, den, c)


def einstein_midpoint(
    points: torch.Tensor, weights: torch.Tensor | None = None, *, c: Curvature
) -> torch.Tensor:
    r"""Weighted Einstein midpoint, (..., n, d) -> (..., d) (Khrulkov et al. 2020).

    .. math::

        m_K = \frac{\sum_i w_i\gamma_i k_i}{\sum_i w_i\gamma_i},\qquad
        k_i = \frac{2x_i}{1 + c\|x_i\|^2},\quad
        \gamma_i = \frac{1}{\sqrt{1 - c\|k_i\|^2}} = \frac{1 + c\|x_i\|^2}{1 - c\|x_i\|^2}

    mapped back to the ball with :func:`from_klein`. ``weights`` (..., n),
    non-negative with a positive sum (default: uniform). The midpoint commutes
    with isometries, so it is computed once roughly, the points are moved by
    the Möbius translation that takes that estimate to the origin, and the
    (now well-conditioned) midpoint is moved back: the midpoint of identical
    points is that point, also within 1e-12 of the boundary.
    """
    c_t = nm.as_curvature(c, points)
    if weights is None:
        w = torch.ones_like(points[..., :1])
    else:
        w = torch.as_tensor(weights, dtype=points.dtype, device=points.device)[..., None]
    g = gap(points, c=c, keepdim=True)
    with torch.no_grad():
        p = project(_midpoint_once(points, w, c, g), c=c).unsqueeze(-2)
    gp = gap(p, c=c, keepdim=True)
    # the moved points' gaps come exactly out of the Möbius addition (their
    # rounded coordinates would lose u/g relative in the Lorentz factors)
    moved, g_moved = _mobius_add(-p, points, gp, g, c_t)
    m = _midpoint_once(moved, w, c, g_moved).unsqueeze(-2)
    out, _ = _mobius_add(p, m, gp, gap(m, c=c, keepdim=True), c_t)
    return project(out.squeeze(-2), c=c_t)
