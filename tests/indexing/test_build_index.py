"""``hypsearch index build``: folders, manifests, the built-in split; resumable;
unreadable files skipped and listed; bad input exits 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from tests.support.server import ROOT, artifacts, fmnist_test_split, needs_data, write_folder

pytestmark = needs_data


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    torch.set_num_threads(1)
    art = artifacts(tmp_path_factory)
    assert art.model_path is not None
    return art.model_path


def run_cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run(
        [sys.executable, "-m", "service.cli", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def main_json(capsys, *args: str) -> tuple[int, dict | str]:
    from service.cli import main

    code = main(list(args))
    out, err = capsys.readouterr()
    return code, (json.loads(out) if code == 0 else err)


def build_args(model_path, out, *source: str, workers: str = "0") -> list[str]:
    """``index build`` of ``source`` (``--images X`` or ``--dataset ...``) into ``out``."""
    return ["index", "build", "--model", str(model_path), *source, "--out", str(out)] + (
        ["--workers", workers] if workers else []
    )


def build_json(capsys, model_path, out, *source: str, workers: str = "0"):
    return main_json(
        capsys, *build_args(model_path, out, *source, workers=workers), "--json", "--quiet"
    )


def test_folder_build_is_resumable_and_lists_skips(tmp_path, model_path, capsys):
    images = write_folder(tmp_path / "pics")
    out = tmp_path / "index"
    p = run_cli(
        *build_args(model_path, out, "--images", str(images), workers="2"), "--batch-size", "3"
    )
    assert p.returncode == 0, p.stderr
    assert "img/s" in p.stderr  # the progress bar shows images per second
    assert "indexed 8 of 13 images" in p.stdout
    assert "broken.png" in p.stdout and "unreadable" in p.stdout
    assert "'unicorn' is not in the taxonomy" in p.stdout

    # resumable: a second run skips what is stored
    code, r = build_json(capsys, model_path, out, "--images", str(images))
    assert code == 0
    assert r["indexed"] == 0 and r["skipped"]["already indexed"] == 8 and r["items"] == 8
    # a new picture is picked up by the next run
    from PIL import Image

    Image.fromarray(fmnist_test_split().images[0]).save(images / "coat" / "new.png")
    code, r = build_json(capsys, model_path, out, "--images", str(images))
    assert r["indexed"] == 1 and r["items"] == 9
    assert {e["source"] for e in r["skipped_examples"] if "unreadable" in e["reason"]} == {
        str(images / "coat" / "broken.png")
    }

    from indexing import HyperbolicIndex

    index = HyperbolicIndex.load(out)
    try:
        item = index.get("sneaker/000.png")
        assert item.label == "gym_shoe.n.01"
        assert item.payload["image"]["path"] == str((images / "sneaker" / "000.png").resolve())
        assert index.get("coat/new.png").label == "coat.n.01"
        assert len(index) == 9
    finally:
        index.close()


def test_manifest_and_dataset(tmp_path, model_path, capsys):
    write_folder(tmp_path / "pics", per_class=2)
    manifest = tmp_path / "list.csv"
    manifest.write_text(
        "id,path,label\n"
        "a,pics/sneaker/000.png,sneaker\n"
        "b,pics/coat/000.png,\n"  # no label: predicted
        "c,pics/missing.png,coat\n"
        "d,pics/coat/001.png,dragon\n"
    )
    out = tmp_path / "index"
    code, r = build_json(capsys, model_path, out, "--images", str(manifest))
    assert code == 0, r
    assert r["indexed"] == 2 and r["total"] == 4
    assert r["skipped"] == {"no such file": 1, "class 'dragon' is not in the taxonomy": 1}
    from indexing import HyperbolicIndex

    index = HyperbolicIndex.load(out)
    try:
        assert index.get("a").label == "gym_shoe.n.01"
        b = index.get("b")
        assert b.payload["label_source"] == "predicted" and b.label is not None
        # predicted among the labels that indexed items carry (here: those the build gives)
        assert b.label in {"gym_shoe.n.01", "coat.n.01"}
    finally:
        index.close()
    # the built-in split, limited; the same index takes more items
    dataset = ("--dataset", "fashion-mnist", "--split", "test", "--limit", "40")
    code, r = build_json(capsys, model_path, out, *dataset, workers="")
    assert code == 0 and r["indexed"] == 40 and r["items"] == 42


def test_bad_input_exits_2(tmp_path, model_path, capsys):
    from service.cli import main

    cases = [
        (["--model", str(tmp_path / "none.safetensors"), "--dataset", "fashion-mnist"], "--model"),
        (["--model", str(model_path), "--images", str(tmp_path / "nowhere")], "--images"),
        (["--model", str(model_path)], "--dataset"),
        (
            ["--model", str(model_path), "--dataset", "fashion-mnist", "--data-dir", str(tmp_path)],
            str(tmp_path),
        ),
    ]
    for extra, words in cases:
        code = main(["index", "build", *extra, "--out", str(tmp_path / "idx"), "--quiet"])
        err = capsys.readouterr().err
        assert code == 2 and words in err and len(err.strip().splitlines()) == 1, (extra, err)
    # an index of another space
    from indexing import HyperbolicIndex

    HyperbolicIndex(dim=3, curvature=1.0, path=tmp_path / "other").close()
    source = ("--dataset", "fashion-mnist", "--limit", "2")
    code = main([*build_args(model_path, tmp_path / "other", *source, workers=""), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and "dimension" in err


def test_embed_writes_the_vectors_an_index_build_stores(tmp_path, model_path, capsys):
    """``hypsearch embed``: (n, D) float64 in the sources' order, ids and space in
    the sidecar, the same vectors as ``index build`` stores; bad --out exits 2."""
    from indexing import HyperbolicIndex
    from models.vision.image_model import ImageModel

    write_folder(tmp_path / "pics", per_class=3)
    out = tmp_path / "z.npy"
    code, r = main_json(
        capsys,
        *["embed", "--model", str(model_path), "--images", str(tmp_path / "pics")],
        *["--out", str(out), "--workers", "0", "--json", "--quiet"],
    )
    assert code == 0, r
    z = np.load(out)
    side = json.loads(out.with_suffix(".json").read_text())
    model = ImageModel.load(model_path)
    assert z.dtype == np.float64 and z.shape == (r["n"], model.dim) and r["n"] == 6
    assert side["geometry"] == "poincare" and side["curvature"] == model.curvature
    assert side["space"] == f"poincare:{model.dim}@{model.curvature:g}"
    assert side["ids"] == sorted(side["ids"]) and len(side["ids"]) == 6  # listing order
    # skipped, not fatal: the broken file and the unicorns (not a taxonomy class)
    skipped = sorted(e["source"].rsplit("/", 2)[-2] for e in side["skipped"])
    assert skipped == ["coat", "unicorn", "unicorn", "unicorn"]
    code, b = build_json(capsys, model_path, tmp_path / "index", "--images", str(tmp_path / "pics"))
    assert code == 0, b
    index = HyperbolicIndex.load(tmp_path / "index")
    try:
        for i, item_id in enumerate(side["ids"]):
            np.testing.assert_allclose(index.get(item_id).vector, z[i], rtol=0, atol=1e-12)
    finally:
        index.close()
    code, err = main_json(
        capsys,
        "embed",
        "--model",
        str(model_path),
        "--dataset",
        "fashion-mnist",
        "--out",
        str(tmp_path / "z.txt"),
    )
    assert code == 2 and "must end in .npy" in err and len(err.strip().splitlines()) == 1
