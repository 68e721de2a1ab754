"""The hypsearch command line: outputs, JSON, and one-line errors with exit status 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from service.cli import main

WORDNET = "/usr/share/wordnet"
FMNIST = "/usr/share/datasets/fashion-mnist"
needs_wordnet = pytest.mark.skipif(
    not os.path.exists(f"{WORDNET}/data.noun"), reason="wordnet-base not installed"
)


def run(capsys, *argv: str) -> tuple[int, str, str]:
    try:
        rc = main(list(argv))
    except SystemExit as e:  # argparse
        rc = e.code
    out, err = capsys.readouterr()
    return rc, out, err


def one_line_error(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    return lines[0]


@pytest.fixture(scope="module")
def mammal_files(tmp_path_factory):
    if not os.path.exists(f"{WORDNET}/data.noun"):
        pytest.skip("wordnet-base not installed")
    d = tmp_path_factory.mktemp("cli")
    tsv = d / "mammals.tsv"
    labels = d / "mammals.labels"
    assert main(["taxonomy", "wordnet", "--root", "mammal.n.01", "--out", str(tsv), "--json"]) == 0
    assert (
        main(
            [
                "labels",
                "train",
                "--taxonomy",
                str(tsv),
                "--out",
                str(labels),
                "--epochs",
                "4",
                "--quiet",
            ]
        )
        == 0
    )
    return tsv, labels


@needs_wordnet
def test_taxonomy_wordnet_writes_closure(capsys, tmp_path):
    out = tmp_path / "m.tsv"
    rc, stdout, _ = run(
        capsys, "taxonomy", "wordnet", "--root", "mammal.n.01", "--out", str(out), "--json"
    )
    assert rc == 0
    result = json.loads(stdout)
    assert result["nodes"] == 1182 and result["edges"] == 6542
    lines = [ln for ln in out.read_text().splitlines() if ln and not ln.startswith("#")]
    assert len(lines) == 6542
    assert "dog.n.01\tmammal.n.01" in lines  # closure, not only direct edges


def test_labels_train_eval_export(capsys, mammal_files, tmp_path):
    tsv, labels = mammal_files
    assert labels.exists()
    assert not Path(str(labels) + ".partial").exists()
    rc, stdout, _ = run(
        capsys, "labels", "eval", str(labels), "--taxonomy", str(tsv), "--json", "--quiet"
    )
    assert rc == 0
    m = json.loads(stdout)
    assert {"nodes", "edges", "mean_rank", "map"} <= set(m)
    assert m["nodes"] == 1182 and m["edges"] == 6542
    assert 0.5 < m["map"] <= 1.0 and m["mean_rank"] >= 1.0
    assert 0.0 <= m["cone_f1"] <= 1.0
    out = tmp_path / "labels.tsv"
    rc, _, _ = run(capsys, "labels", "export", str(labels), "--out", str(out))
    assert rc == 0
    lines = out.read_text().splitlines()
    assert lines[0] == "# curvature=1.0 dim=10 cone=cap theta0=2.5 beta=0.5"
    name, *coords = lines[1].split("\t")
    assert name.endswith(".n.01") or ".n." in name
    assert len(coords) == 10
    assert np.linalg.norm([float(c) for c in coords]) < 1


def test_labels_train_resumes_from_partial(capsys, mammal_files, tmp_path):
    tsv, _ = mammal_files
    out = tmp_path / "l.labels"
    from models.labels import LabelEmbedding, LabelTrainConfig, train_labels
    from models.taxonomy.graph import Taxonomy

    tax = Taxonomy.from_tsv(tsv)
    cfg = LabelTrainConfig(epochs=3)

    def stop(epoch, loss, theta):
        if epoch == 1:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train_labels(tax, cfg, checkpoint_path=str(out) + ".partial", on_epoch=stop)
    rc, stdout, err = run(
        capsys,
        "labels",
        "train",
        "--taxonomy",
        str(tsv),
        "--out",
        str(out),
        "--epochs",
        "3",
        "--json",
        "--quiet",
    )
    assert rc == 0, err
    assert "resuming" in err and "epoch 1" in err
    assert json.loads(stdout)["epochs"] == 3
    assert LabelEmbedding.load(out).epoch == 3
    assert not Path(str(out) + ".partial").exists()


@pytest.mark.parametrize(
    "argv, needle",
    [
        (
            ["labels", "train", "--taxonomy", "{d}/missing.tsv", "--out", "{d}/x"],
            "missing.tsv: no such file",
        ),
        (["labels", "train", "--taxonomy", "{d}/bad.tsv", "--out", "{d}/x"], "bad.tsv:2"),
        (["labels", "train", "--taxonomy", "{d}/cycle.tsv", "--out", "{d}/x"], "cycle"),
        (["labels", "train", "--taxonomy", "{d}/ok.tsv", "--out", "{d}/x", "--dim", "0"], "--dim"),
        (
            ["labels", "train", "--taxonomy", "{d}/ok.tsv", "--out", "{d}/x", "--dim", "1"],
            "dim must be at least 2",
        ),
        (
            ["labels", "train", "--taxonomy", "{d}/ok.tsv", "--out", "{d}/x", "--curvature", "-1"],
            "--curvature",
        ),
        (["labels", "eval", "{d}/trunc.labels", "--json"], "trunc.labels: truncated"),
        (["labels", "eval", "{d}/ok.tsv"], "ok.tsv: "),
        (["labels", "export", "{d}/nothing", "--out", "{d}/y"], "nothing: no such checkpoint"),
        (["taxonomy", "wordnet", "--wordnet-dir", "{d}/nowhere", "--out", "{d}/t.tsv"], "nowhere"),
        (["hyperbolicity", "--vectors", "{d}/nan.txt"], "NaN"),
        (["hyperbolicity", "--vectors", "{d}/ok.tsv"], "ok.tsv"),
        (["labels"], "SUBCOMMAND"),
    ],
)
def test_bad_input_exits_2_with_one_line(capsys, tmp_path, argv, needle):
    (tmp_path / "bad.tsv").write_text("a\tb\njust-one-field\n")
    (tmp_path / "cycle.tsv").write_text("a\tb\nb\tc\nc\ta\n")
    (tmp_path / "ok.tsv").write_text("a\troot\nb\troot\n")
    (tmp_path / "trunc.labels").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{")
    (tmp_path / "nan.txt").write_text("1 2\n3 nan\n4 5\n6 7\n8 9\n")
    before = sorted(p.name for p in tmp_path.iterdir())
    rc, stdout, err = run(capsys, *[a.format(d=tmp_path) for a in argv])
    assert rc == 2
    line = one_line_error(err)
    assert needle in line, line
    assert "Traceback" not in err
    # nothing new (in particular no half-written output) was left behind
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_hyperbolicity_of_vectors(capsys, tmp_path):
    rng = np.random.default_rng(0)
    pts = rng.standard_normal((200, 5))
    path = tmp_path / "v.npy"
    np.save(path, pts)
    rc, stdout, _ = run(
        capsys, "hyperbolicity", "--vectors", str(path), "--json", "--samples", "150"
    )
    assert rc == 0
    r = json.loads(stdout)
    assert r["points"] == 200
    assert r["delta_rel"] == pytest.approx(2 * r["delta"] / r["diameter"])
    assert r["suggested_curvature"] == pytest.approx((0.144 / r["delta_rel"]) ** 2)
    assert 0 < r["delta_rel"] < 1


@pytest.mark.skipif(not os.path.isdir(FMNIST), reason="dataset-fashion-mnist not installed")
def test_hyperbolicity_of_dataset(capsys):
    rc, stdout, _ = run(
        capsys, "hyperbolicity", "--dataset", "fashion-mnist", "--samples", "300", "--json"
    )
    assert rc == 0
    r = json.loads(stdout)
    assert r["points"] == 10000 and r["delta"] > 0


def test_console_script_help():
    exe = Path(sys.executable).with_name("hypsearch")
    assert exe.exists(), "the project is not installed (pip install -e .)"
    for argv in (
        [],
        ["labels", "train"],
        ["taxonomy", "wordnet"],
        ["labels", "eval"],
        ["hyperbolicity"],
    ):
        p = subprocess.run([str(exe), *argv, "--help"], capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        assert "usage: hypsearch" in p.stdout


def test_python_m_service_cli_bad_input_exits_2_with_one_line(tmp_path):
    """``python -m service.cli`` (``__main__``) catches the same user errors as ``main``."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    for argv, needle in (
        (["serve", "--model", str(tmp_path / "none")], "--model"),
        (
            ["index", "build", "--model", str(tmp_path / "none"), "--out", str(tmp_path / "i")],
            "--model",
        ),
        (["labels", "train", "--taxonomy", str(tmp_path / "t.tsv"), "--out", "x"], "--taxonomy"),
    ):
        p = subprocess.run(
            [sys.executable, "-m", "service.cli", *argv],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        assert p.returncode == 2, p.stderr
        assert needle in one_line_error(p.stderr) and "no such file" in p.stderr
