"""Training views written in torch on batches: random resized crop, shift, flip,
colour jitter, Gaussian blur, grey-scale (:class:`Augment`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .preprocess import convert_channels


def random_resized_crop(
    x: torch.Tensor,
    size: int,
    scale: tuple[float, float] = (0.08, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """A random crop of each image (area in ``scale``, aspect in ``ratio``) resized to ``size``.

    Batched through an affine sampling grid (bilinear, zero padding never
    used: crops stay inside the image).
    """
    n = x.shape[0]
    area = torch.empty(n).uniform_(scale[0], scale[1], generator=generator)
    logr = torch.empty(n).uniform_(math.log(ratio[0]), math.log(ratio[1]), generator=generator)
    r = torch.exp(logr)
    w = torch.sqrt(area * r).clamp(max=1.0)  # crop width as a fraction of the image
    h = torch.sqrt(area / r).clamp(max=1.0)
    cx = (torch.rand(n, generator=generator) * 2 - 1) * (1 - w)  # centre in [-1, 1] coordinates
    cy = (torch.rand(n, generator=generator) * 2 - 1) * (1 - h)
    theta = torch.zeros(n, 2, 3)
    theta[:, 0, 0], theta[:, 0, 2] = w, cx
    theta[:, 1, 1], theta[:, 1, 2] = h, cy
    grid = torch.nn.functional.affine_grid(theta, (n, x.shape[1], size, size), align_corners=False)
    return torch.nn.functional.grid_sample(
        x, grid, mode="bilinear", padding_mode="border", align_corners=False
    )


def random_shift(
    x: torch.Tensor, pad: int = 2, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Random translation of each image by up to ``pad`` pixels in x and y, zero fill.

    The "pad and random crop" of small-image training (the padded border is
    black, the background of Fashion-MNIST), batched as an integer-pixel
    affine sampling grid, so the pixels are copied exactly.
    """
    n, _, h, w = x.shape
    if pad <= 0:
        return x
    sx = torch.randint(-pad, pad + 1, (n,), generator=generator).to(x.dtype)
    sy = torch.randint(-pad, pad + 1, (n,), generator=generator).to(x.dtype)
    theta = torch.zeros(n, 2, 3, dtype=x.dtype)
    theta[:, 0, 0], theta[:, 0, 2] = 1, 2 * sx / w
    theta[:, 1, 1], theta[:, 1, 2] = 1, 2 * sy / h
    grid = torch.nn.functional.affine_grid(theta, list(x.shape), align_corners=False)
    return torch.nn.functional.grid_sample(
        x, grid, mode="nearest", padding_mode="zeros", align_corners=False
    )


