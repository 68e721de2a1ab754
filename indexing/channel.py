"""A direct channel to a shard's actor on the same machine: the reads of a
:class:`~indexing.shards.RayShards` without a Ray task per call.

A Ray actor call costs about a millisecond of CPU on the caller, the raylet and
the actor (task submission, the object store, serialisation): on a machine whose
cores also serve the requests, that, not the search, bounded the sharded service
(``benchmarks/results/ray-serve.md``; ``benchmarks/shard_channel.py`` measures one
round trip each way). So each shard's actor also listens on a Unix socket in the
abstract namespace (no file to clean up; reachable from its own network namespace
only), authenticated by a random key (the HMAC handshake of
:mod:`multiprocessing.connection`) handed out through the actor itself
(:meth:`~indexing.shards.ShardServer.channel`, i.e. over Ray's own channel). A
read is one pickled ``(method, args, kwargs)`` written to the socket and one
pickled ``(ok, answer)`` read back; one thread in the actor per connection, as
Ray's threaded actor runs concurrent calls.

:class:`ChannelServer` is the actor's side, :class:`ChannelClient` the caller's:
a few open connections per shard, reused. A connection that breaks (the actor
died: the socket closes at once, no waiting for Ray to notice) raises
:class:`ChannelBroken`; the caller decides what that means (``RayShards``: the
shard is down, 503, unless the connection was an old one and the shard is back).
"""

from __future__ import annotations

import logging
import os
import pickle
import secrets
import threading
from collections.abc import Callable
from multiprocessing import AuthenticationError, resource_tracker
from multiprocessing.connection import Client, Connection, Listener
from multiprocessing.shared_memory import SharedMemory
from typing import Any

log = logging.getLogger("indexing")

#: open connections kept per shard (the service's search workers, plus its other
#: reads, each hold one while their call is out)
POOL = 8


class ChannelBroken(ConnectionError):
    """The connection to a shard's actor closed (the actor died or restarted)."""


class ShardState:
    """A shard's count of changes in 8 bytes of shared memory: the shard adds one
    after every call that may change it, before its caller hears back; a process on
    the same machine reads it without asking the shard (what lets the serving
    process keep the shards' answers to repeated label queries,
    :meth:`indexing.sharded.ShardedIndex.run_calls`). A restarted shard makes a new
    one (another name)."""

    def __init__(self, shm: SharedMemory, owner: bool) -> None:
        self._shm = shm
        self._owner = owner
        self._lock = threading.Lock()

    @classmethod
    def create(cls) -> ShardState:
        return cls(SharedMemory(create=True, size=8), True)

    @classmethod
    def attach(cls, name: str) -> ShardState:
        shm = SharedMemory(name=name)
        # Python < 3.13 registers an attached segment too, and would unlink it at
        # this process's exit: it is the shard's
        resource_tracker.unregister(shm._name, "shared_memory")  # noqa: SLF001
        return cls(shm, False)

    @property
    def name(self) -> str:
        return self._shm.name

    def read(self) -> int:
        return int.from_bytes(self._shm.buf[:8], "little")

    def bump(self) -> None:
        with self._lock:
            self._shm.buf[:8] = (self.read() + 1).to_bytes(8, "little")

    def close(self, unlink: bool = False) -> None:
        try:
            self._shm.close()
            if unlink and self._owner:
                self._shm.unlink()
        except (OSError, BufferError):
            pass


def dumps(value: Any) -> bytes:
    """``value`` pickled (protocol 5); what plain pickle refuses (a local function),
    by Ray's cloudpickle, as a Ray task would send it."""
    try:
        return pickle.dumps(value, protocol=5)
    except (pickle.PicklingError, AttributeError, TypeError):
        from ray import cloudpickle

        return cloudpickle.dumps(value, protocol=5)


class ChannelServer:
    """Serve ``handle(method, args, kwargs)`` on a new abstract Unix socket, one
    thread per connection; :attr:`address` and :attr:`authkey` are what a client
    needs."""

    def __init__(self, handle: Callable[[str, tuple, dict], Any], name: str) -> None:
        self.authkey = secrets.token_bytes(32)
        # abstract namespace: a leading NUL; unique per process and start
        self.address = f"\0hypsearch-{name}-{os.getpid()}-{secrets.token_hex(4)}"
        self._handle = handle
        self._listener = Listener(self.address, family="AF_UNIX", authkey=self.authkey)
        self._closed = False
        threading.Thread(target=self._accept, name="shard-channel", daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn = self._listener.accept()
            except Exception:  # noqa: BLE001 - a failed handshake, or the listener closed
                if self._closed:
                    return
                log.warning("shard channel: a connection was refused", exc_info=True)
                continue
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: Connection) -> None:
        with conn:
            while True:
                try:
                    method, args, kwargs = pickle.loads(conn.recv_bytes())
                except (EOFError, OSError):
                    return
                try:
                    out = dumps((True, self._handle(method, args, kwargs)))
                except Exception as e:  # noqa: BLE001 - the call's own error, sent back
                    try:
                        out = dumps((False, e))
                    except Exception:  # noqa: BLE001 - an error that does not pickle
                        out = dumps((False, RuntimeError(f"{type(e).__name__}: {e}")))
                try:
                    conn.send_bytes(out)
                except OSError:
                    return

    def close(self) -> None:
        self._closed = True
        try:
            self._listener.close()
        except OSError:
            pass


class ChannelClient:
    """Connections to one shard's :class:`ChannelServer` (``address``, ``authkey``),
    at most :data:`POOL` kept open; thread-safe."""

    def __init__(self, address: str, authkey: bytes) -> None:
        self.address = address
        self.authkey = authkey
        self._idle: list[Connection] = []
        self._lock = threading.Lock()

    def take(self) -> tuple[Connection, bool]:
        """A connection, and whether it was opened now (else it was kept, and may be
        to an actor that died since)."""
        with self._lock:
            if self._idle:
                return self._idle.pop(), False
        try:
            return Client(self.address, family="AF_UNIX", authkey=self.authkey), True
        except (OSError, EOFError, AuthenticationError) as e:
            raise ChannelBroken(f"cannot connect: {e}") from None

    def give(self, conn: Connection) -> None:
        with self._lock:
            if len(self._idle) < POOL:
                self._idle.append(conn)
                return
        conn.close()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for c in idle:
            c.close()


def send(conn: Connection, method: str, args: tuple, kwargs: dict) -> None:
    """Write one call; :class:`ChannelBroken` when the connection is closed."""
    try:
        conn.send_bytes(dumps((method, args, kwargs)))
    except OSError as e:
        raise ChannelBroken(str(e)) from None


def receive(conn: Connection) -> tuple[bool, Any]:
    """Read one answer ``(ok, value)``; :class:`ChannelBroken` when the connection
    closed first."""
    try:
        return pickle.loads(conn.recv_bytes())
    except (EOFError, OSError) as e:
        raise ChannelBroken(str(e) or "the connection closed") from None
