"""Image data sets, preprocessing and training views.

* Fashion-MNIST from its IDX files (gzip-compressed or not), with its WordNet
  class map; item ids ``fashion-mnist-<split>-<row>``.
* A user's images: a folder ``DIR/<class name>/<image files>`` (ids: paths
  relative to ``DIR``) or a CSV manifest ``id,path[,label]`` (ids: the ``id``
  column), each class mapped to a taxonomy node.
* :class:`Preprocess`: the one path from decoded images of any size to model
  inputs, used by training, evaluation and serving.
* Training views written in torch on batches: random resized crop, flip,
  colour jitter, Gaussian blur (:class:`Augment`).
"""

from __future__ import annotations

import gzip
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from .imaging import DEFAULT_MAX_PIXELS, IMAGE_SUFFIXES, ImageDecodeError, decode

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
        raise DataError(
            f"{folder}: no such folder (install the Debian package dataset-fashion-mnist)"
        )
    stem = _SPLIT_FILES[split]
    images = read_idx(_find(folder, f"{stem}-images-idx3-ubyte"))
    targets = read_idx(_find(folder, f"{stem}-labels-idx1-ubyte")).astype(np.int64)
    if images.ndim != 3 or targets.ndim != 1 or len(images) != len(targets):
        raise DataError(f"{folder}: {split} images and labels do not match")
    if targets.size and (targets.min() < 0 or targets.max() >= len(FASHION_MNIST_CLASSES)):
        raise DataError(f"{folder}: {split} labels outside 0..9")
    ids = [f"fashion-mnist-{split}-{i}" for i in range(len(images))]
    return ImageSet(images, targets, FASHION_MNIST_CLASSES, ids)


# ---------------------------------------------------------------- a user's images


def read_image(path: str | os.PathLike, max_pixels: int = DEFAULT_MAX_PIXELS) -> np.ndarray:
    """Decode one image file (:func:`models.imaging.decode`, the decoder of builds and
    queries too): uint8 (h, w) for grayscale, (h, w, 3) otherwise."""
    try:
        return decode(path, max_pixels=max_pixels)
    except ImageDecodeError as e:
        if e.kind == "missing":
            raise DataError(f"{path}: no such image file") from None
        raise DataError(f"{path}: unreadable image ({e})") from None


def _stack(images: list[np.ndarray]) -> np.ndarray | list[np.ndarray]:
    """One array when every image has the same shape, else the list (resized later)."""
    if images and all(im.shape == images[0].shape for im in images):
        return np.stack(images)
    return images


def map_class(name: str, class_map: dict[str, str] | None, taxonomy) -> str:
    """Class name -> taxonomy node: through ``class_map``, else the name itself, then
    ``taxonomy.resolve`` (anything with that method; a synset name resolves to itself,
    a word to one of its senses). Raises :class:`DataError` (without a location)."""
    if class_map is not None:
        if name not in class_map:
            raise DataError(f"class {name!r} has no entry in the class map")
        node = class_map[name]
    else:
        node = name
    if taxonomy is not None:
        try:
            node = taxonomy.resolve(node)
        except Exception:  # noqa: BLE001 - UnknownLabelError, TypeError
            raise DataError(
                f"class {name!r} maps to {node!r}, which is not in the taxonomy"
            ) from None
    return node


@dataclass(frozen=True)
class Listed:
    """One picture of a folder or manifest: its id, class name ("" = none), real path."""

    id: str
    label: str
    path: str
    where: str  # the class folder, or "manifest:line"


@dataclass
class Listing:
    """What a folder or manifest lists, and what it refuses to list.

    ``problems``: ``(where, reason, item id or None)``; ``classes``: the class
    names of a folder, sorted (a class may have no entries)."""

    source: str
    entries: list[Listed]
    problems: list[tuple[str, str, str | None]] = field(default_factory=list)
    classes: list[str] = field(default_factory=list)


def _inside(real: Path, roots: list[Path] | None) -> bool:
    return roots is None or any(real == r or r in real.parents for r in roots)


def _real_roots(roots) -> list[Path] | None:
    return None if roots is None else [Path(os.path.realpath(r)) for r in roots]


def _image_files(folder: Path) -> list[Path]:
    """The image files under ``folder`` (by suffix), sorted; hidden names are left out,
    symlinked folders are not followed."""
    files = []
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = [n for n in dirnames if not n.startswith(".")]
        files += [
            Path(dirpath) / n
            for n in filenames
            if Path(n).suffix.lower() in IMAGE_SUFFIXES and not n.startswith(".")
        ]
    return sorted(files)


