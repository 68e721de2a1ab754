"""Image data sets: Fashion-MNIST from its IDX files, with its WordNet class map.

The IDX reader takes the files gzip-compressed or not. Item ids follow the
contract: ``fashion-mnist-<split>-<row>``.
"""

from __future__ import annotations

import gzip
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

DEFAULT_FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"

#: Fashion-MNIST class index -> (class name, WordNet noun synset).
FASHION_MNIST_CLASSES: tuple[tuple[str, str], ...] = (
    ("T-shirt/top", "jersey.n.03"),
    ("Trouser", "trouser.n.01"),
    ("Pullover", "pullover.n.01"),
    ("Dress", "dress.n.01"),
    ("Coat", "coat.n.01"),
    ("Sandal", "sandal.n.01"),
    ("Shirt", "shirt.n.01"),
    ("Sneaker", "gym_shoe.n.01"),
    ("Bag", "bag.n.04"),
    ("Ankle boot", "boot.n.01"),
)

_SPLIT_FILES = {"train": "train", "test": "t10k"}
_IDX_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


class DataError(ValueError):
    """A data file or folder that is missing or unreadable; the message names it."""


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Read an IDX file (``.gz`` or plain) into a numpy array."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise DataError(f"{path}: no such file") from None
    except OSError as e:
        raise DataError(f"{path}: cannot read ({e.strerror})") from None
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as e:
            raise DataError(f"{path}: corrupt gzip data ({e})") from None
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES:
        raise DataError(f"{path}: not an IDX file")
    ndim = raw[3]
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DataError(f"{path}: truncated IDX header")
    shape = tuple(int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    dtype = np.dtype(_IDX_DTYPES[raw[2]])
    need = int(np.prod(shape)) * dtype.itemsize
    if len(raw) - header < need:
        raise DataError(f"{path}: truncated IDX data ({len(raw) - header} of {need} bytes)")
    return np.frombuffer(raw, dtype=dtype, count=int(np.prod(shape)), offset=header).reshape(shape)


def _find(folder: Path, stem: str) -> Path:
    for name in (stem, stem + ".gz"):
        if (folder / name).exists():
            return folder / name
    raise DataError(f"{folder}: missing {stem}[.gz] (is the Fashion-MNIST folder right?)")


@dataclass
class ImageSet:
    """Images (n, h, w) uint8, integer class targets, and the class → synset map."""

    images: np.ndarray
    targets: np.ndarray
    classes: tuple[tuple[str, str], ...]
    ids: list[str]

    @property
    def labels(self) -> list[str]:
        """Taxonomy node (synset) of each image."""
        return [self.classes[t][1] for t in self.targets]


def load_fashion_mnist(
    split: str = "test", data_dir: str | os.PathLike = DEFAULT_FASHION_MNIST_DIR
) -> ImageSet:
    if split not in _SPLIT_FILES:
        raise DataError(f"split {split!r}: must be one of {', '.join(_SPLIT_FILES)}")
    folder = Path(data_dir)
    if not folder.is_dir():
        raise DataError(f"{folder}: no such folder (install the Debian package dataset-fashion-mnist)")
    stem = _SPLIT_FILES[split]
    images = read_idx(_find(folder, f"{stem}-images-idx3-ubyte"))
    targets = read_idx(_find(folder, f"{stem}-labels-idx1-ubyte")).astype(np.int64)
    if images.ndim != 3 or targets.ndim != 1 or len(images) != len(targets):
        raise DataError(f"{folder}: {split} images and labels do not match")
    if targets.size and (targets.min() < 0 or targets.max() >= len(FASHION_MNIST_CLASSES)):
        raise DataError(f"{folder}: {split} labels outside 0..9")
    ids = [f"fashion-mnist-{split}-{i}" for i in range(len(images))]
    return ImageSet(images, targets, FASHION_MNIST_CLASSES, ids)
