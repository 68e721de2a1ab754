r"""Heads that map encoder features to embeddings, and the spaces they live in.

:class:`HyperbolicHead` (Khrulkov et al. 2020; Ermolov et al. 2022; Guo et
al. 2022)::

    features (n, F) --linear--> v (n, D) --CLIP(v; r)--> --expmap0_c--> z in the ball
                     [--Möbius linear: z <- (M ⊗_c z) ⊕_c b]   (optional)

computed in float64 from the linear layer on (points of hyperbolic radius up
to 2r/√c; float32 loses the gap near radius 14). :class:`EuclideanHead` is
its Euclidean twin: the same linear layer and clipping, no exponential map.

A :class:`Space` gives the distances an objective and the evaluation use:
:class:`PoincareSpace` calls :mod:`models.geometry.poincare` (one
implementation per formula), :class:`EuclideanSpace` the Euclidean norm.
Label prototypes enter a Euclidean space through ``logmap0`` (their tangent
vectors at the origin), so a Euclidean twin aims at the same directions and
(tangent) radii as the hyperbolic model.

``scale`` (:attr:`Space.scale`, 0: off) makes the prototypes the label points as
seen from the head's base point ``m`` with their distances from ``m`` multiplied
by ``scale``: :func:`models.geometry.poincare.toward` ``(m, p, scale·d(m, p))``
(the twin: the tangent vector scaled alike). Training sets it so that the trained
classes lie at a mean distance ``prototype_radius`` from ``m``
(:attr:`models.training.config.TrainConfig.prototype_radius`): the label points of
a cap construction lie 11 to 16 units away, where ``-d(z, p)`` varies with the
angle only like ``-2 log sin(θ/2)`` and the images must travel far out; scaled,
directions and depth order stay the labels'.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from ..geometry import numerics as nm
from ..geometry import poincare

__all__ = [
    "EuclideanHead",
    "EuclideanSpace",
    "HeadConfig",
    "HyperbolicHead",
    "PoincareSpace",
    "ProductHead",
    "ProductTrainSpace",
    "Space",
    "build_head",
    "make_space",
]


# ---------------------------------------------------------------- spaces


class Space:
    """Distances of an embedding space; every method takes float64 tensors."""

    name = "?"
    scale = 0.0  # prototypes: the label points' distances from the base point times this

    def pairwise(
        self, x: torch.Tensor, y: torch.Tensor
    ) -> torch.Tensor:  # (n, D), (m, D) -> (n, m)
        raise NotImplementedError

    def dist(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:  # (n, D), (n, D) -> (n,)
        raise NotImplementedError

    def to_origin(self, x: torch.Tensor) -> torch.Tensor:  # (n, D) -> (n,)
        raise NotImplementedError

    def to_base(
        self, x: torch.Tensor
    ) -> torch.Tensor:  # (n, D) -> (n,), from the head's base point
        raise NotImplementedError

    def from_ball(self, p: torch.Tensor) -> torch.Tensor:
        """Label points of the Poincaré ball -> prototypes in this space."""
        raise NotImplementedError

    def midpoint(self, x: torch.Tensor) -> torch.Tensor:  # (n, D) -> (D,)
        raise NotImplementedError


class PoincareSpace(Space):
    """The ball of curvature ``-c``. ``learned``: a callable returning the current 0-d
    curvature tensor of a head that learns it (:attr:`HyperbolicHead.log_c`); ``c`` then
    follows it, with its gradient."""

    name = "poincare"

    def __init__(
        self,
        curvature: float,
        base: torch.Tensor | None = None,
        learned=None,
        scale: float = 0.0,
    ):
        self._c = float(curvature)
        self.base = base  # the head's base point (where a zero feature lands)
        self.learned = learned
        self.scale = float(scale)

    @property
    def c(self):
        return self._c if self.learned is None else self.learned()

    def to_base(self, x):
        if self.base is None:
            return self.to_origin(x)
        return poincare.dist(self.base.to(x.dtype).expand_as(x), x, c=self.c)

    def pairwise(self, x, y):
        return poincare.pairwise_dist(x, y, c=self.c)

    def dist(self, x, y):
        return poincare.dist(x, y, c=self.c)

    def to_origin(self, x):
        return poincare.distance_to_origin(x, c=self.c)

    def from_ball(self, p):
        if not self.scale:
            return p
        m = torch.zeros_like(p) if self.base is None else self.base.to(p.dtype).expand_as(p)
        return poincare.toward(m, p, self.scale * self.dist(m, p)[..., None], c=self.c)

    def midpoint(self, x):
        """Einstein midpoint (hyperbolic ProtoNet prototype of a few examples)."""
        return poincare.einstein_midpoint(x, c=self.c)


class EuclideanSpace(Space):
    r"""The twin's space: tangent vectors at the head's base point ``m`` of the ball.

    A label point ``p`` becomes :math:`\log_0((-m) \oplus_c p)`, the tangent
    vector the hyperbolic head would need to reach it (its norm is
    :math:`\sqrt c\, d(m, p)/2`).
    """

    name = "euclidean"

    def __init__(
        self, curvature: float = 1.0, base: torch.Tensor | None = None, scale: float = 0.0
    ):
        self.c = float(curvature)  # only to map label points
        self.base = base
        self.scale = float(scale)

    def pairwise(self, x, y):
        return nm.safe_sqrt(nm.pairwise_sqdist(x, y)).to(x.dtype)

    def dist(self, x, y):
        return nm.safe_norm(x - y)

    def to_origin(self, x):
        return nm.safe_norm(x)

    def to_base(self, x):  # the twin's vectors are tangent vectors at the base point
        return nm.safe_norm(x)

    def from_ball(self, p):
        if self.base is not None:
            p = poincare.mobius_add(-self.base.to(p.dtype).expand_as(p), p, c=self.c)
        v = poincare.logmap0(p, c=self.c)
        return v * self.scale if self.scale else v

    def midpoint(self, x):
        return x.mean(0)


class ProductTrainSpace(Space):
    r"""A mixed-curvature product (CurvLearn; Gu et al. 2019), e.g.
    ``poincare:8,sphere:4,euclidean:4``: the :math:`\ell_2` combination of the
    factors' distances (:class:`models.geometry.product.ProductSpace`). It has no
    label points: label embeddings live in one ball, so the prototype losses
    do not apply (train with ``circle``, ``pairwise`` or ``ntxent``)."""

    name = "product"

    def __init__(self, spec: str, curvature: float = 1.0, base: torch.Tensor | None = None):
        from ..geometry.product import ProductSpace

        self.product = ProductSpace.parse(spec)
        self.spec = str(self.product)
        self.c = float(curvature)
        self.base = base

    def pairwise(self, x, y):
        return self.product.pairwise_dist(x, y)

    def dist(self, x, y):
        return self.product.dist(x, y)

    def to_origin(self, x):
        return self.product.dist(x, torch.zeros_like(x))

    def to_base(self, x):
        return self.to_origin(x)

    def from_ball(self, p):
        raise ValueError(f"a {self.spec} model has no label points in the ball")

    def midpoint(self, x):
        """Per factor: the Einstein midpoint (balls), the mean (Euclidean), the mean of the
        tangent vectors at the origin mapped back (spheres)."""
        parts = []
        for f, a in zip(self.product.factors, self.product.split(x), strict=True):
            if f.kind == "poincare":
                parts.append(poincare.einstein_midpoint(a, c=f.curvature))
            elif f.kind == "euclidean":
                parts.append(a.mean(0))
            else:
                from ..geometry import stereographic

                v = stereographic.logmap0(a, k=f.curvature).mean(0)
                parts.append(stereographic.expmap0(v, k=f.curvature))
        return torch.cat(parts, dim=-1)


def make_space(
    geometry: str,
    curvature: float,
    base: torch.Tensor | None = None,
    spec: str | None = None,
    scale: float = 0.0,
) -> Space:
    """The space of a head; ``scale`` > 0: prototypes at that multiple of the label
    points' distances from ``base`` (:attr:`Space.scale`)."""
    if geometry == "poincare":
        return PoincareSpace(curvature, base, scale=scale)
    if geometry == "euclidean":
        return EuclideanSpace(curvature, base, scale=scale)
    if geometry == "product" and spec:
        return ProductTrainSpace(spec, curvature, base)
    raise ValueError(f"unknown geometry {geometry!r} (poincare, euclidean or product)")


