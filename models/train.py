r"""Training of the image encoder: images -> points of the Poincaré ball next to their labels.

Reads top to bottom: the schedule (:func:`get_lr`, :func:`plan_epochs`), the
set-up (:func:`build_model`, :func:`build_optimizer`), the validation
(:func:`validate`), one epoch (:func:`train_epoch`: views, forward,
objective, backward, clipping, step), then :func:`train`, which runs the
epochs with an evaluation on the validation split and a resumable checkpoint
after each. The options are :class:`~models.train_config.TrainConfig`, the
data :func:`~models.train_data.prepare_data`, the run state on disk
:mod:`models.train_state`, the objectives :data:`models.losses.LOSSES`.

The default objective (``loss="prototype"``): softmax cross-entropy over
:math:`-d(z, p)/\tau` against the label points of every taxonomy node (the
image's class is the target; its ancestors are neither target nor negative;
held-out classes and their subtrees are left out entirely), plus ``pull``
times :math:`d(z, p_{class})`, which gathers each class around its label
point, plus the expected cost :math:`\sum_k p_k\,\mathrm{hops}(y, k)^{2}` of a class
drawn from the posterior over the trained classes (:func:`models.losses.expected_hops`,
``hop_weight`` times it, default 1 up to 2,048 trained classes; ``hop_power`` 2;
:func:`class_hops`): of two wrong posteriors, the one on near relatives costs less.
With ``cone_weight`` > 0 (default 0: off, see docs/image-model.md; ball geometry) the cone term
:func:`models.losses.cone_hinge` (``cone_weight`` times it) asks each image to
lie inside the cone of its class's label point (in the label checkpoint's cone
family, :func:`models.prototypes.label_cone_spec`; with nested cones, inside
every ancestor's too) and outside the cones of the other trained classes; a
cone lies beyond its label point, so the head's default reach is then
``cone_reach`` farther. The head works around a base point, the Einstein midpoint of the
trained classes' label points (see :class:`models.heads.HyperbolicHead`): the
label points of a deep WordNet subtree sit in a thin cone far from the
origin (the Fashion-MNIST classes point in nearly the same direction), and
seen from their midpoint they spread in every direction. The Euclidean twin
(``geometry="euclidean"``) trains the same encoder and loss against the
tangent vectors of the same label points at that base point.

With ``aux`` > 0 a linear softmax classifier on the encoder's features adds
its cross-entropy (times ``aux``) for the labelled losses: deep supervision
of the encoder, dropped after training. Distances to fixed label points far
from the base point make slow logits (for far prototypes :math:`-d` varies
like :math:`-2\log\sin(\theta/2)` in the angle to the prototype), and the
encoder learns markedly faster with the plain classifier beside them (see the
measurements in docs/image-model.md). The default encoder is Conv-4 with pool-first blocks
(conv, max pool, batch norm, ReLU: the same function class, cheaper) and no
augmentation: in the few epochs the default time budget allows on a small
CPU the model underfits, and crops or shifts cost more accuracy than they
gain.

Optimisation is Riemannian Adam (geoopt): Euclidean parameters get plain
Adam, parameters that live on the ball (the bias of the optional Möbius
layer; the base point with ``learn_base``) are updated along the manifold.
Warm-up then cosine decay (:func:`get_lr`), gradient-norm clipping, and a
time budget that fits the schedule to the epochs that fit it, planned after
the first epoch and again after the second (the first carries start-up
costs; never beyond the requested epochs). The encoder runs under bfloat16
autocast on CPUs that support it, in channels-last layout, with one torch
thread by default (faster than two on a shared small machine); heads,
distances and losses are float64.
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import geoopt
import torch
from torch import nn

from .augment import Augment
from .data import ImageSet
from .encoders import EncoderConfig, build_encoder, load_backbone
from .features import pretrained_encoder
from .geometry import poincare
from .heads import HeadConfig, Space, build_head, make_space
from .image_model import ImageModel
from .labels import LabelEmbedding
from .losses import ConeTargets, Criterion, Prototypes, build_criterion
from .objectives import Extras, build_extras
from .preprocess import normalize
from .prototypes import label_cone_spec
from .train_config import TrainConfig, TrainError
from .train_data import Prepared, prepare_data
from .train_state import load_partial_config, resume_run, save_run

__all__ = [
    "Prepared",
    "TrainConfig",
    "TrainError",
    "get_lr",
    "load_partial_config",
    "plan_epochs",
    "prepare_data",
    "train",
]


# ---------------------------------------------------------------- the schedule


def get_lr(it: int, cfg: TrainConfig, max_iters: int) -> float:
    """Linear warm-up for ``warmup_iters``, then cosine decay to ``min_lr`` at ``max_iters``."""
    if it < cfg.warmup_iters:
        return cfg.lr * (it + 1) / cfg.warmup_iters
    if it >= max_iters:
        return cfg.min_lr
    ratio = (it - cfg.warmup_iters) / max(1, max_iters - cfg.warmup_iters)
    coeff = 0.5 * (1.0 + math.cos(math.pi * ratio))  # 1 -> 0
    return cfg.min_lr + coeff * (cfg.lr - cfg.min_lr)


def plan_epochs(
    cfg: TrainConfig, done: int, first: int, planned: int, per_epoch: float, elapsed: float
) -> int:
    """How many epochs the time budget allows, after ``done`` epochs (the run started at ``first``).

    Planned after the run's first epoch and planned again after its second
    (the first one carries start-up costs), from the last epoch's
    ``per_epoch`` seconds with a 5 % margin; never fewer than ``done``,
    never more than ``cfg.epochs``. Any other time: ``planned`` unchanged.
    """
    if not cfg.time_budget or done not in (first + 1, first + 2) or done >= cfg.epochs:
        return planned
    fit = int((cfg.time_budget - elapsed) // (1.05 * per_epoch))
    return min(cfg.epochs, max(done, done + fit))


# ---------------------------------------------------------------- set-up


@dataclass
class Model:
    """What training trains: encoder and head, the optional auxiliary classifier, their space."""

    encoder: nn.Module
    head: nn.Module
    aux: nn.Module | None  # linear classifier over the trained classes (dropped after training)
    space: Space
    protos: Prototypes | None  # the label points the objective and the validation use
    encoder_cfg: EncoderConfig
    head_cfg: HeadConfig
    extra: Extras | None = None  # the auxiliary terms' parts (models.objectives; dropped after)
    tta: bool = False  # features outside training: the mean of an image's and its mirror's

    def modules(self) -> dict[str, nn.Module]:
        """The trained modules by their checkpoint prefix."""
        parts = {"encoder.": self.encoder, "head.": self.head}
        parts = parts if self.aux is None else parts | {"aux.": self.aux}
        return parts if self.extra is None else parts | {"extra.": self.extra}

    def train(self, mode: bool = True) -> None:
        self.encoder.train(mode)
        self.head.train(mode)


def _prototypes(
    cfg: TrainConfig,
    labels: LabelEmbedding,
    space: Space,
    seen_nodes: list[str],
    class_points: torch.Tensor,
) -> Prototypes:
    """The trained classes' label points, and the candidates of the prototype loss."""
    classes = space.from_ball(class_points)  # (K, D)
    cone = _cone_targets(cfg, labels, seen_nodes, class_points)
    hops = None  # the expected-hops term's costs, its weight included
    weight = cfg.resolved_hop_weight(len(seen_nodes))
    if weight > 0:
        hops = weight * class_hops(labels.taxonomy, seen_nodes) ** cfg.hop_power
    if cfg.negatives != "taxonomy":
        return Prototypes(classes, classes, torch.arange(len(seen_nodes)), cone=cone, hops=hops)
    # every node (held-out classes too: ``--holdout`` removes their images and nothing
    # else, so a run with held-out classes trains as a deployment would); each
    # class's ancestors excluded from its softmax
    tax = labels.taxonomy
    nodes = list(labels.names)
    pos = {name: i for i, name in enumerate(nodes)}
    points = space.from_ball(labels.embeddings[[tax.index(n) for n in nodes]])
    target = torch.tensor([pos[n] for n in seen_nodes])
    exclude = torch.zeros(len(seen_nodes), len(nodes), dtype=torch.bool)
    for k, node in enumerate(seen_nodes):
        exclude[k, [pos[a] for a in tax.ancestors(node) if a in pos]] = True
    return Prototypes(classes, points, target, exclude, cone=cone, hops=hops)


