"""The shards' direct channel (indexing.channel), without Ray: a call and its answer
or its own error, the key checked, and a server that goes away seen at once."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from multiprocessing import AuthenticationError

import numpy as np
import pytest

from indexing import IndexInputError
from indexing.channel import ChannelBroken, ChannelClient, ChannelServer, receive, send


class Shardlike:
    def __init__(self) -> None:
        self.calls = 0

    def search(self, q, k=10):
        self.calls += 1
        if k < 1:
            raise IndexInputError(f"k: must be at least 1, got {k}")
        return np.argsort(q)[:k], np.sort(q)[:k]

    def local_function(self):
        return lambda: 1  # not picklable by plain pickle


def handle_of(obj):
    return lambda method, args, kwargs: getattr(obj, method)(*args, **kwargs)


def call(client: ChannelClient, method: str, *args, **kwargs):
    conn, _ = client.take()
    send(conn, method, args, kwargs)
    out = receive(conn)
    client.give(conn)
    return out


def test_a_call_answers_and_a_shards_error_comes_back_as_itself():
    shard = Shardlike()
    server = ChannelServer(handle_of(shard), "t")
    client = ChannelClient(server.address, server.authkey)
    try:
        q = np.array([0.3, 0.1, 0.2])
        ok, (ids, dists) = call(client, "search", q, k=2)
        assert ok and ids.tolist() == [1, 2] and dists.tolist() == [0.1, 0.2]
        ok, err = call(client, "search", q, k=0)
        assert not ok and isinstance(err, IndexInputError) and "k: must be at least 1" in str(err)
        ok, fn = call(client, "local_function")  # by Ray's cloudpickle, as a Ray task would
        assert ok and fn() == 1
        ok, err = call(client, "nope")
        assert not ok and isinstance(err, AttributeError)
        assert shard.calls == 2
    finally:
        client.close()
        server.close()


def test_concurrent_callers_each_get_their_own_answer():
    server = ChannelServer(handle_of(Shardlike()), "t")
    client = ChannelClient(server.address, server.authkey)
    bad: list = []

    def caller(j: int) -> None:
        for r in range(30):
            q = np.arange(5.0)[::-1] + j + r
            ok, (ids, _) = call(client, "search", q, k=1)
            if not ok or ids.tolist() != [4]:
                bad.append((j, r, ids))

    threads = [threading.Thread(target=caller, args=(j,)) for j in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    client.close()
    server.close()
    assert not bad


def test_the_wrong_key_is_refused():
    server = ChannelServer(handle_of(Shardlike()), "t")
    try:
        with pytest.raises((AuthenticationError, ChannelBroken)):
            call(ChannelClient(server.address, b"x" * 32), "search", np.zeros(3), k=1)
    finally:
        server.close()


def _serve_in_child(pipe) -> None:
    server = ChannelServer(handle_of(Shardlike()), "child")
    pipe.send((server.address, server.authkey))
    threading.Event().wait(60)


def test_a_server_process_killed_breaks_its_connections_at_once():
    ctx = multiprocessing.get_context("fork")
    here, there = ctx.Pipe()
    child = ctx.Process(target=_serve_in_child, args=(there,), daemon=True)
    child.start()
    try:
        client = ChannelClient(*here.recv())
        ok, _ = call(client, "search", np.arange(3.0), k=1)
        assert ok
        conn, fresh = client.take()  # kept from the call
        assert not fresh
        os.kill(child.pid, signal.SIGKILL)
        child.join(10)
        t0 = time.monotonic()
        with pytest.raises(ChannelBroken):
            send(conn, "search", (np.arange(3.0),), {"k": 1})
            receive(conn)
        assert time.monotonic() - t0 < 1  # the socket closed with the process
        with pytest.raises(ChannelBroken, match="cannot connect"):
            client.take()  # nothing listens there any more
    finally:
        if child.is_alive():
            child.kill()
