"""Shared helpers of the service tests: small artifacts and real server processes.

* :func:`artifacts`: a small WordNet taxonomy (the ten Fashion-MNIST classes,
  their ancestors and their parents' other children), label embeddings of it,
  a tiny image model (600 training images, one epoch), built once per test
  session under pytest's base temporary folder and reused by every module.
* :func:`fill_index`: an index of the first N Fashion-MNIST test images;
  :func:`write_index` one on disk, :func:`runtime_fixture` a module's runtime
  around one, :func:`app_client` an app (in process) serving a runtime.
* :func:`write_folder`: a folder of class subfolders of Fashion-MNIST test pictures.
* :class:`Server`: ``hypsearch serve`` in a subprocess on a free loopback port;
  :class:`LoopbackServer`: the app around a runtime, served by uvicorn in a thread.

Everything is seeded; nothing leaves 127.0.0.1.
"""

from __future__ import annotations

import functools
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
WORDNET = Path("/usr/share/wordnet")
FMNIST = Path("/usr/share/datasets/fashion-mnist")

needs_data = pytest.mark.skipif(
    not (WORDNET / "data.noun").exists() or not FMNIST.is_dir(),
    reason="needs the Debian packages wordnet-base and dataset-fashion-mnist",
)

_lock = threading.Lock()


@functools.cache
def small_taxonomy():
    from models.images.datasets import FASHION_MNIST_CLASSES
    from models.taxonomy.graph import Taxonomy

    full = Taxonomy.from_wordnet(WORDNET)
    keep: set[str] = set()
    for _, s in FASHION_MNIST_CLASSES:
        keep.add(s)
        keep |= full.ancestors(s)
        for p in full.parents(s):
            keep |= set(full.children(p))
    for s in list(keep):
        keep |= full.ancestors(s)
    return full.induced(keep)


@dataclass
class Artifacts:
    folder: Path
    labels_path: Path
    model_path: Path | None  # None while the model checkpoint cannot be written
    labels: object
    model: object


@functools.cache
def _artifacts(folder: str) -> Artifacts:
    from models.labels import LabelTrainConfig, train_labels
    from models.training.run import TrainConfig, train

    torch.set_num_threads(1)
    folder_p = Path(folder)
    folder_p.mkdir(parents=True, exist_ok=True)
    tax = small_taxonomy()
    emb = train_labels(tax, LabelTrainConfig(epochs=30, seed=0), progress=False)
    labels_path = folder_p / "labels.safetensors"
    emb.save(labels_path)
    # the head's own outputs (the service's placed-model behaviour: test_service_cones)
    cfg = TrainConfig(limit=600, epochs=1, batch_size=64, seed=0, placement="none")
    if hasattr(cfg, "time_budget"):
        cfg.time_budget = None
    model = train(cfg, emb, progress=False)
    model_path: Path | None = folder_p / "model.safetensors"
    try:
        model.save(model_path)
    except Exception:  # noqa: BLE001 - the model side may not save yet; tests needing the file skip
        model_path = None
    return Artifacts(folder_p, labels_path, model_path, emb, model)


def artifacts(tmp_path_factory) -> Artifacts:
    with _lock:
        return _artifacts(str(tmp_path_factory.getbasetemp() / "service-artifacts"))


@functools.cache
def fmnist_test_split():
    from models.images.datasets import load_fashion_mnist

    return load_fashion_mnist("test", FMNIST)


def fill_index(index, model, n: int) -> None:
    """Add the first ``n`` Fashion-MNIST test images, with their labels and pictures."""
    data = fmnist_test_split()
    z = model.embed(data.images[:n]).numpy()
    payloads = [
        {"image": {"dataset": "fashion-mnist", "split": "test", "row": i}, "label_source": "given"}
        for i in range(n)
    ]
    index.add(z, data.ids[:n], labels=data.labels[:n], payloads=payloads)


def write_index(art: Artifacts, path: Path, n: int) -> Path:
    """An index of the first ``n`` test images at ``path`` (in the model's space), closed."""
    from indexing import HyperbolicIndex

    index = HyperbolicIndex(dim=art.model.dim, curvature=art.model.curvature, path=path)
    fill_index(index, art.model, n)
    index.save()
    index.close()
    return path


def make_runtime(art: Artifacts, folder: Path, n: int = 600):
    from indexing import HyperbolicIndex
    from service.runtime import runtime_for

    index = HyperbolicIndex(
        dim=art.labels.dim, curvature=art.labels.curvature, path=folder / "index"
    )
    fill_index(index, art.model, n)
    return runtime_for(
        index,
        art.labels,
        art.model,
        image_dir=folder / "index" / "images",
        data_dir=FMNIST,
        taxonomy=small_taxonomy(),
    )


