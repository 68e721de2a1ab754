"""A local Ray cluster for a test module: :func:`ray_cluster_fixture`.

Ray binds the machine's network interface, so its tests run only inside a
network namespace that has just ``lo`` (``make test`` makes one when run as
root). Where that is not so, or the ``ray`` extra is missing, the tests skip
-- except under CI (``CI=true``), where a Ray cluster is expected: there they
fail, so that a CI run that lost its namespace does not pass by skipping.
"""

from __future__ import annotations

import importlib.util
import os
import socket

import pytest


def loopback_only() -> bool:
    return [name for _, name in socket.if_nameindex()] == ["lo"]


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def cannot_run(reason: str):
    """Skip, or under CI fail (a cluster is expected there)."""
    if in_ci():
        pytest.fail(f"CI=true and no Ray cluster can be started: {reason}", pytrace=False)
    pytest.skip(reason)


def start_local_ray():
    """``ray`` initialised on a new local cluster: 2 CPUs, a 200 MB object store, no
    dashboard, namespace ``hypsearch`` (or skip / fail as the module docstring says)."""
    if importlib.util.find_spec("ray") is None:
        cannot_run("the ray extra is not installed: pip install -e '.[ray]'")
    if not loopback_only():
        cannot_run(
            "Ray binds the machine's network interface: its tests run only inside a network "
            "namespace with just lo (make test makes one when run as root)"
        )
    from service.ray_serve import start_local_ray as start

    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    # Serve kills a proxy whose readiness check times out (5 s by default): on a loaded
    # 2-core machine the proxy of a starting `hypsearch serve --ray` took longer (the
    # cluster's processes inherit this environment)
    os.environ.setdefault("RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S", "60")
    temp = f"/tmp/hsray-{os.getpid()}"  # short: Ray's socket paths have a length limit
    return start(cpus=2, object_store_bytes=200 * 2**20, temp_dir=temp)


def ray_cluster_fixture():
    """A module-scoped fixture ``ray_cluster``: one local cluster for the module."""

    @pytest.fixture(scope="module")
    def ray_cluster():
        ray = start_local_ray()
        try:
            yield ray
        finally:
            ray.shutdown()

    return ray_cluster
