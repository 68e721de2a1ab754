"""Where the shards of a :class:`~indexing.sharded.ShardedIndex` run: one
:class:`ShardServer` per shard (a :class:`~indexing.index.HyperbolicIndex` opened in
its folder), in this process (:class:`LocalShards`) or in named, detached Ray actors
(:class:`RayShards`, :func:`shard_actor`), whose calls are repeated while an actor
restarts, at most a timeout, then :class:`ShardUnavailableError`. The reads that do
not wait for a restart go to the actors on this machine through their direct
channel (:mod:`indexing.channel`), not a Ray task each."""

from __future__ import annotations

import gc
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .channel import ChannelBroken, ChannelClient, ChannelServer, ShardState, receive, send
from .index import HyperbolicIndex
from .store import STORE_FILE

log = logging.getLogger("indexing")

NAMESPACE = "hypsearch"
START_TIMEOUT = 180.0  # seconds to wait for the shards' actors to start
#: a read that has waited this long asks the GCS whether its shard's actor is alive:
#: a shard that is down (restarting, or its node gone) fails the read then (503),
#: a live but slow one is waited for, up to the timeout
PROBE_SECONDS = 1.0
#: the index methods that change nothing: any other call through :meth:`ShardServer.call`
#: counts as a change of the shard (:class:`indexing.channel.ShardState`)
READS = frozenset(
    {"search", "search_hierarchical", "search_entailment", "entailment_candidates", "get",
     "get_many", "count", "scroll", "filter_mask", "__len__", "__contains__", "ids", "stats",
     "contains_many", "item_labels"}
)  # fmt: skip


class ShardUnavailableError(RuntimeError):
    """A shard did not answer within the timeout (its actor is restarting or gone)."""