def list_photos(folder: str | os.PathLike) -> Listing:
    """Every image file under ``folder``, unlabelled (ids: paths relative to it): a
    folder of photos for a model that places pictures without classes
    (``hypsearch demo --photos``)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise DataError(f"{folder}: no such folder")
    try:
        files = _image_files(folder)
    except OSError as e:
        raise DataError(f"{folder}: cannot list ({e.strerror})") from None
    out = Listing(str(folder), [])
    for f in files:
        rel = f.relative_to(folder).as_posix()
        out.entries.append(Listed(rel, "", os.path.realpath(f), str(f.parent)))
    return out


def list_folder(folder: str | os.PathLike, roots=None) -> Listing:
    """The image files of ``DIR/<class name>/...`` (ids: paths relative to ``DIR``).

    Classes and files are sorted; hidden names are left out; symlinked folders
    are not followed. With ``roots``, a class folder or file whose real path is
    outside them is a problem, not an entry."""
    folder = Path(folder)
    roots = _real_roots(roots)
    if not folder.is_dir():
        raise DataError(f"{folder}: no such folder")
    try:
        class_dirs = sorted(
            p for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")
        )
    except OSError as e:
        raise DataError(f"{folder}: cannot list ({e.strerror})") from None
    if not class_dirs:
        raise DataError(f"{folder}: no class folders (expected DIR/<class name>/<images>)")
    out = Listing(str(folder), [])
    for d in class_dirs:
        rel_d = d.relative_to(folder).as_posix()
        if not _inside(Path(os.path.realpath(d)), roots):
            out.problems.append((rel_d + "/", "outside the data roots", None))
            continue
        out.classes.append(d.name)
        for f in _image_files(d):
            rel = f.relative_to(folder).as_posix()
            real = Path(os.path.realpath(f))
            if not _inside(real, roots):
                out.problems.append((rel, "outside the data roots", rel))
                continue
            out.entries.append(Listed(rel, d.name, str(real), str(d)))
    return out


def list_manifest(path: str | os.PathLike, roots=None) -> Listing:
    """The rows of a CSV manifest with header ``id,path[,label]``.

    Paths are relative to the manifest's folder (or absolute). A row with the
    wrong number of columns, an empty or repeated id -- and with ``roots``, a
    path with a ``..`` component or outside the roots -- is a problem."""
    import csv

    path = Path(path)
    roots = _real_roots(roots)
    if not path.is_file():
        raise DataError(f"{path}: no such manifest file")
    try:
        with open(path, newline="", encoding="utf-8") as f:
            rows = list(csv.reader(f))
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise DataError(f"{path}: unreadable manifest ({e})") from None
    if not rows:
        raise DataError(f"{path}: empty manifest (expected a header id,path[,label])")
    header = [h.strip().lower() for h in rows[0]]
    if (
        header[:2] != ["id", "path"]
        or len(header) > 3
        or (len(header) == 3 and header[2] != "label")
    ):
        raise DataError(f"{path}: header must be id,path[,label], got {','.join(rows[0])}")
    out = Listing(str(path), [])
    seen: set[str] = set()
    for line, row in enumerate(rows[1:], start=2):
        where = f"{path}:{line}"
        if not row or all(not c.strip() for c in row):
            continue
        if len(row) < 2 or len(row) > len(header):
            out.problems.append((where, f"expected {len(header)} columns, got {len(row)}", None))
            continue
        item_id, rel = row[0].strip(), row[1].strip()
        if not item_id:
            out.problems.append((where, "empty id", None))
            continue
        if item_id in seen:
            out.problems.append((where, f"duplicate id {item_id!r}", None))
            continue
        p = Path(rel)
        if roots is not None and ".." in p.parts:
            out.problems.append((where, "path contains '..'", item_id))
            continue
        real = Path(os.path.realpath(p if p.is_absolute() else path.parent / p))
        if not _inside(real, roots):
            out.problems.append((where, "outside the data roots", item_id))
            continue
        seen.add(item_id)
        label = row[2].strip() if len(row) > 2 else ""
        out.entries.append(Listed(item_id, label, str(real), where))
    return out


def _load_listing(listing: Listing, class_map, taxonomy) -> ImageSet:
    """Read every entry; the first problem, unmapped class or unreadable image raises."""
    if listing.problems:
        where, reason, _ = listing.problems[0]
        raise DataError(f"{where}: {reason}")
    classes: list[tuple[str, str]] = []
    index: dict[str, int] = {}
    for name in listing.classes:  # a folder's classes, in order, each with images
        if not any(e.label == name for e in listing.entries):
            raise DataError(f"{Path(listing.source) / name}: no image files")
    images, targets, ids = [], [], []
    for e in listing.entries:
        target = -1  # unlabelled (manifest rows without a label)
        if e.label:
            if e.label not in index:
                try:
                    node = map_class(e.label, class_map, taxonomy)
                except DataError as err:
                    raise DataError(f"{e.where}: {err}") from None
                index[e.label] = len(classes)
                classes.append((e.label, node))
            target = index[e.label]
        images.append(read_image(e.path))
        targets.append(target)
        ids.append(e.id)
    if not images:
        raise DataError(f"{listing.source}: lists no images")
    return ImageSet(_stack(images), np.asarray(targets, dtype=np.int64), tuple(classes), ids)


def load_folder(
    folder: str | os.PathLike,
    class_map: dict[str, str] | None = None,
    taxonomy=None,
) -> ImageSet:
    """Images of ``DIR/<class name>/<image files>``; ids are paths relative to ``DIR``.

    ``class_map`` maps the folder names to taxonomy nodes (default: the folder
    name is the node, or a word that ``taxonomy.resolve`` knows). A missing
    folder, an unreadable image or an unmapped class raises :class:`DataError`
    naming it. Classes are sorted by name; files in a class by name
    (:func:`list_folder`).
    """
    return _load_listing(list_folder(folder), class_map, taxonomy)


def load_manifest(
    path: str | os.PathLike,
    class_map: dict[str, str] | None = None,
    taxonomy=None,
) -> ImageSet:
    """Images listed by a CSV manifest with header ``id,path[,label]``
    (:func:`list_manifest`).

    ``label`` is a class name mapped through ``class_map`` (default: a taxonomy
    node or word). Rows without a label get target -1 (unlabelled, for
    self-supervised objectives). Ids are the ``id`` column and must be unique.
    """
    return _load_listing(list_manifest(path), class_map, taxonomy)


def load_dataset(
    dataset: str | None = None,
    *,
    split: str = "train",
    data_dir: str | os.PathLike = DEFAULT_FASHION_MNIST_DIR,
    images: str | os.PathLike | None = None,
    class_map: dict[str, str] | None = None,
    taxonomy=None,
) -> ImageSet:
    """``fashion-mnist`` (with ``split``) or a folder / CSV manifest given as ``images``."""
    if dataset is not None and images is not None:
        raise DataError("give either a dataset or an images folder/manifest, not both")
    if images is not None:
        p = Path(images)
        if p.suffix.lower() == ".csv":
            return load_manifest(p, class_map, taxonomy)
        return load_folder(p, class_map, taxonomy)
    if dataset in (None, "fashion-mnist"):
        return load_fashion_mnist(split, data_dir)
    raise DataError(f"dataset {dataset!r}: unknown (built in: fashion-mnist)")


def read_class_map(path: str | os.PathLike) -> dict[str, str]:
    """A class map file: ``class<TAB>node`` (or ``class,node``) per line; ``#`` comments."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DataError(f"{path}: no such class map file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"{path}: unreadable class map ({e})") from None
    out: dict[str, str] = {}
    for line, raw in enumerate(text.splitlines(), start=1):
        s = raw.strip()
        if not s or s.startswith("#"):
            continue
        parts = s.split("\t") if "\t" in s else s.split(",")
        if len(parts) != 2 or not parts[0].strip() or not parts[1].strip():
            raise DataError(f"{path}:{line}: expected class<TAB>node")
        out[parts[0].strip()] = parts[1].strip()
    if not out:
        raise DataError(f"{path}: empty class map")
    return out


def split_indices(
    targets: np.ndarray, val_fraction: float, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Deterministic stratified split: (train indices, validation indices), both sorted."""
    targets = np.asarray(targets)
    rng = np.random.default_rng(seed)
    val = []
    for t in np.unique(targets):
        idx = np.flatnonzero(targets == t)
        k = int(round(len(idx) * val_fraction))
        val.append(rng.permutation(idx)[:k])
    val = np.sort(np.concatenate(val)) if val else np.zeros(0, dtype=np.int64)
    train = np.setdiff1d(np.arange(len(targets)), val)
    return train, val


# ---------------------------------------------------------------- preprocessing


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


# ---------------------------------------------------------------- training views


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
    :meth:`ImageModel.features <models.image_model.ImageModel.features>`), "shift"
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