def runtime_fixture(name: str, n: int):
    """A module-scoped fixture: a runtime around an index of ``n`` test images
    (in a temporary folder named ``name``), closed after the module."""

    @pytest.fixture(scope="module")
    def rt(tmp_path_factory):
        torch.set_num_threads(1)
        runtime = make_runtime(artifacts(tmp_path_factory), tmp_path_factory.mktemp(name), n=n)
        yield runtime
        runtime.close()

    return rt


def app_client(rt, **settings):
    """A TestClient of an app serving ``rt`` (quiet logs; ``settings`` on top)."""
    from fastapi.testclient import TestClient

    from service.app import create_app
    from service.settings import Settings

    s = Settings(index=rt.index.path, log_json=False, log_level="WARNING", **settings)
    return TestClient(create_app(s, runtime=rt))


def png_bytes(pixels: np.ndarray) -> bytes:
    from service.imaging import encode_png

    return encode_png(pixels)


def write_folder(root, per_class: int = 4):
    """root/sneaker/*.png, root/coat/*.png (+ a broken file), root/unicorn/*.png."""
    from PIL import Image

    data = fmnist_test_split()
    for name, target in (("sneaker", 7), ("coat", 4), ("unicorn", 0)):
        d = root / name
        d.mkdir(parents=True)
        for j, row in enumerate(np.flatnonzero(data.targets == target)[:per_class]):
            Image.fromarray(data.images[row]).save(d / f"{j:03d}.png")
    (root / "coat" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\nnot really")
    return root


# ---------------------------------------------------------------- server processes


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """``hypsearch serve ARGS`` (or ``command``, e.g. ``["demo", ...]``) on
    127.0.0.1:<free port>; logs in ``log``."""

    def __init__(
        self, args: list[str], log: Path, env: dict | None = None, command: list[str] | None = None
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        full_env = {
            **os.environ,
            "HYPSEARCH_TORCH_THREADS": "1",
            "PYTHONUNBUFFERED": "1",
            **(env or {}),
        }
        self._logf = open(log, "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "service.cli",
                *(command or ["serve"]),
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                *args,
            ],
            cwd=ROOT,
            env=full_env,
            stdout=self._logf,
            stderr=subprocess.STDOUT,
        )

    def wait_ready(self, timeout: float = 90.0) -> Server:
        import httpx

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited with {self.proc.returncode}:\n{self.tail()}")
            try:
                if httpx.get(self.url + "/readyz", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"server not ready after {timeout} s:\n{self.tail()}")

    def tail(self, n: int = 4000) -> str:
        if not self._logf.closed:
            self._logf.flush()
        return self.log.read_bytes()[-n:].decode(errors="replace")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._logf.close()
        return self.proc.returncode

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


class LoopbackServer:
    """The app around a runtime of the index at ``folder/index``, served by uvicorn
    in a thread on a free loopback port (home: ``folder/home``)."""

    def __init__(self, art, folder: Path, n: int | None = None, **settings) -> None:
        import uvicorn

        from indexing import HyperbolicIndex
        from service.app import create_app
        from service.lane import uvicorn_config
        from service.runtime import runtime_for
        from service.settings import Settings

        path = folder / "index"
        if n is not None:
            index = HyperbolicIndex(dim=art.labels.dim, curvature=art.labels.curvature, path=path)
            fill_index(index, art.model, n)
        else:
            index = HyperbolicIndex.load(path)
        rt = runtime_for(
            index,
            art.labels,
            art.model,
            image_dir=path / "images",
            data_dir=FMNIST,
            taxonomy=small_taxonomy(),
        )
        s = Settings(
            home=folder / "home",
            index=path,
            log_json=False,
            log_level="ERROR",
            job_workers=0,
            **settings,
        )
        self.app = create_app(s, runtime=rt, owns_runtime=True)
        self.url = f"http://127.0.0.1:{free_port()}"
        port = int(self.url.rsplit(":", 1)[1])
        # the protocol `hypsearch serve` runs (service.lane)
        self.server = uvicorn.Server(
            uvicorn_config(self.app, host="127.0.0.1", port=port, log_level="error")
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "no server"
            time.sleep(0.05)
        services = self.app.state.services
        assert services.collections.loaded.wait(30)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)
