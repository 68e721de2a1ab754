r"""Numerical guards and stable primitives shared by every geometry module.

One table (:data:`EPS`) holds every numerical guard, by dtype; nothing else in
``models.geometry`` writes an eps literal. The primitives below are the only
places where the delicate arithmetic happens:

* :func:`one_minus_c_sqnorm` -- :math:`1 - c\|x\|^2`, the quantity that decides
  everything near the boundary of the ball, computed without cancellation
  (compensated sum of squares in float64, float32 inputs upcast);
* :func:`safe_sqrt`, :func:`safe_norm` -- square roots with a finite (zero)
  gradient at zero;
* :func:`tanhc`, :func:`asinhc`, :func:`asinc` -- :math:`\tanh(\sqrt q)/\sqrt q`
  and friends as smooth functions of :math:`q \ge 0`, so that expmap0,
  logmap0, logmap and the distances are smooth at the origin and on the
  diagonal;
* :func:`pairwise_sqdist` and :func:`gram_pairwise` -- :math:`(n, m)` tables
  from :math:`\|x\|^2`, :math:`\|y\|^2`, :math:`x y^\top` without materialising
  :math:`(n, m, d)`, with an exact recomputation, in bounded chunks, of the
  pairs where the Gram form cancels.

Why the care: a float64 Poincaré coordinate can sit within 1e-12 of the
boundary (hyperbolic radius about 28), where :math:`1 - c\|x\|^2` computed
naively keeps only four digits. See ``DESIGN.md`` ("Precision near the
boundary").

References
----------
* T. J. Dekker, "A floating-point technique for extending the available
  precision", Numer. Math. 18, 1971 (two_prod, Veltkamp splitting).
* S. M. Rump, T. Ogita, S. Oishi, "Accurate floating-point summation part I:
  faithful rounding", SIAM J. Sci. Comput. 31, 2008 (error-free extraction).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .ranking import GAP_FLOOR

__all__ = [
    "EPS",
    "Guards",
    "VELTKAMP_SPLIT",
    "accurate_dtype",
    "as_curvature",
    "asinc",
    "asinhc",
    "eps",
    "flatten_pair",
    "gram_pairwise",
    "max_norm",
    "one_minus_c_sqnorm",
    "pairwise_sqdist",
    "safe_norm",
    "safe_sqrt",
    "tanhc",
]


@dataclass(frozen=True)
class Guards:
    """Numerical guards of one dtype (see :data:`EPS`)."""

    norm: float  # floor of a vector norm (or denominator) before dividing by it
    boundary: float  # relative margin to the boundary: max_norm = (1 - boundary)/sqrt(c)
    angle: float  # arcsin/arccos arguments are kept within [-1 + angle, 1 - angle]
    series: float  # q below this: Taylor series in tanhc/asinhc/asinc (smooth at 0)
    cancel: float  # Gram form of |x-y|^2 trusted only above cancel*(|x|^2+|y|^2)
    tiny: float  # smallest positive normal number: guards of exact zeros


#: The one table of numerical guards, by dtype.
#:
#: ========  =======  ========  =====  ======  ======  =========
#: dtype     norm     boundary  angle  series  cancel  tiny
#: ========  =======  ========  =====  ======  ======  =========
#: float64   1e-15    1e-15     1e-15  1e-4    1e-5    2.2e-308
#: float32   1e-15    1e-6      1e-7   1e-2    1e-5*   1.2e-38
#: float16   1e-7     1e-3      1e-3   1e-1    1e-5*   6.1e-5
#: bfloat16  1e-15    1e-2      1e-2   1e-1    1e-5*   1.2e-38
#: ========  =======  ========  =====  ======  ======  =========
#:
#: ``boundary``: float64 allows hyperbolic radius ``ln(2/1e-15) = 35.2/sqrt(c)``
#: (the largest float below 1 would allow 37.4); float32 allows 14.5/sqrt(c),
#: i.e. norms within 1e-5 of 1/sqrt(c) for every c >= 0.01, where a float32
#: coordinate still fixes ``1 - c|x|^2`` to about 5 % (so distances to about
#: 0.05/sqrt(c)); the gap itself is always computed exactly from the given
#: coordinates. The float64 ``boundary`` is :data:`models.geometry.ranking.GAP_FLOOR`
#: (the torch-free module the index ranks with), so both floor the gap alike.
#: float16/bfloat16 rows are best effort (not tested).
#: ``cancel`` (*): Gram products are always formed in float64
#: (:func:`accurate_dtype`), so one float64 threshold serves every dtype; with
#: it the Gram form of ``|x-y|^2`` keeps about 1e-10 relative accuracy.
EPS: dict[torch.dtype, Guards] = {
    torch.float64: Guards(1e-15, GAP_FLOOR, 1e-15, 1e-4, 1e-5, torch.finfo(torch.float64).tiny),
    torch.float32: Guards(1e-15, 1e-6, 1e-7, 1e-2, 1e-5, torch.finfo(torch.float32).tiny),
    torch.float16: Guards(1e-7, 1e-3, 1e-3, 1e-1, 1e-5, torch.finfo(torch.float16).tiny),
    torch.bfloat16: Guards(1e-15, 1e-2, 1e-2, 1e-1, 1e-5, torch.finfo(torch.bfloat16).tiny),
}

# Chunk size (elements of a (pairs, d) gather) for the exact recomputation in
# gram_pairwise: 2**22 float64 values = 32 MiB.
_CHUNK_ELEMS = 1 << 22

#: Veltkamp splitting constant 2**27 + 1 (float64): ``t = a * VELTKAMP_SPLIT;
#: hi = t - (t - a)`` splits ``a = hi + lo`` exactly (used by the numpy twins in
#: :mod:`models.geometry.poincare_np` too).
VELTKAMP_SPLIT = 134217729.0


def _guards(dtype: torch.dtype) -> Guards:
    try:
        return EPS[dtype]
    except KeyError:
        raise TypeError(f"no numerical guards for dtype {dtype}; use a floating dtype") from None


def eps(dtype: torch.dtype, kind: str = "norm") -> float:
    """Numerical guard ``kind`` for ``dtype``, from the one table :data:`EPS`.

    Parameters
    ----------
    dtype : torch.dtype
        float64, float32, float16 or bfloat16.
    kind : str
        ``"norm"`` (default: floor of norms and denominators), ``"boundary"``
        (relative margin to the boundary, see :func:`max_norm`), ``"angle"``,
        ``"series"``, ``"cancel"`` or ``"tiny"``.

    Returns
    -------
    float
    """
    g = _guards(dtype)
    try:
        return float(getattr(g, kind))
    except AttributeError:
        raise ValueError(f"unknown guard kind {kind!r}") from None


def max_norm(c: float | torch.Tensor, dtype: torch.dtype = torch.float64):
    r"""Largest Euclidean norm allowed strictly inside the ball of curvature :math:`-c`.

    .. math::

        r_{\max} = \frac{1 - \varepsilon_{\text{boundary}}}{\sqrt c}

    A python float ``c`` gives a python float, a tensor gives a tensor.
    """
    m = 1.0 - eps(dtype, "boundary")
    if torch.is_tensor(c):
        return m / c.sqrt()
    c = float(c)
    if not (c > 0 and math.isfinite(c)):
        raise ValueError(f"curvature c must be a finite positive number, got {c}")
    return m / math.sqrt(c)


def accurate_dtype(dtype: torch.dtype) -> torch.dtype:
    """Dtype in which gaps and Gram products are formed: float64 for every dtype."""
    return torch.float64


def as_curvature(c: float | torch.Tensor, like: torch.Tensor, *, name: str = "c") -> torch.Tensor:
    """Curvature magnitude ``c`` as a 0-d tensor of ``like``'s dtype and device.

    A python number must be finite and positive (``ValueError`` otherwise); a
    tensor is taken as given (it may be a learnable parameter).
    """
    if torch.is_tensor(c):
        if c.dim() != 0:
            raise ValueError(f"curvature {name} must be a python float or a 0-d tensor")
        return c.to(dtype=like.dtype, device=like.device)
    c = float(c)
    if not (c > 0 and math.isfinite(c)):
        raise ValueError(f"curvature {name} must be a finite positive number, got {c}")
    return torch.tensor(c, dtype=like.dtype, device=like.device)


# --------------------------------------------------------------------------
# square roots with a finite gradient at 0


def safe_sqrt(x: torch.Tensor) -> torch.Tensor:
    r""":math:`\sqrt{\max(x, 0)}` with value 0 and gradient 0 where :math:`x \le` tiny.

    Exact zeros (a point and itself, the origin) get a zero gradient instead of
    ``inf * 0 = nan``; every positive normal number keeps its exact square root.
    """
    ok = x > _guards(x.dtype).tiny
    return torch.where(ok, torch.where(ok, x, torch.ones_like(x)).sqrt(), torch.zeros_like(x))


def safe_norm(x: torch.Tensor, *, keepdim: bool = False) -> torch.Tensor:
    r"""Euclidean norm over the last dim, :math:`\sqrt{\sum_i x_i^2}`, with a zero gradient at 0."""
    return safe_sqrt((x * x).sum(-1, keepdim=keepdim))


# --------------------------------------------------------------------------
# 1 - c |x|^2 without cancellation


def _split(a: torch.Tensor):
    # Veltkamp: a = hi + lo exactly, hi and lo with at most 26 significant bits each
    t = a * VELTKAMP_SPLIT
    hi = t - (t - a)
    return hi, a - hi


def _two_prod(a: torch.Tensor, b: torch.Tensor):
    # Dekker: a * b = p + e exactly
    p = a * b
    ah, al = _split(a)
    bh, bl = _split(b)
    return p, ((ah * bh - p) + ah * bl + al * bh) + al * bl


def _sqnorm_parts(x: torch.Tensor):
    """|x|^2 over the last dim of a float64 tensor as an unevaluated sum hi + lo.

    x_i^2 = p_i + e_i exactly (Dekker); each p_i = q_i + r_i exactly with q_i a
    multiple of ulp(sigma), sigma = 2^M 2^ceil(log2 max p), 2^M >= d + 2
    (Rump, Ogita and Oishi's ExtractVector), so sum(q) is exact in any order
    and only the tiny sum(r + e) is rounded: relative error about d^2 u^2.
    No autograd; four temporaries, reused in place.
    """
    a = torch.mul(x, VELTKAMP_SPLIT)
    b = torch.sub(a, x)
    a.sub_(b)  # a = hi (Veltkamp)
    torch.sub(x, a, out=b)  # b = lo
    p = torch.mul(x, x)
    e = torch.mul(a, a)
    e.sub_(p).addcmul_(a, b, value=2.0).addcmul_(b, b)  # e = x^2 - p exactly
    m = math.ceil(math.log2(x.shape[-1] + 2))
    _, ex = torch.frexp(p.amax(-1, keepdim=True))
    sigma = torch.ldexp(torch.ones_like(p[..., :1]), ex + m)
    torch.add(p, sigma, out=a)
    a.sub_(sigma)  # a = q
    p.sub_(a).add_(e)  # p = r + e
    return a.sum(-1), p.sum(-1)


def one_minus_c_sqnorm(
    x: torch.Tensor, c: float | torch.Tensor, *, keepdim: bool = False
) -> torch.Tensor:
    r"""The gap :math:`1 - c\|x\|^2` over the last dim, without cancellation.

    .. math::

        g(x) = 1 - c\sum_i x_i^2 = (1 - p) - q - c\,s_{lo},
        \qquad c\,s_{hi} = p + q \text{ exactly}

    where :math:`s_{hi} + s_{lo} = \|x\|^2` up to about :math:`d^2u^2`
    relative, from error-free transformations in float64 (Dekker products,
    Rump-Ogita-Oishi extraction; about 15 elementwise passes, no loop over
    the dimension: some 4x the cost of the plain formula). The result is
    accurate to a few ulp of :math:`g` itself, also when :math:`g \approx
    10^{-15}` (measured against 60 digits at :math:`g \ge 10^{-15}`: 4e-16
    relative for d <= 5, 1e-15 for d = 16, 3e-14 for d = 128, 6e-13 for
    d = 512), instead of to a few ulp of 1. Its
    gradient is that of the plain formula, :math:`-2cx` (and
    :math:`-\|x\|^2` for a tensor ``c``). Not clamped: points on or outside
    the boundary give :math:`g \le 0`.

    Parameters
    ----------
    x : tensor (..., d)
    c : float or 0-d tensor
        curvature magnitude (may be 0 or negative here: this is just arithmetic).
    keepdim : bool

    Returns
    -------
    tensor (...,) or (..., 1), dtype of ``x``
    """
    wide = accurate_dtype(x.dtype)
    with torch.no_grad():
        if torch.is_tensor(c):
            cw = c.detach().to(dtype=wide, device=x.device)
        else:
            cw = torch.tensor(float(c), dtype=wide, device=x.device)
        s_hi, s_lo = _sqnorm_parts(x.detach().to(wide))
        p, q = _two_prod(cw, s_hi)
        exact = ((1 - p) - q) - cw * s_lo
    needs_grad = torch.is_grad_enabled() and (
        x.requires_grad or (torch.is_tensor(c) and c.requires_grad)
    )
    if needs_grad:
        c_t = c.to(dtype=x.dtype, device=x.device) if torch.is_tensor(c) else float(c)
        plain = 1 - c_t * (x * x).sum(-1)
        g = plain + (exact.to(x.dtype) - plain.detach())
    else:
        g = exact.to(x.dtype)
    return g.unsqueeze(-1) if keepdim else g


# --------------------------------------------------------------------------
# smooth special functions of q = s^2 >= 0

_TANHC = (1.0, -1 / 3, 2 / 15, -17 / 315, 62 / 2835)
_ASINHC = (1.0, -1 / 6, 3 / 40, -5 / 112, 35 / 1152)
_ASINC = (1.0, 1 / 6, 3 / 40, 5 / 112, 35 / 1152)


def _series(q: torch.Tensor, coeffs) -> torch.Tensor:
    out = torch.full_like(q, coeffs[-1])
    for a in reversed(coeffs[:-1]):
        out = out * q + a
    return out


def _smooth(q: torch.Tensor, coeffs, f: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    small = q < _guards(q.dtype).series
    q_big = torch.where(small, torch.ones_like(q), q)
    s = q_big.sqrt()
    return torch.where(small, _series(torch.where(small, q, torch.zeros_like(q)), coeffs), f(s) / s)


def tanhc(q: torch.Tensor) -> torch.Tensor:
    r""":math:`\tanh(\sqrt q)/\sqrt q` for :math:`q \ge 0`, smooth at 0 (a series near 0)."""
    return _smooth(q, _TANHC, torch.tanh)


def asinhc(q: torch.Tensor) -> torch.Tensor:
    r""":math:`\operatorname{arsinh}(\sqrt q)/\sqrt q` for :math:`q \ge 0`, smooth at 0."""
    return _smooth(q, _ASINHC, torch.asinh)


def asinc(q: torch.Tensor) -> torch.Tensor:
    r""":math:`\arcsin(\sqrt q)/\sqrt q` for :math:`0 \le q \le 1`, smooth at 0 (clamped at 1)."""
    one = 1.0 - _guards(q.dtype).angle
    return _smooth(q, _ASINC, lambda s: torch.asin(s.clamp_max(one)))


# --------------------------------------------------------------------------
# (n, m) tables from Gram products


def flatten_pair(x: torch.Tensor, y: torch.Tensor):
    """Broadcast the leading dims of ``x`` (..., n, d) and ``y`` (..., m, d).

    Returns ``(xb, yb, batch)``: (B, n, d) and (B, m, d) tensors in
    :func:`accurate_dtype` and the broadcast batch shape (B = its product).
    """
    if x.dim() < 2 or y.dim() < 2 or x.shape[-1] != y.shape[-1]:
        raise ValueError(
            f"pairwise: need (..., n, d) and (..., m, d), got {tuple(x.shape)} and {tuple(y.shape)}"
        )
    wide = accurate_dtype(x.dtype)
    batch = torch.broadcast_shapes(x.shape[:-2], y.shape[:-2])
    xb = x.to(wide).expand(*batch, *x.shape[-2:]).reshape(-1, *x.shape[-2:])
    yb = y.to(wide).expand(*batch, *y.shape[-2:]).reshape(-1, *y.shape[-2:])
    return xb, yb, batch


def gram_pairwise(
    xb: torch.Tensor,
    yb: torch.Tensor,
    fast: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
    exact: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor],
) -> torch.Tensor:
    r"""A (B, n, m) table from Gram products, with exact recomputation where they cancel.

    ``fast(x2, y2, xy)`` gets :math:`\|x\|^2` (B, n, 1), :math:`\|y\|^2`
    (B, 1, m) and :math:`x y^\top` (B, n, m) and returns ``(values, flag)``;
    ``exact(b, i, j)`` recomputes the values of the flagged pairs from the rows
    ``xb[b, i]``, ``yb[b, j]`` (1-d index tensors), in chunks of at most
    2**22 gathered elements. Memory: :math:`O(nm)` plus one chunk, never
    :math:`O(nmd)`. Inputs come from :func:`flatten_pair`; differentiable.
    """
    x2 = (xb * xb).sum(-1)[..., :, None]
    y2 = (yb * yb).sum(-1)[..., None, :]
    xy = xb @ yb.transpose(-1, -2)
    values, flag = fast(x2, y2, xy)
    idx = flag.nonzero()
    if idx.shape[0]:
        step = max(1, _CHUNK_ELEMS // max(1, xb.shape[-1]))
        parts = [exact(*idx[s : s + step].unbind(1)) for s in range(0, idx.shape[0], step)]
        values = values.index_put(tuple(idx.unbind(1)), torch.cat(parts).to(values.dtype))
    return values


def pairwise_sqdist(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    r"""Squared distances :math:`\|x_i - y_j\|^2`, (..., n, d), (..., m, d) -> (..., n, m).

    .. math::

        \|x - y\|^2 = \|x\|^2 + \|y\|^2 - 2\langle x, y\rangle

    formed in float64; pairs where this cancels (:math:`\le` eps "cancel"
    :math:`\cdot(\|x\|^2 + \|y\|^2)`) are recomputed exactly as
    :math:`\sum_k (x_k - y_k)^2`, so the result keeps about 1e-10 relative
    accuracy for every pair. Returned in float64 (:func:`accurate_dtype`);
    differentiable.
    """
    xb, yb, batch = flatten_pair(x, y)
    tau = _guards(torch.float64).cancel

    def fast(x2, y2, xy):
        sq = (x2 + y2 - 2 * xy).clamp_min(0)
        return sq, sq <= tau * (x2 + y2)

    def exact(b, i, j):
        diff = xb[b, i] - yb[b, j]
        return (diff * diff).sum(-1)

    out = gram_pairwise(xb, yb, fast, exact)
    return out.reshape(*batch, x.shape[-2], y.shape[-2])
