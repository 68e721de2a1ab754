"""Beyond one machine: the sharded index answers what one index answers; on a
local Ray cluster (started once for the module, inside a loopback-only network
namespace) the shards live in actors that restart with every acknowledged
write, and the Ray Data build gives the local build's items and vectors.

The Ray tests are marked ``ray`` (``pytest -m ray``); they skip when the
``ray`` extra is not installed or when the process is not in a network
namespace that has only ``lo`` (``make test`` makes one when run as root), and
fail instead under CI (``CI=true``; :mod:`tests.support.ray_cluster`).
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from indexing import HyperbolicIndex, IndexInputError, IndexStoreError
from indexing.sharded import ShardedIndex, ShardUnavailableError, shard_of
from tests.support.cloud import chain_up
from tests.support.ray_cluster import ray_cluster_fixture

DIM = 6
#: a small tree of labels: root -> a, b; a -> a1, a2; b -> b1, b2
PARENT = {"root": None, "a": "root", "b": "root", "a1": "a", "a2": "a", "b1": "b", "b2": "b"}
LEAVES = ["a1", "a2", "b1", "b2"]


def descendants(label: str) -> set[str]:
    out = set()
    for n in PARENT:
        p = PARENT[n]
        while p is not None:
            if p == label:
                out.add(n)
                break
            p = PARENT[p]
    return out


def chain_of(label: str) -> list[str]:
    return chain_up(PARENT, label)


def items(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, DIM))
    x *= (rng.uniform(0.05, 0.95, size=n) / np.linalg.norm(x, axis=1))[:, None]
    ids = [f"item-{seed}-{i}" for i in range(n)]
    labels = [LEAVES[i % len(LEAVES)] for i in range(n)]
    payloads = [{"row": i} for i in range(n)]
    return x, ids, labels, payloads


def assert_same_answers(single, sharded, queries) -> None:
    """Nearest (with and without the label and ``under`` filters, k beyond the
    size) and hierarchical (each page of 13) answers are equal: ids and distances."""
    n = len(single)
    for k, filters in (
        (1, {}),
        (10, {}),
        (n + 5, {}),
        (8, {"labels": {"a1", "b2"}}),
        (8, {"under": {"a2"}}),
        (5, {"labels": {"a1"}, "under": {"a1", "a2"}}),
    ):
        ids1, d1 = single.search(queries, k=k, **filters)
        ids2, d2 = sharded.search(queries, k=k, **filters)
        assert ids1.shape == ids2.shape, (k, filters)
        np.testing.assert_array_equal(ids1, ids2)
        np.testing.assert_array_equal(d1, d2)
    for qi, q in enumerate(queries[:2]):
        chain = chain_of(LEAVES[qi % len(LEAVES)])
        for by in ("holder", "label"):
            whole = single.search_hierarchical(q, chain, descendants, k=n, by=by)
            assert len(whole) == n
            got = []
            for offset in range(0, n + 13, 13):
                page = sharded.search_hierarchical(
                    q, chain, descendants, k=13, offset=offset, by=by
                )
                assert page == single.search_hierarchical(
                    q, chain, descendants, k=13, offset=offset, by=by
                )
                got += page
            assert got == whole
        filt = {"labels": {"a2", "b1"}}
        assert sharded.search_hierarchical(
            q, chain, descendants, k=9, offset=2, **filt
        ) == single.search_hierarchical(q, chain, descendants, k=9, offset=2, **filt)


def fill(index, n: int, seed: int = 0) -> None:
    x, ids, labels, payloads = items(n, seed)
    for lo in range(0, n, 37):  # several batches
        sl = slice(lo, lo + 37)
        index.add(x[sl], ids[sl], labels=labels[sl], payloads=payloads[sl])


#: filters of every kind: payload match / in / range, label, id, under, nested, empty
FILTERS = [
    {},
    {"must": [{"key": "payload.color", "match": "red"}]},
    {"must": [{"key": "payload.row", "range": {"gte": 20, "lt": 90}}]},
    {"should": [{"key": "label", "in": ["a1", "b2"]}, {"key": "payload.tags", "match": "t1"}]},
    {"must_not": [{"key": "payload.color", "in": ["red", "blue"]}], "must": [{"under": "a"}]},
    {"must": [{"key": "id", "in": [f"item-0-{i}" for i in range(0, 200, 3)]}]},
    {"must": [{"must_not": [{"key": "payload.missing", "match": 1}]}]},
    {"must": [{"key": "payload.color", "match": "none-such"}]},
]


def fill_rich(index, n: int) -> None:
    """``fill`` with payloads that filters can tell apart (colours, tags, a row)."""
    x, ids, labels, _ = items(n)
    pays = [
        {"row": i, "color": ["red", "blue", "green"][i % 3], "tags": [f"t{i % 4}", f"t{i % 5}"]}
        for i in range(n)
    ]
    for lo in range(0, n, 37):
        sl = slice(lo, lo + 37)
        index.add(x[sl], ids[sl], labels=labels[sl], payloads=pays[sl])


def under_a(label: str, where: str) -> set[str]:
    return {label} | descendants(label)


def full_scroll(index, where, limit: int) -> list[tuple[list[str], str | None]]:
    pages, after = [], None
    while True:
        page = index.scroll(where, limit, after)
        pages.append(page)
        if page[1] is None:
            return pages
        after = page[1]


def assert_same_records(single, sharded) -> None:
    """get, get_many, item_labels, contains_many, count, filter_mask, scroll (page by
    page) and delete_where answer what one index over the same items answers; bad
    input raises the same error (the shard's own, not a wrapper)."""
    from indexing.filters import parse_filter

    ids = [f"item-0-{i}" for i in (7, 3, 150, 999, 0)]
    for vectors in (True, False):
        a, b = single.get_many(ids, vectors=vectors), sharded.get_many(ids, vectors=vectors)
        assert [it.id for it in a] == [it.id for it in b] == [i for i in ids if i in single]
        for x, y in zip(a, b, strict=True):
            assert (x.label, x.payload, x.holder) == (y.label, y.payload, y.holder)
            np.testing.assert_array_equal(x.vector, y.vector)
    assert sharded.get_many([]) == []
    assert sharded.item_labels() == single.item_labels()
    assert sharded.contains_many(ids) == single.contains_many(ids)
    assert sharded.count() == single.count() == len(single)
    for raw in FILTERS:
        f = parse_filter(raw, under_of=under_a)
        n = single.count(f)
        assert sharded.count(f) == n, raw
        assert sharded.count(raw) == single.count(raw), raw  # unparsed: under covers itself
        assert np.count_nonzero(sharded.filter_mask(f)) == n, raw
        for limit in (1, 7, 500):
            assert full_scroll(sharded, f, limit) == full_scroll(single, f, limit), (raw, limit)
        listed = [i for page, _ in full_scroll(sharded, f, 9) for i in page]
        assert len(listed) == len(set(listed)) == n  # every item exactly once
    assert sharded.scroll(None, 5, "item-0-50") == single.scroll(None, 5, "item-0-50")
    assert sharded.scroll(None, 5, "zzz") == single.scroll(None, 5, "zzz") == ([], None)
    for call in (
        lambda ix: ix.scroll(None, 0),
        lambda ix: ix.scroll(None, 5, 17),
        lambda ix: ix.count({"must": [{"key": "x", "match": 1}]}),
        lambda ix: ix.get_many(["a", "a"]),
        lambda ix: ix.delete_where({"must": [{"key": "payload.row", "range": {"gt": "a"}}]}),
        lambda ix: ix.search_hierarchical(
            np.zeros(DIM), ["a1", "a", "root"], descendants, by="nope"
        ),
    ):
        with pytest.raises(IndexInputError) as want:
            call(single)
        with pytest.raises(IndexInputError) as got:
            call(sharded)
        assert str(got.value) == str(want.value)
    # delete by filter: the same ids, and the same state after
    f = {"must": [{"key": "payload.color", "match": "green"}, {"under": "b"}]}
    f = parse_filter(f, under_of=under_a)
    gone = single.delete_where(f)
    assert sorted(sharded.delete_where(f)) == sorted(gone) and gone
    assert sharded.delete_where(f) == []
    assert sharded.count() == single.count()
    assert full_scroll(sharded, None, 11) == full_scroll(single, None, 11)


# ---------------------------------------------------------------- without Ray


def test_routing_is_a_stable_hash():
    # blake2b of the id (8 bytes, big-endian) mod n: fixed across processes and runs
    assert [shard_of(f"id-{i}", 4) for i in range(8)] == [shard_of(f"id-{i}", 4) for i in range(8)]
    assert shard_of("fashion-mnist-test-0", 1) == 0
    counts = np.bincount([shard_of(f"x{i}", 4) for i in range(4000)], minlength=4)
    assert counts.min() > 850  # spread evenly


@pytest.mark.parametrize("shards", [2, 4])
def test_local_shards_answer_what_one_index_answers(tmp_path, shards):
    single = HyperbolicIndex(dim=DIM, backend="exact")
    sharded = ShardedIndex(tmp_path / "ix", shards=shards, dim=DIM, backend="exact")
    fill(single, 150)
    fill(sharded, 150)
    gone = [f"item-0-{i}" for i in range(0, 150, 11)]
    assert single.delete(gone) == sharded.delete(gone + ["nope"]) == len(gone)
    assert len(sharded) == len(single) == 150 - len(gone)
    assert sorted(sharded.ids()) == sorted(single.ids())
    a, b = sharded.get("item-0-1"), single.get("item-0-1")
    assert (a.id, a.label, a.payload, a.holder) == (b.id, b.label, b.payload, b.holder)
    np.testing.assert_array_equal(a.vector, b.vector)
    assert sharded.get("item-0-0") is None and "item-0-0" not in sharded
    queries = items(12, seed=1)[0]
    assert_same_answers(single, sharded, queries)
    sharded.close()
    again = ShardedIndex.load(tmp_path / "ix")  # snapshot + store per shard
    assert_same_answers(single, again, queries)
    with pytest.raises(IndexStoreError, match="holds 2 shards|holds 4 shards"):
        ShardedIndex(tmp_path / "ix", shards=shards + 1)
    again.close()


def check_reads_as_one_index(path, shards: int, ray: bool) -> None:
    """The same 200 rich records in one index and in ``shards`` shards read the same."""
    single = HyperbolicIndex(dim=DIM, backend="exact")
    sharded = ShardedIndex(path, shards=shards, dim=DIM, backend="exact", ray=ray)
    try:
        fill_rich(single, 200)
        fill_rich(sharded, 200)
        assert_same_records(single, sharded)
    finally:
        sharded.close()
        single.close()


@pytest.mark.parametrize("shards", [1, 3])
def test_local_shards_read_filter_scroll_and_delete_as_one_index(tmp_path, shards):
    check_reads_as_one_index(tmp_path / "ix", shards, ray=False)


def test_bad_input_writes_nothing_on_any_shard(tmp_path):
    sharded = ShardedIndex(tmp_path / "ix", shards=3, dim=DIM)
    x, ids, labels, _ = items(20)
    x[13] *= 2 / np.linalg.norm(x[13])  # outside the ball
    with pytest.raises(IndexInputError, match=r"^vectors\[13\]"):
        sharded.add(x, ids, labels=labels)
    with pytest.raises(IndexInputError, match=r"^ids\[1\]: duplicate"):
        sharded.add(x[:2] * 0, ["same", "same"])
    assert len(sharded) == 0
    sharded.close()


# ---------------------------------------------------------------- on a local Ray cluster


ray_cluster = ray_cluster_fixture()  # one local cluster for the module

ray_mark = pytest.mark.ray


@ray_mark
def test_ray_shards_answer_what_one_index_answers(tmp_path, ray_cluster):
    single = HyperbolicIndex(dim=DIM, backend="exact")
    sharded = ShardedIndex(tmp_path / "ix", shards=2, dim=DIM, backend="exact", ray=True)
    try:
        fill(single, 200)
        fill(sharded, 200)
        assert len(sharded) == 200 and "item-0-5" in sharded
        assert sharded.contains_many(["item-0-5", "nope"]) == [True, False]
        assert_same_answers(single, sharded, items(6, seed=2)[0])
        # another process of the cluster opening the folder finds the same actors
        other = ShardedIndex(tmp_path / "ix", ray=True)
        assert [s["pid"] for s in other.shard_info()] == [s["pid"] for s in sharded.shard_info()]
        other.close()  # not the owner: the shards keep serving
        assert len(sharded) == 200
        # fail-fast reads go through the shards' direct channels: the same answers
        fast = ShardedIndex(tmp_path / "ix", ray=True, fail_fast=True)
        assert all(c is not None for c in fast._shards.channels) and not fast._shards.elsewhere
        assert_same_answers(single, fast, items(6, seed=2)[0])
        plan = ("search", (items(3, seed=7)[0],), {"k": 4})
        bad = ("search_hierarchical", (np.zeros(DIM), ["a1", "a", "root"], descendants),
               {"by": "nope"})  # fmt: skip
        got = fast.run_calls([plan, bad, plan])
        want = sharded.run_calls([plan, bad, plan])
        for g, w in ((got[0], want[0]), (got[2], want[2])):
            np.testing.assert_array_equal(g[0], w[0])
            np.testing.assert_array_equal(g[1], w[1])
        assert isinstance(got[1], IndexInputError) and str(got[1]) == str(want[1])
        with pytest.raises(IndexInputError) as e:  # the shard's own error, as it was raised
            fast.count({"must": [{"key": "x", "match": 1}]})
        with pytest.raises(IndexInputError) as e0:
            single.count({"must": [{"key": "x", "match": 1}]})
        assert str(e.value) == str(e0.value)
        slow = ShardedIndex(tmp_path / "ix", ray=True, fail_fast=True, channel=False)
        assert slow._shards.channels == [None, None]
        assert_same_answers(single, slow, items(2, seed=8)[0])
        fast.close(), slow.close()
    finally:
        sharded.close()
    assert not any(ray_cluster.util.list_named_actors(all_namespaces=True)) or all(
        "hypsearch-shard" not in str(a) for a in ray_cluster.util.list_named_actors(True)
    )


@ray_mark
def test_ray_shards_read_filter_scroll_and_delete_as_one_index(tmp_path, ray_cluster):
    check_reads_as_one_index(tmp_path / "ix", 2, ray=True)


@ray_mark
def test_killed_shard_restarts_with_every_acknowledged_write(tmp_path, ray_cluster):
    sharded = ShardedIndex(tmp_path / "ix", shards=2, dim=DIM, ray=True, timeout=60)
    x, ids, labels, _ = items(400, seed=3)
    acked: list[str] = []
    errors: list[Exception] = []

    def writer():
        for lo in range(0, 400, 10):
            try:
                sharded.add(x[lo : lo + 10], ids[lo : lo + 10], labels=labels[lo : lo + 10])
                acked.extend(ids[lo : lo + 10])
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(e)

    try:
        before = sharded.shard_info()
        t = threading.Thread(target=writer)
        t.start()
        while len(acked) < 100:
            time.sleep(0.01)
        victim = sharded._shards.actors[0]
        ray_cluster.kill(victim, no_restart=False)  # during the writes
        t.join(120)
        assert not t.is_alive() and not errors, errors
        after = sharded.shard_info()  # waits for the restarted actor
        assert after[0]["pid"] != before[0]["pid"]  # a new process...
        assert after[1]["pid"] == before[1]["pid"]
        assert set(sharded.ids()) == set(acked) == set(ids)  # ...with every write
        ray_cluster.kill(victim, no_restart=False)  # after the writes
        got, _ = sharded.search(x[:1], k=1)  # waits for the restart, then answers
        assert got[0, 0] == ids[0]
        assert len(sharded) == 400
        assert sharded.get(ids[7]).label == labels[7]
    finally:
        sharded.close()


def _wait_dead(ray, actor, timeout: float = 60.0) -> None:
    """Until a killed actor no longer answers (ray.kill only sends the kill)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            ray.get(actor.__ray_ready__.remote(), timeout=5)
        except Exception:  # RayActorError once it is gone (or a timeout: it does not answer)
            return
        time.sleep(0.1)
    raise AssertionError(f"actor still answers {timeout:.0f} s after ray.kill")


@ray_mark
def test_a_shard_that_stays_down_fails_the_query_clearly(tmp_path, ray_cluster):
    sharded = ShardedIndex(tmp_path / "ix", shards=2, dim=DIM, ray=True, timeout=2)
    try:
        fill(sharded, 20)
        assert sharded.search(items(1, seed=4)[0], k=3)[0].shape == (1, 3)
        gone = sharded._shards.actors[1]
        ray_cluster.kill(gone, no_restart=True)
        _wait_dead(ray_cluster, gone)  # the kill is asynchronous: a loaded machine lags
        with pytest.raises(ShardUnavailableError, match=r"^shard 1 of 2 .* did not answer"):
            sharded.search(items(1, seed=4)[0], k=3)
    finally:
        sharded._shards.owned[1] = False  # gone already
        sharded.close()


@ray_mark
def test_fail_fast_reads_answer_at_once_while_a_shard_restarts(tmp_path, ray_cluster):
    """``fail_fast``: a search that meets a restarting shard fails within about
    ``PROBE_SECONDS`` naming it, never waits for the restart; writes still wait;
    once the shard is back, reads answer again with every item (through a channel
    to the new process: the fail-fast reads go by the shards' direct channels)."""
    from indexing.shards import PROBE_SECONDS

    sharded = ShardedIndex(tmp_path / "ix", shards=2, dim=DIM, ray=True, fail_fast=True)
    try:
        x, ids, labels, _ = items(60, seed=5)
        sharded.add(x, ids, labels=labels)
        pid = sharded.shard_info()[0]["pid"]
        ray_cluster.kill(sharded._shards.actors[0], no_restart=False)
        t0 = time.monotonic()
        with pytest.raises(ShardUnavailableError, match=r"^shard 0 of 2 .* did not answer"):
            for _ in range(50):  # the kill is asynchronous: until a search meets it
                sharded.search(x[:1], k=3)
                time.sleep(0.05)
        assert time.monotonic() - t0 < 3 * PROBE_SECONDS + 3
        t0 = time.monotonic()
        with pytest.raises(ShardUnavailableError):  # known down: asked at once, no wait
            sharded.search(x[:1], k=3)
        assert time.monotonic() - t0 < PROBE_SECONDS + 1
        more = items(4, seed=6)
        sharded.add(more[0], more[1])  # a write waits for the restart
        assert sharded.shard_info()[0]["pid"] != pid
        # the reads' channel to the new process is opened again, once it answers
        got, _ = sharded.search(x[:1], k=1)
        assert got[0, 0] == ids[0] and len(sharded) == 64
        assert sharded._shards.channels[0] is not None
        assert sharded.get_many(ids[:5], vectors=False)[4].id == ids[4]
    finally:
        sharded.close()


@ray_mark
def test_ray_build_gives_the_local_build_item_for_item(tmp_path, tmp_path_factory, ray_cluster):
    import torch

    from indexing.batches import open_index
    from service.ingest.build import build_index
    from service.ingest.plans import plan_dataset
    from service.ingest.ray_build import ray_build_index
    from tests.support.server import FMNIST, artifacts, needs_data

    if needs_data.args[0]:
        pytest.skip(needs_data.kwargs["reason"])
    torch.set_num_threads(1)
    art = artifacts(tmp_path_factory)
    model = art.model
    plan = plan_dataset("fashion-mnist", "test", FMNIST)
    plan.sources = plan.sources[:300]
    local = open_index(tmp_path / "local", dim=model.dim, curvature=model.curvature)
    build_index(model, local, plan, batch_size=64, workers=0)
    sharded = ShardedIndex(
        tmp_path / "sharded", shards=2, dim=model.dim, curvature=model.curvature, ray=True
    )
    try:
        half = plan_dataset("fashion-mnist", "test", FMNIST)
        half.sources = plan.sources[:100]  # a build cut short, then resumed
        r1 = ray_build_index(str(art.model_path), model, sharded, half, batch_size=64, workers=1)
        r2 = ray_build_index(str(art.model_path), model, sharded, plan, batch_size=64, workers=1)
        assert (r1.indexed, r2.indexed, r2.skipped["already indexed"]) == (100, 200, 100)
        assert sorted(sharded.ids()) == sorted(local.ids())
        for item_id in local.ids()[::7]:
            a, b = local.get(item_id), sharded.get(item_id)
            assert (a.label, a.payload, a.holder) == (b.label, b.payload, b.holder)
            np.testing.assert_array_equal(a.vector, b.vector)
        q = local.get(local.ids()[3]).vector
        np.testing.assert_array_equal(local.search(q, k=20)[0], sharded.search(q, k=20)[0])
    finally:
        sharded.close()
        local.close()


def test_ray_flags_refuse_bad_input_in_one_line(tmp_path, capsys, monkeypatch):
    import sys

    from service.cli import main

    model = tmp_path / "model.safetensors"
    model.write_bytes(b"")  # never read: the flags are checked first
    build = ["index", "build", "--model", str(model), "--dataset", "fashion-mnist"]
    cases = [
        (
            build + ["--out", str(tmp_path / "a"), "--ray", "127.0.0.1:1"],
            "--ray 127.0.0.1:1: no Ray",
        ),
        (build + ["--out", str(tmp_path / "a"), "--ray", "nowhere"], "--ray nowhere: expected"),
        (build + ["--out", str(tmp_path / "a"), "--shards", "2"], "--shards: needs --ray"),
        (["serve", "--model", str(model), "--shards", "2"], "--ray ADDRESS and --shards N"),
    ]
    for argv, message in cases:
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert message in err and "\n" not in err, err
    monkeypatch.setitem(sys.modules, "ray", None)  # the extra is not installed
    assert main(build + ["--out", str(tmp_path / "a"), "--ray", "auto"]) == 2
    assert "pip install -e '.[ray]'" in capsys.readouterr().err


@ray_mark
def test_serve_on_ray_answers_like_the_single_service(tmp_path, tmp_path_factory, ray_cluster):
    """``hypsearch serve --ray ADDRESS --shards 2 --replicas 2`` as a real process on
    the module's cluster answers what the single-process service answers over the same
    items; writes reach the shards, and need the serving process's
    ``HYPSEARCH_API_KEY`` (a replica runs in a Ray worker with the node's environment:
    the settings travel with it); bad input gets 4xx; SIGTERM stops it cleanly and
    leaves no Serve application and no shard actor behind."""
    import signal

    import httpx
    import torch
    from fastapi.testclient import TestClient

    from service.app import create_app
    from service.runtime import open_runtime
    from service.settings import Settings
    from tests.support.server import Server, artifacts, fill_index, needs_data, write_index

    if needs_data.args[0]:
        pytest.skip(needs_data.kwargs["reason"])
    torch.set_num_threads(1)
    art = artifacts(tmp_path_factory)
    n = 200
    write_index(art, tmp_path / "single", n)
    sharded = ShardedIndex(
        tmp_path / "sharded", shards=2, dim=art.model.dim, curvature=art.model.curvature
    )
    fill_index(sharded, art.model, n)  # in this process; the service opens it on Ray
    sharded.close()
    settings = Settings(
        model=art.model_path, index=tmp_path / "single", log_json=False, log_level="WARNING"
    )
    single = TestClient(create_app(settings, runtime=open_runtime(settings), owns_runtime=True))
    address = ray_cluster.get_runtime_context().gcs_address
    srv = Server(
        ["--model", str(art.model_path), "--index", str(tmp_path / "sharded"), "--threads", "1"]
        + ["--ray", address, "--shards", "2", "--replicas", "2"],
        tmp_path / "serve.log",
        env={"HYPSEARCH_API_KEY": "replica-key-0123456789"},
    )
    auth = {"Authorization": "Bearer replica-key-0123456789"}
    try:
        srv.wait_ready(180)
        with single, httpx.Client(base_url=srv.url, timeout=60) as c:
            assert c.get("/v1/stats").json()["items"] == n
            vec = [0.05 * ((-1) ** i) for i in range(art.model.dim)]
            for body in (
                {"vector": vec, "k": 15},
                {"vector": vec, "k": 7, "offset": 9},
                {"label": "sneaker", "mode": "hierarchical", "k": 40},
                {"label": "sneaker", "mode": "hierarchical", "k": 25, "offset": 30},
                {"label": "bag", "mode": "hierarchical", "k": 10},
            ):
                want = single.post("/v1/search", json=body)
                got = c.post("/v1/search", json=body)
                assert want.status_code == got.status_code == 200, (body, got.text)
                w, g = want.json(), got.json()
                assert len(w["results"]) == body["k"]
                assert [(h["id"], h["distance"], h["level"], h["via"]) for h in g["results"]] == [
                    (h["id"], h["distance"], h["level"], h["via"]) for h in w["results"]
                ], body
                assert g["query"]["label"] == w["query"]["label"]
            # a write through the service reaches the shards, seen by whichever replica answers
            new = [0.3] + [0.0] * (art.model.dim - 1)
            one = {"vector": new, "label": "gym_shoe.n.01"}
            assert c.put("/v1/items/new-one", json=one).status_code == 401  # the key holds
            put = c.put("/v1/items/new-one", json=one, headers=auth)
            assert put.status_code in (200, 201), put.text
            for _ in range(4):  # answered by either replica
                hit = c.post("/v1/search", json={"vector": new, "k": 1}).json()["results"][0]
                assert (hit["id"], hit["distance"]) == ("new-one", 0.0)
            assert c.get("/v1/stats").json()["items"] == n + 1
            assert c.get("/v1/items/new-one").json()["label"] == "gym_shoe.n.01"
            # bad input: 4xx with a detail, nothing stored
            for method, path, body in (
                ("post", "/v1/search", {"vector": [0.1, 0.2], "k": 3}),
                ("post", "/v1/search", {"vector": [0.9] * art.model.dim, "k": 3}),
                ("post", "/v1/search", {"label": "no-such-label-x", "k": 3}),
                ("post", "/v1/search", {"vector": vec, "k": 0}),
                ("put", "/v1/items/bad-one", {"vector": [2.0] * art.model.dim}),
            ):
                r = getattr(c, method)(path, json=body, headers=auth)
                assert 400 <= r.status_code < 500 and r.json().get("detail"), (body, r.text)
            assert c.get("/v1/items/bad-one").status_code == 404
            assert c.get("/v1/stats").json()["items"] == n + 1
    finally:
        rc = srv.stop(signal.SIGTERM, timeout=180)  # Serve shuts down slowly on a loaded machine
    assert rc == 0, srv.tail()
    left = [str(a) for a in ray_cluster.util.list_named_actors(all_namespaces=True)]
    assert not [a for a in left if "SERVE" in a or "hypsearch-shard" in a], left
    with pytest.raises(httpx.HTTPError):
        httpx.get(srv.url + "/readyz", timeout=2)
    again = ShardedIndex.load(tmp_path / "sharded")  # the write is durable in its shard
    assert len(again) == n + 1 and again.get("new-one") is not None
    again.close()


@ray_mark
def test_serve_on_ray_stops_cleanly_when_told_to_while_it_still_starts(
    tmp_path, tmp_path_factory, ray_cluster
):
    """A SIGTERM that comes while ``serve.run`` still waits for its replicas (the proxy
    may already route to the first) is a clean stop: exit 0, no Serve application and
    no shard actor left -- not Ray's fatal-signal dump and rc 15."""
    import signal

    import torch

    from tests.support.server import Server, artifacts, fill_index, needs_data

    if needs_data.args[0]:
        pytest.skip(needs_data.kwargs["reason"])
    torch.set_num_threads(1)
    art = artifacts(tmp_path_factory)
    sharded = ShardedIndex(
        tmp_path / "sharded", shards=2, dim=art.model.dim, curvature=art.model.curvature
    )
    fill_index(sharded, art.model, 50)
    sharded.close()
    srv = Server(
        ["--model", str(art.model_path), "--index", str(tmp_path / "sharded"), "--threads", "1"]
        + ["--ray", ray_cluster.get_runtime_context().gcs_address, "--shards", "2"]
        + ["--replicas", "2"],
        tmp_path / "serve.log",
    )
    deadline = time.monotonic() + 180
    while "Started Serve" not in srv.tail():
        assert srv.proc.poll() is None and time.monotonic() < deadline, srv.tail()
        time.sleep(0.05)
    rc = srv.stop(signal.SIGTERM, timeout=180)
    assert rc == 0, srv.tail()
    assert "SIGTERM received" not in srv.log.read_text(errors="replace")
    left = [str(a) for a in ray_cluster.util.list_named_actors(all_namespaces=True)]
    assert not [a for a in left if "SERVE" in a or "hypsearch-shard" in a], left
