"""Uploaded pictures -> pixels through the one decoder; pixel arrays -> PNG.

Decoding is :func:`models.images.decode.decode` (formats, limits, reduction, EXIF
orientation, transparency onto white: the same rules as training and index
builds); this module maps its refusals to HTTP: not a supported format 415,
too many pixels 413 (decompression bombs included), anything else 422, each
message naming the field.

Large pictures cost their full size to decode (a 4096 x 4096 RGBA PNG: 64 MB):
:func:`decode_off_loop` runs such decodes in threads, at most
``HYPSEARCH_MAX_CONCURRENT_DECODES`` at a time, the others waiting on the event
loop (taking no thread), so the memory of decoding is bounded whatever arrives.
"""

from __future__ import annotations

import functools
import io
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio
import anyio.to_thread
import numpy as np

from models.images.decode import FORMATS, ImageDecodeError, announced_pixels, decode

from .errors import ApiError

__all__ = [
    "FORMATS",
    "EncodedPicture",
    "announced_pixels",
    "decode_image",
    "decode_off_loop",
    "encode_png",
]

T = TypeVar("T")

_STATUS = {"format": 415, "too_large": 413}


def decode_image(data: bytes, *, max_pixels: int, field: str = "file") -> np.ndarray:
    """Bytes of an upload -> uint8 (h, w) for grayscale or (h, w, 3)."""
    try:
        return decode(data, max_pixels=max_pixels)
    except ImageDecodeError as e:
        limit = " (HYPSEARCH_MAX_IMAGE_PIXELS)" if e.over_limit else ""
        raise ApiError(_STATUS.get(e.kind, 422), f"{field}: {e}{limit}") from None


#: one limiter per event loop (an anyio limiter belongs to the loop it was made on)
_LIMITERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _limiter(slots: int) -> anyio.CapacityLimiter:
    import asyncio

    loop = asyncio.get_running_loop()
    lim = _LIMITERS.get(loop)
    if lim is None:
        lim = _LIMITERS[loop] = anyio.CapacityLimiter(max(1, int(slots)))
    elif lim.total_tokens != max(1, int(slots)):
        lim.total_tokens = max(1, int(slots))
    return lim


async def decode_off_loop(slots: int, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` (a decode) in a worker thread, at most ``slots`` of
    them at a time in this process's event loop; the others wait without a thread."""
    return await anyio.to_thread.run_sync(
        functools.partial(fn, *args, **kwargs), limiter=_limiter(slots)
    )


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
