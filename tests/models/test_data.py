"""Image data: IDX files, folders and manifests, preprocessing, training views."""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from models.images.augment import (
    Augment,
    color_jitter,
    gaussian_blur,
    random_flip,
    random_resized_crop,
    random_shift,
)
from models.images.datasets import (
    DataError,
    load_fashion_mnist,
    load_folder,
    load_manifest,
    read_class_map,
    read_idx,
    split_indices,
)
from models.images.preprocess import Preprocess

FMNIST = "/usr/share/datasets/fashion-mnist"
torch.set_num_threads(1)


def _idx_bytes(a: np.ndarray) -> bytes:
    code = {np.uint8: 0x08, np.int32: 0x0C}[a.dtype.type]
    header = bytes([0, 0, code, a.ndim]) + b"".join(int(s).to_bytes(4, "big") for s in a.shape)
    return header + a.astype(a.dtype.newbyteorder(">")).tobytes()


def test_read_idx_plain_and_gzip(tmp_path):
    a = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    (tmp_path / "a").write_bytes(_idx_bytes(a))
    (tmp_path / "a.gz").write_bytes(gzip.compress(_idx_bytes(a)))
    np.testing.assert_array_equal(read_idx(tmp_path / "a"), a)
    np.testing.assert_array_equal(read_idx(tmp_path / "a.gz"), a)
    b = np.array([1, -2, 70000], dtype=np.int32)
    (tmp_path / "b").write_bytes(_idx_bytes(b))
    np.testing.assert_array_equal(read_idx(tmp_path / "b"), b)


def test_read_idx_truncated_and_foreign_name_the_file(tmp_path):
    a = np.zeros((5, 28, 28), dtype=np.uint8)
    raw = _idx_bytes(a)
    bad = tmp_path / "cut-images"
    bad.write_bytes(raw[: len(raw) - 10])
    with pytest.raises(DataError, match="cut-images.*truncated"):
        read_idx(bad)
    gz = tmp_path / "cut.gz"
    gz.write_bytes(gzip.compress(raw)[:-20])
    with pytest.raises(DataError, match="cut.gz"):
        read_idx(gz)
    foreign = tmp_path / "notes.txt"
    foreign.write_text("hello world")
    with pytest.raises(DataError, match="notes.txt.*not an IDX"):
        read_idx(foreign)
    with pytest.raises(DataError, match="missing-file"):
        read_idx(tmp_path / "missing-file")


def test_fashion_mnist_folder_errors(tmp_path):
    with pytest.raises(DataError, match="no such folder"):
        load_fashion_mnist("test", tmp_path / "nope")
    with pytest.raises(DataError, match="t10k-images"):
        load_fashion_mnist("test", tmp_path)


@pytest.mark.skipif(not os.path.isdir(FMNIST), reason=f"Fashion-MNIST not installed at {FMNIST}")
def test_real_fashion_mnist():
    data = load_fashion_mnist("test", FMNIST)
    assert data.images.shape == (10000, 28, 28) and data.images.dtype == np.uint8
    assert np.bincount(data.targets).tolist() == [1000] * 10
    assert data.ids[42] == "fashion-mnist-test-42"
    assert data.labels[0] == data.classes[data.targets[0]][1]


# ---------------------------------------------------------------- folders and manifests

PIL = pytest.importorskip("PIL.Image", reason="Pillow is needed to read image files")


def _png(path: Path, shape=(12, 10), value=128, mode="L"):
    path.parent.mkdir(parents=True, exist_ok=True)
    a = np.full(shape if mode == "L" else (*shape, 3), value, dtype=np.uint8)
    PIL.fromarray(a, mode=mode).save(path)


def test_load_folder_ids_classes_and_map(tmp_path):
    _png(tmp_path / "boots" / "b1.png")
    _png(tmp_path / "boots" / "b2.png", value=10)
    _png(tmp_path / "sandals" / "s1.png", shape=(30, 20), mode="RGB")
    data = load_folder(tmp_path, {"boots": "boot.n.01", "sandals": "sandal.n.01"})
    assert data.ids == ["boots/b1.png", "boots/b2.png", "sandals/s1.png"]
    assert data.classes == (("boots", "boot.n.01"), ("sandals", "sandal.n.01"))
    assert data.targets.tolist() == [0, 0, 1]
    assert isinstance(data.images, list)  # different sizes stay a list
    assert data.images[2].shape == (30, 20, 3)
    assert data.labels == ["boot.n.01", "boot.n.01", "sandal.n.01"]


