"""A trained image model: encoder + head + the label embedding it was trained against.

:class:`ImageModel` is what the service loads::

    model = ImageModel.load("model.safetensors")
    z = model.embed(images)          # float64 (n, D) points of the ball
    model.labels                     # LabelEmbedding: prototypes and taxonomy
    model.curvature, model.dim, model.preprocess, model.class_map, model.holdout, model.version

The checkpoint is one safetensors file of kind ``model`` (see
:mod:`models.checkpoint`): encoder and head weights under ``encoder.`` and
``head.``, the label checkpoint's tensors under ``labels.`` (so a model is
one file), and in the JSON metadata the encoder and head configs,
preprocessing, class map, holdout classes, training config and metrics.
Loading never unpickles anything; a foreign or truncated file raises
:class:`~models.checkpoint.CheckpointError`.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from ..images.preprocess import Preprocess
from ..labels import LabelEmbedding
from .encoders import EncoderConfig, build_encoder
from .heads import HeadConfig, Space, build_head, make_space

__all__ = ["ImageModel", "KIND", "load_model", "preprocess_from_dict"]

KIND = "model"


class ImageModel:
    """Encoder and head in eval mode, with everything needed to use them."""

    def __init__(
        self,
        encoder_cfg: EncoderConfig,
        head_cfg: HeadConfig,
        preprocess: Preprocess,
        labels: LabelEmbedding,
        classes: list[tuple[str, str]],
        holdout: list[str] | None = None,
        config: dict[str, Any] | None = None,
        metrics: dict[str, Any] | None = None,
        encoder: nn.Module | None = None,
        head: nn.Module | None = None,
    ):
        self.encoder_cfg = encoder_cfg
        self.head_cfg = head_cfg
        self.encoder = encoder if encoder is not None else build_encoder(encoder_cfg)
        # one memory layout for training and serving: conv kernels (and so the last bits of
        # the embeddings) depend on it
        self.encoder = self.encoder.to(memory_format=torch.channels_last)
        self.head = head if head is not None else build_head(head_cfg)
        self.preprocess = preprocess
        self.labels = labels
        self.classes = [tuple(c) for c in classes]  # (class name, taxonomy node), in target order
        self.holdout = list(holdout or [])
        self.config = dict(config or {})
        self.metrics = dict(metrics or {})
        # models.vision.novelty.FeatureNovelty of the encoder features (its threshold in config)
        self.novelty = None
        # (weight (K, F), bias (K,)): the linear classifier over the trained classes on the
        # encoder features that training kept for the placement's posterior, or None
        self.classifier = None
        self.version = ""

    # ---------------------------------------------------------------- properties
    @property
    def curvature(self) -> float:
        return float(self.head_cfg.curvature)

    @property
    def dim(self) -> int:
        return int(self.head_cfg.dim)

    @property
    def geometry(self) -> str:
        return self.head_cfg.geometry

    @property
    def head_space(self) -> Space:
        """The space of the head's outputs; its prototypes are the label points, or their
        scaled stand-ins for a model trained with ``prototype_radius``
        (:attr:`models.vision.heads.Space.scale`)."""
        return make_space(
            self.geometry,
            self.curvature,
            base=self.head.base.detach(),
            spec=self.head_cfg.space,
            scale=float(getattr(self.head_cfg, "prototype_scale", 0.0) or 0.0),
        )

    @property
    def space(self) -> Space:
        """The space of :meth:`embed`'s outputs: the head's, except that a placed model's
        outputs sit beside the label points themselves (the placement's anchors)."""
        if self.config.get("placement", "none") == "cones" and self.geometry == "poincare":
            return make_space(self.geometry, self.curvature, base=self.head.base.detach())
        return self.head_space

    @property
    def places_in_cones(self) -> bool:
        """Whether this model's images belong where the labels' cones say: the
        cone placement (``placement: "cones"``, :mod:`models.vision.placement`) or
        training with the cone term (``cone_weight > 0``)."""
        if self.geometry != "poincare":
            return False
        return self.placement is not None or float(self.config.get("cone_weight", 0.0)) > 0

    @property
    def placement(self):
        """The :class:`~models.vision.placement.ConePlacement` of a model whose config says
        ``placement: "cones"`` (the last step of :meth:`embed`), else None."""
        if self.config.get("placement", "none") != "cones" or self.geometry != "poincare":
            return None
        if getattr(self, "_placement", None) is None:
            from .placement import ConePlacement, PlacementConfig

            get = self.config.get
            cfg = PlacementConfig(
                depth=float(get("placement_depth", PlacementConfig.depth)),
                tau=float(get("tau", PlacementConfig.tau)),
                confidence=float(get("placement_confidence", PlacementConfig.confidence)),
                novelty=float(get("placement_novelty", PlacementConfig.novelty)),
                certainty_depth=float(
                    get("placement_certainty_depth", PlacementConfig.certainty_depth)
                ),
            )
            radii = get("placement_radii") or None
            self._placement = ConePlacement(
                self.labels,
                self.seen_classes,
                cfg,
                radii,
                prototypes=self.head_prototypes(),
                feature_novelty=self.novelty,
                classifier=self.classifier,
            )
        return self._placement

    @property
    def prediction_nodes(self) -> list[str] | None:
        """What an unlabelled item's predicted label is chosen among when an index has no
        labels yet: for a model of an unsupervised run whose taxonomy is its cluster tree
        (:mod:`models.training.clusters`) the finest clusters; None (every taxonomy node)
        otherwise."""
        if self.labels.config.get("init") == "clusters":
            return [node for _, node in self.classes]
        return None

    @property
    def class_map(self) -> dict[str, str]:
        """Class name -> taxonomy node (synset)."""
        return dict(self.classes)

    @property
    def seen_classes(self) -> list[str]:
        """Taxonomy nodes of the classes used in training (all classes but the holdout)."""
        return [node for _, node in self.classes if node not in self.holdout]

    def prototypes(self, nodes: list[str] | None = None) -> torch.Tensor:
        """Label prototypes in the space of :meth:`embed`'s outputs (:attr:`space`): where
        each label's images gather, (len(nodes), D) float64 (default: every node)."""
        emb = self.labels.embeddings
        if nodes is not None:
            emb = emb[[self.labels.taxonomy.index(n) for n in nodes]]
        return self.space.from_ball(emb)

    def search_points(self) -> torch.Tensor:
        """Every node's point a search by its name starts from, (M, D) float64: where
        :meth:`embed` puts that node's images. The prototypes; for a placed model the
        placement's anchors (the label point moved ``placement_depth`` outward), the
        centre of the images placed at the node: its label point lies ``depth`` inward,
        nearest to the images the placement squashed to the rim (the least typical)."""
        if self.placement is None:
            return self.prototypes()
        return self.placement.anchors_of(self.labels.embeddings.to(torch.float64))

    def head_prototypes(self) -> torch.Tensor:
        """Every node's prototype in the space of the head's outputs (:attr:`head_space`,
        before any placement), (M, D) float64, taxonomy order."""
        return self.head_space.from_ball(self.labels.embeddings.to(torch.float64))

    # ---------------------------------------------------------------- inference
    @property
    def batch_size(self) -> int:
        """Images per forward pass at inference: 512 for the small encoders, the
        measured best of a pretrained backbone (``embed_batch``)."""
        return int(getattr(self.encoder, "embed_batch", 512))

    @property
    def tta(self) -> bool:
        """Whether an image's features are the mean of its and its mirror image's encoder
        features (a model trained with flips: ``tta`` in its config)."""
        return bool(self.config.get("tta", False))

    def _encode(self, x: torch.Tensor) -> torch.Tensor:
        f = self.encoder(x)
        if self.tta:
            f = (f + self.encoder(x.flip(-1))) / 2
        return f

    @torch.no_grad()
    def features(self, images, batch_size: int | None = None) -> torch.Tensor:
        """Encoder features (n, F) float32 of images in any format :class:`Preprocess`
        takes; for a model trained with flips (:attr:`tta`) the mean of the image's and
        its mirror image's."""
        self.encoder.eval()
        out = []
        for chunk in _chunks(images, batch_size or self.batch_size):
            x = self.preprocess(chunk).contiguous(memory_format=torch.channels_last)
            out.append(self._encode(x).float())
        if not out:
            return torch.zeros(0, getattr(self.encoder, "out_features", 0))
        return torch.cat(out)

    @torch.no_grad()
    def embed(self, images, batch_size: int | None = None) -> torch.Tensor:
        """Images -> float64 (n, D) embeddings (points of the ball for a poincare model).

        ``images``: uint8 arrays (n, h, w) or (n, h, w, 3|4) of any size, a list
        of such images of different sizes, or float pixels in [0, 1]; resized
        and converted to the model's input (:attr:`preprocess`). Batched, no
        gradient, eval mode.
        """
        self.encoder.eval()
        self.head.eval()
        place = self.placement
        out = []
        for chunk in _chunks(images, batch_size or self.batch_size):
            x = self.preprocess(chunk).contiguous(memory_format=torch.channels_last)
            f = self._encode(x)
            z = self.head(f)
            out.append(z if place is None else place(z, f))
        if not out:
            return torch.zeros(0, self.dim, dtype=torch.float64)
        return torch.cat(out)

    @torch.no_grad()
    def class_prototype(self, images) -> torch.Tensor:
        """Prototype of a new class from a few images: the Einstein midpoint of their
        embeddings (hyperbolic ProtoNet; the mean for a Euclidean model), (D,)."""
        z = self.embed(images)
        if z.shape[0] == 0:
            raise ValueError("a prototype needs at least one image")
        return self.space.midpoint(z)

    # ---------------------------------------------------------------- io
    def tensors_and_meta(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        # 0-d tensors (batch-norm counters) are stored as (1,): safetensors hashing views bytes
        tensors = {
            f"encoder.{k}": v.reshape(-1) if v.dim() == 0 else v
            for k, v in self.encoder.state_dict().items()
        }
        tensors |= {
            f"head.{k}": v.reshape(-1) if v.dim() == 0 else v
            for k, v in self.head.state_dict().items()
        }
        lt, lmeta = self.labels.tensors_and_meta()
        tensors |= {f"labels.{k}": v for k, v in lt.items()}
        if self.novelty is not None:
            tensors |= {f"novelty.{k}": v for k, v in self.novelty.tensors().items()}
        if self.classifier is not None:
            w, b = self.classifier
            tensors |= {"classifier.weight": w.detach(), "classifier.bias": b.detach()}
        meta = {
            "encoder": dataclasses.asdict(self.encoder_cfg),
            "head": dataclasses.asdict(self.head_cfg),
            "preprocess": self.preprocess.to_dict(),
            "labels": lmeta,
            "labels_version": self.labels.version,
            "classes": [list(c) for c in self.classes],
            "holdout": self.holdout,
            "config": self.config,
            "metrics": self.metrics,
            "curvature": self.curvature,
            "dim": self.dim,
            "geometry": self.geometry,
        }
        return tensors, meta

    def save(self, path: str | os.PathLike, extra_tensors=None, extra_meta=None) -> str:
        tensors, meta = self.tensors_and_meta()
        tensors |= dict(extra_tensors or {})
        meta |= dict(extra_meta or {})
        self.version = save_checkpoint(path, KIND, tensors, meta)
        return self.version

    @classmethod
    def from_tensors(
        cls, tensors: dict[str, torch.Tensor], meta: dict[str, Any], where: str
    ) -> ImageModel:
        try:
            enc_cfg = EncoderConfig(**meta["encoder"])
            head_cfg = HeadConfig(**meta["head"])
            pre = preprocess_from_dict(meta["preprocess"])
            classes = [tuple(c) for c in meta["classes"]]
            lmeta = meta["labels"]
        except (KeyError, TypeError, ValueError) as e:
            raise CheckpointError(
                f"{where}: model checkpoint metadata is incomplete ({e})"
            ) from None
        labels = LabelEmbedding.from_tensors(
            {k[len("labels.") :]: v for k, v in tensors.items() if k.startswith("labels.")},
            lmeta,
            where,
        )
        labels.version = meta.get("labels_version", "")
        model = cls(
            enc_cfg,
            head_cfg,
            pre,
            labels,
            classes,
            meta.get("holdout"),
            meta.get("config"),
            meta.get("metrics"),
        )
        for prefix, module in (("encoder.", model.encoder), ("head.", model.head)):
            state = {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}
            for k, v in module.state_dict().items():
                if v.dim() == 0 and k in state and state[k].numel() == 1:
                    state[k] = state[k].reshape(())
            try:
                module.load_state_dict(state, strict=True)
            except RuntimeError as e:
                first = str(e).strip().splitlines()[0]
                raise CheckpointError(
                    f"{where}: {prefix[:-1]} weights do not match its config ({first})"
                ) from None
        if "novelty.means" in tensors and "novelty.precision" in tensors:
            from .novelty import FeatureNovelty

            threshold = float((meta.get("config") or {}).get("novelty_threshold", float("inf")))
            try:
                model.novelty = FeatureNovelty(
                    tensors["novelty.means"], tensors["novelty.precision"], threshold
                )
            except ValueError as e:
                raise CheckpointError(f"{where}: {e}") from None
        if "classifier.weight" in tensors and "classifier.bias" in tensors:
            model.classifier = (tensors["classifier.weight"], tensors["classifier.bias"])
        model.encoder = model.encoder.to(memory_format=torch.channels_last)
        model.encoder.eval()
        model.head.eval()
        return model

    @classmethod
    def load(cls, path: str | os.PathLike) -> ImageModel:
        tensors, meta, version = load_checkpoint(Path(path), kind=KIND)
        model = cls.from_tensors(tensors, meta, str(path))
        model.version = version
        return model

    def __repr__(self) -> str:
        return (
            f"ImageModel({self.encoder_cfg.name}, {self.geometry} dim={self.dim} "
            f"c={self.curvature:g}, "
            f"{len(self.classes)} classes, holdout={self.holdout}, version={self.version[:12]})"
        )


def preprocess_from_dict(d: dict):
    """The stored preprocessing of a checkpoint:
    :class:`~models.images.preprocess.Preprocess`, or the centre crop of a pretrained backbone
    (:class:`~models.vision.backbones.CropPreprocess`)."""
    from .backbones import CropPreprocess

    if d.get("kind") == "center-crop":
        return CropPreprocess.from_dict(d)
    return Preprocess.from_dict(d)


def load_model(spec: str | os.PathLike, **kwargs):
    """The one resolver of a ``--model`` argument: ``pretrained:NAME`` (a built-in
    pretrained model, :mod:`models.vision.pretrained`; ``kwargs`` go to
    :func:`~models.vision.pretrained.load_pretrained`) or the path of a model checkpoint.
    Failures raise :class:`~models.checkpoint.CheckpointError` with one line."""
    from .pretrained import is_pretrained, load_pretrained

    if is_pretrained(spec):
        return load_pretrained(str(spec), **kwargs)
    return ImageModel.load(spec)


def _chunks(images, size: int):
    if isinstance(images, (list, tuple)):
        for i in range(0, len(images), size):
            yield list(images[i : i + size])
        return
    n = len(images)
    for i in range(0, n, size):
        yield images[i : i + size]