# ---------------------------------------------------------------- heads


@dataclass
class HeadConfig:
    in_features: int = 128
    dim: int = 10
    geometry: str = "poincare"  # or "euclidean" (the twin)
    curvature: float = 1.0
    clip_r: float = 2.3  # CLIP(x; r) before expmap0: hyperbolic radius at most 2r/sqrt(c)
    mobius: bool = False  # a Möbius linear layer after expmap0
    space: str | None = None  # geometry "product": the factors, "poincare:8,sphere:4,euclidean:4"
    learn_curvature: bool = False  # poincare: c = exp(log_c) is a parameter (`curvature` its value)
    prototype_scale: float = 0.0  # the prototypes' distances from the base point: the label
    # points' times this (0: the label points themselves; Space.scale)


class HyperbolicHead(nn.Module):
    """linear -> CLIP(.; r) -> expmap0 -> [Möbius linear] -> m ⊕ (.); float64 points of the ball.

    ``cfg.learn_curvature``: the curvature is ``exp(log_c)``, a trained parameter
    (clamped to [1e-3, 1e2]) that starts at ``cfg.curvature``; whoever saves the
    model writes its value back into ``cfg.curvature`` (:meth:`sync_curvature`),
    so a loaded model's ``curvature`` is the learned one.

    ``base`` (``m``, a point of the ball, trained by Riemannian Adam) is
    where a zero feature vector lands: the Möbius translation by ``m`` is an
    isometry, so the head works around ``m`` as it would around the origin
    (label embeddings of a deep subtree, such as clothing in WordNet, sit in
    a thin cone far from the origin; seen from their Einstein midpoint they
    spread in every direction). ``m = 0`` gives the plain head.
    """

    def __init__(self, cfg: HeadConfig):
        super().__init__()
        import geoopt

        self.cfg = cfg
        self.linear = nn.Linear(cfg.in_features, cfg.dim)
        ball = geoopt.PoincareBall(c=cfg.curvature)
        self.base = geoopt.ManifoldParameter(
            torch.zeros(cfg.dim, dtype=torch.float64), manifold=ball
        )
        self.log_c = None
        if cfg.learn_curvature:
            self.log_c = nn.Parameter(torch.tensor(math.log(cfg.curvature), dtype=torch.float64))
        self.mobius = None
        if cfg.mobius:
            self.mobius = nn.Parameter(torch.eye(cfg.dim, dtype=torch.float64))
            self.mobius_bias = geoopt.ManifoldParameter(
                torch.zeros(cfg.dim, dtype=torch.float64), manifold=ball
            )

    def curvature(self):
        """The curvature magnitude: ``cfg.curvature``, or the learned 0-d tensor."""
        if self.log_c is None:
            return self.cfg.curvature
        return self.log_c.clamp(math.log(1e-3), math.log(1e2)).exp()

    def sync_curvature(self) -> float:
        """Write the learned curvature into ``cfg.curvature``; returns it."""
        if self.log_c is not None:
            self.cfg.curvature = float(self.curvature().detach())
        return float(self.cfg.curvature)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        c = self.curvature()
        v = self.linear(features.float()).to(torch.float64)  # (n, D) tangent vectors at 0
        v = poincare.clip_features(v, self.cfg.clip_r)
        z = poincare.expmap0(v, c=c)  # (n, D) in the ball, d(0, z) <= 2r/sqrt(c)
        if self.mobius is not None:
            z = poincare.mobius_matvec(self.mobius, z, c=c)
            z = poincare.mobius_add(z, self.mobius_bias.expand_as(z), c=c)
        return poincare.mobius_add(self.base.expand_as(z), z, c=c)  # around m