def class_hops(taxonomy, nodes: list[str]) -> torch.Tensor:
    """(K, K) float32 taxonomy hops between ``nodes`` (:meth:`Taxonomy.hop_table
    <models.taxonomy.Taxonomy.hop_table>`; nodes without a common ancestor: the longest
    path found among the others, plus one)."""
    table = taxonomy.hop_table(nodes, missing=-1)
    table[table < 0] = table.max(initial=0) + 1
    return torch.from_numpy(table).to(torch.float32)


def _cone_targets(
    cfg: TrainConfig, labels: LabelEmbedding, seen_nodes: list[str], class_points: torch.Tensor
) -> ConeTargets | None:
    """The cone term's targets (ball geometry and ``cone_weight`` > 0), else None."""
    if cfg.cone_weight <= 0 or cfg.geometry != "poincare":
        return None
    tax = labels.taxonomy
    k = len(seen_nodes)
    other = torch.ones(k, k, dtype=torch.bool)
    for i, node in enumerate(seen_nodes):
        anc = tax.ancestors(node) | {node}
        other[i] = torch.tensor([n not in anc for n in seen_nodes])
    return ConeTargets(class_points, other, label_cone_spec(labels), labels.curvature)


def build_model(cfg: TrainConfig, labels: LabelEmbedding, prep: Prepared) -> Model:
    """Seeded encoder, head (around the trained classes' midpoint) and auxiliary classifier."""
    objective = cfg.objective
    seen_nodes = [prep.classes[i][1] for i in prep.seen]
    torch.manual_seed(cfg.seed)
    product = None
    if cfg.space is not None:
        from .geometry.product import ProductSpace

        product = ProductSpace.parse(cfg.space)
        if cfg.dim is not None and cfg.dim != product.dim:
            raise TrainError(f"--dim {cfg.dim} does not match --space {cfg.space}")
    dim = cfg.dim or (product.dim if product is not None else labels.dim)
    if objective.needs_protos and dim != labels.dim:
        raise TrainError(
            f"--dim {dim}: the {cfg.loss} loss needs the label embedding's dimension {labels.dim}"
        )
    if cfg.placement == "cones" and (
        cfg.geometry != "poincare" or label_cone_spec(labels)["family"] != "cap"
    ):
        raise TrainError(
            "--placement cones needs the ball geometry and labels of the cap family "
            "(`hypsearch labels train`, the cap construction)"
        )
    c = labels.curvature
    if cfg.curvature is not None and not objective.needs_protos:
        c = float(cfg.curvature)  # label-free objectives: the model's own curvature
    # the head's base point: the Einstein midpoint of the trained classes' label points
    base = torch.zeros(dim, dtype=torch.float64)
    class_points = None  # label-free objectives: the classes need not be label nodes
    if objective.needs_protos:
        class_points = labels.embeddings[[labels.taxonomy.index(n) for n in seen_nodes]]
    if objective.needs_protos and cfg.centre:
        base = poincare.einstein_midpoint(class_points, c=c)
    geometry = "product" if product is not None else cfg.geometry
    scale = 0.0  # prototypes at prototype_radius, on average, from the base point
    if objective.needs_protos and cfg.radius_of_prototypes > 0 and geometry != "product":
        mean = float(poincare.dist(base.expand_as(class_points), class_points, c=c).mean())
        scale = cfg.radius_of_prototypes / mean if mean > 0 else 0.0
    space = make_space(geometry, c, base=base, spec=cfg.space, scale=scale)
    protos = None
    if objective.needs_protos:
        protos = _prototypes(cfg, labels, space, seen_nodes, class_points)
    clip_r = cfg.clip_r
    if clip_r is None:  # reach the farthest class from the base point: d <= 2r/sqrt(c)
        if objective.needs_protos:
            far = float(poincare.dist(base.expand_as(class_points), class_points, c=c).max())
            far *= scale or 1.0
            clip_r = far * math.sqrt(c) / 2 + 0.5
            if protos is not None and protos.cone is not None:
                clip_r += cfg.cone_reach * math.sqrt(c) / 2  # beyond the label points
        else:
            clip_r = 2.3  # Hyp-ViT
    if prep.features:  # a pretrained backbone, frozen but for its last cfg.unfreeze blocks
        encoder = pretrained_encoder(cfg.backbone, prep.preprocess.size, cfg.unfreeze)
        enc_cfg = encoder.config
    else:
        enc_cfg = EncoderConfig(
            name=cfg.encoder,
            in_channels=prep.preprocess.channels,
            input_size=prep.preprocess.size,
            widths=list(cfg.widths),
            depth=cfg.depth,
            pool_first=cfg.pool_first,
            dropout=cfg.dropout,
        )
        encoder = build_encoder(enc_cfg)
    if cfg.backbone and not prep.features:
        try:
            load_backbone(encoder, cfg.backbone)
        except ValueError as e:
            raise TrainError(str(e)) from None
    head_cfg = HeadConfig(
        in_features=encoder.out_features,
        dim=dim,
        geometry=geometry,
        curvature=c,
        clip_r=clip_r,
        mobius=cfg.mobius,
        space=None if product is None else str(product),
        learn_curvature=cfg.learn_curvature,
        prototype_scale=scale,
    )
    head = build_head(head_cfg)
    if cfg.learn_curvature:
        space.learned = head.curvature  # the objectives see the head's current curvature
    with torch.no_grad():
        head.base.copy_(base)
    head.base.requires_grad_(cfg.learn_base and geometry == "poincare")
    encoder = encoder.to(memory_format=torch.channels_last)
    aux = None
    if cfg.aux > 0 and objective.needs_labels and cfg.classifier == "linear":
        aux = nn.Linear(encoder.out_features, len(seen_nodes))
    k = len(seen_nodes) if objective.needs_labels else 0
    extra = build_extras(cfg, space, encoder, encoder.out_features, k, c, base)
    return Model(encoder, head, aux, space, protos, enc_cfg, head_cfg, extra, tta=bool(cfg.tta))


