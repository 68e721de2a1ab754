"""Geometry core of hypsearch: pure functions on tensors (float32 and float64, batched).

* :mod:`.numerics` -- the one table of numerical guards (eps by dtype) and the
  stable primitives (gap 1 - c|x|^2 without cancellation, safe square roots,
  Gram tables with exact fallback);
* :mod:`.poincare` -- the Poincaré ball: Möbius addition, distances, exp/log
  maps, Möbius matvec, Lorentz and Klein coordinates, Einstein midpoint;
* :mod:`.stereographic` -- the κ-stereographic model, continuous through κ = 0;
* :mod:`.product` -- products of Poincaré, spherical and Euclidean factors;
* :mod:`.cones` -- hyperbolic entailment cones;
* :mod:`.delta` -- Gromov δ-hyperbolicity of point sets.
"""

from . import cones, delta, numerics, poincare, product, stereographic
from .product import ProductSpace

__all__ = ["ProductSpace", "cones", "delta", "numerics", "poincare", "product", "stereographic"]
