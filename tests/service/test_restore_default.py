"""Restoring a snapshot of the default collection in place.

Through the Python client against a real uvicorn server on 127.0.0.1
(:class:`tests.support.server.LoopbackServer`): the items after the
restore are the snapshot's; searches running in other threads meanwhile all
succeed, each answer the old index's or the restored one's; an index job
running refuses the restore, and a restore running refuses new jobs (409 with a
detail). The folder swap (:mod:`indexing.swap`) is stopped by a crash at each
of its steps, in a subprocess, and the next open finds the old index or the
restored one whole; one crash goes through a real ``hypsearch serve``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

from service.client import Client, HypsearchError
from tests.support.server import (
    ROOT,
    LoopbackServer,
    Server,
    artifacts,
    needs_data,
    write_folder,
    write_index,
)

pytestmark = needs_data


def _items(hs: Client) -> dict:
    """Every item: id -> (label, vector, payload)."""
    out = {}
    for page in hs.scroll_all(limit=500, with_vector=True, with_payload=True):
        out[page["id"]] = (page["label"], tuple(page["vector"]), page.get("payload"))
    return out


def _answers(hs: Client, queries: np.ndarray) -> list:
    return [[(h["id"], h["distance"]) for h in hs.search(q, k=5)["results"]] for q in queries]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    torch.set_num_threads(1)
    art = artifacts(tmp_path_factory)
    folder = tmp_path_factory.mktemp("restore-default")
    data = folder / "data"
    data.mkdir()
    srv = LoopbackServer(art, folder, n=150, data_roots=str(data), job_batch_size=8)
    yield art, folder, srv
    srv.stop()


def test_restore_in_place_while_searches_run(served):
    art, folder, srv = served
    rng = np.random.default_rng(0)
    with Client(srv.url, timeout=120) as hs:
        snap_items = _items(hs)
        queries = np.array([v for _, v, _ in list(snap_items.values())[:8]]) * 0.97
        snap_answers = _answers(hs, queries)
        sid = hs.create_snapshot()
        # later writes: new items near the queries (so the answers change), deletes
        x = queries + rng.normal(scale=1e-3, size=queries.shape)
        hs.upsert_batch([{"id": f"new-{i}", "vector": x[i].tolist()} for i in range(len(x))])
        hs.delete_many(list(snap_items)[100:110])
        old_answers = _answers(hs, queries)
        assert old_answers != snap_answers and hs.stats()["items"] == 150 + 8 - 10
        # a lease held like a request in flight: the restore waits for it to finish
        services = srv.app.state.services
        lease = services.slot.try_acquire()
        assert lease is not None
        done: dict = {}

        def restore() -> None:
            with Client(srv.url, timeout=120) as c:
                done["out"] = c.restore_snapshot(sid)

        stop = threading.Event()
        seen = {"old": 0, "restored": 0}
        errors: list = []

        def search_loop(j: int) -> None:
            with Client(srv.url, timeout=120) as c:
                while not stop.is_set():
                    q = j % len(queries)
                    try:
                        got = [
                            (h["id"], h["distance"]) for h in c.search(queries[q], k=5)["results"]
                        ]
                    except Exception as e:  # noqa: BLE001 - every failure is reported
                        errors.append(repr(e))
                        continue
                    if got == old_answers[q]:
                        seen["old"] += 1
                    elif got == snap_answers[q]:
                        seen["restored"] += 1
                    else:
                        errors.append(f"query {q}: an answer of neither index: {got}")
                    j += 1

        with ThreadPoolExecutor(5) as pool:
            searches = [pool.submit(search_loop, j) for j in range(4)]
            try:
                time.sleep(0.5)
                t = pool.submit(restore)
                deadline = time.monotonic() + 30
                while not services.slot.swapping:  # the restore waits for the lease now
                    assert time.monotonic() < deadline and not t.done(), t.exception()
                    time.sleep(0.02)
                # while it runs: index jobs are refused, with a detail
                with pytest.raises(HypsearchError) as e:
                    hs.start_job(str(folder / "data"))
                assert e.value.status == 409 and "being restored" in e.value.detail
                time.sleep(0.3)  # searches queue up behind the swap meanwhile
                lease.release()
                lease = None
                t.result(timeout=60)
                time.sleep(0.5)
                stop.set()
            finally:
                stop.set()
                if lease is not None:
                    lease.release()
            for f in searches:
                f.result()
        assert not errors, errors[:5]
        assert seen["old"] > 0 and seen["restored"] > 0, seen
        assert done["out"] == {
            "collection": "default",
            "snapshot": sid,
            "restored": True,
            "items": 150,
        }
        assert _items(hs) == snap_items
        assert _answers(hs, queries) == snap_answers
        assert hs.stats()["items"] == 150
        # the restored index is the one at the path, and it takes writes
        assert (folder / "index" / "store.sqlite3").exists()
        assert [p.name for p in folder.iterdir() if p.name.startswith(".")] == [".index.swap.lock"]
        hs.put("after", queries[0] * 0.5)
        assert hs.get("after")["id"] == "after"
        hs.delete("after")


def test_a_running_job_refuses_the_restore(served):
    art, folder, srv = served
    root = folder / "data"
    write_folder(root / "pics", per_class=2)
    rows = "\n".join(f"big-{i},pics/sneaker/{i % 2:03d}.png,sneaker" for i in range(3000))
    (root / "big.csv").write_text("id,path,label\n" + rows + "\n")
    with Client(srv.url, timeout=120) as hs:
        sid = hs.create_snapshot()
        job = hs.start_job(str(root / "big.csv"))
        with pytest.raises(HypsearchError) as e:
            hs.restore_snapshot(sid)
        assert e.value.status == 409 and job["id"] in e.value.detail
        assert "cancel" in e.value.detail
        hs.cancel_job(job["id"])
        deadline = time.monotonic() + 120
        while hs.job(job["id"])["state"] in ("queued", "running"):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert hs.restore_snapshot(sid)["items"] == hs.stats()["items"]
        assert hs.count(filter={"must": [{"key": "id", "match": "big-0"}]}) == 0


def test_writes_on_a_retired_runtime_are_refused(tmp_path_factory):
    """A write that still holds the runtime an in-place restore replaced gets a 503."""
    from service.routes.errors import as_api_error
    from service.runtime import RetiredError
    from tests.support.server import make_runtime

    art = artifacts(tmp_path_factory)
    rt = make_runtime(art, tmp_path_factory.mktemp("retired"), n=20)
    try:
        rt.retire("collection: it was restored meanwhile; retry")
        with pytest.raises(RetiredError) as e:
            rt.upsert(["x"], np.zeros((1, rt.dim)), [None])
        err = as_api_error(e.value)  # the runtime's error, as the routes answer it
        assert err.status == 503 and "restored" in err.detail
        with pytest.raises(RetiredError):
            rt.delete([rt.index.ids()[0]])
        assert len(rt) == 20
    finally:
        rt.close()


# -- crashes at every step of the swap ----------------------------------------------

_SWAP = """
import os, sys
from indexing.swap import swap_in
step = sys.argv[3]
def hook(s):
    if s == step:
        os._exit(70)
