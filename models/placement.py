r"""Cone placement: each image's point moved inside the cone of the node it belongs to.

A trained head puts images *around* their class's label point (the prototype
loss gathers them there), which is not inside the class's cone: with the cap
family a cone lies beyond its label point, and the images sit on every side
of it. :class:`ConePlacement` is the last step of :meth:`ImageModel.embed
<models.image_model.ImageModel.embed>` for a model whose config says
``placement: "cones"`` (``hypsearch train --placement cones``):

1. **Which node.** The posterior over the trained classes is the softmax of
   :math:`-d(z, p_k)/\tau` (the logits of training); a node's mass is the sum
   over the trained classes below it. The node is the one of mass at least
   ``threshold`` with the fewest trained classes below it, then the deepest,
   then the nearest (:func:`backoff_choice`: a confident image gets its class,
   an uncertain one the lowest common ancestor of the classes it hesitates
   between; Deng et al. 2012, Liu et al. 2020).
2. **Where in its cone.** The node's *anchor* :math:`a` is its label point
   moved ``depth`` outward along its ray
   (:func:`models.geometry.poincare.move_outward`). The image is seen from
   its node's point :math:`p` (:math:`u = (-p) \oplus z`, so
   :math:`\|u\|` measures :math:`d(p, z)`), its distance squashed to
   :math:`R\tanh(d/R)` with :math:`R` = ``depth - margin`` (order kept), and
   carried to the anchor: :math:`z' = a \oplus u'`, so :math:`d(a, z') < R`.
   With caps (:math:`\theta = \theta_0 e^{-\beta\rho}`, :math:`\beta \le 1`)
   every point within :math:`R` of the anchor is farther out than :math:`p`
   and within the angle the cap allows (a ball of fixed radius subtends an
   angle shrinking like :math:`e^{-\rho}`, the cap like
   :math:`e^{-\beta\rho}`), so :math:`z'` is inside the node's cone, hence
   inside every ancestor's of the spanning tree; the cap construction keeps
   a node's own ray outside its children's caps, so :math:`z'` is not inside a
   child's. Each placed point is checked with
   :func:`models.geometry.cones.membership_margin_np` and, where the check
   fails, moved closer to the anchor (the anchor itself always passes).

Within a node the relative positions of the images are kept (the Möbius
translations are isometries; the squash is monotone in the distance to the
label point), so nearest neighbours among images of one class stay what the
head made them; between nodes the anchors set the distances, and these rank
like the label points (the cap construction's distances: siblings before
cousins).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .geometry import cones, poincare

__all__ = ["ConePlacement", "PlacementConfig", "backoff_choice", "class_membership"]


@dataclass(frozen=True)
class PlacementConfig:
    depth: float = 3.0  # anchor: the label point moved this far outward
    margin: float = 0.5  # images stay within depth - margin of the anchor
    threshold: float = 0.5  # mass a node needs to be chosen
    tau: float = 1.0  # temperature of the posterior -d/tau

    def validate(self) -> None:
        if not (self.depth > self.margin > 0):
            raise ValueError(f"placement needs depth > margin > 0, got {self.depth}, {self.margin}")
        if not (0.5 <= self.threshold <= 1):
            raise ValueError(f"placement threshold must be in [0.5, 1], got {self.threshold}")
        if not self.tau > 0:
            raise ValueError(f"placement tau must be positive, got {self.tau}")


def class_membership(taxonomy, candidates: list[str], seen: list[str]) -> torch.Tensor:
    """``member[v, k]`` = 1 where trained class ``seen[k]`` is ``candidates[v]`` or below it."""
    member = torch.zeros(len(candidates), len(seen), dtype=torch.float64)
    col = {c: k for k, c in enumerate(seen)}
    for i, v in enumerate(candidates):
        for c in (taxonomy.descendants(v) | {v}) & col.keys():
            member[i, col[c]] = 1.0
    return member


def backoff_choice(
    d_seen: torch.Tensor,
    d_cand: torch.Tensor,
    member: torch.Tensor,
    depth: torch.Tensor,
    *,
    tau: float = 1.0,
    threshold: float = 0.5,
) -> torch.Tensor:
    """Index of the chosen candidate per row (the rule of the module docstring).

    ``d_seen`` (b, K) distances to the trained classes' points, ``d_cand``
    (b, C) to the candidates', ``member`` (C, K), ``depth`` (C,). When no
    candidate has the mass (its classes' common ancestor is not a candidate),
    the nearest candidate.
    """
    post = torch.softmax(-d_seen / tau, dim=1)
    mass = post @ member.T  # (b, C)
    size = member.sum(1)
    ok = (mass >= threshold) & (size > 0)
    # lexicographic: fewest classes below, then deepest, then nearest
    key = size[None, :] * 1e6 - depth[None, :] * 1e3 + d_cand.clamp(max=999.0)
    key = key.masked_fill(~ok, float("inf"))
    return torch.where(ok.any(1), key.argmin(1), d_cand.argmin(1))


class ConePlacement:
    """Moves head outputs inside the cone of the node they belong to (module docstring).

    ``labels``: the model's :class:`~models.labels.LabelEmbedding` (cap family);
    ``seen``: the trained classes' nodes. Candidates are the nodes with a
    trained class at or below them (held-out leaves cannot be chosen).
    """

    def __init__(self, labels, seen: list[str], cfg: PlacementConfig | None = None):
        self.cfg = cfg or PlacementConfig()
        self.cfg.validate()
        spec = cones.cone_spec(**labels.cone)
        if spec["family"] != "cap":
            raise ValueError(
                f"cone placement needs label embeddings of the cap family, not {spec['family']!r} "
                "(train the labels with `hypsearch labels train`, the cap construction)"
            )
        if not seen:
            raise ValueError("cone placement needs at least one trained class")
        self.spec = spec
        self.c = float(labels.curvature)
        tax = labels.taxonomy
        member = class_membership(tax, list(tax.names), seen)
        keep = member.sum(1) > 0
        self.names = [n for n, k in zip(tax.names, keep.tolist(), strict=True) if k]
        self.member = member[keep]
        self.depth = torch.tensor([tax.depth(n) for n in self.names], dtype=torch.float64)
        emb = labels.embeddings.to(torch.float64)
        self.points = emb[[tax.index(n) for n in self.names]]
        self.seen_points = emb[[tax.index(n) for n in seen]]
        self.anchors = poincare.move_outward(self.points, self.cfg.depth, c=self.c)
        row = {n: j for j, n in enumerate(self.names)}
        self.children = [[row[k] for k in tax.children(n) if k in row] for n in self.names]

    def choose(self, z: torch.Tensor) -> torch.Tensor:
        """Row of :attr:`names` each point belongs to, (n,) int64."""
        d_seen = poincare.pairwise_dist(z, self.seen_points, c=self.c)
        d_cand = poincare.pairwise_dist(z, self.points, c=self.c)
        return backoff_choice(
            d_seen, d_cand, self.member, self.depth, tau=self.cfg.tau, threshold=self.cfg.threshold
        )

    def _carry(self, z: torch.Tensor, rows: torch.Tensor, shrink: torch.Tensor) -> torch.Tensor:
        c = self.c
        p, a = self.points[rows], self.anchors[rows]
        u = poincare.mobius_add(-p, z, c=c)
        d = poincare.distance_to_origin(u, c=c, keepdim=True)
        reach = self.cfg.depth - self.cfg.margin
        target = reach * torch.tanh(d / reach) * shrink[:, None]
        n = u.norm(dim=-1, keepdim=True)
        unit = torch.where(n > 0, u / n.clamp_min(1e-300), torch.zeros_like(u))
        u2 = unit * poincare.radius_to_norm(target, c=c)
        return poincare.project(poincare.mobius_add(a, u2, c=c), c=c)

    def _fits(self, x: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """Inside the chosen node's cone and outside each of its children's."""
        pts = self.points.numpy()
        ok = cones.membership_margin_np(pts[rows], x, self.spec, c=self.c) >= 0
        for i in np.flatnonzero(ok):
            kids = self.children[rows[i]]
            if (
                kids
                and (cones.membership_margin_np(pts[kids], x[i], self.spec, c=self.c) >= 0).any()
            ):
                ok[i] = False
        return ok

    @torch.no_grad()
    def place(self, z: torch.Tensor) -> tuple[torch.Tensor, list[str]]:
        """Placed points (n, D) float64 and the name of each one's node."""
        z = z.to(torch.float64)
        if len(z) == 0:
            return z, []
        rows = self.choose(z)
        shrink = torch.ones(len(z), dtype=torch.float64)
        out = self._carry(z, rows, shrink)
        rows_np = rows.numpy()
        for _ in range(8):  # a check that fails moves the point closer to the anchor
            bad = ~self._fits(out.numpy(), rows_np)
            if not bad.any():
                break
            idx = torch.from_numpy(np.flatnonzero(bad))
            shrink[idx] *= 0.5
            out[idx] = self._carry(z[idx], rows[idx], shrink[idx])
        else:
            bad = ~self._fits(out.numpy(), rows_np)
            idx = torch.from_numpy(np.flatnonzero(bad))
            out[idx] = self.anchors[rows[idx]]
        return out, [self.names[r] for r in rows_np.tolist()]

    def __call__(self, z: torch.Tensor) -> torch.Tensor:
        return self.place(z)[0]
