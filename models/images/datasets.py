"""Image data sets.

* Fashion-MNIST from its IDX files (gzip-compressed or not), with its WordNet
  class map; item ids ``fashion-mnist-<split>-<row>``.
* A user's images: a folder ``DIR/<class name>/<image files>`` (ids: paths
  relative to ``DIR``) or a CSV manifest ``id,path[,label]`` (ids: the ``id``
  column), each class mapped to a taxonomy node.

Decoded images become model inputs through :class:`models.images.preprocess.Preprocess`;
training views are :class:`models.images.augment.Augment`.
"""

from __future__ import annotations

import gzip
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .decode import DEFAULT_MAX_PIXELS, IMAGE_SUFFIXES, ImageDecodeError, decode

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

#: ``inside(real_path)``: whether a listing may read a file (the data roots).
Inside = Callable[[Path], bool]

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
    """Decode one image file (:func:`models.images.decode.decode`, the decoder of builds and
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


def list_folder(folder: str | os.PathLike, inside: Inside | None = None) -> Listing:
    """The image files of ``DIR/<class name>/...`` (ids: paths relative to ``DIR``).

    Classes and files are sorted; hidden names are left out; symlinked folders
    are not followed. With ``inside`` (the data roots' test of a real path,
    :func:`service.ingest.roots.inside_roots`), a class folder or file whose real
    path it refuses is a problem, not an entry."""
    folder = Path(folder)
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
        if inside is not None and not inside(Path(os.path.realpath(d))):
            out.problems.append((rel_d + "/", "outside the data roots", None))
            continue
        out.classes.append(d.name)
        for f in _image_files(d):
            rel = f.relative_to(folder).as_posix()
            real = Path(os.path.realpath(f))
            if inside is not None and not inside(real):
                out.problems.append((rel, "outside the data roots", rel))
                continue
            out.entries.append(Listed(rel, d.name, str(real), str(d)))
    return out


def list_manifest(path: str | os.PathLike, inside: Inside | None = None) -> Listing:
    """The rows of a CSV manifest with header ``id,path[,label]``.

    Paths are relative to the manifest's folder (or absolute). A row with the
    wrong number of columns, an empty or repeated id -- and with ``inside`` (as
    for :func:`list_folder`), a path with a ``..`` component or one it refuses --
    is a problem."""
    import csv

    path = Path(path)
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
        if inside is not None and ".." in p.parts:
            out.problems.append((where, "path contains '..'", item_id))
            continue
        real = Path(os.path.realpath(p if p.is_absolute() else path.parent / p))
        if inside is not None and not inside(real):
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