swap_in(sys.argv[1], sys.argv[2], carry=("images",), hook=hook)
"""


@pytest.mark.parametrize(
    "step", ["before", "swap-marked", "swap-old-moved", "swap-new-moved", "swap-committed"]
)
def test_a_crash_at_each_step_of_the_swap_ends_whole(tmp_path_factory, step):
    """The old index (30 items) and a restored one (12 items) beside it; a process
    swapping them is stopped at ``step``; the next open gets one of them whole: the
    old one for a crash before the marker, the restored one after (rolled forward),
    with the old folder's pictures carried over and nothing left beside it."""
    from indexing import HyperbolicIndex
    from indexing.batches import open_index
    from indexing.swap import stage_path

    art = artifacts(tmp_path_factory)
    folder = tmp_path_factory.mktemp(f"swap-{step}")
    path = write_index(art, folder / "index", 30)
    with HyperbolicIndex.load(path) as old:
        ids_old = set(old.ids())
    (path / "images").mkdir()
    (path / "images" / "a.png").write_bytes(b"picture")
    stage = stage_path(path)
    x = np.random.default_rng(1).uniform(-0.1, 0.1, (12, art.labels.dim))
    with HyperbolicIndex(dim=art.labels.dim, curvature=art.labels.curvature, path=stage) as new:
        new.add(x, [f"restored-{i}" for i in range(12)])
    if step == "before":  # a crash before the marker: only the stage was written
        rc = 70
    else:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        rc = subprocess.run(
            [sys.executable, "-c", _SWAP, str(path), str(stage), step], env=env, cwd=ROOT
        ).returncode
    assert rc == 70
    ix = open_index(path, dim=art.labels.dim, curvature=art.labels.curvature)
    try:
        ids = set(ix.ids())
        if step == "before":
            assert ids == ids_old and len(ix) == 30
        else:
            assert ids == {f"restored-{i}" for i in range(12)}
            assert (path / "images" / "a.png").read_bytes() == b"picture"
        assert sorted(p.name for p in folder.iterdir()) == [".index.swap.lock", "index"]
    finally:
        ix.close()


def test_a_server_stopped_mid_restore_comes_back_whole(tmp_path_factory):
    """``hypsearch serve`` stopped (``HYPSEARCH_TEST_CRASH_AT``) after the old
    index folder moved aside and before the restored one took its place: the next
    open of the index (what a restart does first) finds the restored index, whole."""
    import httpx

    art = artifacts(tmp_path_factory)
    folder = tmp_path_factory.mktemp("restore-crash")
    index = write_index(art, folder / "index", 40)
    args = ["--labels", str(art.labels_path), "--index", str(index)]
    env = {"HYPSEARCH_HOME": str(folder / "home"), "HYPSEARCH_TEST_CRASH_AT": "swap-old-moved"}
    srv = Server(args, folder / "0.log", env=env).wait_ready(timeout=120)
    try:
        with Client(srv.url, timeout=120) as hs:
            sid = hs.create_snapshot()
            snap = _items(hs)
            hs.delete_many(list(snap)[:15])
            assert hs.stats()["items"] == 25
            with pytest.raises((httpx.HTTPError, HypsearchError)):
                hs.restore_snapshot(sid)
        assert srv.proc.wait(30) == 70
        assert not index.exists()  # stopped between the two renames
    finally:
        srv.stop()
    # the restart: the service opens its index with open_index, which finishes the swap
    from indexing.batches import open_index

    ix = open_index(index, dim=art.labels.dim, curvature=art.labels.curvature)
    try:
        assert len(ix) == 40
        got = {it.id: (it.label, tuple(it.vector.tolist())) for it in ix.get_many(ix.ids())}
        assert got == {i: (lab, vec) for i, (lab, vec, _) in snap.items()}
    finally:
        ix.close()
    assert [p.name for p in folder.iterdir() if p.name.startswith(".")] == [".index.swap.lock"]