def build_optimizer(
    cfg: TrainConfig, model: Model
) -> tuple[torch.optim.Optimizer, list[nn.Parameter]]:
    """Riemannian Adam over the trainable parameters; weight decay on matrices and kernels only."""
    params = [p for m in model.modules().values() for p in m.parameters() if p.requires_grad]

    def decays(p):
        return p.dim() >= 2 and not isinstance(p, geoopt.ManifoldParameter)

    groups = [
        {"params": [p for p in params if decays(p)], "weight_decay": cfg.weight_decay},
        {"params": [p for p in params if not decays(p)], "weight_decay": 0.0},
    ]
    return geoopt.optim.RiemannianAdam(groups, lr=cfg.lr), params


def _amp_supported() -> bool:
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except Exception:
        return False


def _autocast(enabled: bool):
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=enabled)


# ---------------------------------------------------------------- evaluation during training


@torch.no_grad()
def validate(model: Model, prep: Prepared, amp: bool, batch_size: int = 1024) -> dict:
    """Loss-free metrics of the validation split: nearest-prototype accuracy (or Recall@1)."""
    pixels, targets = prep.val_pixels, prep.val_targets
    if len(pixels) == 0:
        return {}
    f = split_features(model, prep, pixels, amp, batch_size)
    model.train(False)
    z = model.head(f)
    out = {}
    space = model.space
    if model.protos is not None and (targets >= 0).any():
        pred = space.pairwise(z, model.protos.classes).argmin(1)
        ok = targets >= 0
        out["val_acc"] = float((pred[ok] == targets[ok]).double().mean())
        if isinstance(model.aux, nn.Linear):  # the auxiliary classifier's accuracy
            pred = model.aux(f).argmax(1)
            out["val_aux_acc"] = float((pred[ok] == targets[ok]).double().mean())
    elif (targets >= 0).sum() > 1:
        d = space.pairwise(z, z)
        d.fill_diagonal_(float("inf"))
        nn_ = d.argmin(1)
        out["val_r1"] = float((targets[nn_] == targets).double().mean())
    model.train()
    return out


