r"""numpy float64 twins of the Poincaré-ball formulas a service request needs.

The torch functions of :mod:`models.geometry.poincare` are the reference; on
one query vector each of their calls is dominated by torch's dispatch (the
compensated gap alone is about 15 elementwise operations). These twins
compute the *same formulas in the same order* on numpy float64 arrays, for the
per-request hot paths (distance to the origin of a query, its nearest label
prototypes). Tests check them against the torch
functions and the 60-digit reference (``tests/models/test_geometry_numpy.py``).

* :func:`gap` -- :math:`g(x) = 1 - c\|x\|^2` without cancellation (the error-free
  transformations of :func:`models.geometry.numerics.one_minus_c_sqnorm`),
  floored at :data:`models.geometry.ranking.GAP_FLOOR` like
  :func:`models.geometry.poincare.gap` (the plain, faster gap the index ranks
  with is :func:`models.geometry.ranking.fast_gap`);
* :func:`dist`, :func:`pairwise_dist` -- the geodesic distance
  :math:`\frac{2}{\sqrt c}\operatorname{arsinh}\sqrt{c\|x-y\|^2/(g(x)g(y))}`,
  with :math:`\|x-y\|^2` always from the differences (in bounded chunks for
  tables), so a table entry equals :func:`dist` of its pair;
* :func:`distance_to_origin` -- the same kernel with :math:`y = 0`.

Only float64 and a python float curvature (what the service holds); no autograd.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from . import numerics as nm
from .ranking import GAP_FLOOR

__all__ = ["dist", "distance_to_origin", "gap", "one_minus_c_sqnorm", "pairwise_dist"]

# the guards of the one table (models.geometry.numerics.EPS), float64 row
_TINY = nm.eps(torch.float64, "tiny")
_SPLIT = nm.VELTKAMP_SPLIT
_CHUNK_ELEMS = 1 << 20  # float64 values of one (rows, m, d) block of differences: 8 MiB


def _curvature(c) -> float:
    c = float(c)
    if not (c > 0 and math.isfinite(c)):
        raise ValueError(f"curvature c must be a finite positive number, got {c}")
    return c


def _as_points(x) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    if x.ndim == 0:
        raise ValueError("expected points with their coordinates in the last dimension")
    return x


def _split(a: np.ndarray):
    # Veltkamp: a = hi + lo exactly
    t = a * _SPLIT
    hi = t - (t - a)
    return hi, a - hi


def _two_prod(a, b):
    # Dekker: a * b = p + e exactly
    p = a * b
    ah, al = _split(np.asarray(a, dtype=np.float64))
    bh, bl = _split(np.asarray(b, dtype=np.float64))
    return p, ((ah * bh - p) + ah * bl + al * bh) + al * bl


def _sqnorm_parts(x: np.ndarray):
    """|x|^2 over the last dim as hi + lo (see numerics._sqnorm_parts: same steps)."""
    hi, lo = _split(x)
    p = x * x
    e = ((hi * hi - p) + 2.0 * hi * lo) + lo * lo  # x^2 - p exactly
    m = math.ceil(math.log2(x.shape[-1] + 2))
    _, ex = np.frexp(p.max(axis=-1, keepdims=True))
    sigma = np.ldexp(np.ones_like(p[..., :1]), ex + m)
    q = (p + sigma) - sigma
    r = (p - q) + e
    return q.sum(-1), r.sum(-1)


def one_minus_c_sqnorm(x, c: float) -> np.ndarray:
    r""":math:`1 - c\|x\|^2` over the last dim without cancellation (not clamped);
    twin of :func:`models.geometry.numerics.one_minus_c_sqnorm` in float64."""
    x = _as_points(x)
    c = np.float64(c)
    s_hi, s_lo = _sqnorm_parts(x)
    p, q = _two_prod(c, s_hi)
    return ((1 - p) - q) - c * s_lo


def gap(x, *, c: float) -> np.ndarray:
    r"""The gap :math:`g(x) = 1 - c\|x\|^2`, floored at
    :data:`~models.geometry.ranking.GAP_FLOOR` (the float64 "boundary" guard);
    twin of :func:`models.geometry.poincare.gap`."""
    c = _curvature(c)
    return np.maximum(one_minus_c_sqnorm(x, c), GAP_FLOOR)


def _safe_sqrt(a: np.ndarray) -> np.ndarray:
    # sqrt(a) where a > tiny, else 0 (numerics.safe_sqrt)
    return np.sqrt(np.where(a > _TINY, a, 0.0))


def _dist_sq(sq, gx, gy, c: float) -> np.ndarray:
    # d = 2/sqrt(c) * arsinh(sqrt(c |x-y|^2 / (g(x) g(y))))  (poincare._dist_sq)
    return 2 * np.arcsinh(_safe_sqrt(c * sq / (gx * gy))) / math.sqrt(c)


def dist(x, y, *, c: float) -> np.ndarray:
    r"""Geodesic distance, broadcasting over the leading dims; twin of
    :func:`models.geometry.poincare.dist`."""
    c = _curvature(c)
    x, y = _as_points(x), _as_points(y)
    diff = x - y
    sq = (diff * diff).sum(-1)
    return _dist_sq(sq, gap(x, c=c), gap(y, c=c), c)


def distance_to_origin(x, *, c: float) -> np.ndarray:
    r""":math:`d(0, x) = \frac{2}{\sqrt c}\operatorname{artanh}(\sqrt c\|x\|)`; twin of
    :func:`models.geometry.poincare.distance_to_origin` (a 0-d array for one point)."""
    c = _curvature(c)
    x = _as_points(x)
    sq = (x * x).sum(-1)
    return _dist_sq(sq, gap(x, c=c), np.ones_like(sq), c)


def pairwise_dist(x, y, *, c: float, gy: np.ndarray | None = None) -> np.ndarray:
    r"""Distances of every pair, (n, d), (m, d) -> (n, m); twin of
    :func:`models.geometry.poincare.pairwise_dist` (which uses the Gram form with an
    exact fallback; here every :math:`\|x_i - y_j\|^2` comes from the differences,
    in blocks of at most 2**20 values, so each entry is :func:`dist` of its pair).

    ``gy``: the gaps of ``y`` (:func:`gap`) when the caller keeps them (a fixed
    set of prototypes), else computed here.
    """
    c = _curvature(c)
    x, y = _as_points(x), _as_points(y)
    if x.ndim != 2 or y.ndim != 2 or x.shape[1] != y.shape[1]:
        raise ValueError(f"pairwise: need (n, d) and (m, d), got {x.shape} and {y.shape}")
    gx = gap(x, c=c)
    gy = gap(y, c=c) if gy is None else np.asarray(gy, dtype=np.float64)
    n, m = len(x), len(y)
    out = np.empty((n, m), dtype=np.float64)
    rows = max(1, _CHUNK_ELEMS // max(1, m * x.shape[1]))
    for a in range(0, n, rows):
        diff = x[a : a + rows, None, :] - y[None, :, :]
        sq = (diff * diff).sum(-1)
        out[a : a + rows] = _dist_sq(sq, gx[a : a + rows, None], gy[None, :], c)
    return out
