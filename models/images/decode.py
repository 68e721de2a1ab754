"""The one image decoder: files and uploaded bytes -> uint8 pixel arrays.

Training (:func:`models.images.datasets.read_image`), index builds
(:func:`service.ingest.build.read_picture`) and queries
(:func:`service.imaging.decode_image`) all decode through :func:`decode`, so
the same file reaches the model with the same pixels whichever way it comes.
The rules, in order:

* formats: only :data:`FORMATS` are opened (Pillow's ``formats=``); a file
  of any other kind is refused before any pixel is decoded; folder listings
  pick files by :data:`IMAGE_SUFFIXES`, the suffixes of those formats;
* limits: a header announcing more pixels than ``max_pixels`` is refused
  (for a JPEG, the pixels of its reduced decode), so are decompression bombs
  (Pillow's own warning, made an error) and pictures without pixels;
* reduction: a JPEG decodes in draft mode (1/2, 1/4 or 1/8 scale) and any
  picture larger than :data:`MAX_SIDE` a side becomes a thumbnail of at most
  that size: the models read 28 to 64 pixels a side, so nothing larger is
  needed;
* orientation: the EXIF orientation is applied (a rotated camera JPEG is
  upright);
* transparency is composited onto white, then the mode becomes ``L``
  (grayscale modes) or ``RGB`` (everything else).

A refusal raises :class:`ImageDecodeError`, whose ``kind`` says why (the
service maps the kinds to HTTP statuses, a build to skip reasons).
"""

from __future__ import annotations

import io
import os
import warnings
from pathlib import Path

import numpy as np

__all__ = [
    "DEFAULT_MAX_PIXELS",
    "FORMATS",
    "IMAGE_SUFFIXES",
    "MAX_SIDE",
    "ImageDecodeError",
    "announced_pixels",
    "decode",
    "to_array",
]

#: Formats decoded (Pillow names).
FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP", "TIFF")
#: File suffixes of those formats (how folder listings pick image files).
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff")
#: Longest side of a decoded picture; larger ones are reduced.
MAX_SIDE = 512
#: Pixel limit of a decode when the caller gives none.
DEFAULT_MAX_PIXELS = 40_000_000

_GRAY_MODES = ("1", "L", "I", "I;16", "F", "LA", "La")

# Kinds of ImageDecodeError
MISSING, EMPTY, FORMAT, TOO_LARGE, UNREADABLE = (
    "missing",
    "empty",
    "format",
    "too_large",
    "unreadable",
)


class ImageDecodeError(ValueError):
    """A picture that is not decoded; ``kind`` is one of ``missing`` (no such file),
    ``empty``, ``format`` (not one of :data:`FORMATS`), ``too_large`` (pixel
    limit or decompression bomb), ``unreadable`` (malformed or truncated).

    ``over_limit`` is true when ``max_pixels`` itself was exceeded; ``cause``
    names the underlying exception type, if any. ``reason`` is a short text
    for counting skipped files by cause."""

    def __init__(
        self, kind: str, message: str, *, cause: str | None = None, over_limit: bool = False
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.cause = cause
        self.over_limit = over_limit

    @property
    def reason(self) -> str:
        if self.kind == MISSING:
            return "no such file"
        if self.kind == TOO_LARGE:
            return str(self)
        return f"unreadable ({self.cause or self.kind})"


def decode(
    source: bytes | str | os.PathLike,
    *,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    max_side: int = MAX_SIDE,
) -> np.ndarray:
    """Bytes or a file path -> uint8 (h, w) for grayscale or (h, w, 3), by the rules above."""
    from PIL import Image, ImageOps, UnidentifiedImageError

    if isinstance(source, (bytes, bytearray, memoryview)):
        if not len(source):
            raise ImageDecodeError(EMPTY, "empty file")
        fp = io.BytesIO(source)
    else:
        fp = Path(source)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            im = Image.open(fp, formats=FORMATS)
    except FileNotFoundError:
        raise ImageDecodeError(MISSING, "no such file", cause="FileNotFoundError") from None
    except UnidentifiedImageError:
        raise ImageDecodeError(
            FORMAT,
            f"not a picture in a supported format ({', '.join(FORMATS)})",
            cause="UnidentifiedImageError",
        ) from None
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise ImageDecodeError(TOO_LARGE, "the picture has too many pixels") from None
    except Exception as e:  # noqa: BLE001 - a malformed header of any kind
        name = type(e).__name__
        raise ImageDecodeError(UNREADABLE, f"unreadable picture ({name})", cause=name) from None
    with im:
        if im.format == "JPEG":  # decode at 1/2, 1/4 or 1/8 scale: a large photo costs little
            try:
                im.draft("RGB" if im.mode not in ("L", "1") else "L", (max_side, max_side))
            except Exception as e:  # noqa: BLE001 - a malformed header of any kind
                name = type(e).__name__
                raise ImageDecodeError(
                    UNREADABLE, f"unreadable picture ({name})", cause=name
                ) from None
        w, h = im.size  # what will be decoded
        if w < 1 or h < 1:
            raise ImageDecodeError(UNREADABLE, f"the picture has no pixels ({w}x{h})")
        if w * h > max_pixels:
            raise ImageDecodeError(
                TOO_LARGE,
                f"{w}x{h} = {w * h:,} pixels is over the limit of {max_pixels:,}",
                over_limit=True,
            )
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error", Image.DecompressionBombWarning)
                im.seek(0)
                im.load()
                # reduced first, turned after: exif_transpose copies the picture
                # (a second full-size buffer), thumbnail reduces it in place
                if max(im.size) > max_side:
                    im.thumbnail((max_side, max_side))
                im = ImageOps.exif_transpose(im) or im
                return to_array(im)
        except Exception as e:  # noqa: BLE001 - truncated or corrupt data of any kind
            name = type(e).__name__
            raise ImageDecodeError(
                UNREADABLE, f"the picture does not decode ({name}: {e})", cause=name
            ) from None


def to_array(im) -> np.ndarray:
    """A decoded Pillow image -> uint8 (h, w) or (h, w, 3); transparency onto white."""
    from PIL import Image

    if im.mode in _GRAY_MODES:
        if im.mode in ("LA", "La"):
            bg = Image.new("L", im.size, 255)
            bg.paste(im.convert("L"), mask=im.getchannel("A"))
            im = bg
        return np.asarray(im.convert("L"), dtype=np.uint8).copy()
    if im.mode in ("RGBA", "RGBa", "PA") or (im.mode == "P" and "transparency" in im.info):
        rgba = im.convert("RGBA")
        bg = Image.new("RGB", im.size, (255, 255, 255))
        bg.paste(rgba, mask=rgba.getchannel("A"))
        return np.asarray(bg, dtype=np.uint8).copy()
    return np.asarray(im.convert("RGB"), dtype=np.uint8).copy()


def announced_pixels(data: bytes) -> int | None:
    """Width x height a picture's header announces (``None`` when it cannot be read:
    :func:`decode` says why). Reads the header only."""
    from PIL import Image

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with Image.open(io.BytesIO(data), formats=FORMATS) as im:
                w, h = im.size
    except Exception:  # noqa: BLE001 - decode reports it
        return None
    return w * h
