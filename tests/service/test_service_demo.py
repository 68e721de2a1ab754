"""The demo's index: built once, then only served, so acknowledged writes survive
restarts; a model change sets the old index aside. And `serve` fails cleanly."""

from __future__ import annotations

import subprocess
import sys

import torch

from tests.support.server import ROOT, artifacts, needs_data

pytestmark = needs_data


def test_demo_index_is_built_once_and_keeps_writes(tmp_path, tmp_path_factory):
    from indexing import HyperbolicIndex
    from service.demo import _default_index

    torch.set_num_threads(1)
    art = artifacts(tmp_path_factory)
    model = art.model
    assert model.version
    steps: list[str] = []
    path, items = _default_index(tmp_path, model, art.model_path, steps, False, limit=30)
    assert items == 30 and "indexed 30" in steps[-1]
    index = HyperbolicIndex.load(path)
    index.delete(["fashion-mnist-test-3"])
    index.add(index.get("fashion-mnist-test-4").vector[None], ["mine"], labels=["coat.n.01"])
    index.close()
    # a restart: reused as it is (the deleted item is not indexed again)
    path, items = _default_index(tmp_path, model, art.model_path, steps, False, limit=30)
    assert items == 30 and steps[-1].startswith("reused the index")
    index = HyperbolicIndex.load(path)
    assert "fashion-mnist-test-3" not in index and "mine" in index
    index.close()
    # another model: the old index is kept aside, a new one built
    version = model.version
    model.version = "f" * 64
    try:
        path, items = _default_index(tmp_path, model, art.model_path, steps, False, limit=10)
    finally:
        model.version = version
    assert items == 10 and any("moved it to" in s for s in steps)
    assert len(list(tmp_path.glob("index.*"))) == 1


def test_serve_exits_2_when_the_artifacts_do_not_load(tmp_path):
    import socket

    bad = tmp_path / "model.safetensors"
    bad.write_bytes(b"not a checkpoint")
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    port = busy.getsockname()[1]
    for args, words in (
        (["--port", "0", "--model", str(tmp_path / "missing.safetensors")], "--model"),
        (
            ["--port", "0", "--model", str(bad), "--index", str(tmp_path / "index")],
            "model.safetensors",
        ),
        (["--port", str(port), "--model", str(bad)], "--port"),
    ):
        p = subprocess.run(
            [sys.executable, "-m", "service.cli", "serve", "--host", "127.0.0.1", *args],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert p.returncode == 2, p.stderr
        last = p.stderr.strip().splitlines()[-1]
        assert last.startswith("hypsearch: error:") and words in last, p.stderr
    busy.close()
