"""``--ray ADDRESS`` against a cluster with Ray's token authentication on.

A real head node (``ray start --head --block``, its own HOME holding the token
that ``ray get-auth-token --generate`` leaves, so ``ray start`` turns token
authentication on) in the loopback-only namespace of the Ray tests
(:mod:`tests.support.ray_cluster`: skipped outside one, failed under CI). A client with
the token connects (Ray's own ``ray.init(address=HOST:PORT)`` does not send it);
one without a token, or with another, is told that authentication failed and
how to fix it -- not "no Ray cluster there".
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.ray_cluster import cannot_run, loopback_only
from tests.support.server import ROOT, free_port

pytestmark = pytest.mark.ray

RAY = Path(sys.executable).parent / "ray"


def _env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    env.update(HOME=str(home), RAY_USAGE_STATS_ENABLED="0", PYTHONUNBUFFERED="1", **extra)
    return env


@pytest.fixture(scope="module")
def token_cluster(tmp_path_factory):
    """``(address, home, token)`` of a head node with token authentication on."""
    try:
        import ray  # noqa: F401
    except ImportError:
        cannot_run("the ray extra is not installed: pip install -e '.[ray]'")
    if not loopback_only():
        cannot_run("Ray tests run only inside a network namespace with just lo")
    home = tmp_path_factory.mktemp("ray-home")
    gen = subprocess.run(
        [str(RAY), "get-auth-token", "--generate"],
        env=_env(home), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    token_file = home / ".ray" / "auth_token"
    assert token_file.is_file(), gen.stderr[-2000:]
    port = free_port()
    log = open(home / "head.log", "wb")  # noqa: SIM115 - closed below
    head = subprocess.Popen(
        [str(RAY), "start", "--head", "--block", f"--port={port}", "--num-cpus=1",
         "--object-store-memory=100000000", "--include-dashboard=false",
         f"--ray-client-server-port={free_port()}",
         f"--dashboard-agent-listen-port={free_port()}",
         f"--temp-dir=/tmp/hsauth-{os.getpid()}"],
        env=_env(home), stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while b"Ray runtime started" not in (home / "head.log").read_bytes():
            assert head.poll() is None, (home / "head.log").read_text(errors="replace")[-3000:]
            assert time.monotonic() < deadline, "the head node did not start in 120 s"
            time.sleep(0.3)
        yield f"127.0.0.1:{port}", home, token_file.read_text().strip()
    finally:
        os.killpg(head.pid, signal.SIGTERM)  # ray start --block stops its processes
        try:
            head.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
            head.wait(10)
        log.close()


def _connect(address: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    code = (
        "import sys\n"
        "from service.ray_serve import RayUnavailable, connect\n"
        "try:\n"
        f"    ray = connect({address!r})\n"
        "except RayUnavailable as e:\n"
        "    print('REFUSED', e); sys.exit(2)\n"
        "print('CONNECTED', ray.cluster_resources().get('CPU'))\n"
        "ray.shutdown()\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=180,
    )  # fmt: skip


def test_the_token_on_the_machine_is_sent(token_cluster):
    address, home, _ = token_cluster
    got = _connect(address, _env(home))
    assert got.returncode == 0 and "CONNECTED 1.0" in got.stdout, got.stdout + got.stderr[-3000:]


def test_the_token_from_the_environment_is_sent(token_cluster, tmp_path):
    address, _, token = token_cluster
    got = _connect(address, _env(tmp_path, RAY_AUTH_TOKEN=token))
    assert got.returncode == 0 and "CONNECTED" in got.stdout, got.stdout + got.stderr[-3000:]


def test_no_token_says_authentication_is_needed_and_how(token_cluster, tmp_path):
    address, _, _ = token_cluster
    t0 = time.monotonic()
    got = _connect(address, _env(tmp_path))  # a HOME without ~/.ray/auth_token
    assert got.returncode == 2, got.stdout + got.stderr[-3000:]
    line = got.stdout.strip()
    assert "uses token authentication and no token was found" in line, line
    assert "ray get-auth-token" in line and "RAY_AUTH_TOKEN" in line, line
    assert "no Ray cluster there" not in line
    assert time.monotonic() - t0 < 60  # said at once, not after Ray's own retries


def test_a_wrong_token_says_authentication_failed(token_cluster, tmp_path):
    address, _, _ = token_cluster
    got = _connect(address, _env(tmp_path, RAY_AUTH_TOKEN="not-the-cluster-token"))
    assert got.returncode == 2, got.stdout + got.stderr[-3000:]
    line = got.stdout.strip()
    assert "authentication failed" in line and "RAY_AUTH_TOKEN" in line, line


def test_the_cli_says_it_in_one_line(token_cluster, tmp_path):
    address, _, _ = token_cluster
    labels = tmp_path / "labels.safetensors"
    labels.write_bytes(b"")  # never read: the cluster is joined first
    cmd = [sys.executable, "-m", "service.cli", "serve", "--labels", str(labels)]
    cmd += ["--index", str(tmp_path / "ix"), "--port", str(free_port())]
    cmd += ["--ray", address, "--shards", "2"]
    got = subprocess.run(
        cmd, cwd=ROOT, env=_env(tmp_path), capture_output=True, text=True, timeout=180
    )
    err = got.stderr.strip()
    assert got.returncode == 2 and "\n" not in err, err[-3000:]
    assert err.startswith("hypsearch: --ray") or "--ray " in err, err
    assert "token authentication" in err, err