@torch.no_grad()
def split_features(
    model: Model, prep: Prepared, pixels: torch.Tensor, amp: bool, batch_size: int = 1024
) -> torch.Tensor:
    """Encoder features (n, F) float32 of rows of a split (eval mode; train mode after):
    with ``model.tta`` the mean of each image's and its mirror image's, as
    :meth:`ImageModel.features` computes them."""
    model.train(False)
    fs = []
    for s in range(0, len(pixels), batch_size):
        x = _inputs(prep, pixels[s : s + batch_size])
        with _autocast(amp):
            f = _encode(model.encoder, prep, x).float()
            if model.tta and x.dim() == 4:
                f = (f + _encode(model.encoder, prep, x.flip(-1)).float()) / 2
            fs.append(f)
    model.train()
    return torch.cat(fs) if fs else torch.zeros(0, 0)


#: training images the feature novelty statistics are fitted on (a seeded sample)
NOVELTY_FIT_IMAGES = 20_000


def fit_novelty(out: ImageModel, model: Model, prep: Prepared, cfg: TrainConfig) -> None:
    """The feature novelty rule (:mod:`models.novelty`): fitted on up to
    :data:`NOVELTY_FIT_IMAGES` training images, its threshold calling
    ``cfg.novelty_rate`` of the validation images novel; kept in ``out.novelty``,
    ``out.config["novelty_threshold"]`` and ``out.metrics["novelty"]``. Features in
    float32 (no bfloat16 autocast), as :meth:`ImageModel.embed` computes them."""
    from .novelty import FeatureNovelty

    rate = cfg.resolved_novelty_rate(len(prep.classes))
    tr, va = prep.train_targets >= 0, prep.val_targets >= 0
    if rate <= 0 or not bool(va.any()):
        return
    gen = torch.Generator().manual_seed(cfg.seed * 7_919 + 1)
    rows = torch.nonzero(tr).flatten()
    rows = rows[torch.randperm(len(rows), generator=gen)[:NOVELTY_FIT_IMAGES]].sort().values
    t0 = time.perf_counter()
    try:
        nov = FeatureNovelty.fit(
            split_features(model, prep, prep.train_pixels[rows], False), prep.train_targets[rows]
        )
    except ValueError:  # a trained class without a sampled image: no rule rather than a bad one
        return
    threshold = nov.calibrate(split_features(model, prep, prep.val_pixels[va], False), rate)
    out.novelty = nov
    out.config |= {"novelty_rate": rate, "novelty_threshold": threshold}
    out.metrics["novelty"] = {
        "rate": rate,
        "threshold": threshold,
        "fit_images": len(rows),
        "seconds": time.perf_counter() - t0,
    }
    out._placement = None