def random_flip(
    x: torch.Tensor, p: float = 0.5, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Horizontal flip of each image with probability ``p``."""
    flip = (torch.rand(x.shape[0], generator=generator) < p).view(-1, 1, 1, 1)
    return torch.where(flip, x.flip(-1), x)


def color_jitter(
    x: torch.Tensor,
    brightness: float = 0.4,
    contrast: float = 0.4,
    saturation: float = 0.4,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Random brightness, contrast and (RGB) saturation factors in [1 - s, 1 + s]."""
    n = x.shape[0]

    def factor(s):
        return torch.empty(n, 1, 1, 1).uniform_(max(0.0, 1 - s), 1 + s, generator=generator)

    x = x * factor(brightness)
    gray = x.mean(dim=1, keepdim=True) if x.shape[1] == 1 else convert_channels(x, 1)
    x = (x - gray.mean(dim=(2, 3), keepdim=True)) * factor(contrast) + gray.mean(
        dim=(2, 3), keepdim=True
    )
    if x.shape[1] == 3 and saturation > 0:
        g = convert_channels(x, 1)
        x = (x - g) * factor(saturation) + g
    return x.clamp(0, 1)


def gaussian_blur(
    x: torch.Tensor,
    sigma: tuple[float, float] = (0.1, 2.0),
    p: float = 0.5,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Gaussian blur, random sigma per image, applied with probability ``p`` (separable)."""
    n, ch, h, w = x.shape
    s = torch.empty(n).uniform_(sigma[0], sigma[1], generator=generator)
    apply = torch.rand(n, generator=generator) < p
    k = max(1, int(math.ceil(3 * sigma[1])))
    k = min(k, (min(h, w) - 1) // 2) if min(h, w) > 2 else 0
    if k == 0:
        return x
    t = torch.arange(-k, k + 1, dtype=x.dtype)
    kern = torch.exp(-(t[None] ** 2) / (2 * s[:, None] ** 2))
    kern = kern / kern.sum(1, keepdim=True)  # (n, 2k+1)
    # one depthwise convolution per image and channel: fold n into channels
    y = x.reshape(1, n * ch, h, w)
    kk = kern.repeat_interleave(ch, 0)  # (n*ch, 2k+1)
    y = torch.nn.functional.pad(y, (k, k, 0, 0), mode="reflect")
    y = torch.nn.functional.conv2d(y, kk.view(n * ch, 1, 1, -1), groups=n * ch)
    y = torch.nn.functional.pad(y, (0, 0, k, k), mode="reflect")
    y = torch.nn.functional.conv2d(y, kk.view(n * ch, 1, -1, 1), groups=n * ch)
    y = y.reshape(n, ch, h, w)
    return torch.where(apply.view(-1, 1, 1, 1), y, x)


def random_grayscale(
    x: torch.Tensor, p: float = 0.2, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Each RGB image turned grey (luminance in every channel) with probability ``p``;
    grey images are returned as they are (for them this step is the identity)."""
    if x.shape[1] != 3:
        return x
    grey = (torch.rand(x.shape[0], generator=generator) < p).view(-1, 1, 1, 1)
    return torch.where(grey, convert_channels(x, 1).expand_as(x), x)


@dataclass
class Augment:
    """A training view: pixels in [0, 1] (n, C, S, S) -> augmented pixels, same shape.

    ``strength`` "flip" (horizontal flips only; a model trained so embeds the
    mean of an image's and its mirror image's features,
    :meth:`ImageModel.features <models.vision.image_model.ImageModel.features>`), "shift"
    (translations by up to 2 pixels with a black fill, and flips: the standard
    augmentation of small images), "light" (mild resized crops and flips),
    "strong" (SimCLR-style views: wide crops, jitter, blur) or "none"; "ssl" the
    view pipeline of SimCLR / BYOL / Barlow Twins: a resized crop (area 0.2-1), a
    flip, colour distortion with probability 0.8 (brightness, contrast and, for RGB,
    saturation: on grey images such as Fashion-MNIST only brightness and contrast),
    grey-scale with probability 0.2 (the identity on grey images) and a Gaussian
    blur with probability 0.5.
    """

    strength: str = "light"
    flip: bool = True

    def __call__(self, x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        if self.strength == "none":
            return x
        if self.strength == "flip":
            return random_flip(x, generator=generator)
        size = x.shape[-1]
        if self.strength == "shift":
            x = random_shift(x, max(1, round(2 * size / 28)), generator=generator)
            if self.flip:
                x = random_flip(x, generator=generator)
            return x
        if self.strength == "light":
            x = random_resized_crop(
                x, size, scale=(0.7, 1.0), ratio=(0.85, 1.18), generator=generator
            )
            if self.flip:
                x = random_flip(x, generator=generator)
            return x
        if self.strength == "strong":
            x = random_resized_crop(x, size, scale=(0.3, 1.0), generator=generator)
            if self.flip:
                x = random_flip(x, generator=generator)
            x = color_jitter(x, 0.4, 0.4, 0.4, generator=generator)
            return gaussian_blur(x, (0.1, 1.0 + size / 64), p=0.5, generator=generator)
        if self.strength == "ssl":
            x = random_resized_crop(x, size, scale=(0.2, 1.0), generator=generator)
            if self.flip:
                x = random_flip(x, generator=generator)
            jit = color_jitter(x, 0.4, 0.4, 0.4, generator=generator)
            keep = (torch.rand(x.shape[0], generator=generator) < 0.8).view(-1, 1, 1, 1)
            x = torch.where(keep, jit, x)
            x = random_grayscale(x, 0.2, generator=generator)
            return gaussian_blur(x, (0.1, 1.0 + size / 64), p=0.5, generator=generator)
        raise ValueError(
            f"unknown augmentation strength {self.strength!r} "
            "(none, flip, shift, light, strong, ssl)"
        )
