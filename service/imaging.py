"""Uploaded pictures -> uint8 pixel arrays, under limits; pixel arrays -> PNG.

Decoding refuses, before any pixel is decoded, what is not a PNG, JPEG, WebP,
GIF or BMP (415) and pictures whose header announces more pixels than the
limit (413: decompression bombs; for a JPEG, the pixels of its reduced decode);
a picture that starts like an image but does not decode is 422. Large pictures
are reduced while decoding (JPEG draft mode, then a thumbnail of at most
:data:`MAX_SIDE` pixels a side): the model reads 28 to 64 pixels a side, so
nothing larger is ever needed.
"""

from __future__ import annotations

import io
import warnings
from dataclasses import dataclass

import numpy as np

from .errors import ApiError

#: Formats accepted (Pillow names); SPEC promises PNG and JPEG.
FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP")
MAX_SIDE = 512


def decode_image(data: bytes, *, max_pixels: int, field: str = "file") -> np.ndarray:
    """Bytes of an upload -> uint8 (h, w) for grayscale or (h, w, 3)."""
    from PIL import Image, ImageOps, UnidentifiedImageError

    if not data:
        raise ApiError(422, f"{field}: empty file")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            im = Image.open(io.BytesIO(data), formats=FORMATS)
    except UnidentifiedImageError:
        raise ApiError(
            415, f"{field}: not a picture in a supported format ({', '.join(FORMATS)})"
        ) from None
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise ApiError(413, f"{field}: the picture has too many pixels") from None
    except Exception as e:  # noqa: BLE001 - a malformed header of any kind
        raise ApiError(422, f"{field}: unreadable picture ({type(e).__name__})") from None
    with im:
        if im.format == "JPEG":  # decode at 1/2, 1/4 or 1/8 scale: a large photo costs little
            try:
                im.draft("RGB" if im.mode not in ("L", "1") else "L", (MAX_SIDE, MAX_SIDE))
            except Exception as e:  # noqa: BLE001 - a malformed header of any kind
                raise ApiError(422, f"{field}: unreadable picture ({type(e).__name__})") from None
        w, h = im.size  # what will be decoded
        if w < 1 or h < 1:
            raise ApiError(422, f"{field}: the picture has no pixels ({w}x{h})")
        if w * h > max_pixels:
            raise ApiError(
                413,
                f"{field}: {w}x{h} = {w * h:,} pixels is over the limit of {max_pixels:,} "
                "(HYPSEARCH_MAX_IMAGE_PIXELS)",
            )
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error", Image.DecompressionBombWarning)
                im.seek(0)
                im.load()
                im = ImageOps.exif_transpose(im) or im
                if max(im.size) > MAX_SIDE:
                    im.thumbnail((MAX_SIDE, MAX_SIDE))
                return _to_array(im)
        except ApiError:
            raise
        except Exception as e:  # noqa: BLE001 - truncated or corrupt data of any kind
            raise ApiError(
                422, f"{field}: the picture does not decode ({type(e).__name__}: {e})"
            ) from None


@dataclass(frozen=True)
class EncodedPicture:
    """An upload's bytes, to be decoded (:func:`decode_image`) by whoever embeds it."""

    data: bytes
    max_pixels: int
    field: str = "file"

    def decode(self) -> np.ndarray:
        return decode_image(self.data, max_pixels=self.max_pixels, field=self.field)


def announced_pixels(data: bytes) -> int | None:
    """Width x height a picture's header announces (``None`` when it cannot be read:
    :func:`decode_image` says why). Reads the header only."""
    from PIL import Image

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with Image.open(io.BytesIO(data), formats=FORMATS) as im:
                w, h = im.size
    except Exception:  # noqa: BLE001 - decode_image reports it
        return None
    return w * h


def _to_array(im) -> np.ndarray:
    from PIL import Image

    if im.mode in ("1", "L", "I", "I;16", "F", "LA", "La"):
        if im.mode in ("LA", "La"):
            bg = Image.new("L", im.size, 255)
            bg.paste(im.convert("L"), mask=im.getchannel("A"))
            im = bg
        return np.asarray(im.convert("L"), dtype=np.uint8).copy()
    if im.mode in ("RGBA", "RGBa", "PA") or (im.mode == "P" and "transparency" in im.info):
        rgba = im.convert("RGBA")
        bg = Image.new("RGB", im.size, (255, 255, 255))  # transparent -> white background
        bg.paste(rgba, mask=rgba.getchannel("A"))
        return np.asarray(bg, dtype=np.uint8).copy()
    return np.asarray(im.convert("RGB"), dtype=np.uint8).copy()


def encode_png(pixels: np.ndarray) -> bytes:
    from PIL import Image

    a = np.asarray(pixels, dtype=np.uint8)
    im = Image.fromarray(a)
    buf = io.BytesIO()
    im.save(buf, format="PNG", optimize=False)
    return buf.getvalue()
