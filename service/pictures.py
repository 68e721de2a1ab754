"""Item pictures: where an item's picture is kept, and how its payload finds it.

A :class:`Pictures` belongs to one collection's runtime (:mod:`service.runtime`);
the item routes store uploads through :meth:`Pictures.store` and read a
picture back with :meth:`Pictures.read`. A payload refers to its picture as

* ``{"image": {"file": NAME}}``: an uploaded picture under :attr:`Pictures.folder`
  (PNG, content-addressed: NAME is its SHA-256 and ``.png``);
* ``{"image": {"path": PATH}}``: a file read by a batch build, served only while
  it lies under the data roots (``HYPSEARCH_DATA_ROOTS``, :attr:`Pictures.roots`);
* ``{"image": {"dataset": "fashion-mnist", "split": S, "row": R}}``: a row of the
  built-in data set under :attr:`Pictures.data_dir`.
"""

from __future__ import annotations

import hashlib
import logging
import re
import threading
from pathlib import Path
from typing import Any

import numpy as np

from .ingest.roots import BuildInputError, check_under_roots

log = logging.getLogger("service")

__all__ = ["NoPictureFolderError", "Pictures"]

_IMAGE_NAME = re.compile(r"^[0-9a-f]{64}\.png$")


class NoPictureFolderError(Exception):
    """An upload is to be kept, and no folder for item pictures is configured."""


class Pictures:
    """The pictures of one collection: uploads kept under ``folder``, rows of the
    built-in data set under ``data_dir``, files under ``roots``."""

    def __init__(self, folder: str | Path | None, data_dir: str | Path | None) -> None:
        self.folder = Path(folder) if folder is not None else None
        self.data_dir = Path(data_dir) if data_dir is not None else None
        #: folders a picture's ``{"path": ...}`` may lie under (set by the app from
        #: ``HYPSEARCH_DATA_ROOTS``; none: no such picture is served)
        self.roots: tuple = ()
        self._splits: dict[str, np.ndarray | None] = {}
        self._split_lock = threading.Lock()

    def read(self, payload: Any) -> np.ndarray | None:
        """The pixels of an item's picture from its payload (see the module
        docstring), or ``None`` when it has none or it cannot be read."""
        ref = payload.get("image") if isinstance(payload, dict) else None
        if not isinstance(ref, dict):
            return None
        if "file" in ref and self.folder is not None:
            name = str(ref["file"])
            if not _IMAGE_NAME.match(name):
                return None
            return _read_pixels(self.folder / name)
        if "path" in ref:
            # checked now, not when written: a restored store may name any file
            try:
                real = check_under_roots(str(ref["path"]), self.roots, "image")
            except (BuildInputError, ValueError):
                return None
            return _read_pixels(real)
        if ref.get("dataset") == "fashion-mnist" and self.data_dir is not None:
            images = self._split_images(str(ref.get("split")))
            row = ref.get("row")
            if images is None or not isinstance(row, int) or not 0 <= row < len(images):
                return None
            return images[row]
        return None

    def _split_images(self, split: str) -> np.ndarray | None:
        with self._split_lock:
            if split not in self._splits:
                from models.images.datasets import DataError, load_fashion_mnist

                try:
                    self._splits[split] = load_fashion_mnist(split, self.data_dir).images
                except DataError:
                    log.warning("pictures of fashion-mnist %s are not available", split)
                    self._splits[split] = None
            return self._splits[split]

    def store(self, pixels: np.ndarray) -> dict:
        """Keep an uploaded picture (PNG, content-addressed, written atomically and
        fsynced); its payload ref. :class:`NoPictureFolderError` without a folder."""
        from models.checkpoint import atomic_write_bytes

        from .imaging import encode_png

        if self.folder is None:
            raise NoPictureFolderError("no folder for item pictures is configured")
        png = encode_png(pixels)
        name = hashlib.sha256(png).hexdigest() + ".png"
        path = self.folder / name
        if not path.exists():
            atomic_write_bytes(path, png)
        return {"file": name}


def _read_pixels(path: Path) -> np.ndarray | None:
    from models.images.decode import ImageDecodeError, decode

    try:
        return decode(path)
    except ImageDecodeError:
        return None
