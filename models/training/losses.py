r"""Training objectives, all on distances of a :class:`~models.vision.heads.Space`.

With labels and a label embedding (prototypes :math:`p_k` of the classes):

* :func:`prototype_ce`: softmax cross-entropy over :math:`-d(z, p_k)/\tau`
  (hyperbolic prototypical / zero-shot classification);
* :func:`margin_rank`: :math:`\sum_{k \ne y} [m + d(z, p_y) - d(z, p_k)]_+`,
  the ranking loss of hyperbolic zero-shot learning (Liu et al. 2020).

Without a taxonomy, on two views of each image (``z1[i]``, ``z2[i]``):

* :func:`pairwise_ce`: pairwise cross-entropy of Hyp-ViT (Ermolov et al.
  2022): each view must pick its partner among the other view's batch by
  :math:`-d/\tau`; with targets, other images of the same class are not
  counted as negatives;
* :func:`nt_xent`: NT-Xent of SimCLR (Chen et al. 2020) with similarity
  :math:`-d/\tau`, for unlabelled images;

and on a labelled batch:

* :func:`cone_hinge`: images inside the entailment cone of their class's
  label point and outside the cones of the other trained classes (the
  hierarchy in the geometry; added to the labelled objectives with
  ``cone_weight``, see :func:`build_criterion`);

* :func:`expected_hops`: the taxonomy hops from each image's class to a class
  drawn from its posterior over the trained classes, in expectation (a
  cost-sensitive term in the spirit of "Making Better Mistakes", Bertinetto
  et al. 2020: hops to ``hop_power``, by default squared, so a sibling mistake
  costs 4 and a cousin 16; added with ``hop_weight``, see :func:`build_criterion`);

* :func:`circle_loss` (Sun et al. 2020) on similarities :math:`s = 1 -
  d/\sigma` (an affine map of :math:`-d`), with the paper's optima
  :math:`O_p = 1 + m`, :math:`O_n = -m` and margins :math:`\Delta_p = 1 - m`,
  :math:`\Delta_n = m`.

:data:`LOSSES` names them for training: each :class:`Objective` says what it
needs (prototypes, two views, labels) and builds its criterion from the
training config.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from ..geometry import cones
from ..vision.heads import Space

__all__ = [
    "LOSSES",
    "Objective",
    "Prototypes",
    "ConeTargets",
    "build_criterion",
    "circle_loss",
    "cone_hinge",
    "cone_ratio",
    "expected_hops",
    "margin_rank",
    "nt_xent",
    "pairwise_ce",
    "prototype_ce",
    "sampled_columns",
]


def prototype_ce(
    z: torch.Tensor,
    protos: torch.Tensor,
    y: torch.Tensor,
    space: Space,
    tau: float = 1.0,
    pull: float = 0.0,
    exclude: torch.Tensor | None = None,
    offset: torch.Tensor | None = None,
) -> torch.Tensor:
    """Cross-entropy of the logits -(d(z, p_k) - offset_k)/tau, plus ``pull`` times the
    mean d(z, p_y). ``offset`` (K,), e.g. each prototype's distance from the head's base
    point (``prototype_logits="busemann"``), removes the prototypes' depth from the
    softmax: as p_k goes to the boundary, d(z, p_k) - d(m, p_k) tends to the Busemann
    function of its ideal point, whatever its radius.

    z (n, D), protos (K, D), y (n,) in [0, K). The cross-entropy alone is
    satisfied once the right prototype wins by a few units of distance and
    leaves a class spread over its whole cell; the pull term gathers it
    around its prototype (tight classes for retrieval, the class label as
    the nearest taxonomy node). ``exclude`` (n, K) drops logits from the
    softmax (with taxonomy nodes as negatives: each image's ancestors).
    """
    d = space.pairwise(z, protos)  # (n, K)
    logits = -d / tau if offset is None else -(d - offset) / tau
    if exclude is not None:  # (n, K) True: neither target nor negative (e.g. the class's ancestors)
        logits = logits.masked_fill(exclude, float("-inf"))
    loss = F.cross_entropy(logits, y)
    if pull > 0:
        loss = loss + pull * d.gather(1, y[:, None]).mean()
    return loss


def margin_rank(
    z: torch.Tensor, protos: torch.Tensor, y: torch.Tensor, space: Space, margin: float = 1.0
) -> torch.Tensor:
    """Mean over images and wrong classes of [margin + d(z, p_y) - d(z, p_k)]_+."""
    d = space.pairwise(z, protos)  # (n, K)
    pos = d.gather(1, y[:, None])  # (n, 1)
    hinge = (margin + pos - d).clamp_min(0)
    wrong = torch.ones_like(d, dtype=torch.bool).scatter_(1, y[:, None], False)
    return (hinge * wrong).sum(1).mean() / max(1, d.shape[1] - 1)


def pairwise_ce(
    z1: torch.Tensor,
    z2: torch.Tensor,
    space: Space,
    tau: float = 0.2,
    y: torch.Tensor | None = None,
) -> torch.Tensor:
    """Hyp-ViT pairwise cross-entropy of two views (n, D) each, symmetric."""
    logits = -space.pairwise(z1, z2) / tau  # (n, n), positives on the diagonal
    n = z1.shape[0]
    target = torch.arange(n)
    if y is not None:  # same-class pairs off the diagonal are not negatives
        same = (y[:, None] == y[None, :]) & ~torch.eye(n, dtype=torch.bool)
        logits = logits.masked_fill(same, float("-inf"))
    return 0.5 * (F.cross_entropy(logits, target) + F.cross_entropy(logits.T, target))


def nt_xent(z1: torch.Tensor, z2: torch.Tensor, space: Space, tau: float = 0.2) -> torch.Tensor:
    """SimCLR NT-Xent over the 2n views: each view's positive is its partner."""
    n = z1.shape[0]
    z = torch.cat([z1, z2])  # (2n, D)
    logits = -space.pairwise(z, z) / tau  # (2n, 2n)
    logits = logits.masked_fill(torch.eye(2 * n, dtype=torch.bool), float("-inf"))
    target = torch.cat([torch.arange(n, 2 * n), torch.arange(n)])
    return F.cross_entropy(logits, target)


def expected_hops(
    z: torch.Tensor,
    classes: torch.Tensor,
    y: torch.Tensor,
    hops: torch.Tensor,
    space: Space,
    tau: float = 1.0,
) -> torch.Tensor:
    r""":math:`\operatorname{mean}_i \sum_k p_{ik} H_{y_i k}`: the expected taxonomy hops
    between image i's class and a class drawn from its posterior :math:`p_i =
    \operatorname{softmax}_k(-d(z_i, c_k)/\tau)` over the trained classes ``classes``
    (K, D); ``hops`` (K, K) with a zero diagonal. Zero when every image is sure of its
    class; of two equally wrong posteriors, the one whose mass sits on near relatives
    costs less (the cross-entropy cannot tell them apart)."""
    p = torch.softmax(-space.pairwise(z, classes) / tau, dim=1)  # (n, K)
    return (p * hops.to(p.dtype)[y]).sum(1).mean()


def circle_loss(
    z: torch.Tensor,
    y: torch.Tensor,
    space: Space,
    m: float = 0.25,
    gamma: float = 32.0,
    scale: float = 4.0,
) -> torch.Tensor:
    r"""Circle loss on pairs of a labelled batch, similarity :math:`s = 1 - d/\text{scale}`.

    Per anchor: :math:`\log(1 + \sum_n e^{\gamma\alpha_n(s_n - \Delta_n)}
    \sum_p e^{-\gamma\alpha_p(s_p - \Delta_p)})`, :math:`\alpha_p = [O_p -
    s_p]_+`, :math:`\alpha_n = [s_n - O_n]_+` (weights not back-propagated);
    mean over anchors that have a positive and a negative.
    """
    n = z.shape[0]
    s = 1 - space.pairwise(z, z) / scale  # (n, n)
    eye = torch.eye(n, dtype=torch.bool)
    pos = (y[:, None] == y[None, :]) & ~eye
    neg = y[:, None] != y[None, :]
    alpha_p = (1 + m - s.detach()).clamp_min(0)
    alpha_n = (s.detach() + m).clamp_min(0)
    lp = (-gamma * alpha_p * (s - (1 - m))).masked_fill(~pos, float("-inf"))
    ln = (gamma * alpha_n * (s - m)).masked_fill(~neg, float("-inf"))
    ok = pos.any(1) & neg.any(1)
    if not ok.any():
        return z.sum() * 0.0
    loss = F.softplus(torch.logsumexp(lp[ok], 1) + torch.logsumexp(ln[ok], 1))
    return loss.mean()


def cone_ratio(apex: torch.Tensor, z: torch.Tensor, spec: dict, c: float) -> torch.Tensor:
    r"""How much of the cone of ``apex`` (K, D) the point ``z`` (n, D) uses, (n, K).

    :math:`r = 1 - m(p, z)/a(p)` with :math:`m` the membership margin and
    :math:`a` the aperture (:func:`models.geometry.cones.membership_margin`,
    :func:`~models.geometry.cones.aperture`): ``z`` is in the cone iff
    :math:`r \le 1`. For caps :math:`r = (\angle(p, z) + \theta(z))/\theta(p)`,
    for Ganea cones :math:`\Xi(p, z)/\psi(p)`; scale-free, so the deep classes'
    tiny apertures (1e-3 rad for the default taxonomy) weigh as much as the
    shallow ones'.
    """
    margin = cones.membership_margin(apex[None, :, :], z[:, None, :], spec, c=c)  # (n, K)
    ap = cones.aperture(apex, spec, c=c)[None, :]
    return 1 - margin / ap


def cone_hinge(
    z: torch.Tensor,
    y: torch.Tensor,
    apex: torch.Tensor,
    other: torch.Tensor,
    spec: dict,
    c: float,
    margin: float = 0.25,
    neg_margin: float = 0.05,
) -> torch.Tensor:
    r"""Cone hinge, the mean over images of
    :math:`[\log r_y + m]_+ + \operatorname{mean}_{k \in O_y}[m' - \log r_k]_+`.

    ``r`` is :func:`cone_ratio` against the trained classes' label points
    ``apex`` (K, D); ``other`` (K, K) bool marks, per class, the classes whose
    cones it must stay out of (the trained classes that are neither itself nor
    an ancestor). In log ratio the hinge is bounded for points far off in
    angle and, near the class point, :math:`\log r_y \le -m` asks for a radius
    beyond the label point's (for caps with :math:`\beta`: at least
    :math:`m/\beta` more).
    """
    r = cone_ratio(apex, z, spec, c).clamp_min(1e-12)
    logr = r.log()
    own = (logr.gather(1, y[:, None]).squeeze(1) + margin).clamp_min(0)
    mask = other[y].to(logr.dtype)  # (n, K)
    neg = ((neg_margin - logr).clamp_min(0) * mask).sum(1) / mask.sum(1).clamp_min(1)
    return (own + neg).mean()


# ---------------------------------------------------------------- the objectives of training


@dataclass
class Prototypes:
    """What a labelled objective compares the images with (built by :mod:`models.training.run`).

    ``classes`` (K, D): the trained classes' prototypes (targets of the margin
    loss and of validation). ``points`` (M, D) with ``target`` (K,): the
    candidates of the prototype loss and each class's position among them
    (the classes themselves, or every taxonomy node outside the held-out
    subtrees); ``exclude`` (K, M): per class, the candidates that are neither
    target nor negative (its ancestors), or None. ``cone``: what the cone
    term needs (a :class:`ConeTargets`), None without it. ``hops`` (K, K): the
    expected-hops term's cost of taking class k for class j (:func:`expected_hops`; the
    taxonomy hops to a power, times the term's weight), None without the term.
    """

    classes: torch.Tensor
    points: torch.Tensor
    target: torch.Tensor
    exclude: torch.Tensor | None = None
    cone: ConeTargets | None = None
    hops: torch.Tensor | None = None


@dataclass
class ConeTargets:
    """The cone term's data: the trained classes' label points in the ball ``apex`` (K, D),
    ``other`` (K, K) (the cones each class must stay out of), the cone ``spec``, curvature ``c``."""

    apex: torch.Tensor
    other: torch.Tensor
    spec: dict
    c: float


#: a criterion: (z (n, D) or two views stacked (2n, D), y (n,)) -> scalar loss
Criterion = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


#: ``negative_sample="auto"``: the prototype softmax over every taxonomy node up to this
#: many nodes (the default taxonomy has 1,788), else over the trained classes and
#: :data:`AUTO_NEGATIVE_SAMPLE` other nodes drawn each step.  Over all 10,699 nodes of
#: ``artifact.n.01`` a step took 2.2 times as long (docs/image-model.md), and the
#: time budget fitted half the epochs.
AUTO_FULL_NODES = 4096
AUTO_NEGATIVE_SAMPLE = 2048


def negative_sample_of(cfg, n_nodes: int) -> int:
    """The number of sampled other nodes per step (0: every node) for ``n_nodes``
    prototypes: ``cfg.negative_sample``, with ``"auto"`` resolved."""
    ns = getattr(cfg, "negative_sample", 0)
    if ns == "auto":
        return AUTO_NEGATIVE_SAMPLE if n_nodes > AUTO_FULL_NODES else 0
    return int(ns or 0)


def _prototype(cfg, space: Space, protos: Prototypes) -> Criterion:
    sample = negative_sample_of(cfg, len(protos.points))
    if sample > 0 and len(protos.points) > len(protos.classes) + sample:
        return _sampled_prototype(cfg, space, protos, sample)

    offset = prototype_offsets(cfg, space, protos.points)

    def criterion(z, y):
        exclude = None if protos.exclude is None else protos.exclude[y]
        return prototype_ce(
            z,
            protos.points,
            protos.target[y],
            space,
            cfg.tau,
            cfg.pull,
            exclude=exclude,
            offset=offset,
        )

    return criterion


def prototype_offsets(cfg, space: Space, points: torch.Tensor) -> torch.Tensor | None:
    """``cfg.prototype_logits``: "distance" -> None; "busemann" -> each prototype's
    distance from the head's base point (the twin: its tangent norm), (M,)."""
    kind = getattr(cfg, "prototype_logits", "distance")
    if kind == "distance":
        return None
    if kind != "busemann":
        raise ValueError(f"unknown prototype logits {kind!r} (distance or busemann)")
    return space.to_base(points).detach()


def sampled_columns(m: int, must: torch.Tensor, sample: int, gen=None) -> torch.Tensor:
    """The candidate columns of one step: ``must`` (the trained classes' positions) and
    ``sample`` others drawn uniformly without replacement from the ``m`` candidates
    (all of them when ``sample`` >= the rest); sorted, unique."""
    keep = torch.zeros(m, dtype=torch.bool)
    keep[must] = True
    rest = torch.nonzero(~keep).flatten()
    if sample < len(rest):
        rest = rest[torch.randperm(len(rest), generator=gen)[:sample]]
    keep[rest] = True
    return torch.nonzero(keep).flatten()


def _sampled_prototype(cfg, space: Space, protos: Prototypes, sample: int) -> Criterion:
    """The prototype loss over the trained classes and ``sample`` other candidates drawn
    afresh each step (:func:`sampled_columns`): the per-step cost stays
    flat however many taxonomy nodes there are; every node sampled, it is the full loss."""
    gen = torch.Generator().manual_seed(cfg.seed * 31337 + 5)
    m = len(protos.points)
    offset = prototype_offsets(cfg, space, protos.points)

    def criterion(z, y):
        cols = sampled_columns(m, protos.target, sample, gen)
        pos = torch.full((m,), -1, dtype=torch.long)
        pos[cols] = torch.arange(len(cols))
        exclude = None if protos.exclude is None else protos.exclude[:, cols][y]
        return prototype_ce(
            z,
            protos.points[cols],
            pos[protos.target[y]],
            space,
            cfg.tau,
            cfg.pull,
            exclude,
            None if offset is None else offset[cols],
        )

    return criterion


def _margin(cfg, space: Space, protos: Prototypes) -> Criterion:
    return lambda z, y: margin_rank(z, protos.classes, y, space, cfg.margin)


def _circle(cfg, space: Space, protos: None) -> Criterion:
    return lambda z, y: circle_loss(z, y, space)


def _pairwise(cfg, space: Space, protos: None) -> Criterion:
    def criterion(z, y):
        z1, z2 = z.chunk(2)
        return pairwise_ce(z1, z2, space, cfg.tau, y if (y >= 0).all() else None)

    return criterion


def _ntxent(cfg, space: Space, protos: None) -> Criterion:
    def criterion(z, y):
        z1, z2 = z.chunk(2)
        return nt_xent(z1, z2, space, cfg.tau)

    return criterion


@dataclass(frozen=True)
class Objective:
    """A training objective: what it needs, and ``build(cfg, space, protos)`` -> its criterion.

    ``cfg`` is the :class:`~models.training.config.TrainConfig` (``tau``,
    ``pull``, ``margin``); ``protos`` a :class:`Prototypes` when
    ``needs_protos``, else None. With ``two_views`` the criterion gets two
    augmented views of the batch stacked along the first axis.
    """

    build: Callable[[Any, Space, Prototypes | None], Criterion]
    needs_protos: bool
    two_views: bool
    needs_labels: bool


def build_criterion(cfg, space: Space, protos: Prototypes | None) -> Criterion:
    """The criterion of ``cfg.loss`` (:data:`LOSSES`), plus ``cfg.cone_weight`` times
    :func:`cone_hinge` when the prototypes carry cone targets (labelled objectives on the
    Poincaré ball) and :func:`expected_hops` when they carry the classes' costs
    (``Prototypes.hops``, weight included); the images' points are the first view."""
    base = LOSSES[cfg.loss].build(cfg, space, protos)
    cone_w = float(getattr(cfg, "cone_weight", 0.0))
    ct = None if protos is None or cone_w <= 0 else protos.cone
    hops = None if protos is None else protos.hops
    if ct is None and hops is None:
        return base
    tau = 1.0 if cfg.tau is None else float(cfg.tau)

    def criterion(z, y):
        zc = z[: len(y)]
        loss = base(z, y)
        if ct is not None:
            loss = loss + cone_w * cone_hinge(
                zc, y, ct.apex, ct.other, ct.spec, ct.c, cfg.cone_margin
            )
        if hops is not None:
            loss = loss + expected_hops(zc, protos.classes, y, hops, space, tau)
        return loss

    return criterion


#: objective name -> how to train with it (the one place a loss is chosen)
LOSSES: dict[str, Objective] = {
    "prototype": Objective(_prototype, needs_protos=True, two_views=False, needs_labels=True),
    "margin": Objective(_margin, needs_protos=True, two_views=False, needs_labels=True),
    "pairwise": Objective(_pairwise, needs_protos=False, two_views=True, needs_labels=False),
    "circle": Objective(_circle, needs_protos=False, two_views=False, needs_labels=True),
    "ntxent": Objective(_ntxent, needs_protos=False, two_views=True, needs_labels=False),
}
