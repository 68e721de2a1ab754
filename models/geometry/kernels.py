r"""Compiled (numba) float64 twins of the distances the index returns.

:func:`models.geometry.poincare.dist` and :meth:`models.geometry.ProductSpace.dist`
(torch) are the reference; this module computes the *same formulas* one pair
at a time in numba ``nopython`` code, so the index's search kernels re-rank
their candidates without leaving compiled code (no GIL, no per-query Python).
Tests check it against torch (``tests/models/test_geometry_kernels.py``).

A space is a *factor table* (:func:`factor_table`): ``kinds`` (:data:`POINCARE`,
:data:`SPHERE`, :data:`EUCLIDEAN`), coordinate ``starts`` (``F + 1`` entries)
and curvature magnitudes.  The Poincaré ball is the table of one factor.

Per point, the factors' *gaps* (:func:`gaps`: ``1 - c|x|^2`` of a ball factor,
compensated and floored like :func:`models.geometry.poincare.gap`, the steps
of :func:`models.geometry.poincare_np.one_minus_c_sqnorm` compiled; ``1 + k|x|^2`` of a
sphere factor; 1 for a Euclidean one) are computed once and stored;
:func:`dist` then needs only the coordinate differences:

* ball: :math:`\frac{2}{\sqrt c}\operatorname{arsinh}\sqrt{c\|x-y\|^2/(g_x g_y)}`
  (``poincare._dist_sq``);
* sphere (stereographic): :math:`\frac{2}{\sqrt k}\arcsin\sqrt{k\|x-y\|^2/(A_x A_y)}`
  (``stereographic._dist_sq``, argument clamped below 1 like ``numerics.asinc``);
* Euclidean: :math:`\|x - y\|`;
* product: :math:`\sqrt{\sum_i d_i^2}` (one factor: :math:`d_1` itself).

:math:`\|x-y\|^2` always from the differences, summed in float64.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from .numerics import VELTKAMP_SPLIT as _VELTKAMP
from .ranking import GAP_FLOOR

__all__ = ["EUCLIDEAN", "POINCARE", "SPHERE", "dist", "dist_rows", "factor_table", "gaps"]

POINCARE, SPHERE, EUCLIDEAN = 0, 1, 2
_KIND = {"poincare": POINCARE, "sphere": SPHERE, "euclidean": EUCLIDEAN}
#: safe_sqrt's guard (``numerics.EPS`` float64 "tiny")
_TINY = float(np.finfo(np.float64).tiny)
#: numerics' float64 "angle" guard: arcsin arguments kept <= 1 - this
_ANGLE = 1e-15


def factor_table(factors) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(kinds, starts, curvatures)`` of ``(kind, dim, curvature)`` factors
    (``models.geometry.product.Factor`` or plain tuples)."""
    kinds = np.array([_KIND[f[0]] for f in factors], dtype=np.int64)
    starts = np.zeros(len(factors) + 1, dtype=np.int64)
    starts[1:] = np.cumsum([int(f[1]) for f in factors])
    curv = np.array([float(f[2]) for f in factors], dtype=np.float64)
    return kinds, starts, curv


def gaps(x: np.ndarray, table) -> np.ndarray:
    """Per-factor gaps ``(n, F)`` float64 of the points ``x (n, D)`` (see the module
    docstring): compiled, row by row, the steps of
    :func:`models.geometry.poincare_np.one_minus_c_sqnorm` (the numpy form
    made 10 temporaries the size of ``x``: 1.5 s for 200,000 x 64-d, where
    this takes milliseconds)."""
    kinds, starts, curv = table
    x = np.ascontiguousarray(np.asarray(x, dtype=np.float64).reshape(-1, int(starts[-1])))
    out = np.ones((len(x), len(kinds)), dtype=np.float64)
    _gaps_rows(x, kinds, starts, curv, out)
    return out