#: what the placement's calibration asks of the validation images: at least this share
#: placed at their class, and at most ``PLACEMENT_OTHER`` in another class's cone -- 0.01
#: below the 0.05 aimed at on the test split (a model whose validation images gave 0.046
#: gave 0.053 on the test split: docs/image-model.md)
PLACEMENT_IN_CLASS, PLACEMENT_OTHER = 0.9, 0.04


def placement_merit(got: dict) -> tuple[bool, float]:
    """How good a calibrated placement is on validation (larger is better): first whether
    it meets both aims (:data:`PLACEMENT_IN_CLASS`, :data:`PLACEMENT_OTHER`), then the
    share of images placed at their class."""
    both = got["val_in_class"] >= PLACEMENT_IN_CLASS and got["val_other"] <= PLACEMENT_OTHER
    return both, got["val_in_class"]


def calibrate_placement(out: ImageModel, model: Model, prep: Prepared, cfg: TrainConfig) -> None:
    """The cone placement's back-offs from the validation split
    (:func:`models.placement.calibrate`), written into ``out.config``
    (``placement_confidence``, ``placement_novelty``, ``placement_radii``) and
    ``out.metrics["placement"]``; with a kept classifier, its posterior or the
    distances', whichever does better on validation (:func:`placement_merit`;
    ``placement_posterior``, ``metrics["placement_val_in_class"]`` and
    ``["placement_val_other"]``)."""
    from .placement import ConePlacement, PlacementConfig, calibrate

    if cfg.placement_posterior == "classifier":
        if isinstance(model.aux, nn.Linear):  # kept for the placement's posterior
            out.classifier = (model.aux.weight.detach().clone(), model.aux.bias.detach().clone())
        else:  # no linear auxiliary classifier (--aux 0, --classifier hmlr): the distances
            out.config["placement_posterior"] = "distance"
    ok = prep.val_targets >= 0
    if not bool(ok.any()):
        return
    # float32 features, as ImageModel.embed computes them (no bfloat16 autocast)
    f = split_features(model, prep, prep.val_pixels[ok], False)
    with torch.no_grad():
        z = model.head(f).double()
    seen = [prep.classes[i][1] for i in prep.seen]
    classes = [seen[t] for t in prep.val_targets[ok].tolist()]

    def calibrated(classifier) -> dict:
        pl = ConePlacement(
            out.labels,
            seen,
            PlacementConfig(tau=out.config.get("tau", 1.0)),
            prototypes=out.head_prototypes(),
            classifier=classifier,
        )
        return calibrate(
            pl, z, classes, in_class=PLACEMENT_IN_CLASS, other=PLACEMENT_OTHER, features=f
        )

    got = calibrated(out.classifier)
    if out.classifier is not None:
        # the classifier's posterior unless the distances' does better on validation: meets
        # both aims where the classifier's does not, or places more images at their class
        # (a short run's classifier can lag behind the head)
        by_distance = calibrated(None)
        out.metrics["placement_val_in_class"] = {
            "classifier": got["val_in_class"],
            "distance": by_distance["val_in_class"],
        }
        out.metrics["placement_val_other"] = {
            "classifier": got["val_other"],
            "distance": by_distance["val_other"],
        }
        if placement_merit(by_distance) > placement_merit(got):
            got = by_distance
            out.classifier = None
            out.config["placement_posterior"] = "distance"
    out.config |= {
        "placement_confidence": got["confidence"],
        "placement_novelty": 1.0,
        "placement_radii": got["radii"],
    }
    out.metrics["placement"] = {k: got[k] for k in ("confidence", "val_in_class", "val_other")}
    out._placement = None