class ShardServer:
    """One shard: a :class:`HyperbolicIndex` opened (or created) in ``folder``.

    In Ray this is the actor class; a restart runs ``__init__`` again, which
    reopens the store (snapshot + replay of later writes)."""

    def __init__(self, folder: str, space: str, curvature: float, backend: str, params: dict):
        self.folder = Path(folder)
        if (self.folder / STORE_FILE).exists():
            self.index = HyperbolicIndex.load(self.folder)
        else:
            self.index = HyperbolicIndex(
                space=space, curvature=curvature, backend=backend, path=self.folder, **params
            )
        # the first search loads the distance code (seconds): do it before answering
        warm = HyperbolicIndex(space=space, curvature=curvature, backend="exact")
        pts = np.random.default_rng(0).uniform(-0.1, 0.1, size=(64, warm.dim)) / warm.dim
        warm.add(pts, [f"w{i}" for i in range(64)])
        warm.search(pts[:1], k=1)
        warm.close()
        # what is loaded (the index, Ray, numba's kernels) into the collector's permanent
        # generation: a full collection under load scanned it all (pauses of ~0.1 s)
        gc.collect()
        gc.freeze()
        self._cones_seen, self._cones_fp = None, ""
        self._channel: ChannelServer | None = None
        self._state: ShardState | None = None
        self._channel_lock = threading.Lock()
        self.started = time.time()

    def call(self, method: str, *args, **kwargs):
        if method in READS:
            return getattr(self.index, method)(*args, **kwargs)
        try:
            return getattr(self.index, method)(*args, **kwargs)
        finally:  # before the caller hears of it: a read after the answer sees the change
            if self._state is not None:
                self._state.bump()

    def attr(self, name: str):
        return getattr(self.index, name)

    def info(self) -> dict:
        return {"pid": os.getpid(), "started": self.started, "items": len(self.index)}

    def item_labels(self) -> dict[str, str | None]:
        return self.index.item_labels()

    def many(self, calls: list[tuple[str, tuple, dict]]) -> list[tuple[bool, Any]]:
        """Several calls of this server's methods in one (the searches of a service's
        micro-batch): ``(True, answer)`` or ``(False, the exception it raised)`` each."""
        out: list[tuple[bool, Any]] = []
        for method, args, kwargs in calls:
            try:
                out.append((True, getattr(self, method)(*args, **kwargs)))
            except Exception as e:  # noqa: BLE001 - that call's answer
                out.append((False, e))
        return out

    def own_levels(self, query, chain, fingerprint: str, k: int, offset: int, **options):
        """:meth:`HyperbolicIndex.search_hierarchical` with the levels of this shard's
        own cones (kept by the index until it changes), which must be the caller's
        (``fingerprint``): no table of labels travels with a query."""
        cones = self.index.cones
        if cones is None or self._fingerprint(cones) != fingerprint:
            raise RuntimeError(
                f"shard {self.folder.name}: its label cones are not the ones the query "
                "was ranked by (set_cones on the sharded index sets every shard's)"
            )
        return self.index.search_hierarchical(query, chain, cones.held_by, k, offset, **options)

    def _fingerprint(self, cones) -> str:
        if self._cones_seen is not cones:
            self._cones_fp, self._cones_seen = cones.fingerprint(), cones
        return self._cones_fp

    def contains(self, ids: list[str]) -> list[bool]:
        return self.index.contains_many(ids)

    def channel(self) -> dict:
        """Where this actor's direct channel listens (started on the first ask):
        ``node`` (the Ray node id), ``address``, ``authkey``
        (:class:`indexing.channel.ChannelServer`: this server's methods, as Ray calls
        them, without a Ray task)."""
        import ray

        with self._channel_lock:
            if self._channel is None:
                self._state = ShardState.create()
                self._channel = ChannelServer(self._dispatch, self.folder.name)
        return {
            "node": ray.get_runtime_context().get_node_id(),
            "address": self._channel.address,
            "authkey": self._channel.authkey,
            "state": self._state.name,
            "pid": os.getpid(),
        }

    def _dispatch(self, method: str, args: tuple, kwargs: dict):
        return getattr(self, method)(*args, **kwargs)

    def stop(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._state.close(unlink=True)
        self.index.save()
        self.index.close()


class LocalShards:
    """Shards in this process."""

    def __init__(self, servers: list[ShardServer]) -> None:
        self.servers = servers

    def run(self, calls: Sequence[tuple[int, str, tuple, dict]], **_: Any) -> list:
        return [getattr(self.servers[i], m)(*a, **kw) for i, m, a, kw in calls]

    def state(self) -> None:
        return None  # no answers kept for shards in this process (nothing to save)

    def stop(self) -> None:
        for s in self.servers:
            s.stop()


class RayShards:
    """Shards in named Ray actors; calls repeated while an actor restarts.

    ``channel``: the reads that do not wait for a restart (``fail_fast``) go to the
    shards on this machine through their direct channel (:mod:`indexing.channel`)
    instead of a Ray task each; a shard on another node, or one whose channel
    cannot be had, is asked by Ray actor calls as before."""

    def __init__(
        self,
        names: list[str],
        make: Callable[[int], Any],
        timeout: float,
        *,
        channel: bool = True,
    ) -> None:
        import ray

        self.ray = ray
        self.names = names
        self.timeout = timeout
        self.owned: list[bool] = []
        self.actors = []
        self.seen_down: set[int] = set()
        #: per shard: its channel's client (None: none open now); elsewhere: the
        #: shards on other nodes (actor calls only)
        self.channels: list[ChannelClient | None] = [None] * len(names)
        #: per shard with a channel: its process id and change count (ShardState)
        self.states: list[tuple[int, ShardState] | None] = [None] * len(names)
        self.elsewhere: set[int] = set() if channel else set(range(len(names)))
        for i, name in enumerate(names):
            try:
                actor = ray.get_actor(name, namespace=NAMESPACE)
                self.owned.append(False)
            except ValueError:  # not running: start it
                actor = make(i)
                self.owned.append(True)
            self.actors.append(actor)
        # wait until all are up (a start takes longer than a call)
        self.run([(i, "info", (), {}) for i in range(len(names))], max(timeout, START_TIMEOUT))
        for i in range(len(names)):
            if i not in self.elsewhere:
                self._open_channel(i, max(timeout, START_TIMEOUT))

    def run(
        self,
        calls: Sequence[tuple[int, str, tuple, dict]],
        timeout=None,
        *,
        fail_fast: bool = False,
    ) -> list:
        """The calls' answers, in order. A call whose actor died is asked again until
        the actor is back, at most ``timeout``; with ``fail_fast`` (reads) a shard
        that is down -- its actor died during the call, or is not alive after
        :data:`PROBE_SECONDS` -- fails the call at once instead: a query waits for a
        slow shard, never for a restart."""
        from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

        timeout = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        if fail_fast:
            shards = {c[0] for c in calls}
            for i in shards & self.seen_down:  # down at the last look
                if not self._alive(i):
                    raise self._down(i)
                self.seen_down.discard(i)
            if not shards & self.elsewhere:
                for i in shards:
                    if self.channels[i] is None and not self._open_channel(i, PROBE_SECONDS):
                        raise self._down(i)
                if not shards & self.elsewhere:
                    return self._run_channel(calls, timeout, deadline)
        refs = [self._submit(c) for c in calls]
        out = []
        for c, ref in zip(calls, refs, strict=True):
            while True:
                left = deadline - time.monotonic()
                wait = min(left, PROBE_SECONDS) if fail_fast else left
                try:
                    out.append(self.ray.get(ref, timeout=max(wait, 0.001)))
                    break
                except RayTaskError as e:  # the shard's own error (bad input): as it was raised
                    cause = getattr(e, "cause", None)
                    if isinstance(cause, Exception) and not isinstance(cause, RayTaskError):
                        raise cause from None
                    raise
                except RayActorError:
                    if fail_fast:
                        raise self._down(c[0]) from None
                    if time.monotonic() >= deadline:
                        raise self._unavailable(c[0], timeout) from None
                    time.sleep(0.05)
                    ref = self._submit(c)  # the actor restarts: ask again
                except GetTimeoutError:
                    if time.monotonic() >= deadline:
                        raise self._unavailable(c[0], timeout) from None
                    if not self._alive(c[0]):  # fail_fast only: a wait shorter than left
                        raise self._down(c[0]) from None
        return out

    def _open_channel(self, i: int, timeout: float) -> bool:
        """Open shard ``i``'s channel (asking its actor where it listens, at most
        ``timeout``): ``False`` when the actor did not answer; a shard on another
        node, or whose actor has no channel, joins :attr:`elsewhere`."""
        from ray.exceptions import GetTimeoutError, RayActorError

        try:
            where = self.ray.get(self.actors[i].channel.remote(), timeout=timeout)
        except (GetTimeoutError, RayActorError):
            return False
        except Exception:  # noqa: BLE001 - an actor without a channel: Ray calls then
            self.elsewhere.add(i)
            return True
        if where["node"] != self.ray.get_runtime_context().get_node_id():
            self.elsewhere.add(i)
            return True
        client = ChannelClient(where["address"], where["authkey"])
        try:  # one connection now: a shard this process cannot reach (another network
            client.give(client.take()[0])  # namespace on the same node) is asked by Ray
        except ChannelBroken:
            if self._alive(i):
                self.elsewhere.add(i)
                log.warning("shard %d: no direct channel from here, Ray calls instead", i)
                return True
            return False
        try:
            self.states[i] = (int(where["pid"]), ShardState.attach(where["state"]))
        except OSError:  # another /dev/shm (a container): no kept answers then
            self.states[i] = None
        self.channels[i] = client
        return True

    def _drop_channel(self, i: int) -> None:
        client, self.channels[i] = self.channels[i], None
        state, self.states[i] = self.states[i], None
        if client is not None:
            client.close()
        if state is not None:
            state[1].close()

    def state(self) -> tuple | None:
        """What the shards hold, as a value that changes whenever any of them changes
        (each one's change count, and which process it is), read without asking
        them; ``None`` when that cannot be said (a shard without a channel, seen
        down, or whose process is gone: it restarted, or is restarting)."""
        out = []
        for i in range(len(self.names)):
            st = self.states[i]
            if st is None or i in self.seen_down:
                return None
            pid, shared = st
            try:
                os.kill(pid, 0)  # the process the count belongs to still runs
            except OSError:
                return None
            out.append((shared.name, shared.read()))
        return tuple(out)

    def _run_channel(self, calls, timeout: float, deadline: float) -> list:
        """:meth:`run`'s reads through the shards' channels. A broken connection
        that was kept from before, to a shard that is alive (it restarted since), is
        opened again and the calls made once more; any other break is the shard
        down (its actor died during the call)."""
        try:
            return self._channel_once(calls, timeout, deadline)
        except _Broken as b:
            self._drop_channel(b.shard)
            if b.fresh or not self._alive(b.shard):
                raise self._down(b.shard) from None
            if not self._open_channel(b.shard, PROBE_SECONDS):
                raise self._down(b.shard) from None
        try:
            return self._channel_once(calls, timeout, deadline)
        except _Broken as b:
            self._drop_channel(b.shard)
            raise self._down(b.shard) from None

    def _channel_once(self, calls, timeout: float, deadline: float) -> list:
        out: list = []
        sent: list = []  # (shard, client, connection) of each call sent
        try:
            for i, method, args, kwargs in calls:
                client = self.channels[i]
                if client is None:  # dropped by another thread meanwhile
                    raise _Broken(i, True)
                try:
                    conn, fresh = client.take()
                except ChannelBroken:
                    raise _Broken(i, True) from None
                try:
                    send(conn, method, args, kwargs)
                except ChannelBroken:
                    conn.close()
                    raise _Broken(i, fresh) from None
                sent.append((i, client, conn, fresh))
            while sent:
                i, client, conn, fresh = sent[0]
                while not conn.poll(max(min(deadline - time.monotonic(), PROBE_SECONDS), 0)):
                    if time.monotonic() >= deadline:
                        raise self._unavailable(i, timeout)
                    if not self._alive(i):
                        raise self._down(i)
                try:
                    out.append(receive(conn))
                except ChannelBroken:
                    raise _Broken(i, fresh) from None
                sent.pop(0)
                client.give(conn)
        finally:
            for _, _, conn, _ in sent:  # an answer still owed on it: not reusable
                conn.close()
        for ok, value in out:
            if not ok:  # the shard's own error (bad input): as it was raised
                raise value
        return [value for _, value in out]

    def _alive(self, i: int) -> bool:
        """Whether the GCS has shard ``i``'s actor alive (``True`` when it cannot say:
        then the call waits, as for a slow shard)."""
        try:
            from ray._private.state import actors

            state = actors(actor_id=self.actors[i]._actor_id.hex())["State"]
        except Exception:  # noqa: BLE001 - another Ray, or the GCS did not answer
            return True
        return state == "ALIVE"

    def _submit(self, c):
        i, method, args, kwargs = c
        return getattr(self.actors[i], method).remote(*args, **kwargs)

    def _unavailable(self, i: int, timeout: float) -> ShardUnavailableError:
        return ShardUnavailableError(
            f"shard {i} of {len(self.names)} ({self.names[i]}) did not answer within "
            f"{timeout:g} s (its actor is restarting or its node is gone); try again"
        )

    def _down(self, i: int) -> ShardUnavailableError:
        self.seen_down.add(i)  # the next reads ask the GCS first, without waiting
        return ShardUnavailableError(
            f"shard {i} of {len(self.names)} ({self.names[i]}) did not answer: its actor "
            "died and is restarting (or its node is gone); no partial answer is given, "
            "try again in a few seconds"
        )

    def stop(self) -> None:
        for i in range(len(self.names)):
            self._drop_channel(i)
        calls = [(i, "stop", (), {}) for i, own in enumerate(self.owned) if own]
        try:
            self.run(calls, max(self.timeout, START_TIMEOUT))
        finally:
            for i, own in enumerate(self.owned):
                if own:
                    self.ray.kill(self.actors[i], no_restart=True)


class _Broken(Exception):
    """Shard ``shard``'s channel connection broke (``fresh``: one opened for the call)."""

    def __init__(self, shard: int, fresh: bool) -> None:
        super().__init__(shard, fresh)
        self.shard, self.fresh = shard, fresh


def shard_actor(name: str, i: int, args: tuple, num_cpus: float):
    """Start the actor of shard ``i`` (pinned by ``hypsearch_shard_<i>`` when the
    cluster has that resource)."""
    import ray

    opts: dict[str, Any] = {
        "name": name,
        "namespace": NAMESPACE,
        "lifetime": "detached",
        "get_if_exists": True,
        "max_restarts": -1,
        "max_task_retries": 0,
        "max_concurrency": 8,
        "num_cpus": num_cpus,
    }
    pin = f"hypsearch_shard_{i}"
    if ray.cluster_resources().get(pin, 0) > 0:
        opts["resources"] = {pin: 0.01}
    return ray.remote(ShardServer).options(**opts).remote(*args)
