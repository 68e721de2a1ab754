"""Group commit (:mod:`service.group_commit`) over a real durable index: writes
queued while another is written go out together, each answered once durable,
an id written twice keeps its later write, a bad write fails alone, and a
refusal before the write (a retired runtime) fails the whole group. The kill -9
tests (test_store_crash, test_points_crash) check that nothing acknowledged
is lost through the service's write path."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from indexing import HyperbolicIndex, IndexInputError
from service.group_commit import GroupCommit

DIM = 4


@pytest.fixture()
def setup(tmp_path):
    index = HyperbolicIndex(dim=DIM, backend="exact", path=tmp_path / "ix")
    gate = threading.Event()
    entered = threading.Event()
    calls: list[list[str]] = []
    refuse: list[BaseException] = []

    def apply(ids, vectors, labels, payloads):
        calls.append(list(ids))
        if len(calls) == 1:  # the first write holds the lock until the test lets it go
            entered.set()
            assert gate.wait(30)
        index.add(vectors, ids, labels=labels, payloads=payloads)

    def before():
        if refuse:
            raise refuse[0]

    gc = GroupCommit(threading.Lock(), apply, before)
    yield index, gc, gate, entered, calls, refuse
    index.close()


def _vec(r: float = 0.3, j: int = 0) -> np.ndarray:
    v = np.zeros((1, DIM))
    v[0, j % DIM] = r
    return v


def _start(gc, errors, item_id, v, label=None, payload=None):
    def run():
        try:
            gc.submit([item_id], v, [label], None if payload is None else [payload])
        except BaseException as e:  # noqa: BLE001 - checked by the test
            errors[item_id] = e

    t = threading.Thread(target=run)
    t.start()
    return t


def _wait_queued(gc, n: int) -> None:
    deadline = time.monotonic() + 30
    while len(gc._queue) < n:
        assert time.monotonic() < deadline
        time.sleep(0.005)


def test_writes_queued_meanwhile_share_one_commit_and_the_later_write_wins(setup):
    index, gc, gate, entered, calls, _ = setup
    errors: dict = {}
    first = _start(gc, errors, "first", _vec(0.1))
    assert entered.wait(30)
    threads = [_start(gc, errors, f"w{j}", _vec(0.2, j), "a", {"j": j}) for j in range(6)]
    _wait_queued(gc, 6)
    threads.append(_start(gc, errors, "w2", _vec(0.5, 3), "b", {"again": True}))
    _wait_queued(gc, 7)
    gate.set()
    for t in [first, *threads]:
        t.join(30)
    assert not errors
    assert calls[0] == ["first"] and sorted(calls[1]) == [f"w{j}" for j in range(6)]
    assert len(calls) == 2 and (gc.groups, gc.writes) == (2, 8)
    again = index.get("w2")  # the later of the two writes of w2
    assert (again.label, again.payload) == ("b", {"again": True})
    np.testing.assert_array_equal(again.vector, _vec(0.5, 3)[0])
    assert len(index) == 7
    index.close()
    reopened = HyperbolicIndex.load(index.path)  # durable: from the store
    assert sorted(reopened.ids()) == sorted(["first"] + [f"w{j}" for j in range(6)])
    reopened.close()


def test_a_bad_write_fails_alone(setup):
    index, gc, gate, entered, calls, _ = setup
    errors: dict = {}
    first = _start(gc, errors, "first", _vec(0.1))
    assert entered.wait(30)
    good = _start(gc, errors, "good", _vec(0.2))
    _wait_queued(gc, 1)
    bad = _start(gc, errors, "bad", np.full((1, DIM), 0.9))  # outside the ball
    _wait_queued(gc, 2)
    late = _start(gc, errors, "late", _vec(0.3))
    _wait_queued(gc, 3)
    gate.set()
    for t in (first, good, bad, late):
        t.join(30)
    assert set(errors) == {"bad"} and isinstance(errors["bad"], IndexInputError)
    assert str(errors["bad"]).startswith("vectors[0]: norm")  # its own message
    assert sorted(index.ids()) == ["first", "good", "late"]


def test_a_refusal_before_the_write_fails_the_whole_group(setup):
    index, gc, gate, entered, calls, refuse = setup
    errors: dict = {}
    first = _start(gc, errors, "first", _vec(0.1))
    assert entered.wait(30)
    threads = [_start(gc, errors, f"r{j}", _vec(0.2, j)) for j in range(3)]
    _wait_queued(gc, 3)
    refuse.append(RuntimeError("retired"))
    gate.set()
    for t in [first, *threads]:
        t.join(30)
    assert set(errors) == {"r0", "r1", "r2"}
    assert all(str(e) == "retired" for e in errors.values())
    assert index.ids() == ["first"]


def test_a_lone_writer_writes_at_once(setup):
    index, gc, gate, _, calls, _ = setup
    gate.set()
    for j in range(20):
        gc.submit([f"s{j}"], _vec(0.1 + j / 100), ["a"], [{"j": j}])
    assert len(index) == 20 and gc.groups == 20
    assert index.get("s7").payload == {"j": 7}