def test_load_folder_errors_name_the_file(tmp_path):
    with pytest.raises(DataError, match="no such folder"):
        load_folder(tmp_path / "absent")
    _png(tmp_path / "boots" / "b1.png")
    (tmp_path / "boots" / "broken.png").write_bytes(b"\x89PNG not really")
    with pytest.raises(DataError, match="broken.png.*unreadable"):
        load_folder(tmp_path, {"boots": "boot.n.01"})
    (tmp_path / "boots" / "broken.png").unlink()
    _png(tmp_path / "hats" / "h.png")
    with pytest.raises(DataError, match="hats.*'hats' has no entry"):
        load_folder(tmp_path, {"boots": "boot.n.01"})


def test_manifest(tmp_path):
    _png(tmp_path / "img" / "a.png")
    _png(tmp_path / "img" / "b.png", value=3)
    m = tmp_path / "m.csv"
    m.write_text("id,path,label\nx1,img/a.png,boot\nx2,img/b.png,\n")
    data = load_manifest(m, {"boot": "boot.n.01"})
    assert data.ids == ["x1", "x2"]
    assert data.targets.tolist() == [0, -1]  # unlabelled row
    assert data.images.shape == (2, 12, 10)
    m.write_text("id,path,label\nx1,img/a.png,boot\nx1,img/b.png,boot\n")
    with pytest.raises(DataError, match="m.csv:3: duplicate id"):
        load_manifest(m, {"boot": "boot.n.01"})
    m.write_text("id,path\nx1,img/missing.png\n")
    with pytest.raises(DataError, match="missing.png: no such image"):
        load_manifest(m)
    m.write_text("name,file\n")
    with pytest.raises(DataError, match="header must be id,path"):
        load_manifest(m)
    m.write_text("id,path,label\nx1,img/a.png,hat\n")
    with pytest.raises(DataError, match="m.csv:2: class 'hat' has no entry"):
        load_manifest(m, {"boot": "boot.n.01"})


def test_class_map_file(tmp_path):
    p = tmp_path / "map.tsv"
    p.write_text("# comment\nboots\tboot.n.01\nsandals,sandal.n.01\n")
    assert read_class_map(p) == {"boots": "boot.n.01", "sandals": "sandal.n.01"}
    p.write_text("boots\n")
    with pytest.raises(DataError, match="map.tsv:1"):
        read_class_map(p)


# ---------------------------------------------------------------- preprocessing and views


def test_preprocess_any_size_and_channels():
    pre = Preprocess(size=28, channels=1, mean=(0.5,), std=(0.25,))
    rgb = np.zeros((2, 40, 50, 3), dtype=np.uint8)
    rgb[..., 0] = 255  # pure red -> luminance 0.299
    x = pre(rgb)
    assert x.shape == (2, 1, 28, 28) and x.dtype == torch.float32
    assert torch.allclose(x, torch.full_like(x, (0.299 - 0.5) / 0.25), atol=1e-5)
    mixed = [np.zeros((10, 10), np.uint8), np.full((64, 32, 4), 255, np.uint8)]
    y = pre.pixels(mixed)
    assert y.shape == (2, 1, 28, 28)
    assert float(y[0].max()) == 0.0 and float(y[1].min()) == pytest.approx(1.0)
    # uint8 and the same pixels as floats in [0, 1] agree
    g = np.random.default_rng(0).integers(0, 256, (3, 28, 28), dtype=np.uint8)
    assert torch.allclose(pre(g), pre(torch.from_numpy(g).float() / 255), atol=1e-6)
    pre3 = Preprocess(size=16, channels=3, mean=(0, 0, 0), std=(1, 1, 1))
    assert pre3(g).shape == (3, 3, 16, 16)


