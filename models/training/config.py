"""The options of image training (:class:`TrainConfig`) and the error of a request that fails."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from ..images.datasets import DEFAULT_FASHION_MNIST_DIR
from . import features, losses

__all__ = ["MAX_HOP_CLASSES", "TrainConfig", "TrainError"]

#: the default expected-hops term is on up to this many trained classes (a K x K table)
MAX_HOP_CLASSES = 2048


class TrainError(ValueError):
    """A training request that cannot work (unknown class, wrong dimension, …); one line."""


@dataclass
class TrainConfig:
    """Every option of image training; the defaults are the benchmarked configuration."""

    # data
    dataset: str | None = "fashion-mnist"  # or None with `images`
    data_dir: str = DEFAULT_FASHION_MNIST_DIR
    images: str | None = None  # a folder DIR/<class>/<images> or a CSV manifest id,path[,label]
    class_map: dict[str, str] | None = None  # class name -> taxonomy node (user images)
    holdout: list[str] = field(default_factory=list)  # taxonomy nodes kept out of training
    limit: int | None = None  # use only this many training images (stratified; quick runs, tests)
    val_fraction: float = 0.05  # stratified validation split of the training images
    input_size: int | None = None  # None: the images' own size (Fashion-MNIST 28), 64 for user's
    # model
    encoder: str = "conv4"
    widths: list[int] = field(default_factory=lambda: [32, 64, 128, 128])
    depth: int = 1  # conv4: 3x3 convolutions per block
    pool_first: bool = True  # conv4: conv -> pool -> BN -> ReLU (False: the original order)
    dropout: float = 0.0  # on the encoder's pooled features
    backbone: str | None = None  # a user's pretrained backbone state dict (local file), or
    # pretrained:efficientnet-lite0 (models.training.features: frozen, its outputs cached on disk)
    unfreeze: int = 0  # with a pretrained:NAME backbone: train its last N blocks too
    geometry: str = "poincare"  # "euclidean": the Euclidean twin
    dim: int | None = None  # None: the label embedding's dimension
    clip_r: float | None = None  # None: reach the farthest class prototype (radius / 2 + 0.5)
    mobius: bool = False
    centre: bool = True  # head around the Einstein midpoint of the class prototypes (else 0)
    learn_base: bool = False  # train that base point too (Riemannian Adam on the ball)
    # objective
    loss: str = "prototype"  # a name of losses.LOSSES: prototype, margin, pairwise, circle, ntxent
    negatives: str = "taxonomy"  # prototype losses: "classes" (the trained classes) or "taxonomy"
    # (every taxonomy node except the class's ancestors and the held-out subtrees)
    tau: float | None = None  # temperature of prototype / pairwise / ntxent logits -d/tau;
    # None: 0.1 for the prototype loss, 1 for it on the ball with unscaled label points and
    # for the other losses (resolved)
    prototype_logits: str = "distance"  # or "busemann": -(d(z, p) - d(m, p))/tau, the
    # prototypes' depth taken out of the softmax (losses.prototype_offsets)
    prototype_radius: float | None = None  # labelled objectives: the prototypes are the label
    # points seen from the head's base point with their distances scaled so that the trained
    # classes lie at this mean distance (heads.Space.scale); 0: the label points themselves;
    # None: 2 on the ball, 0 for the twin and with the cone term (radius_of_prototypes)
    pull: float = 0.3  # prototype loss: weight of the mean distance to the class prototype
    margin: float = 1.0  # margin rank loss
    cone_weight: float = 0.0  # labelled objectives on the ball: weight of the cone hinge
    # (losses.cone_hinge: each image inside its class's label cone, outside other classes'); 0: off
    cone_margin: float = 0.25  # its margin in log aperture ratio
    hop_weight: float | None = None  # labelled objectives: weight of the expected cost
    # hops ** hop_power between an image's class and the classes of its posterior
    # (losses.expected_hops: mistakes that stay in the family cost less); 0: off; None: 1 up
    # to MAX_HOP_CLASSES trained classes, else off (resolved_hop_weight)
    hop_power: float = 2.0  # the cost of a mistake: hops ** hop_power (far mistakes dearer)
    cone_reach: float = 2.0  # with the cone term, the head's default reach beyond the farthest
    # class (hyperbolic distance): inside a cone lies beyond its label point
    placement: str | None = None  # "cones": embed moves each image inside the cone of its node
    # (models.vision.placement: its class, or the common ancestor of the classes it
    # hesitates between);
    # None: "cones" for the prototype loss on the ball with cap-family labels, else "none"
    placement_posterior: str = "classifier"  # with placement: what picks an image's node,
    # "classifier" (the auxiliary linear classifier on the encoder's features, kept in the
    # model) or "distance" (the softmax of -d(z, prototype)/tau of the head's output)
    novelty_rate: float | None = None  # with placement: the share of validation images of
    # trained classes the feature novelty rule (models.vision.novelty) calls novel; a novel image
    # goes under the parent of the nodes without training images its posterior points to
    # (models.vision.placement); None: 0 (off), with or without --holdout
    aux: float = 1.0  # weight of an auxiliary softmax classifier on the encoder's features
    # (labelled losses; the classifier is dropped after training)
    # auxiliary terms (models.training.objectives; each 0 / "none": off)
    classifier: str = "linear"  # the aux classifier: "linear" on the features, or "hmlr"
    # (hyperbolic multinomial logistic regression on the ball embeddings, Ganea et al. 2018)
    hier_weight: float = 0.0  # HIER (Kim et al. 2023): weight of the hierarchical-proxy term
    hier_proxies: int = 32  # its learnable proxies
    hier_margin: float = 0.1
    contrastive: str = "none"  # NT-Xent of two views beside the main loss: "hyperbolic"
    # (similarity -d/tau, Yue et al. 2023) or "euclidean" (cosine of the tangent vectors)
    contrastive_weight: float = 0.5
    contrastive_tau: float = 0.2
    ssl: str = "none"  # "byol" or "barlow": a self-supervised term on the encoder's features
    ssl_weight: float = 0.5
    byol_tau: float = 0.99  # BYOL's target moving average
    unsupervised: bool = False  # Yan et al. 2021: log-ratio loss on a clustering, no labels
    cluster_levels: list[int] = field(default_factory=lambda: [4, 16, 64])  # clusters per level
    cluster_sample: int = 2000  # images clustered at each epoch's start
    cluster_weight: float = 1.0
    negative_sample: int | str = "auto"  # prototype loss over the trained classes and this many
    # sampled other nodes per step (0: every node; "auto": every node up to AUTO_FULL_NODES
    # nodes, else AUTO_NEGATIVE_SAMPLE): the cost of a step then does not grow with the taxonomy
    space: str | None = None  # a product space "poincare:8,sphere:4,euclidean:4" (CurvLearn head)
    curvature: float | None = None  # the model's curvature without labels (default 1)
    learn_curvature: bool = False  # label-free objectives on the ball: train log c too,
    # starting from `curvature` (models.vision.heads.HyperbolicHead.log_c); saved as the model's c
    augment: str = "none"  # none, flip, shift, light, strong, ssl (two-view objectives use
    # strong, the contrastive / ssl / unsupervised terms ssl)
    flip: bool = True
    tta: bool | None = None  # embed an image as the mean of its and its mirror image's encoder
    # features (ImageModel.features); None: on with the "flip" augmentation (resolved_tta)
    # optimisation
    epochs: int = 12
    batch_size: int = 256
    lr: float = 4e-3
    min_lr: float = 4e-5
    warmup_iters: int = 100
    weight_decay: float = 5e-4
    grad_clip: float = 5.0
    amp: bool = True  # bfloat16 autocast of the encoder where the CPU supports it
    threads: int | None = 1  # torch threads while training (None: leave torch's setting);
    # on a shared 2-core machine one thread was much faster than two (docs/image-model.md)
    time_budget: float | None = 570.0  # seconds; after epoch 1, fewer epochs if they would not fit
    seed: int = 0

    @property
    def objective(self) -> losses.Objective:
        return losses.LOSSES[self.loss]

    def resolved(self) -> TrainConfig:
        """This config with its automatic defaults made concrete (what a model saves):
        ``prototype_radius`` (:attr:`radius_of_prototypes`) and ``tau``: 0.1 for the
        prototype loss with scaled prototypes or the twin's tangent vectors (scaled, their
        spacing is about a seventh of the label points', and at 1 the softmax stayed
        nearly flat: docs/image-model.md), 1 on the ball with the label points themselves and for
        the other losses."""
        radius = self.radius_of_prototypes
        tta = self.resolved_tta
        tau = self.tau
        if tau is None:
            far = self.geometry == "poincare" and radius == 0  # the label points themselves
            tau = 0.1 if self.loss == "prototype" and not far else 1.0
        return dataclasses.replace(self, prototype_radius=radius, tau=float(tau), tta=tta)

    def with_placement(self, cap_labels: bool) -> TrainConfig:
        """``placement`` made concrete: when not given, "cones" for a labelled prototype
        objective on the ball whose labels are of the cap family (``cap_labels``), else
        "none"."""
        if self.placement is not None:
            return self
        auto = (
            cap_labels
            and self.geometry == "poincare"
            and self.space is None
            and not self.unsupervised
            and self.loss == "prototype"
        )
        return dataclasses.replace(self, placement="cones" if auto else "none")

    def resolved_hop_weight(self, n_classes: int) -> float:
        """``hop_weight``, else 1 for up to :data:`MAX_HOP_CLASSES` trained classes (the
        term needs their K x K hops; docs/image-model.md) and 0 beyond."""
        if self.hop_weight is not None:
            return float(self.hop_weight)
        return 1.0 if 0 < n_classes <= MAX_HOP_CLASSES else 0.0

    def resolved_novelty_rate(self, n_classes: int) -> float:
        """``novelty_rate``, else 0 (off): the share of the trained classes' validation
        images the feature novelty rule calls novel is a trade the user chooses
        (docs/image-model.md, "Zero-shot": what each rate catches and costs), never
        derived from ``holdout``, which removes the held-out classes' images and
        nothing else. ``n_classes`` (the data's classes) is kept for callers."""
        del n_classes
        return 0.0 if self.novelty_rate is None else float(self.novelty_rate)

    @property
    def resolved_tta(self) -> bool:
        """``tta``, else on exactly when training flips the images (the "flip" augmentation)."""
        if self.tta is not None:
            return bool(self.tta)
        return self.augment == "flip" and self.flip

    @property
    def radius_of_prototypes(self) -> float:
        """The prototype radius in effect: ``prototype_radius``, else 2 on the ball, and 0
        (the label points) for the twin, where scaling measured worse (docs/image-model.md),
        and with the cone term, whose cones lie beyond the label points themselves."""
        if self.prototype_radius is not None:
            return float(self.prototype_radius)
        return 2.0 if self.geometry == "poincare" and self.cone_weight == 0 else 0.0

    def key(self) -> dict:
        """What a resumed run must share with the run that wrote the checkpoint (all but epochs)."""
        return {k: v for k, v in dataclasses.asdict(self).items() if k != "epochs"}

    def validate(self) -> None:
        if self.loss not in losses.LOSSES:
            raise TrainError(f"unknown loss {self.loss!r} (one of {', '.join(losses.LOSSES)})")
        if self.geometry not in ("poincare", "euclidean"):
            raise TrainError(f"unknown geometry {self.geometry!r} (poincare or euclidean)")
        if self.augment not in ("none", "flip", "shift", "light", "strong", "ssl"):
            raise TrainError(
                f"unknown augmentation {self.augment!r} (none, flip, shift, light, strong or ssl)"
            )
        self._validate_extras()
        if self.epochs < 0 or self.batch_size < 2:
            raise TrainError("epochs must be >= 0 and batch size >= 2")
        if self.negatives not in ("classes", "taxonomy"):
            raise TrainError(f"unknown negatives {self.negatives!r} (classes or taxonomy)")
        if not (0 <= self.val_fraction < 1):
            raise TrainError(f"val fraction must be in [0, 1), got {self.val_fraction}")
        if not (self.cone_weight >= 0 and self.cone_margin >= 0 and self.cone_reach >= 0):
            raise TrainError("cone weight, margin and reach must be >= 0")
        if self.hop_weight is not None and not self.hop_weight >= 0:
            raise TrainError(f"hop weight must be >= 0, got {self.hop_weight}")
        if not self.hop_power > 0:
            raise TrainError(f"hop power must be positive, got {self.hop_power}")
        if self.placement not in (None, "none", "cones"):
            raise TrainError(f"unknown placement {self.placement!r} (none or cones)")
        if self.placement_posterior not in ("classifier", "distance"):
            raise TrainError(
                f"unknown placement posterior {self.placement_posterior!r} (classifier or distance)"
            )
        if self.novelty_rate is not None and not (0 <= self.novelty_rate < 1):
            raise TrainError(f"novelty rate must be in [0, 1), got {self.novelty_rate}")
        for name in ("lr", "tau", "margin"):
            if getattr(self, name) is not None and not getattr(self, name) > 0:
                raise TrainError(f"{name} must be positive")
        if features.is_pretrained_backbone(self.backbone):
            try:
                features.check_backbone(self.backbone)
            except features.FeatureError as e:
                raise TrainError(str(e)) from None
            if self.objective.two_views or self.augment != "none":
                raise TrainError(
                    f"--backbone {self.backbone}: trains on cached features, which cannot "
                    f"be augmented (loss {self.loss!r}, augment {self.augment!r})"
                )
        elif self.unfreeze:
            raise TrainError("--unfreeze needs --backbone pretrained:NAME")

    def _validate_extras(self) -> None:
        """The auxiliary terms, the product head and the unsupervised mode (one line each)."""
        if self.classifier not in ("linear", "hmlr"):
            raise TrainError(f"unknown classifier {self.classifier!r} (linear or hmlr)")
        if self.contrastive not in ("none", "hyperbolic", "euclidean"):
            raise TrainError(
                f"unknown contrastive similarity {self.contrastive!r} (hyperbolic or euclidean)"
            )
        if self.prototype_radius is not None and not self.prototype_radius >= 0:
            raise TrainError(f"prototype radius must be >= 0, got {self.prototype_radius}")
        if self.prototype_logits not in ("distance", "busemann"):
            raise TrainError(
                f"unknown prototype logits {self.prototype_logits!r} (distance or busemann)"
            )
        if self.ssl not in ("none", "byol", "barlow"):
            raise TrainError(f"unknown ssl term {self.ssl!r} (byol or barlow)")
        for name in ("hier_weight", "contrastive_weight", "ssl_weight", "cluster_weight"):
            if not getattr(self, name) >= 0:
                raise TrainError(f"{name.replace('_', ' ')} must be >= 0")
        ns = self.negative_sample
        if ns != "auto" and (isinstance(ns, bool) or not isinstance(ns, int) or ns < 0):
            raise TrainError(f"negative sample must be 'auto' or an integer >= 0, got {ns!r}")
        if self.hier_proxies < 2 or not (0 <= self.byol_tau < 1):
            raise TrainError("hier proxies must be >= 2, byol tau in [0, 1)")
        if not self.cluster_levels or any(k < 2 for k in self.cluster_levels):
            raise TrainError("cluster levels: at least one level, each of >= 2 clusters")
        if list(self.cluster_levels) != sorted(self.cluster_levels):
            raise TrainError("cluster levels must grow from the coarsest to the finest")
        if self.curvature is not None and not self.curvature > 0:
            raise TrainError(f"curvature must be positive, got {self.curvature}")
        if self.learn_curvature:
            if self.objective.needs_protos or self.geometry != "poincare" or self.space:
                raise TrainError(
                    "--curvature learn: needs a label-free loss (circle, pairwise, ntxent) on "
                    f"the ball, not the {self.loss} loss"
                    + (f" in the {self.geometry} geometry" if self.geometry != "poincare" else "")
                    + (" with --space" if self.space else "")
                    + " (with labels the model takes the labels' curvature: train the labels "
                    "at c with `hypsearch labels train --curvature C`)"
                )
            if self.hier_weight > 0 or self.classifier == "hmlr":
                raise TrainError("--curvature learn: HIER and HMLR keep a fixed curvature")
        if self.unsupervised and self.objective.needs_labels:
            raise TrainError(f"--unsupervised needs a label-free loss (ntxent), not {self.loss!r}")
        if self.space is not None:
            from ..geometry.product import ProductSpace

            try:
                ProductSpace.parse(self.space)
            except ValueError as e:
                raise TrainError(f"--space {self.space}: {e}") from None
            if self.objective.needs_protos:
                raise TrainError(
                    f"--space: the {self.loss} loss needs label points of the ball; "
                    "a product head trains with circle, pairwise or ntxent"
                )
            if self.hier_weight > 0 or self.classifier == "hmlr" or self.unsupervised:
                raise TrainError("--space: HIER, HMLR and --unsupervised need a ball or the twin")
