"""The service on a Ray cluster: ``hypsearch serve --ray ADDRESS --shards N --replicas R``.

* :func:`connect` joins the cluster (``ray.init(address=...)``; ``local``
  starts a one-machine cluster in this process, with a capped object store);
  without the ``ray`` extra, or at an address where no cluster answers, a
  :class:`RayUnavailable` with one line.
* :func:`serve_on_ray` opens (or creates) the sharded index -- this process
  starts the shards' actors (:class:`indexing.sharded.ShardedIndex`) and stops
  them when it ends -- then runs R replicas of :class:`HypsearchReplica` under
  Ray Serve, on ``HOST:PORT`` (Serve's HTTP proxy). Each replica is the
  same FastAPI app as ``hypsearch serve`` (:func:`service.app.create_app`, so
  the REST API is today's), with its own model and label tallies, over the
  shared shards (found by name). Writes go through any replica to the shards;
  the other replicas' label tallies (the counts behind word resolution and the
  predicted labels of vector queries) catch up when they restart.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from typing import Any

__all__ = ["RayUnavailable", "HypsearchReplica", "connect", "serve_on_ray"]

log = logging.getLogger("service")

#: the object store of a local cluster (Ray's default is 30% of the memory)
LOCAL_OBJECT_STORE_BYTES = 300 * 2**20


class RayUnavailable(Exception):
    """No Ray here (the extra is not installed) or no cluster at the address (one line)."""


def connect(address: str, flag: str = "--ray"):
    """``ray`` connected to the cluster at ``address`` (``auto``, ``HOST:PORT``,
    ``ray://HOST:PORT``, or ``local`` for a new one-machine cluster)."""
    try:
        import ray
    except ImportError:
        raise RayUnavailable(
            f"{flag}: the ray extra is not installed (pip install -e '.[ray]')"
        ) from None
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if address != "local":
        _reachable(address, flag)
    if ray.is_initialized():
        return ray
    kw: dict[str, Any] = {"namespace": "hypsearch", "log_to_driver": False}
    try:
        if address == "local":
            ray.init(
                num_cpus=os.cpu_count(),
                object_store_memory=LOCAL_OBJECT_STORE_BYTES,
                include_dashboard=False,
                **kw,
            )
        else:
            ray.init(address=address, **kw)
    except (ConnectionError, ValueError, RuntimeError, TimeoutError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise RayUnavailable(f"{flag} {address}: no Ray cluster there ({first})") from None
    return ray


def _reachable(address: str, flag: str) -> None:
    """A ``HOST:PORT`` that accepts a TCP connection within 3 s (Ray itself retries
    for minutes before giving up on a wrong address)."""
    import socket

    if address == "auto":
        return
    hostport = address.removeprefix("ray://")
    host, sep, port = hostport.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise RayUnavailable(
            f"{flag} {address}: expected auto, local, HOST:PORT or ray://HOST:PORT"
        )
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=3).close()
    except OSError as e:
        raise RayUnavailable(
            f"{flag} {address}: no Ray cluster there ({e.strerror or e})"
        ) from None


class HypsearchReplica:
    """One Serve replica: the runtime over the shared shards, and the app."""

    def __init__(self, settings_kw: dict) -> None:
        from indexing.sharded import ShardedIndex
        from service.runtime import open_runtime
        from service.settings import get_settings

        self.settings = get_settings(**settings_kw)
        index = ShardedIndex(self.settings.index, ray=True)  # the running shards, by name
        self.runtime = open_runtime(self.settings, index=index)

    def __serve_build_asgi_app__(self):
        from service.app import create_app

        return create_app(self.settings, runtime=self.runtime, owns_runtime=True)


def serve_on_ray(
    settings,
    settings_kw: dict,
    *,
    shards: int,
    replicas: int = 1,
    replica_cpus: float = 0.5,
    dim: int,
    curvature: float,
    announce: str | None = None,
    stop: threading.Event | None = None,
) -> int:
    """Start the shards and R replicas; serve until ``stop`` is set (or Ctrl-C)."""
    import ray
    from ray import serve

    from indexing.sharded import ShardedIndex

    if stop is None:
        # Installed before Serve starts (and after ray.init, whose fatal-signal handler
        # it replaces): a SIGTERM that comes while ``serve.run`` still waits for the
        # last replica -- the proxy already routes to the first -- is a clean stop too.
        stop = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
    index = ShardedIndex(settings.index, shards=shards, dim=dim, curvature=curvature, ray=True)
    try:
        serve.start(http_options={"host": settings.host, "port": settings.port})
        deployment = serve.deployment(
            serve.ingress()(HypsearchReplica),
            name="hypsearch",
            num_replicas=replicas,
            ray_actor_options={"num_cpus": replica_cpus},
        )
        serve.run(deployment.bind(settings_kw), name="hypsearch", route_prefix="/")
        if announce:
            print(announce, flush=True)
        while not stop.wait(0.5):
            pass
        log.info("stopping: Serve, then the shards")
        serve.shutdown()
    finally:
        index.close()
    del ray
    return 0
