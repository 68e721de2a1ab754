r"""The Poincaré ball as the index ranks it: membership, gap, deep test, proxy.

One place for the plain float64 arithmetic that decides which points an index
accepts and how it orders candidates before the exact re-ranking by
:func:`models.geometry.poincare.dist`.  numpy only, so ``indexing`` can
import it without torch;
the constants are plain floats and :func:`arcosh1p` plain scalar ``math``, so
the numba kernels of ``indexing.backends`` compile them in.

* membership (:func:`inside_ball`): every coordinate finite and
  :math:`c\|x\|^2 < 1` in float64.  For such a point the plain gap
  :math:`1 - c\|x\|^2` is at least :math:`2^{-53}` (no rounding reaches 0), so
  nothing below divides by zero;
* the gap :math:`g(x) = 1 - c\|x\|^2`: :func:`fast_gap` is the plain formula
  (a few ulp of 1: enough to rank), :func:`models.geometry.poincare_np.gap`
  (numpy) and :func:`models.geometry.poincare.gap` (torch) the compensated one
  (a few ulp of :math:`g` itself: for distances).  All three are floored at
  :data:`GAP_FLOOR`, the float64 "boundary" guard of
  :data:`models.geometry.numerics.EPS` (which takes it from here), so the
  proxy and the exact distance see the same gap for a point nearer the
  boundary than the floor;
* *deep* points (:func:`is_deep`): gap below :data:`DEEP_GAP`, hyperbolic
  radius above about :math:`12.9/\sqrt c`, where float32 coordinates cannot
  tell neighbours apart (a float32 coordinate step there is already a
  hyperbolic distance of order one): float32 ranking is not used for them;
* the *ranking proxy*: for a query :math:`q`,

  .. math::

      \operatorname{key}(q, x) = \|x - q\|^2\, w(x),\qquad w(x) = 1/g(x)

  (:func:`proxy_weight`, :func:`proxy_key_rows`) orders
  the items like the geodesic distance from :math:`q` does: the arcosh
  argument is :math:`z = 2c\operatorname{key}(q, x)\,w(q)`
  (:func:`key_to_arg`, the correction from proxy to distance) and
  :math:`\sqrt c\,d = \operatorname{arcosh}(1 + z)` (:func:`arcosh1p`;
  :func:`models.geometry.poincare.dist_from_arg` in torch).  Its symmetric
  form :math:`K(x, y) = \|x - y\|^2 w(x) w(y)` gives
  :math:`\cosh\sqrt c\,d(x, y) - 1 = 2cK`.  Keys come from coordinate
  differences, never from :math:`\|x\|^2 + \|q\|^2 - 2\langle x, q\rangle`,
  which cancels catastrophically near the boundary.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = [
    "DEEP_GAP",
    "GAP_FLOOR",
    "arcosh1p",
    "fast_gap",
    "inside_ball",
    "is_deep",
    "key_to_arg",
    "proxy_key_rows",
    "proxy_weight",
    "sqnorm",
]

#: Floor of the float64 gap ``1 - c|x|^2`` (also the float64 "boundary" guard
#: of :data:`models.geometry.numerics.EPS`): hyperbolic radius ``ln(2/1e-15) =
#: 35.2/sqrt(c)``.
GAP_FLOOR = 1e-15

#: Points whose gap ``1 - c|x|^2`` is below this are "deep": float32 ranking is
#: not reliable for them (see the module docstring).
DEEP_GAP = 1e-5


def sqnorm(x) -> np.ndarray:
    r""":math:`\|x\|^2` over the last dim, float64 (plain sum of squares)."""
    x = np.asarray(x, dtype=np.float64)
    return np.einsum("...i,...i->...", x, x)


def inside_ball(x, c: float) -> np.ndarray:
    r"""Ball membership over the last dim: finite coordinates and :math:`c\|x\|^2 < 1`."""
    x = np.asarray(x, dtype=np.float64)
    return np.isfinite(x).all(axis=-1) & (c * sqnorm(x) < 1.0)


def fast_gap(x, c: float) -> np.ndarray:
    r"""The plain float64 gap :math:`1 - c\|x\|^2`, floored at :data:`GAP_FLOOR`."""
    return np.maximum(1.0 - c * sqnorm(x), GAP_FLOOR)


def is_deep(x, c: float) -> np.ndarray:
    """Mask of the points too close to the boundary for float32 ranking (gap
    below :data:`DEEP_GAP`)."""
    return fast_gap(x, c) < DEEP_GAP


def proxy_weight(x, c: float) -> np.ndarray:
    r"""The proxy's per-point factor :math:`w(x) = 1/g(x)` (:func:`fast_gap`), float64.

    Always from float64 coordinates: float32 coordinates of a point very near
    the boundary may round onto the sphere."""
    return 1.0 / fast_gap(x, c)


def proxy_key_rows(q: np.ndarray, x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Keys ``(n, m)`` of gathered rows: ``q (n, d)``, ``x (n, m, d)``, ``w (n, m)``,
    in the dtype of ``x``."""
    diff = x - np.asarray(q, dtype=x.dtype)[:, None, :]
    return np.einsum("nmd,nmd->nm", diff, diff) * w


def key_to_arg(key, q: np.ndarray, c: float) -> np.ndarray:
    r"""The arcosh argument :math:`z = 2c\operatorname{key}\,w(q)` of keys ``(n, ...)``
    from queries ``q (n, d)``: :math:`d = \operatorname{arcosh}(1 + z)/\sqrt c`."""
    w = proxy_weight(q, c)
    key = np.asarray(key, dtype=np.float64)
    return 2.0 * c * key * w.reshape(w.shape + (1,) * (key.ndim - w.ndim))


def arcosh1p(z: float) -> float:
    r""":math:`\operatorname{arcosh}(1 + z) = \log(1 + z + \sqrt{z(z+2)})` of one
    float (:math:`\sqrt c\,d` from the arcosh argument; monotone in ``z``).
    Plain ``math``: the numba kernels compile it."""
    return math.log1p(z + math.sqrt(z * (z + 2.0)))
