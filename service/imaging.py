"""Uploaded pictures -> pixels through the one decoder; pixel arrays -> PNG.

Decoding is :func:`models.imaging.decode` (formats, limits, reduction, EXIF
orientation, transparency onto white: the same rules as training and index
builds); this module maps its refusals to HTTP: not a supported format 415,
too many pixels 413 (decompression bombs included), anything else 422, each
message naming the field.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np

from models.imaging import FORMATS, ImageDecodeError, announced_pixels, decode

from .errors import ApiError

__all__ = ["FORMATS", "EncodedPicture", "announced_pixels", "decode_image", "encode_png"]

_STATUS = {"format": 415, "too_large": 413}


def decode_image(data: bytes, *, max_pixels: int, field: str = "file") -> np.ndarray:
    """Bytes of an upload -> uint8 (h, w) for grayscale or (h, w, 3)."""
    try:
        return decode(data, max_pixels=max_pixels)
    except ImageDecodeError as e:
        limit = " (HYPSEARCH_MAX_IMAGE_PIXELS)" if e.over_limit else ""
        raise ApiError(_STATUS.get(e.kind, 422), f"{field}: {e}{limit}") from None


@dataclass(frozen=True)
class EncodedPicture:
    """An upload's bytes, to be decoded (:func:`decode_image`) by whoever embeds it."""

    data: bytes
    max_pixels: int
    field: str = "file"

    def decode(self) -> np.ndarray:
        return decode_image(self.data, max_pixels=self.max_pixels, field=self.field)


def encode_png(pixels: np.ndarray) -> bytes:
    from PIL import Image

    a = np.asarray(pixels, dtype=np.uint8)
    im = Image.fromarray(a)
    buf = io.BytesIO()
    im.save(buf, format="PNG", optimize=False)
    return buf.getvalue()
