"""The set-up of a training run (:mod:`models.training.run`): the trained modules
(:class:`Model`: encoder, head, auxiliary classifier, their space, the label points
the objective uses), the optimiser, bfloat16 autocast, and the encoder's inputs."""

from __future__ import annotations

import math
from dataclasses import dataclass

import geoopt
import torch
from torch import nn

from ..geometry import poincare
from ..images.preprocess import normalize
from ..labels import LabelEmbedding
from ..prototypes import label_cone_spec
from ..vision.encoders import EncoderConfig, build_encoder, load_backbone
from ..vision.heads import HeadConfig, Space, build_head, make_space
from .config import TrainConfig, TrainError
from .data import Prepared
from .features import pretrained_encoder
from .losses import ConeTargets, Prototypes
from .objectives import Extras, build_extras


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
    # the auxiliary terms' parts (models.training.objectives; dropped after)
    extra: Extras | None = None
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
    <models.taxonomy.graph.Taxonomy.hop_table>`; nodes without a common ancestor: the longest
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
        from ..geometry.product import ProductSpace

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


def amp_supported() -> bool:
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except Exception:
        return False


def autocast(enabled: bool):
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=enabled)


def model_inputs(prep: Prepared, rows: torch.Tensor, augment=None, views: int = 1, gen=None):
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


def encode(encoder: nn.Module, prep: Prepared, x: torch.Tensor) -> torch.Tensor:
    """Encoder features (n, F) of :func:`model_inputs`."""
    return encoder.from_cached(x) if prep.features else encoder(x)
