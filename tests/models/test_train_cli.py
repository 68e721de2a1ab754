"""`hypsearch train` and `hypsearch eval`: happy path and bad input (exit 2, one line)."""

from __future__ import annotations

import json
import os

import pytest
import torch

from tests.support.cli import cli_status, one_line_error
from tests.support.training import needs_fmnist, small_labels


@pytest.fixture(scope="module")
def labels_file(tmp_path_factory):
    torch.set_num_threads(1)
    path = tmp_path_factory.mktemp("labels") / "labels.safetensors"
    small_labels().save(path)
    return path


def train_argv(labels, out, *more):
    """``hypsearch train`` on Fashion-MNIST with these labels and output."""
    return [
        *"train --dataset fashion-mnist --labels".split(),
        str(labels),
        "--out",
        str(out),
        *more,
    ]


@needs_fmnist
def test_train_and_eval_happy_path(labels_file, tmp_path, capsys):
    out = tmp_path / "model.safetensors"
    more = "--epochs 1 --limit 700 --batch-size 64 --threads 1 --holdout sandal.n.01 --json --quiet"
    code = cli_status(train_argv(labels_file, out, *more.split()))
    captured = capsys.readouterr()
    assert code == 0, captured.err
    r = json.loads(captured.out)
    assert r["out"] == str(out) and out.exists() and len(r["version"]) == 64
    assert r["holdout"] == ["sandal.n.01"] and r["epochs"] == 1 and r["geometry"] == "poincare"
    assert not (tmp_path / "model.safetensors.partial").exists()

    more = "--dataset fashion-mnist --split test --limit 400 --threads 1 --json --quiet"
    code = cli_status(["eval", "--model", str(out), *more.split()])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    m = json.loads(captured.out)
    for key in ("recall@1", "recall@5", "recall@10", "map@r", "hier_hit@1", "nearest_label_acc"):
        assert 0.0 <= m[key] <= 1.0, key
    assert set(m["hop_map@50"]) == {"0", "2", "4"}
    assert m["recall@1"] <= m["recall@5"] <= m["recall@10"]
    assert m["zero_shot"]["classes"]["sandal.n.01"]["images"] == 40
    assert 0.0 <= m["zero_shot"]["classes"]["sandal.n.01"]["name_precision@50"] <= 1.0
    assert "auroc_radius" in m["ood"] or "skipped" in m["ood"]
    assert m["features_delta"]["delta_rel"] >= 0 and m["images"] == 400


def test_train_bad_input(labels_file, tmp_path, capsys):
    out = str(tmp_path / "m.safetensors")
    code = cli_status(train_argv(tmp_path / "none", out, "--quiet"))
    one_line_error(capsys, code, "--labels", "no such file")
    nofolder = str(tmp_path / "nofolder")
    code = cli_status(train_argv(labels_file, out, "--data-dir", nofolder, "--quiet"))
    one_line_error(capsys, code, "nofolder", "no such folder")
    code = cli_status(["train", "--labels", str(labels_file), "--out", out, "--quiet"])
    one_line_error(capsys, code, "--dataset")
    one_line_error(capsys, cli_status(train_argv(labels_file, out, "--epochs", "-1")), "--epochs")
    (tmp_path / "junk.safetensors").write_bytes(b"\x00" * 100)
    code = cli_status(train_argv(tmp_path / "junk.safetensors", out, "--quiet"))
    one_line_error(capsys, code, "junk.safetensors")
    assert not os.path.exists(out)


@needs_fmnist
def test_train_bad_holdout_and_eval_bad_model(labels_file, tmp_path, capsys):
    out = str(tmp_path / "m.safetensors")
    code = cli_status(train_argv(labels_file, out, "--holdout", "hat.n.01", "--quiet"))
    one_line_error(capsys, code, "--holdout hat.n.01")
    assert not os.path.exists(out)
    code = cli_status(
        ["eval", "--model", str(labels_file), "--dataset", "fashion-mnist", "--json", "--quiet"]
    )
    one_line_error(capsys, code, "expected a 'model' checkpoint")
    code = cli_status(
        ["eval", "--model", str(tmp_path / "absent"), "--dataset", "fashion-mnist", "--json"]
    )
    one_line_error(capsys, code, "--model", "no such file")
