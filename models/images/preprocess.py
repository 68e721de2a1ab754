"""Preprocessing: the one path from decoded images of any size to model inputs
(:class:`Preprocess`), used by training, evaluation and serving."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .datasets import DataError


@dataclass
class Preprocess:
    """The single preprocessing path of training, evaluation and serving.

    Images (uint8 arrays (n, h, w) or (n, h, w, 3|4), a list of such images
    of any sizes, or float pixels in [0, 1]) become a float32 tensor
    (n, channels, size, size): channels converted (RGB -> luminance for a
    1-channel model, gray repeated for a 3-channel one, alpha dropped),
    resized (bilinear, antialiased), normalised by ``mean``/``std``.
    ``background="dark"`` (Fashion-MNIST: light objects on black) inverts
    images whose border is mostly light, such as product photos on white.
    """

    size: int = 28
    channels: int = 1
    mean: tuple[float, ...] = (0.2860,)
    std: tuple[float, ...] = (0.3530,)
    background: str = "any"  # "dark": invert images with a light border

    def to_dict(self) -> dict:
        return {
            "size": self.size,
            "channels": self.channels,
            "mean": list(self.mean),
            "std": list(self.std),
            "background": self.background,
        }

    @classmethod
    def from_dict(cls, d: dict) -> Preprocess:
        return cls(
            size=int(d["size"]),
            channels=int(d["channels"]),
            mean=tuple(float(v) for v in d["mean"]),
            std=tuple(float(v) for v in d["std"]),
            background=str(d.get("background", "any")),
        )

    def pixels(self, images) -> torch.Tensor:
        """Images -> float32 (n, channels, size, size) in [0, 1], not normalised."""
        return image_pixels(images, self.size, self.channels, background=self.background)

    def __call__(self, images) -> torch.Tensor:
        return normalize(self.pixels(images), self.mean, self.std)


def image_pixels(
    images, size: int, channels: int, *, background: str = "any", crop: float | None = None
) -> torch.Tensor:
    """The pixel path of every preprocessing: images in any form :class:`Preprocess`
    takes -> float32 (n, channels, size, size) in [0, 1], not normalised.

    Channels converted, images with a light border inverted for
    ``background="dark"``, then with ``crop`` the centre square of side
    ``crop`` x the shorter side, and a resize (bilinear, antialiased) to
    ``size`` x ``size`` where the shape differs.
    """
    if isinstance(images, (list, tuple)):
        if not images:
            return torch.zeros(0, channels, size, size)
        one = [
            image_pixels(_one(i), size, channels, background=background, crop=crop) for i in images
        ]
        return torch.cat(one)
    x = convert_channels(to_float(images), channels)  # (n, C, h, w)
    if background == "dark":
        x = invert_light_background(x)
    if crop is not None:
        h, w = x.shape[-2:]
        side = max(1, round(min(h, w) * crop))
        top, left = (h - side) // 2, (w - side) // 2
        x = x[..., top : top + side, left : left + side]
    if x.shape[-2:] != (size, size):
        x = resize(x, size)
    return x.clamp(0, 1)


def _one(im) -> np.ndarray | torch.Tensor:
    """One image -> a batch of one."""
    a = im if torch.is_tensor(im) else np.asarray(im)
    return a[None]


def to_float(images) -> torch.Tensor:
    """uint8/float images (n, h, w), (n, h, w, C) or (n, C, h, w) -> float32 (n, C, h, w), 0..1."""
    if not torch.is_tensor(images):
        a = np.asarray(images)
        if a.dtype == object:
            raise DataError("images of different sizes must be given as a list")
        images = torch.from_numpy(
            np.array(a, copy=not a.flags.writeable or not a.flags.c_contiguous)
        )
    x = images
    if x.dim() == 2:
        x = x[None]
    if x.dim() == 3:
        x = x[:, None]  # (n, 1, h, w)
    elif x.dim() == 4:
        if x.shape[-1] in (1, 3, 4):
            x = x.permute(0, 3, 1, 2)  # channels last (decoded images) -> first
        elif x.shape[1] not in (1, 3, 4):
            raise DataError(
                f"images (n, h, w, C) need 1, 3 or 4 channels, got shape {tuple(x.shape)}"
            )
    else:
        raise DataError(f"images must be (n, h, w) or (n, h, w, C), got shape {tuple(x.shape)}")
    if x.dtype == torch.uint8:
        x = x.to(torch.float32) / 255.0
    elif x.is_floating_point():
        x = x.to(torch.float32)
    else:
        raise DataError(f"images must be uint8 or float, got {x.dtype}")
    if not torch.isfinite(x).all():
        raise DataError("images contain NaN or infinite values")
    return x


def convert_channels(x: torch.Tensor, channels: int) -> torch.Tensor:
    """(n, C, h, w) -> (n, channels, h, w): drop alpha, RGB -> luminance, or gray -> RGB."""
    if x.shape[1] == 4:
        x = x[:, :3]
    if x.shape[1] == channels:
        return x
    if channels == 1 and x.shape[1] == 3:
        w = torch.tensor([0.299, 0.587, 0.114], dtype=x.dtype).view(1, 3, 1, 1)
        return (x * w).sum(1, keepdim=True)
    if channels == 3 and x.shape[1] == 1:
        return x.expand(-1, 3, -1, -1)
    raise DataError(f"cannot convert {x.shape[1]}-channel images to {channels} channels")


def invert_light_background(x: torch.Tensor, threshold: float = 0.5) -> torch.Tensor:
    """Invert the images whose one-pixel border is brighter than ``threshold`` on average."""
    border = torch.cat([x[..., 0, :], x[..., -1, :], x[..., :, 0], x[..., :, -1]], dim=-1).mean(
        dim=(1, 2)
    )  # (n,)
    light = (border > threshold).view(-1, 1, 1, 1)
    return torch.where(light, 1 - x, x)


def resize(x: torch.Tensor, size: int) -> torch.Tensor:
    """Resize (n, C, h, w) to (n, C, size, size), bilinear, antialiased when shrinking."""
    return torch.nn.functional.interpolate(
        x, size=(size, size), mode="bilinear", align_corners=False, antialias=True
    )


def normalize(x: torch.Tensor, mean, std) -> torch.Tensor:
    m = torch.as_tensor(mean, dtype=x.dtype).view(1, -1, 1, 1)
    s = torch.as_tensor(std, dtype=x.dtype).view(1, -1, 1, 1)
    return (x - m) / s
