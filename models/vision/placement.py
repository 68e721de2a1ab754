r"""Cone placement: each image's point moved inside the cone of the node it belongs to.

A trained head puts images *around* their class's label point (the prototype
loss gathers them there), which is not inside the class's cone: with the cap
family a cone lies beyond its label point, and the images sit on every side
of it. :class:`ConePlacement` is the last step of :meth:`ImageModel.embed
<models.vision.image_model.ImageModel.embed>` for a model whose config says
``placement: "cones"`` (``hypsearch train --placement cones``):

1. **Which node.** The posterior over the trained classes is the softmax of
   :math:`-d(z, p_k)/\tau` (the logits of training), or, for a model that kept
   its auxiliary classifier (``classifier``: a linear layer on the encoder's
   features, the default of ``hypsearch train`` where it places more validation
   images at their class), the softmax of that classifier's logits
   (:meth:`ConePlacement.posterior`); a node's mass is the sum
   over the trained classes below it. The node is the one of mass at least
   ``threshold`` with the fewest trained classes below it, then the deepest,
   then the nearest (:func:`backoff_choice`: a confident image gets its class,
   an uncertain one the lowest common ancestor of the classes it hesitates
   between; Deng et al. 2012, Liu et al. 2020). Where that node is the most
   probable class, two back-offs can move the image to the class's cone
   parent (:meth:`ConePlacement.decide`): a posterior gap (top-1 minus top-2)
   below ``confidence``, or a distance to the class's point beyond
   ``novelty`` times the class's radius (a validation quantile);
   :func:`calibrate` picks both on validation points. A third rule looks at
   the image's encoder features (:mod:`models.vision.novelty`, fitted at the end of
   training): an image of no trained class is of a node *without training
   images* (no trained class at or below it: the candidates of the rule,
   known from the taxonomy and the trained classes alone). The siblings of a
   trained class cannot be told apart without images of them, so the image
   lands under their parent (:meth:`ConePlacement.novel_rows`): each trained
   class :math:`k` points to its *novel parent* :math:`n(k)`, the nearest node
   strictly above it on its cone-parent chain with a child without training
   images (not :math:`k` itself: a novel image does not look like :math:`k`'s
   images, so its kind is beside :math:`k`, not below it), weighted by
   how many such children it has (a uniform prior over the candidates), and
   the image goes to :math:`\arg\max_P \sum_{k: n(k) = P} p_k\, m(P)`. A
   caller may instead *declare* unseen classes (``unseen``, Python API only;
   ``hypsearch train --holdout`` declares none: a deployment is never told
   which classes are unseen): a novel image then goes to the declared class
   whose label point is nearest the posterior's classes on average
   (:math:`\arg\min_u \sum_k p_k d(u, k)`, ConSE-style: Norouzi et al.
   2014, with the label points' hyperbolic distances). Declared unseen classes
   are candidates for this rule only (no trained class lies below them, so
   the mass rule never picks them).
2. **Where in its cone.** The node's *anchor* :math:`a` is its label point
   moved ``depth`` outward along its ray, and ``certainty_depth`` times the
   image's :func:`certainty` (its posterior mass of the node, as log-odds)
   farther, so that a certain image lies deeper on the node's ray, where the
   node's cone holds it more firmly (:mod:`indexing.entailment` ranks a label's
   items by that firmness: the surest first)
   (:func:`models.geometry.poincare.move_outward`). The image is seen from
   its node's prototype :math:`p` (where the head gathers the node's images:
   its label point, or the scaled stand-in of a model trained with
   ``prototype_radius``; :math:`u = (-p) \oplus z`, so
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

Within a node and one level of certainty the relative positions of the
images are kept (the Möbius translations are isometries; the squash is
monotone in the distance to the label point), so nearest neighbours among
images of one class stay what the head made them, sure images beside sure
ones; between nodes the anchors set the distances, and these rank
like the label points (the cap construction's distances: siblings before
cousins).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

from ..geometry import cones, poincare

__all__ = [
    "ConePlacement",
    "PlacementConfig",
    "backoff_choice",
    "calibrate",
    "certainty",
    "class_membership",
]


@dataclass(frozen=True)
class PlacementConfig:
    depth: float = 3.0  # anchor: the label point moved this far outward
    margin: float = 0.5  # images stay within depth - margin of the anchor
    threshold: float = 0.5  # mass a node needs to be chosen
    tau: float = 1.0  # temperature of the posterior -d/tau
    confidence: float = 0.0  # a class needs posterior top-1 minus top-2 at least this
    novelty: float = float("inf")  # a class needs d(z, class) <= novelty x its radius
    #: a certain image's anchor lies this much farther out (certainty below)
    certainty_depth: float = 3.0

    def validate(self) -> None:
        if not (self.depth > self.margin > 0):
            raise ValueError(f"placement needs depth > margin > 0, got {self.depth}, {self.margin}")
        if not (0.5 <= self.threshold <= 1):
            raise ValueError(f"placement threshold must be in [0.5, 1], got {self.threshold}")
        if not self.tau > 0:
            raise ValueError(f"placement tau must be positive, got {self.tau}")
        if not (0 <= self.confidence <= 1):
            raise ValueError(f"placement confidence must be in [0, 1], got {self.confidence}")
        if not self.novelty > 0:
            raise ValueError(f"placement novelty must be positive, got {self.novelty}")
        if not (0 <= self.certainty_depth < 20):
            raise ValueError(
                f"placement certainty_depth must be in [0, 20), got {self.certainty_depth}"
            )


#: log-odds at which an image counts as certain (:func:`certainty`)
CERTAIN_LOGIT = 30.0


def certainty(mass: torch.Tensor) -> torch.Tensor:
    r"""How certain the posterior is of a node, in [0, 1]: its mass's log-odds
    :math:`\log(m / (1 - m))` clipped to [0, :data:`CERTAIN_LOGIT`] and scaled to
    [0, 1] (0 for a mass of at most one half, 1 from :math:`1 - 10^{-13}` on: the
    log-odds keep apart the masses of 0.99 and 0.9999 that a confident
    classifier gives its right and its wrong answers)."""
    m = mass.to(torch.float64).clamp(0.0, 1.0)
    odds = torch.log(m.clamp_min(1e-300)) - torch.log1p(-m.clamp_max(1 - 1e-16))
    return odds.clamp(0.0, CERTAIN_LOGIT) / CERTAIN_LOGIT


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
    post: torch.Tensor | None = None,
) -> torch.Tensor:
    """Index of the chosen candidate per row (the rule of the module docstring).

    ``d_seen`` (b, K) distances to the trained classes' points, ``d_cand``
    (b, C) to the candidates', ``member`` (C, K), ``depth`` (C,); ``post`` (b, K)
    the posterior over the trained classes, default the softmax of ``-d_seen /
    tau``. When no candidate has the mass (its classes' common ancestor is not a
    candidate), the nearest candidate.
    """
    if post is None:
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
    trained class at or below them, and the ``unseen`` classes (held out of
    training), where the ``feature_novelty`` rule
    (:class:`models.vision.novelty.FeatureNovelty`) sends novel images.
    ``prototypes`` (every taxonomy node, in taxonomy order; default the label
    points): where the head gathers each node's images (a model trained with
    scaled prototypes, :attr:`models.vision.heads.Space.scale`): the posterior and the
    carry measure from them, the cones and anchors stay the label points'.
    ``classifier``: ``(weight (K, F), bias (K,))`` of a linear classifier over
    the trained classes on the encoder's features (the auxiliary classifier of
    training, kept in the model): given features, the posterior is its softmax
    instead of the distances' (:meth:`posterior`).
    """

    def __init__(
        self,
        labels,
        seen: list[str],
        cfg: PlacementConfig | None = None,
        radii: dict[str, float] | None = None,
        prototypes: torch.Tensor | None = None,
        unseen: list[str] | None = None,
        feature_novelty=None,
        classifier: tuple[torch.Tensor, torch.Tensor] | None = None,
    ):
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
        self.taxonomy = tax
        member = class_membership(tax, list(tax.names), seen)
        self.unseen = [u for u in (unseen or []) if u not in set(seen)]
        for u in self.unseen:
            if u not in tax:
                raise ValueError(f"unseen class {u!r} is not in the labels' taxonomy")
        keep = (member.sum(1) > 0) | torch.tensor([n in set(self.unseen) for n in tax.names])
        self.names = [n for n, k in zip(tax.names, keep.tolist(), strict=True) if k]
        self.member = member[keep]
        self.depth = torch.tensor([tax.depth(n) for n in self.names], dtype=torch.float64)
        emb = labels.embeddings.to(torch.float64)
        self.points = emb[[tax.index(n) for n in self.names]]
        protos = emb if prototypes is None else prototypes.to(torch.float64)
        self.protos = protos[[tax.index(n) for n in self.names]]  # (C, D) the candidates'
        self.seen_protos = protos[[tax.index(n) for n in seen]]  # (K, D) the trained classes'
        self.anchors = self.anchors_of(self.points)
        row = {n: j for j, n in enumerate(self.names)}
        # every taxonomy child's cone (candidate or not) must leave a placed point out,
        # so that the deepest holding label (the service's holder) is the chosen node
        self.kid_points = [
            emb[[tax.index(k) for k in sorted(tax.children(n))]].numpy() for n in self.names
        ]
        self.up = self._cone_parents(tax, row)
        self.unseen_rows = torch.tensor([row[u] for u in self.unseen], dtype=torch.int64)
        # the label points' distances from each unseen class to each trained class
        self.unseen_dist = (
            poincare.pairwise_dist(
                self.points[self.unseen_rows], emb[[tax.index(n) for n in seen]], c=self.c
            )
            if self.unseen
            else torch.zeros(0, len(seen), dtype=torch.float64)
        )
        self.feature_novelty = feature_novelty
        self.classifier = None
        if classifier is not None:
            w, b = (t.detach().to(torch.float64) for t in classifier)
            if w.dim() != 2 or w.shape[0] != len(seen) or b.shape != (len(seen),):
                raise ValueError(
                    f"placement classifier: weight {tuple(w.shape)} and bias {tuple(b.shape)} "
                    f"do not fit {len(seen)} trained classes"
                )
            self.classifier = (w, b)
        self.seen = list(seen)
        self.seen_rows = torch.tensor([row[n] for n in seen], dtype=torch.int64)
        self.novel_rows, self.novel_weight = self._novel_parents(tax, seen)
        radii = radii or {}
        self.radius = torch.tensor(
            [float(radii.get(n, float("inf"))) for n in seen], dtype=torch.float64
        )

    def anchors_of(self, points: torch.Tensor) -> torch.Tensor:
        """The anchors of label points (n, D): each moved ``cfg.depth`` outward."""
        return poincare.move_outward(points, self.cfg.depth, c=self.c)

    def _cone_parents(self, tax, row: dict[str, int]) -> torch.Tensor:
        """Row of each candidate's parent whose cap holds its point with the largest
        margin (the service's cone chain, :func:`service.runtime.label_cones`), -1 for
        none: where a back-off goes."""
        up = torch.full((len(self.names),), -1, dtype=torch.int64)
        pts = self.points.numpy()
        for j, n in enumerate(self.names):
            ps = [row[p] for p in tax.parents(n) if p in row]
            if ps:
                m = cones.membership_margin_np(pts[ps], pts[j], self.spec, c=self.c)
                up[j] = ps[int(np.argmax(m))]
        return up

    def _novel_parents(self, tax, seen: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Each trained class's novel parent (a row of :attr:`names`: the nearest node
        strictly above it on its cone-parent chain with a child without training images;
        the class's cone parent, or the class, where none has one) and that node's number of such
        children (0 where none has one): module docstring."""
        with_images = set(seen).union(*(tax.ancestors(s) for s in seen))
        m = [sum(k not in with_images for k in tax.children(n)) for n in self.names]
        rows, weight = [], []
        for start in self.seen_rows.tolist():
            # a novel image is not of its most probable class (it would look like that
            # class's training images): its kind lies beside the class, so the search
            # starts at the class's cone parent (a class's own children without images
            # are as much kinds of it as its training images are)
            r = int(self.up[start])
            while r >= 0 and m[r] == 0:
                r = int(self.up[r])
            if r < 0:  # no node up the chain has a candidate child: the cone parent
                up = int(self.up[start])
                rows.append(up if up >= 0 else start)
                weight.append(0.0)
            else:
                rows.append(r)
                weight.append(float(m[r]))
        return torch.tensor(rows, dtype=torch.int64), torch.tensor(weight, dtype=torch.float64)

    def novel_choice(self, post: torch.Tensor) -> torch.Tensor:
        r"""Rows where novel images with posterior ``post`` (b, K) land when no unseen
        class is declared: :math:`\arg\max_P \sum_{k: n(k) = P} p_k m(P)` over the
        novel parents (module docstring); the most probable class's novel parent where
        no class has a candidate child."""
        q = post * self.novel_weight[None, :]
        agg = torch.zeros(len(post), len(self.names), dtype=torch.float64)
        agg.index_add_(1, self.novel_rows, q)
        best = agg.argmax(1)
        fallback = self.novel_rows[post.argmax(1)]
        return torch.where(q.sum(1) > 0, best, fallback)

    def posterior(self, d_seen: torch.Tensor, features: torch.Tensor | None = None) -> torch.Tensor:
        """The posterior over the trained classes (n, K): the softmax of the
        classifier's logits on the encoder ``features`` where the placement has a
        classifier and features are given, else of ``-d_seen / tau``."""
        if self.classifier is not None and features is not None:
            w, b = self.classifier
            return torch.softmax(features.to(torch.float64) @ w.T + b, dim=1)
        return torch.softmax(-d_seen / self.cfg.tau, dim=1)

    def choose(self, z: torch.Tensor, features: torch.Tensor | None = None) -> torch.Tensor:
        """Row of :attr:`names` each point belongs to, (n,) int64."""
        return self.decide(z, features)[0]

    def decide(
        self, z: torch.Tensor, features: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        r"""The chosen rows and what the back-offs look at: ``gap`` (posterior
        top-1 minus top-2), ``top`` (the most probable trained class, an index of
        :attr:`seen`), ``ratio`` (its distance over its radius), ``novel`` (the
        encoder ``features`` say the image is of no trained class:
        :attr:`feature_novelty`), ``backed`` (the rule of the mass chose that
        class, and the confidence or the distance rule moved the point to its cone
        parent), ``unseen`` (a novel image went to the declared unseen class nearest
        the posterior: the least expected label-point distance :math:`\sum_k p_k
        d(u, k)` to the trained classes); with no unseen class declared a novel image
        goes where :meth:`novel_choice` says."""
        cfg = self.cfg
        d_seen = poincare.pairwise_dist(z, self.seen_protos, c=self.c)
        d_cand = poincare.pairwise_dist(z, self.protos, c=self.c)
        post = self.posterior(d_seen, features)
        rows = backoff_choice(
            d_seen, d_cand, self.member, self.depth, threshold=cfg.threshold, post=post
        )
        two = post.topk(min(2, post.shape[1]), dim=1)
        gap = two.values[:, 0] - (two.values[:, 1] if post.shape[1] > 1 else 0.0)
        top = two.indices[:, 0]
        ratio = d_seen.gather(1, top[:, None])[:, 0] / self.radius[top]
        is_top = rows == self.seen_rows[top]
        novel = torch.zeros(len(z), dtype=torch.bool)
        if features is not None and self.feature_novelty is not None:
            novel = self.feature_novelty.novel(features)
        to_unseen = novel if len(self.unseen) else torch.zeros_like(novel)
        unsure = (gap < cfg.confidence) | (ratio > cfg.novelty)
        up = self.up[rows]
        backed = is_top & unsure & (up >= 0) & ~novel
        rows = torch.where(backed, up, rows)
        if bool(to_unseen.any()):
            best = (post @ self.unseen_dist.T).argmin(1)
            rows = torch.where(to_unseen, self.unseen_rows[best], rows)
        elif bool(novel.any()):
            rows = torch.where(novel, self.novel_choice(post), rows)
        info = {"gap": gap, "top": top, "ratio": ratio, "backed": backed, "post": post}
        return rows, info | {"novel": novel, "unseen": to_unseen}

    def _carry(
        self, z: torch.Tensor, rows: torch.Tensor, shrink: torch.Tensor, sure: torch.Tensor
    ) -> torch.Tensor:
        c = self.c
        p, a = self.protos[rows], self.anchors[rows]
        if self.cfg.certainty_depth > 0:  # certain images deeper along the node's ray
            a = poincare.move_outward(a, (self.cfg.certainty_depth * sure)[:, None], c=c)
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
            kids = self.kid_points[rows[i]]
            if len(kids) == 0:
                continue
            if (cones.membership_margin_np(kids, x[i], self.spec, c=self.c) >= 0).any():
                ok[i] = False
        return ok

    @torch.no_grad()
    def place(
        self, z: torch.Tensor, features: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, list[str]]:
        """Placed points (n, D) float64 and the name of each one's node (``features``:
        the encoder's, for the feature novelty rule)."""
        z = z.to(torch.float64)
        if len(z) == 0:
            return z, []
        rows, info = self.decide(z, features)
        sure = certainty((info["post"] * self.member[rows]).sum(1))
        sure = torch.where(info["novel"], torch.zeros_like(sure), sure)
        shrink = torch.ones(len(z), dtype=torch.float64)
        out = self._carry(z, rows, shrink, sure)
        rows_np = rows.numpy()
        for _ in range(8):  # a check that fails moves the point closer to the anchor
            bad = ~self._fits(out.numpy(), rows_np)
            if not bad.any():
                break
            idx = torch.from_numpy(np.flatnonzero(bad))
            shrink[idx] *= 0.5
            out[idx] = self._carry(z[idx], rows[idx], shrink[idx], sure[idx])
        else:
            bad = ~self._fits(out.numpy(), rows_np)
            idx = torch.from_numpy(np.flatnonzero(bad))
            out[idx] = self.anchors[rows[idx]]
        return out, [self.names[r] for r in rows_np.tolist()]

    def __call__(self, z: torch.Tensor, features: torch.Tensor | None = None) -> torch.Tensor:
        return self.place(z, features)[0]


def calibrate(
    placement: ConePlacement,
    z: torch.Tensor,
    classes: list[str],
    *,
    in_class: float = 0.9,
    other: float = 0.05,
    quantile: float = 0.99,
    features: torch.Tensor | None = None,
) -> dict[str, object]:
    """Back-off settings from validation points (head outputs ``z``, their classes;
    ``features``: their encoder features, for a placement with a classifier).

    * ``radii``: per trained class, the ``quantile`` of its validation images'
      distances to its label point (the novelty rule backs off an image farther
      than its class's radius, :attr:`PlacementConfig.novelty` = 1);
    * ``confidence``: over a grid, the smallest posterior gap whose back-off
      brings the share of validation images placed in another class's cone
      (a node at or below a trained class that is neither their class nor an
      ancestor) to ``other`` or below while the share placed at their class
      stays at ``in_class`` or above; where no gap does both, the largest gap
      that keeps ``in_class`` (0 when none does).

    Returns ``{"radii", "confidence", "val_in_class", "val_other", "grid"}``.
    """
    z = z.to(torch.float64)
    col = {n: k for k, n in enumerate(placement.seen)}
    tgt = torch.tensor([col[c] for c in classes], dtype=torch.int64)
    d = poincare.pairwise_dist(z, placement.seen_protos, c=placement.c)
    own = d.gather(1, tgt[:, None])[:, 0]
    radii = {}
    for k, name in enumerate(placement.seen):
        v = own[tgt == k]
        if len(v):
            radii[name] = float(torch.quantile(v, quantile))
    grid = back_off_grid(placement, z, classes, radii, features)
    pick = pick_back_off(grid, in_class, other)
    return {
        "radii": radii,
        "confidence": pick[0],
        "val_in_class": pick[1],
        "val_other": pick[2],
        "grid": grid,
    }


def pick_back_off(grid, in_class: float, other: float) -> tuple[float, float, float]:
    """The row of a :func:`back_off_grid` the calibration picks: the smallest gap with
    both aims met, else the largest that keeps ``in_class`` (else the first)."""
    both = [g for g in grid if g[1] >= in_class and g[2] <= other]
    keep = [g for g in grid if g[1] >= in_class]
    return both[0] if both else (keep[-1] if keep else grid[0])


def back_off_grid(
    placement: ConePlacement,
    z: torch.Tensor,
    classes: list[str],
    radii: dict[str, float],
    features: torch.Tensor | None = None,
) -> list[tuple[float, float, float]]:
    """For each confidence gap of the calibration's grid (0, 0.05, ..., 0.95), with the
    novelty rule on the class ``radii``: ``(gap, share of the points placed at their
    class, share placed in another trained class's cone)`` (a node at or below a
    trained class that is neither their class nor an ancestor of it)."""
    z = z.to(torch.float64)
    col = {n: k for k, n in enumerate(placement.seen)}
    tgt = torch.tensor([col[c] for c in classes], dtype=torch.int64)
    # wrong[r, k]: a point placed at row r is inside the cone of a trained class
    # that is neither class k nor an ancestor of k
    names = placement.names
    below = torch.zeros(len(names), len(placement.seen), dtype=torch.bool)  # class k holds row r
    tax = placement.taxonomy
    for r, n in enumerate(names):
        anc = tax.ancestors(n) | {n}
        for k, cname in enumerate(placement.seen):
            below[r, k] = cname in anc
    anc_of = torch.tensor(
        [[a in (tax.ancestors(b) | {b}) for b in placement.seen] for a in placement.seen]
    )  # anc_of[a, b]: class a is b or an ancestor of b
    wrong = (below.double() @ (~anc_of).double()) > 0  # (rows, K)
    saved = placement.cfg, placement.radius
    grid = []
    try:
        placement.radius = torch.tensor(
            [radii.get(n, float("inf")) for n in placement.seen], dtype=torch.float64
        )
        for g in [i / 20 for i in range(20)]:
            placement.cfg = replace(saved[0], confidence=g, novelty=1.0)
            rows = placement.choose(z, features)
            ok = float((rows == placement.seen_rows[tgt]).double().mean())
            bad = float(wrong[rows, tgt].double().mean())
            grid.append((g, ok, bad))
    finally:
        placement.cfg, placement.radius = saved
    return grid
