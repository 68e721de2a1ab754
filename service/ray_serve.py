"""The service on a Ray cluster: ``hypsearch serve --ray ADDRESS --shards N --replicas R``.

* :func:`connect` joins the cluster (``ray.init(address=...)``; ``local``
  starts a one-machine cluster in this process, with a capped object store);
  without the ``ray`` extra, or at an address where no cluster answers, a
  :class:`RayUnavailable` with one line.
* :func:`open_sharded_runtime`: ``serve --ray ADDRESS --shards N`` (no
  ``--replicas``): the app in the serving process itself, over the shards' actors.
* :func:`serve_on_ray` (``--replicas R``) opens (or creates) the sharded index -- this process
  starts the shards' actors (:class:`indexing.sharded.ShardedIndex`) and stops
  them when it ends -- then runs R replicas of :class:`HypsearchReplica` under
  Ray Serve, on ``HOST:PORT`` (Serve's HTTP proxy). Each replica is the
  same FastAPI app as ``hypsearch serve`` (:func:`service.app.create_app`, so
  the REST API is today's), with its own model and label tallies, over the
  shared shards (found by name), and the serving process's settings whole
  (:func:`replica_settings`: a replica runs in a Ray worker, whose environment
  is the node's, so ``HYPSEARCH_API_KEY`` and the limits travel with them).
  Writes go through any replica to the shards; the other replicas' label
  tallies (the counts behind word resolution and the predicted labels of
  vector queries) catch up when they restart.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from typing import Any

__all__ = [
    "RayUnavailable",
    "HypsearchReplica",
    "connect",
    "open_sharded_runtime",
    "serve_on_ray",
]

log = logging.getLogger("service")

#: requests a replica takes at once (Serve's default is 5): the replica's search
#: micro-batcher answers what queued meanwhile in one fan-out to the shards, so
#: with 5 the other connections waited in Serve's proxy, one short batch after
#: another (benchmarks/results/load.md)
REPLICA_MAX_ONGOING = 64
#: the object store of a local cluster (Ray's default is 30% of the memory)
LOCAL_OBJECT_STORE_BYTES = 300 * 2**20


class RayUnavailable(Exception):
    """No Ray here (the extra is not installed) or no cluster at the address (one line)."""


def connect(address: str, flag: str = "--ray"):
    """``ray`` connected to the cluster at ``address`` (``auto``, ``HOST:PORT``,
    ``ray://HOST:PORT``, or ``local`` for a new one-machine cluster).

    A cluster with Ray's token authentication (``ray start`` with a token on the
    machine, ``RAY_AUTH_MODE=token``) gets the token Ray would use
    (:func:`_authenticate`); a missing or wrong token is said so, not "no Ray
    cluster there"."""
    try:
        import ray
    except ImportError:
        raise RayUnavailable(
            f"{flag}: the ray extra is not installed (pip install -e '.[ray]')"
        ) from None
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if address != "local":
        _reachable(address, flag)
        _authenticate(address, flag)
    if ray.is_initialized():
        return ray
    try:
        if address == "local":
            start_local_ray()
        else:
            ray.init(address=address, **RAY_INIT)
    except (ConnectionError, ValueError, RuntimeError, TimeoutError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise RayUnavailable(f"{flag} {address}: no Ray cluster there ({first})") from None
    return ray


#: what every ``ray.init`` of the project passes: the project's namespace (its named
#: shard actors), the workers' logs kept out of this process's output
RAY_INIT: dict[str, Any] = {"namespace": "hypsearch", "log_to_driver": False}


def start_local_ray(
    *,
    cpus: int | None = None,
    object_store_bytes: int = LOCAL_OBJECT_STORE_BYTES,
    temp_dir: str | None = None,
):
    """``ray`` initialised on a new one-machine cluster in this process: ``cpus``
    (default: the machine's), a capped object store, no dashboard, no usage
    statistics (``connect("local")``, the tests and the benchmarks). Ray binds the
    machine's network interface: where only loopback traffic is allowed, run it in
    a network namespace that has just ``lo`` (``make test`` does)."""
    import ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    extra = {} if temp_dir is None else {"_temp_dir": temp_dir}
    ray.init(
        num_cpus=cpus or os.cpu_count(),
        object_store_memory=object_store_bytes,
        include_dashboard=False,
        **RAY_INIT,
        **extra,
    )
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


#: the GCS method the authentication probe calls (any call is refused
#: ``UNAUTHENTICATED`` without the cluster's token; this one has an empty request)
_PROBE_METHOD = "/ray.rpc.NodeInfoGcsService/GetClusterId"
_TOKEN_HELP = (
    "put the cluster's token (`ray get-auth-token` on its head node prints it) in "
    "~/.ray/auth_token, or set RAY_AUTH_TOKEN (or RAY_AUTH_TOKEN_PATH to a file holding it)"
)


def _probe(target: str, token: str | None) -> str:
    """The gRPC status of one call to the GCS at ``target`` (``"OK"``,
    ``"UNAUTHENTICATED"``, ...), sending ``token`` when given."""
    import grpc

    metadata = (("authorization", f"Bearer {token}"),) if token else ()
    with grpc.insecure_channel(target) as channel:
        call = channel.unary_unary(
            _PROBE_METHOD, request_serializer=None, response_deserializer=None
        )
        try:
            call(b"", timeout=5, metadata=metadata)
        except grpc.RpcError as e:
            return e.code().name if e.code() is not None else "UNKNOWN"
    return "OK"


def _local_token() -> tuple[str | None, str]:
    """The token Ray would send (``RAY_AUTH_TOKEN``, the file ``RAY_AUTH_TOKEN_PATH``,
    ``~/.ray/auth_token``, in Ray's order) and where it came from."""
    from pathlib import Path

    if os.environ.get("RAY_AUTH_TOKEN", "").strip():
        return os.environ["RAY_AUTH_TOKEN"].strip(), "RAY_AUTH_TOKEN"
    where = os.environ.get("RAY_AUTH_TOKEN_PATH") or str(Path.home() / ".ray" / "auth_token")
    try:
        token = Path(where).read_text().strip()
    except OSError:
        return None, where
    return (token or None), where


def _authenticate(address: str, flag: str) -> None:
    """Ready this process for the cluster's authentication: when the cluster at
    ``address`` refuses calls without a token, turn Ray's token mode on with the
    local token (as ``ray.init()`` does by itself only for ``auto``), or raise
    :class:`RayUnavailable` saying that authentication failed and how to fix it.
    A cluster without authentication, or one that does not answer the probe
    (``ray.init`` then says why), changes nothing."""
    if address == "auto" or address.startswith("ray://"):
        return  # auto: ray.init finds the token itself; ray://: the client server's own check
    try:
        status = _probe(address, None)
    except Exception:  # noqa: BLE001 - grpc missing or the probe failed: ray.init decides
        return
    if status != "UNAUTHENTICATED":
        return
    token, where = _local_token()
    if token is None:
        raise RayUnavailable(
            f"{flag} {address}: the Ray cluster there uses token authentication and no "
            f"token was found here ({where} is missing): {_TOKEN_HELP}"
        )
    if _probe(address, token) == "UNAUTHENTICATED":
        raise RayUnavailable(
            f"{flag} {address}: authentication failed: the Ray cluster there refuses the "
            f"token from {where}: {_TOKEN_HELP}"
        )
    mode = os.environ.get("RAY_AUTH_MODE")
    if mode is not None and mode.lower() != "token":
        raise RayUnavailable(
            f"{flag} {address}: the Ray cluster there uses token authentication but "
            f"RAY_AUTH_MODE={mode} here: unset it or set RAY_AUTH_MODE=token"
        )
    os.environ["RAY_AUTH_MODE"] = "token"  # this process and the ones it starts
    if where != "RAY_AUTH_TOKEN" and "RAY_AUTH_TOKEN_PATH" not in os.environ:
        os.environ["RAY_AUTH_TOKEN_PATH"] = where
    try:  # Ray read its configuration at import: read it again, and the token
        from ray._raylet import AuthenticationTokenLoader, Config

        Config.initialize("")
        AuthenticationTokenLoader.instance().reset_cache()
    except (ImportError, AttributeError):  # another Ray: the environment is all it reads
        pass


class HypsearchReplica:
    """One Serve replica: the runtime over the shared shards, and the app."""

    def __init__(self, settings) -> None:
        from indexing.sharded import ShardedIndex
        from service.runtime import open_runtime

        # the serving process's settings, whole (its environment: HYPSEARCH_API_KEY and
        # every limit): a replica's own environment is the Ray node's, not the caller's
        self.settings = settings
        # the running shards, by name; a query to a shard that is down answers 503 at
        # once (``fail_fast``) instead of holding the request until the actor is back
        index = ShardedIndex(self.settings.index, ray=True, fail_fast=True)
        self.runtime = open_runtime(self.settings, index=index)

    def __serve_build_asgi_app__(self):
        from service.app import create_app

        return create_app(self.settings, runtime=self.runtime, owns_runtime=True)


def open_sharded_runtime(settings, *, shards: int, dim: int, curvature: float):
    """The runtime of ``serve --ray ADDRESS --shards N`` without ``--replicas``: the
    app runs in this process (uvicorn, as ``hypsearch serve``) over the shards'
    actors, started here unless they run already (and then stopped with the runtime).
    A request pays no proxy and no replica hop: each micro-batch of searches is one
    call per shard (:meth:`indexing.sharded.ShardedIndex.run_calls`); a read of a
    shard that is down answers 503 at once (``fail_fast``)."""
    from indexing.sharded import ShardedIndex
    from service.runtime import open_runtime

    index = ShardedIndex(
        settings.index, shards=shards, dim=dim, curvature=curvature, ray=True, fail_fast=True
    )
    try:
        return open_runtime(settings, index=index)
    except BaseException:
        index.close()
        raise


def replica_settings(settings):
    """``settings`` as the replicas get them: the paths made absolute (a replica's
    working folder is the Ray worker's); everything else, the API key included,
    as this process read it."""
    from pathlib import Path

    update = {}
    for name in ("home", "model", "labels", "index", "image_dir", "data_dir", "wordnet_dir"):
        p = getattr(settings, name)
        if p is None or str(p).startswith("pretrained:"):
            continue
        update[name] = Path(os.path.abspath(p))
    if settings.image_dir is None:  # INDEX/images, of the absolute index folder
        update["image_dir"] = update["index"] / "images"
    return settings.model_copy(update=update)


def serve_on_ray(
    settings,
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
            max_ongoing_requests=REPLICA_MAX_ONGOING,
            ray_actor_options={"num_cpus": replica_cpus},
        )
        serve.run(deployment.bind(replica_settings(settings)), name="hypsearch", route_prefix="/")
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