@njit(nogil=True, cache=True)
def _one_minus_c_sqnorm(x, i, a, b, c):
    """``1 - c |x_i[a:b]|^2`` without cancellation: the squares split exactly
    into a part on a common grid (summed exactly in any order) and their
    rounding errors (Dekker / Veltkamp), as
    :func:`models.geometry.poincare_np.one_minus_c_sqnorm` does."""
    pmax = 0.0
    for t in range(a, b):
        v = x[i, t]
        pmax = max(pmax, v * v)
    _, ex = math.frexp(pmax)
    sigma = math.ldexp(1.0, ex + int(math.ceil(math.log2(b - a + 2))))
    s_hi = 0.0
    s_lo = 0.0
    comp = 0.0
    for t in range(a, b):
        v = x[i, t]
        u = v * _VELTKAMP
        hi = u - (u - v)
        lo = v - hi
        p = v * v
        e = ((hi * hi - p) + 2.0 * hi * lo) + lo * lo
        q = (p + sigma) - sigma
        s_hi += q
        # the rounding errors, Neumaier-compensated (numpy's pairwise sum is
        # as accurate; a plain running sum lost a digit at 300-d)
        r = (p - q) + e
        t_lo = s_lo + r
        if abs(s_lo) >= abs(r):
            comp += (s_lo - t_lo) + r
        else:
            comp += (r - t_lo) + s_lo
        s_lo = t_lo
    # c * s_hi = p + q exactly (Dekker's two-product)
    p = c * s_hi
    u = c * _VELTKAMP
    ch = u - (u - c)
    cl = c - ch
    u = s_hi * _VELTKAMP
    sh = u - (u - s_hi)
    sl = s_hi - sh
    q = ((ch * sh - p) + ch * sl + cl * sh) + cl * sl
    return ((1.0 - p) - q) - c * (s_lo + comp)


@njit(nogil=True, cache=True)
def _gaps_rows(x, kinds, starts, curv, out):
    for i in range(x.shape[0]):
        for f in range(kinds.shape[0]):
            a, b = starts[f], starts[f + 1]
            if b == a:
                continue
            if kinds[f] == POINCARE:
                out[i, f] = max(_one_minus_c_sqnorm(x, i, a, b, curv[f]), GAP_FLOOR)
            elif kinds[f] == SPHERE:
                out[i, f] = _one_minus_c_sqnorm(x, i, a, b, -curv[f])


@njit(inline="always", nogil=True, cache=True)
def _safe_sqrt(a):
    return math.sqrt(a) if a > _TINY else 0.0


@njit(nogil=True, cache=True)
def dist(x, i, gx, y, j, gy, kinds, starts, curv):
    """Exact distance between the rows ``x[i]`` and ``y[j]`` (float64 or float32
    coordinates, float64 gaps ``gx[i]``, ``gy[j]`` of :func:`gaps`)."""
    total = 0.0
    nf = kinds.shape[0]
    for f in range(nf):
        sq = 0.0
        for t in range(starts[f], starts[f + 1]):
            dd = np.float64(x[i, t]) - np.float64(y[j, t])
            sq += dd * dd
        kind = kinds[f]
        if kind == POINCARE:
            c = curv[f]
            d = 2.0 * math.asinh(_safe_sqrt(c * sq / (gx[i, f] * gy[j, f]))) / math.sqrt(c)
        elif kind == SPHERE:
            k = curv[f]
            s = _safe_sqrt(k * sq / (gx[i, f] * gy[j, f]))
            d = 2.0 * math.asin(min(s, 1.0 - _ANGLE)) / math.sqrt(k)
        else:
            d = _safe_sqrt(sq)
        if nf == 1:
            return d
        total += d * d
    return _safe_sqrt(total)


@njit(nogil=True, cache=True)
def dist_rows(q, gq, x, gx, cand, kinds, starts, curv, out):
    """``out[i, j] = d(q[i], x[cand[i, j]])`` (``inf`` where ``cand < 0``)."""
    for i in range(cand.shape[0]):
        for j in range(cand.shape[1]):
            s = cand[i, j]
            out[i, j] = np.inf if s < 0 else dist(q, i, gq, x, s, gx, kinds, starts, curv)
    return out
