r"""Products of constant-curvature spaces (Gu et al. 2019): balls, spheres, Euclidean spaces.

A point of the product is the concatenation of its factors' coordinates along
the last dim; the distance is the :math:`\ell_2` combination of the factors'
distances,

.. math::

    d(x, y) = \sqrt{\sum_i d_i(x^{(i)}, y^{(i)})^2}.

Factors:

* ``poincare`` -- the Poincaré ball of curvature :math:`-c`
  (:mod:`models.geometry.poincare`); points must lie inside the ball;
* ``sphere`` -- the sphere of curvature :math:`+c` (radius :math:`1/\sqrt c`) in
  stereographic coordinates, i.e. the κ-stereographic model at :math:`\kappa = c`
  (:mod:`models.geometry.stereographic`); every point of :math:`\mathbb R^d`
  is valid; distances are great-circle distances, at most :math:`\pi/\sqrt c`;
* ``euclidean`` -- :math:`\mathbb R^d` with :math:`d(x, y) = \|x - y\|`.

References
----------
* A. Gu, F. Sala, B. Gunel, C. Ré, "Learning Mixed-Curvature Representations
  in Product Spaces", ICLR 2019.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import NamedTuple

import torch

from . import numerics as nm
from . import poincare, stereographic

__all__ = ["KINDS", "Factor", "ProductSpace"]

KINDS = ("poincare", "sphere", "euclidean")

_DIM = re.compile(r"[1-9][0-9]*")


class Factor(NamedTuple):
    """A factor: ``kind`` in :data:`KINDS`, ``dim`` > 0, curvature magnitude > 0."""

    kind: str
    dim: int
    curvature: float = 1.0

    def __str__(self) -> str:
        s = f"{self.kind}:{self.dim}"
        return s if self.curvature == 1.0 or self.kind == "euclidean" else f"{s}@{self.curvature!r}"


@dataclass(frozen=True)
class ProductSpace:
    """A product of Poincaré, spherical and Euclidean factors (frozen, hashable).

    Build one from factors, ``ProductSpace((("poincare", 8, 1.0), ("euclidean", 4, 1.0)))``,
    or from a string with :meth:`parse`; ``str(space)`` gives that string back.

    Grammar of the string (whitespace around tokens is ignored)::

        spec      := factor ("," factor)*
        factor    := kind ":" dim ["@" curvature]
        kind      := "poincare" | "sphere" | "euclidean"
        dim       := positive integer
        curvature := finite positive float (magnitude; default 1; not for euclidean)

    e.g. ``"poincare:8,sphere:4,euclidean:4"`` or ``"poincare:8@0.5,sphere:2@2"``.
    A bad string raises ``ValueError`` naming the bad part.
    """

    factors: tuple[Factor, ...]

    def __post_init__(self) -> None:
        if isinstance(self.factors, str):
            raise TypeError("use ProductSpace.parse(...) for a string")
        fs = tuple(Factor(*f) for f in self.factors)
        if not fs:
            raise ValueError("a product space needs at least one factor")
        for f in fs:
            if f.kind not in KINDS:
                raise ValueError(
                    f"unknown factor kind {f.kind!r} (expected one of {', '.join(KINDS)})"
                )
            if isinstance(f.dim, bool) or not isinstance(f.dim, int) or f.dim < 1:
                raise ValueError(
                    f"factor {f.kind!r}: dimension must be a positive int, got {f.dim!r}"
                )
            curv = float(f.curvature)
            if not (curv > 0 and math.isfinite(curv)):
                raise ValueError(
                    f"factor {f.kind!r}: curvature must be finite and positive, got {f.curvature!r}"
                )
            if f.kind == "euclidean" and curv != 1.0:
                raise ValueError(
                    f"factor {f.kind!r}: a euclidean factor takes no curvature, got {f.curvature!r}"
                )
        object.__setattr__(
            self, "factors", tuple(Factor(f.kind, f.dim, float(f.curvature)) for f in fs)
        )

    # -- the string form ----------------------------------------------------

    @classmethod
    def parse(cls, spec: str) -> ProductSpace:
        """Parse ``"poincare:8,sphere:4@0.5,euclidean:4"`` (grammar in the class docstring)."""
        if not isinstance(spec, str) or not spec.strip():
            raise ValueError(f"empty product-space spec {spec!r}")
        factors = []
        for part in spec.split(","):
            item = part.strip()
            kind, sep, rest = item.partition(":")
            kind = kind.strip()
            if not sep:
                raise ValueError(f"factor {item!r}: expected kind:dim[@curvature]")
            if kind not in KINDS:
                raise ValueError(
                    f"factor {item!r}: unknown kind {kind!r} (expected one of {', '.join(KINDS)})"
                )
            dim_s, at, curv_s = rest.partition("@")
            dim_s = dim_s.strip()
            if not _DIM.fullmatch(dim_s):
                raise ValueError(f"factor {item!r}: bad dimension {dim_s!r} (a positive integer)")
            curv = 1.0
            if at:
                if kind == "euclidean":
                    raise ValueError(f"factor {item!r}: a euclidean factor takes no curvature")
                try:
                    curv = float(curv_s.strip())
                except ValueError:
                    raise ValueError(f"factor {item!r}: bad curvature {curv_s.strip()!r}") from None
                if not (curv > 0 and math.isfinite(curv)):
                    raise ValueError(
                        f"factor {item!r}: curvature must be finite and positive, "
                        f"got {curv_s.strip()!r}"
                    )
            factors.append(Factor(kind, int(dim_s), curv))
        return cls(tuple(factors))

    def __str__(self) -> str:
        return ",".join(str(f) for f in self.factors)

    # -- coordinates ----------------------------------------------------------

    @property
    def dim(self) -> int:
        """Total dimension (sum of the factors' dimensions)."""
        return sum(f.dim for f in self.factors)

    def split(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The factors' coordinates (views along the last dim)."""
        if x.shape[-1] != self.dim:
            raise ValueError(f"expected last dim {self.dim} for {self}, got {x.shape[-1]}")
        return tuple(torch.split(x, [f.dim for f in self.factors], dim=-1))

    def _k(self, f: Factor) -> float:
        return -f.curvature if f.kind == "poincare" else f.curvature

    # -- metric -----------------------------------------------------------------

    def factor_dists(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Distances in each factor, (..., D), (..., D) -> (..., n_factors)."""
        out = []
        for f, a, b in zip(self.factors, self.split(x), self.split(y), strict=True):
            if f.kind == "poincare":
                out.append(poincare.dist(a, b, c=f.curvature))
            elif f.kind == "sphere":
                out.append(stereographic.dist(a, b, k=f.curvature))
            else:
                out.append(nm.safe_norm(a - b))
        return torch.stack(torch.broadcast_tensors(*out), dim=-1)

    def dist(self, x: torch.Tensor, y: torch.Tensor, *, keepdim: bool = False) -> torch.Tensor:
        r"""Product distance :math:`\sqrt{\sum_i d_i^2}` (broadcasts; zero gradient at x = y)."""
        d = self.factor_dists(x, y)
        return nm.safe_sqrt((d * d).sum(-1, keepdim=keepdim))

    def pairwise_dist(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """:meth:`dist` of every pair, (..., n, D), (..., m, D) -> (..., n, m).

        Built from Gram products per factor (memory O(nm), see
        :func:`models.geometry.numerics.pairwise_sqdist`)."""
        total = None
        for f, a, b in zip(self.factors, self.split(x), self.split(y), strict=True):
            if f.kind == "euclidean":
                d2 = nm.pairwise_sqdist(a, b).to(x.dtype)
            else:
                d = stereographic.pairwise_dist(a, b, k=self._k(f))  # k < 0: poincare.pairwise_dist
                d2 = d * d
            total = d2 if total is None else total + d2
        return nm.safe_sqrt(total)

    # -- validity -------------------------------------------------------------

    def project(self, x: torch.Tensor) -> torch.Tensor:
        """Each Poincaré factor pulled strictly inside its ball; other factors unchanged."""
        parts = [
            poincare.project(a, c=f.curvature) if f.kind == "poincare" else a
            for f, a in zip(self.factors, self.split(x), strict=True)
        ]
        return torch.cat(parts, dim=-1)

    def contains(self, x: torch.Tensor) -> torch.Tensor:
        r"""Whether each point is valid, (..., D) -> (...) bool.

        All coordinates finite and each Poincaré factor strictly inside its
        ball (:math:`1 - c\|x\|^2 > 0`, evaluated without rounding loss);
        sphere (stereographic) and Euclidean factors accept any finite point.
        """
        ok = torch.isfinite(x).all(-1)
        for f, a in zip(self.factors, self.split(x), strict=True):
            if f.kind == "poincare":
                ok = ok & (nm.one_minus_c_sqnorm(a, f.curvature) > 0)
        return ok

    # -- maps at the origin ---------------------------------------------------

    def expmap0(self, v: torch.Tensor) -> torch.Tensor:
        """Exponential map at the origin, factor by factor (identity on Euclidean factors)."""
        parts = [
            a if f.kind == "euclidean" else stereographic.expmap0(a, k=self._k(f))
            for f, a in zip(self.factors, self.split(v), strict=True)
        ]
        return torch.cat(parts, dim=-1)

    def logmap0(self, x: torch.Tensor) -> torch.Tensor:
        """Logarithmic map at the origin, factor by factor (inverse of :meth:`expmap0`)."""
        parts = [
            a if f.kind == "euclidean" else stereographic.logmap0(a, k=self._k(f))
            for f, a in zip(self.factors, self.split(x), strict=True)
        ]
        return torch.cat(parts, dim=-1)
