"""Geometry core of hypsearch: pure functions on tensors (float32 and float64, batched).

* :mod:`.numerics` -- the one table of numerical guards (eps by dtype) and the
  stable primitives (gap 1 - c|x|^2 without cancellation, safe square roots,
  Gram tables with exact fallback);
* :mod:`.poincare` -- the Poincaré ball: Möbius addition, distances, exp/log
  maps, Möbius matvec, Lorentz and Klein coordinates, Einstein midpoint;
* :mod:`.poincare_np` -- numpy float64 twins of the ball formulas a service
  request needs (compensated gap, distances);
* :mod:`.kernels` -- compiled (numba) float64 twins of the distances the index
  returns (ball and products), one pair at a time;
* :mod:`.ranking` -- what the index ranks with, numpy only and importable
  without torch: ball membership, the plain gap and its floor, the "deep"
  test, the ranking proxy and its correction to a distance (constants the
  numba kernels compile in);
* :mod:`.sparse` -- the distance with its analytic gradient (sparse training);
* :mod:`.stereographic` -- the κ-stereographic model, continuous through κ = 0;
* :mod:`.product` -- products of Poincaré, spherical and Euclidean factors;
* :mod:`.cones` -- hyperbolic entailment cones;
* :mod:`.delta` -- Gromov δ-hyperbolicity of point sets.

The submodules are imported on first use (``from models.geometry import
poincare`` or ``models.geometry.poincare``), so ``models.geometry.ranking``
loads without torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from . import (
        cones,
        delta,
        kernels,
        numerics,
        poincare,
        poincare_np,
        product,
        ranking,
        sparse,
        stereographic,
    )
    from .product import ProductSpace

__all__ = [
    "ProductSpace",
    "cones",
    "delta",
    "kernels",
    "numerics",
    "poincare",
    "poincare_np",
    "product",
    "ranking",
    "sparse",
    "stereographic",
]
_SUBMODULES = frozenset(__all__) - {"ProductSpace"}


def __getattr__(name: str):
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    if name == "ProductSpace":
        return importlib.import_module(f"{__name__}.product").ProductSpace
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
