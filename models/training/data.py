"""The training data: images loaded once, classes checked against the labels, split, preprocessed.

:func:`prepare_data` resolves the held-out classes, keeps the images the
objective can use, takes the stratified limit and validation split, and
stores the pixels as uint8 at the model's input size; the normalisation is
the training split's own mean and standard deviation.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..images.datasets import ImageSet, load_dataset, split_indices
from ..images.preprocess import Preprocess
from ..labels import LabelEmbedding
from .config import TrainConfig, TrainError
from .features import (
    FeatureError,
    backbone_inputs,
    backbone_preprocess,
    is_pretrained_backbone,
)

__all__ = ["Prepared", "prepare_data"]


@dataclass
class Prepared:
    """Training and validation pixels (uint8, model input size) with class indices."""

    train_pixels: torch.Tensor  # (n, C, S, S) uint8
    train_targets: torch.Tensor  # (n,) int64 index into `classes`, -1 unlabelled
    val_pixels: torch.Tensor
    val_targets: torch.Tensor
    classes: list[tuple[str, str]]  # every class of the data: (name, taxonomy node)
    seen: list[int]  # class indices used in training (not held out)
    preprocess: Preprocess  # or a pretrained backbone's CropPreprocess
    # a pretrained backbone (models.training.features): train/val_pixels hold the frozen part's
    # cached outputs (float32), not pixels
    features: bool = False
    # how they were obtained (models.training.features.backbone_inputs)
    feature_cache: dict | None = None


def split_rows(
    targets: np.ndarray, idx: np.ndarray, limit: int | None, val_fraction: float, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """The training and validation rows of a run among the kept rows ``idx`` of
    ``targets``: a stratified ``limit`` first (when smaller), then the stratified
    validation split -- what a model's own validation split is (benchmarks rebuild it
    from the model's config)."""
    if limit is not None and limit < len(idx):
        sub, _ = split_indices(targets[idx], 1 - limit / len(idx), seed)
        idx = idx[sub]
    tr, va = split_indices(targets[idx], val_fraction, seed)
    return idx[tr], idx[va]


def _resolve_holdout(names: list[str], classes: list[tuple[str, str]]) -> list[str]:
    out = []
    for h in names:
        hits = [node for name, node in classes if h in (node, name)]
        if not hits:
            raise TrainError(
                f"--holdout {h}: not a class of the data "
                f"(classes: {', '.join(n for _, n in classes)})"
            )
        out.append(hits[0])
    return out


def prepare_data(
    cfg: TrainConfig,
    labels: LabelEmbedding | None,
    data: ImageSet | None = None,
    *,
    progress: bool = False,
) -> Prepared:
    """Load the training images, check their classes against the labels, split, preprocess once
    (with a pretrained backbone: its frozen part's outputs, cached,
    :mod:`models.training.features`)."""
    if data is None:
        data = load_dataset(
            cfg.dataset if cfg.images is None else None,
            split="train",
            data_dir=cfg.data_dir,
            images=cfg.images,
            class_map=cfg.class_map,
            taxonomy=labels.taxonomy if labels is not None else None,
        )
    classes = [tuple(c) for c in data.classes]
    if labels is not None:
        for name, node in classes:
            if node not in labels.taxonomy:
                raise TrainError(
                    f"class {name!r} maps to {node!r}, which the label embedding does not contain"
                )
    holdout = _resolve_holdout(cfg.holdout, classes)
    cfg.holdout = holdout
    seen = [i for i, (_, node) in enumerate(classes) if node not in holdout]
    targets = np.asarray(data.targets)
    needs_labels = cfg.objective.needs_labels
    keep = np.isin(targets, seen) | ((targets < 0) & (not needs_labels))
    if needs_labels and not seen:
        raise TrainError("every class is held out: nothing to train on")
    idx = np.flatnonzero(keep)
    if needs_labels and (targets[idx] < 0).any():
        raise TrainError(f"loss {cfg.loss!r} needs labels, but some images have none")
    tr, va = split_rows(targets, idx, cfg.limit, cfg.val_fraction, cfg.seed)
    if len(tr) < 2:
        raise TrainError(f"only {len(tr)} training images")

    images = data.images
    # class indices -> positions among the seen classes (what the prototypes are indexed by)
    pos = np.full(len(classes) + 1, -1)
    pos[seen] = np.arange(len(seen))
    remap = lambda t: torch.from_numpy(np.where(t >= 0, pos[t], -1).astype(np.int64))  # noqa: E731
    if is_pretrained_backbone(cfg.backbone):
        pre = backbone_preprocess(cfg.input_size, cfg.images is None)
        try:
            x, info = backbone_inputs(cfg, pre, images, idx, progress)
        except FeatureError as e:
            raise TrainError(str(e)) from None
        at = {row: i for i, row in enumerate(idx)}
        return Prepared(
            train_pixels=x[[at[r] for r in tr]],
            train_targets=remap(targets[tr]),
            val_pixels=x[[at[r] for r in va]],
            val_targets=remap(targets[va]),
            classes=classes,
            seen=seen,
            preprocess=pre,
            features=True,
            feature_cache=info,
        )
    shape0 = images[0].shape if len(images) else (28, 28)
    size = cfg.input_size or (shape0[0] if cfg.images is None else 64)
    channels = 1 if len(shape0) == 2 else 3
    fmnist = cfg.images is None and cfg.dataset == "fashion-mnist"
    pre = Preprocess(
        size=size,
        channels=channels,
        mean=(0.0,) * channels,
        std=(1.0,) * channels,
        background="dark" if fmnist else "any",
    )

    def pixels(rows: np.ndarray) -> torch.Tensor:
        if isinstance(images, np.ndarray):
            sel = images[rows]
        else:
            sel = [images[i] for i in rows]
        out = []
        for s in range(0, len(rows), 4096):
            chunk = sel[s : s + 4096]
            p = pre.pixels(chunk) if len(chunk) else torch.zeros(0, channels, size, size)
            out.append((p * 255).round().to(torch.uint8))
        return torch.cat(out) if out else torch.zeros(0, channels, size, size, dtype=torch.uint8)

    train_pixels = pixels(tr)
    x = train_pixels.to(torch.float32) / 255
    pre.mean = tuple(float(v) for v in x.mean(dim=(0, 2, 3)))
    pre.std = tuple(float(v) for v in x.std(dim=(0, 2, 3)).clamp_min(1e-3))
    return Prepared(
        train_pixels=train_pixels,
        train_targets=remap(targets[tr]),
        val_pixels=pixels(va),
        val_targets=remap(targets[va]),
        classes=classes,
        seen=seen,
        preprocess=pre,
    )