# ---------------------------------------------------------------- one epoch


def _inputs(prep: Prepared, rows: torch.Tensor, augment=None, views: int = 1, gen=None):
    """Stored rows -> the encoder's input: uint8 pixels as ``views`` augmented views,
    normalised, channels last; a pretrained backbone's cached outputs as they are."""
    if prep.features:
        x = rows.to(torch.float32)
    else:
        pre = prep.preprocess
        pixels = rows.to(torch.float32) / 255  # (B, C, S, S)
        vs = [augment(pixels, gen) for _ in range(views)] if augment is not None else [pixels]
        x = torch.cat([normalize(v, pre.mean, pre.std) for v in vs])
    return x.contiguous(memory_format=torch.channels_last) if x.dim() == 4 else x


def _encode(encoder: nn.Module, prep: Prepared, x: torch.Tensor) -> torch.Tensor:
    """Encoder features (n, F) of :func:`_inputs`."""
    return encoder.from_cached(x) if prep.features else encoder(x)


@dataclass
class Step:
    """What one optimisation step needs besides the model."""

    criterion: Criterion
    opt: torch.optim.Optimizer
    params: list[nn.Parameter]
    augment: Augment
    views: int  # 2 for the two-view objectives
    amp: bool
    iters_per_epoch: int
    batch_size: int


def train_epoch(
    model: Model,
    step: Step,
    cfg: TrainConfig,
    prep: Prepared,
    epoch: int,
    it: int,
    max_iters: int,
    bar=None,
) -> tuple[float, int, float | None]:
    """One pass over the training images in the epoch's seeded order, from iteration ``it``.

    Returns the epoch's mean loss, the iteration reached and, when the epoch
    holds the run's first iteration, that batch's loss (else None).
    """
    gen = torch.Generator().manual_seed(cfg.seed * 100_003 + epoch)
    order = torch.randperm(len(prep.train_pixels), generator=gen)
    bs = step.batch_size
    running, count, first_loss = 0.0, 0, None
    for b in range(step.iters_per_epoch):
        lr = get_lr(it, cfg, max_iters)
        for group in step.opt.param_groups:
            group["lr"] = lr
        idx = order[b * bs : (b + 1) * bs]
        y = prep.train_targets[idx]
        x = _inputs(prep, prep.train_pixels[idx], step.augment, step.views, gen)
        with _autocast(step.amp):
            feats = _encode(model.encoder, prep, x)  # (V*B, F)
        z = model.head(feats.float())  # (V*B, D) float64
        # one-view objectives with two views (auxiliary terms): both views labelled
        yy = y if cfg.objective.two_views or step.views == 1 else y.repeat(step.views)
        loss = step.criterion(z, yy)
        if model.aux is not None:
            logits = model.aux(feats.float())
            loss = loss + cfg.aux * nn.functional.cross_entropy(logits, yy)
        if model.extra is not None:
            loss = loss + model.extra.loss(x, feats, z, y, _autocast(step.amp))[0]
        step.opt.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.grad_clip > 0:
            nn.utils.clip_grad_norm_(step.params, cfg.grad_clip)
        step.opt.step()
        if model.extra is not None:
            model.extra.after_step(model.encoder)
        if it == 0:
            first_loss = float(loss.detach())
        running += float(loss.detach())
        count += 1
        it += 1
        if bar is not None:
            bar.update(1)
            bar.set_postfix(
                epoch=epoch + 1, loss=f"{running / count:.4f}", lr=f"{lr:.1e}", refresh=False
            )
    return running / max(count, 1), it, first_loss