def test_preprocess_dark_background_inverts_photos():
    pre = Preprocess(size=28, channels=1, mean=(0.0,), std=(1.0,), background="dark")
    photo = np.full((1, 28, 28), 255, np.uint8)
    photo[0, 8:20, 8:20] = 0  # dark object on white
    x = pre(photo)
    assert float(x[0, 0, 0, 0]) == 0.0 and float(x[0, 0, 14, 14]) == pytest.approx(1.0)
    fm = np.zeros((1, 28, 28), np.uint8)
    fm[0, 8:20, 8:20] = 200  # light object on black: unchanged
    assert float(pre(fm)[0, 0, 14, 14]) == pytest.approx(200 / 255, abs=1e-6)


def test_views_shapes_ranges_and_determinism():
    x = torch.rand(6, 3, 32, 32)
    for fn in (
        lambda g: random_resized_crop(x, 24, generator=g),
        lambda g: random_flip(x, generator=g),
        lambda g: color_jitter(x, generator=g),
        lambda g: gaussian_blur(x, p=1.0, generator=g),
        lambda g: Augment("strong")(x, g),
        lambda g: Augment("light")(x, g),
        lambda g: Augment("shift")(x, g),
        lambda g: Augment("flip")(x, g),
    ):
        a = fn(torch.Generator().manual_seed(1))
        b = fn(torch.Generator().manual_seed(1))
        c = fn(torch.Generator().manual_seed(2))
        assert torch.equal(a, b)
        assert not torch.equal(a, c)
        assert a.shape[:2] == (6, 3) and torch.isfinite(a).all()
    # a full-size crop of the whole image is the image
    full = random_resized_crop(
        x, 32, scale=(1.0, 1.0), ratio=(1.0, 1.0), generator=torch.Generator()
    )
    assert torch.allclose(full, x, atol=1e-5)
    # flip with p=1 mirrors
    assert torch.equal(random_flip(x, p=1.0), x.flip(-1))
    # blur keeps the mean of a constant image and smooths noise
    const = torch.full((2, 1, 16, 16), 0.3)
    assert torch.allclose(gaussian_blur(const, p=1.0), const, atol=1e-6)
    assert gaussian_blur(x, (1.5, 1.5), p=1.0).std() < x.std()


def test_flip_augmentation_mirrors_some_images_and_keeps_the_others():
    x = torch.rand(64, 1, 8, 8)
    y = Augment("flip")(x, torch.Generator().manual_seed(0))
    same = [torch.equal(a, b) for a, b in zip(x, y, strict=True)]
    mirrored = [torch.equal(a.flip(-1), b) for a, b in zip(x, y, strict=True)]
    assert all(s or m for s, m in zip(same, mirrored, strict=True))
    assert 10 < sum(mirrored) < 54  # about half
    with pytest.raises(ValueError, match="flip, shift"):
        Augment("mirror")(x)


def test_random_shift_is_an_exact_translation_with_black_fill():
    x = torch.rand(40, 1, 12, 10)
    y = random_shift(x, 2, generator=torch.Generator().manual_seed(3))
    seen = set()
    for xi, yi in zip(x, y, strict=True):
        padded = torch.nn.functional.pad(xi[0], (2, 2, 2, 2))  # zeros around
        shifts = [
            (dx, dy)
            for dx in range(-2, 3)
            for dy in range(-2, 3)
            if torch.equal(padded[2 - dy : 14 - dy, 2 - dx : 12 - dx], yi[0])
        ]
        assert len(shifts) == 1
        seen.add(shifts[0])
    assert len(seen) > 10  # many of the 25 shifts occur
    assert torch.equal(random_shift(x, 0), x)


def test_split_indices_stratified_and_deterministic():
    t = np.repeat(np.arange(4), 50)
    tr, va = split_indices(t, 0.1, seed=3)
    tr2, va2 = split_indices(t, 0.1, seed=3)
    assert np.array_equal(va, va2) and np.array_equal(tr, tr2)
    assert np.bincount(t[va]).tolist() == [5, 5, 5, 5]
    assert len(np.intersect1d(tr, va)) == 0 and len(tr) + len(va) == 200
    assert not np.array_equal(va, split_indices(t, 0.1, seed=4)[1])