class EuclideanHead(nn.Module):
    """The Euclidean twin: linear -> CLIP(.; r); returns float64 vectors.

    ``base`` (a buffer) is the point of the ball whose tangent space holds
    the twin's prototypes (:class:`EuclideanSpace`).
    """

    def __init__(self, cfg: HeadConfig):
        super().__init__()
        self.cfg = cfg
        self.linear = nn.Linear(cfg.in_features, cfg.dim)
        self.register_buffer("base", torch.zeros(cfg.dim, dtype=torch.float64))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        v = self.linear(features.float()).to(torch.float64)
        return poincare.clip_features(v, self.cfg.clip_r)


class ProductHead(nn.Module):
    """linear -> CLIP(.; r) per factor -> the factors' exponential maps at the origin
    (identity on Euclidean factors); float64 points of the product ``cfg.space``."""

    def __init__(self, cfg: HeadConfig):
        super().__init__()
        from ..geometry.product import ProductSpace

        self.cfg = cfg
        self.product = ProductSpace.parse(cfg.space or "")
        if self.product.dim != cfg.dim:
            raise ValueError(f"space {cfg.space!r} has dimension {self.product.dim}, not {cfg.dim}")
        self.linear = nn.Linear(cfg.in_features, cfg.dim)
        self.register_buffer("base", torch.zeros(cfg.dim, dtype=torch.float64))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        v = self.linear(features.float()).to(torch.float64)
        parts = [poincare.clip_features(a, self.cfg.clip_r) for a in self.product.split(v)]
        return self.product.expmap0(torch.cat(parts, dim=-1))


def build_head(cfg: HeadConfig) -> nn.Module:
    if cfg.geometry == "product":
        return ProductHead(cfg)
    if cfg.geometry == "poincare":
        return HyperbolicHead(cfg)
    if cfg.geometry == "euclidean":
        if cfg.mobius:
            raise ValueError("a Möbius layer needs the poincare geometry")
        return EuclideanHead(cfg)
    raise ValueError(f"unknown geometry {cfg.geometry!r} (poincare or euclidean)")