# ---------------------------------------------------------------- the run


def train(
    cfg: TrainConfig,
    labels: LabelEmbedding,
    *,
    progress: bool = True,
    checkpoint_path: str | os.PathLike | None = None,
    resume: bool = True,
    data: ImageSet | None = None,
    max_seconds: float | None = None,
) -> ImageModel:
    """Train an image model against ``labels``; returns it (not saved: see :meth:`ImageModel.save`).

    With ``checkpoint_path`` the run state (model, optimiser, epoch) is written
    there after every epoch, and a matching unfinished run found there is
    resumed. ``max_seconds`` stops after the epoch that crosses the budget.
    """
    cfg.validate()
    cfg = cfg.resolved()
    cap = not cfg.unsupervised and label_cone_spec(labels)["family"] == "cap"
    cfg = cfg.with_placement(cap)
    threads_before = torch.get_num_threads()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    try:
        return _train(cfg, labels, progress, checkpoint_path, resume, data, max_seconds)
    finally:
        torch.set_num_threads(threads_before)


def _progress_bar(total: int, initial: int):
    from tqdm import tqdm

    return tqdm(
        total=total, initial=initial, desc="train", unit="it", dynamic_ncols=True, leave=False
    )


def _train(cfg, labels, progress, checkpoint_path, resume, data, max_seconds) -> ImageModel:
    t0 = time.perf_counter()
    prep = prepare_data(cfg, None if cfg.unsupervised else labels, data, progress=progress)
    model = build_model(cfg, labels, prep)
    opt, params = build_optimizer(cfg, model)
    objective = cfg.objective
    n = len(prep.train_pixels)
    bs = min(cfg.batch_size, n)
    iters_per_epoch = n // bs  # drop the last partial batch (batch norm, pair losses)
    two_views = objective.two_views
    extra_views = model.extra is not None and model.extra.two_views
    strength = cfg.augment
    if extra_views and cfg.augment in ("none", "flip", "light", "strong"):
        strength = "ssl"  # the contrastive / SSL view pipeline
    elif two_views and cfg.augment in ("none", "flip", "light"):
        strength = "strong"
    two_views = two_views or extra_views
    step = Step(
        criterion=build_criterion(cfg, model.space, model.protos),
        opt=opt,
        params=params,
        augment=Augment(strength, flip=cfg.flip),
        views=2 if two_views else 1,
        amp=cfg.amp and _amp_supported(),
        iters_per_epoch=iters_per_epoch,
        batch_size=bs,
    )

    def image_model(metrics: dict) -> ImageModel:
        if cfg.learn_curvature:
            model.head.sync_curvature()  # the saved model's curvature is the learned one
        return ImageModel(
            model.encoder_cfg,
            model.head_cfg,
            prep.preprocess,
            labels,
            prep.classes,
            holdout=list(cfg.holdout),
            config=dataclasses.asdict(cfg),
            metrics=metrics,
            encoder=model.encoder,
            head=model.head,
        )

    # resume an unfinished run
    history: list[dict] = []
    epoch0 = 0
    ckpt = Path(checkpoint_path) if checkpoint_path else None
    if ckpt is not None and resume and ckpt.exists():
        state = resume_run(ckpt, cfg, labels, model.modules(), opt)
        epoch0, history = state.epoch, state.history
        t0 -= state.seconds

    planned = cfg.epochs
    max_iters = planned * iters_per_epoch
    it = epoch0 * iters_per_epoch
    bar = _progress_bar(max_iters, it) if progress else None
    model.train()
    first_loss = None
    epoch = epoch0
    while epoch < planned:
        t_epoch = time.perf_counter()
        if cfg.unsupervised:
            recluster(model, prep, cfg, epoch, step.amp)
        loss, it, first = train_epoch(model, step, cfg, prep, epoch, it, max_iters, bar)
        first_loss = first if first is not None else first_loss
        val = validate(model, prep, step.amp)
        history.append(
            {"epoch": epoch + 1, "loss": loss, **val, "seconds": time.perf_counter() - t0}
        )
        if bar is not None:
            bar.set_postfix(
                epoch=epoch + 1, loss=f"{loss:.4f}", **{k: f"{v:.4f}" for k, v in val.items()}
            )
        if ckpt is not None:
            save_run(
                ckpt,
                image_model({}),
                opt,
                model.aux,
                cfg,
                extra=model.extra,
                epoch=epoch + 1,
                history=history,
                seconds=time.perf_counter() - t0,
            )
        if max_seconds is not None and time.perf_counter() - t0 > max_seconds:
            break
        epoch += 1
        per_epoch = time.perf_counter() - t_epoch
        new_plan = plan_epochs(cfg, epoch, epoch0, planned, per_epoch, time.perf_counter() - t0)
        if new_plan != planned:
            planned = new_plan
            max_iters = planned * iters_per_epoch
            if bar is not None:
                bar.total = max_iters
                bar.write(  # stderr: stdout is --json's
                    f"time budget {cfg.time_budget:.0f} s: {planned} of {cfg.epochs} epochs fit",
                    file=sys.stderr,
                )
    if bar is not None:
        bar.close()

    model.train(False)
    metrics: dict[str, Any] = {
        "train_seconds": time.perf_counter() - t0,
        "epochs": len(history),
        "epochs_requested": cfg.epochs,
        "iterations": it,
        "train_images": n,
        "val_images": len(prep.val_pixels),
        "threads": torch.get_num_threads(),
        "bf16": step.amp,
        "history": history,
        "first_loss": first_loss,  # loss of the first batch (None for a resumed run)
    }
    if prep.feature_cache is not None:
        metrics["features"] = prep.feature_cache  # the pretrained backbone's cached outputs
    if history:
        metrics["loss"] = history[-1]["loss"]
        metrics |= {k: v for k, v in history[-1].items() if k.startswith("val_")}
    out = image_model(metrics)
    if cfg.placement == "cones":
        calibrate_placement(out, model, prep, cfg)
        fit_novelty(out, model, prep, cfg)
    if cfg.unsupervised:
        from .clusters import attach_clusters

        recluster(model, prep, cfg, epoch + 1, step.amp)
        attach_clusters(
            out, model.extra.cluster_tree, replace_labels=labels_are_placeholder(labels)
        )
    return out


def labels_are_placeholder(labels: LabelEmbedding) -> bool:
    """Whether ``labels`` is the stand-in of an unsupervised run without label embeddings."""
    return bool(labels.config.get("placeholder"))


@torch.no_grad()
def recluster(model: Model, prep: Prepared, cfg: TrainConfig, epoch: int, amp: bool) -> None:
    """The unsupervised term's clusters from ``cluster_sample`` training images (seeded by
    the epoch), embedded by the current model in eval mode."""
    gen = torch.Generator().manual_seed(cfg.seed * 100_019 + epoch)
    n = len(prep.train_pixels)
    pick = torch.randperm(n, generator=gen)[: min(cfg.cluster_sample, n)]
    pre = prep.preprocess
    model.train(False)
    zs = []
    for s in range(0, len(pick), 512):
        x = normalize(
            prep.train_pixels[pick[s : s + 512]].to(torch.float32) / 255, pre.mean, pre.std
        )
        with _autocast(amp):
            f = model.encoder(x.contiguous(memory_format=torch.channels_last))
        zs.append(model.head(f.float()))
    model.train()
    model.extra.recluster(torch.cat(zs))
