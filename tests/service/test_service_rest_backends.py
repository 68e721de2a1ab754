"""The vector-database REST checks against both ways of serving: one process
(``hypsearch serve``) and a Ray-sharded server (``hypsearch serve --ray ADDRESS
--shards 2``), each a real server process on loopback over the same 200
Fashion-MNIST test items, with ``HYPSEARCH_API_KEY`` and a small
``HYPSEARCH_MAX_BATCH_ITEMS`` in its environment.

Every test runs under the parametrised fixture ``server`` (``local`` and
``ray``): payloads, filters, batches, get many, scroll, count, delete by ids
and by filter, batch searches, the key on every write and the limits. The Ray
server runs the app in its own process over two shard actors (the Ray Serve
replicas of ``--replicas R``, in Ray workers with the node's environment, are
held to the key in ``tests/indexing/test_ray.py``). It runs on a local cluster
started for this module (:mod:`tests.support.ray_cluster`: skipped outside a
loopback-only network namespace, failed under CI).
"""

from __future__ import annotations

import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch

from indexing.sharded import ShardedIndex
from tests.support.ray_cluster import start_local_ray
from tests.support.rest import (
    check_filtered_search,
    check_search_batch,
    detail_of,
    random_vector,
)
from tests.support.server import Server, artifacts, fill_index, needs_data, write_index

pytestmark = [needs_data]

N = 200
KEY = "rest-backends-key-0123"
AUTH = {"Authorization": f"Bearer {KEY}"}
MAX_BATCH = 60


@dataclass
class Served:
    kind: str
    client: httpx.Client
    dim: int
    curvature: float
    index: Path
    ray: Any = None

    def items(self) -> int:
        return self.client.get("/v1/stats").json()["items"]


@pytest.fixture(scope="module")
def cluster():
    """A local Ray cluster, started only when the ``ray`` server is asked for."""
    state: dict = {}

    def get():
        if "ray" not in state:
            state["ray"] = start_local_ray()
        return state["ray"]

    yield get
    if "ray" in state:
        state["ray"].shutdown()


@pytest.fixture(scope="module", params=["local", "ray"])
def server(request, tmp_path_factory, cluster):
    torch.set_num_threads(1)
    art = artifacts(tmp_path_factory)
    if art.model_path is None:
        pytest.skip("the model checkpoint cannot be written")
    folder = tmp_path_factory.mktemp(f"rest-{request.param}")
    args = ["--model", str(art.model_path), "--index", str(folder / "index"), "--threads", "1"]
    ray = None
    if request.param == "local":
        write_index(art, folder / "index", N)
    else:
        ray = cluster()
        sharded = ShardedIndex(
            folder / "index", shards=2, dim=art.model.dim, curvature=art.model.curvature
        )
        fill_index(sharded, art.model, N)  # in this process; the server opens it on Ray
        sharded.close()
        args += ["--ray", ray.get_runtime_context().gcs_address, "--shards", "2"]
    env = {"HYPSEARCH_API_KEY": KEY, "HYPSEARCH_MAX_BATCH_ITEMS": str(MAX_BATCH)}
    srv = Server(args, folder / "serve.log", env=env)
    try:
        srv.wait_ready(240 if request.param == "ray" else 120)
        with httpx.Client(base_url=srv.url, timeout=60) as c:
            curvature = c.get("/v1/stats").json()["curvature"]
            yield Served(request.param, c, art.model.dim, curvature, folder / "index", ray)
    finally:
        rc = srv.stop(signal.SIGTERM, timeout=180)
    if request.param == "ray":  # Serve, then the shards, stopped cleanly
        assert rc == 0, srv.tail()


def _items(dim, n, prefix, rng, **payload):
    return [
        {
            "id": f"{prefix}{j:03d}",
            "vector": random_vector(rng, dim, rng.uniform(0.2, 0.8)),
            "label": "sneaker" if j % 2 else "sandal",
            "payload": {"n": j, "color": ["red", "blue"][j % 2], **payload},
        }
        for j in range(n)
    ]


def _scroll(c, body) -> list[str]:
    seen, cursor = [], None
    for _ in range(1000):
        r = c.post("/v1/scroll", json={**body, "cursor": cursor})
        assert r.status_code == 200, r.text
        seen += [it["id"] for it in r.json()["items"]]
        cursor = r.json()["next_cursor"]
        if cursor is None:
            return seen
    raise AssertionError("the scroll did not end")


def test_every_write_needs_the_key(server):
    c, rng = server.client, np.random.default_rng(5)
    before = server.items()
    items = _items(server.dim, 3, "nokey-", rng)
    one = {"vector": items[0]["vector"], "label": "sneaker"}
    writes = [
        ("post", "/v1/items/batch", {"json": {"items": items}}),
        ("put", "/v1/items/nokey-x", {"json": one}),
        ("delete", "/v1/items/fashion-mnist-test-0", {}),
        ("post", "/v1/items/delete", {"json": {"ids": ["fashion-mnist-test-1"]}}),
        ("post", "/v1/items/delete", {"json": {"filter": {"must": [{"under": "sneaker"}]}}}),
    ]
    for headers in ({}, {"Authorization": "Bearer wrong-key-0123456"}, {"Authorization": KEY}):
        for method, path, kw in writes:
            r = getattr(c, method)(path, headers=headers, **kw)
            assert r.status_code == 401, (server.kind, method, path, headers, r.text)
            assert detail_of(r).startswith("authorization:")
    assert server.items() == before
    got = c.post("/v1/items/get", json={"ids": ["nokey-000", "nokey-x", "fashion-mnist-test-0"]})
    assert [it["id"] for it in got.json()["items"]] == ["fashion-mnist-test-0"]
    r = c.put("/v1/items/nokey-x", json=one, headers=AUTH)  # with the key: written
    assert r.status_code in (200, 201), r.text
    assert c.delete("/v1/items/nokey-x", headers=AUTH).status_code in (200, 204)
    assert server.items() == before


def test_batch_upsert_get_count_scroll_delete(server):
    c, rng = server.client, np.random.default_rng(0)
    before = server.items()
    items = _items(server.dim, 40, "pb-", rng, group="pb")
    r = c.post("/v1/items/batch", json={"items": items}, headers=AUTH)
    assert r.status_code == 200, r.text
    assert r.json() == {"upserted": 40} and server.items() == before + 40
    # get many: in the order asked, absent ids left out, vector/payload on request
    r = c.post("/v1/items/get", json={"ids": ["pb-003", "nope", "pb-001"]})
    assert r.status_code == 200, r.text
    got = r.json()["items"]
    assert [g["id"] for g in got] == ["pb-003", "pb-001"] and "payload" not in got[0]
    assert got[0]["label"] == "gym_shoe.n.01" and "vector" not in got[0]
    body = {"ids": ["pb-003", "pb-010"], "with_vector": True, "with_payload": True}
    r = c.post("/v1/items/get", json=body)
    assert r.status_code == 200, r.text
    g = r.json()["items"]
    np.testing.assert_allclose(g[0]["vector"], items[3]["vector"])
    assert g[0]["payload"] == {"n": 3, "color": "blue", "group": "pb", "label_source": "given"}
    assert g[1]["payload"]["n"] == 10
    # count with filters (payload, label, under, nested)
    group = {"key": "payload.group", "match": "pb"}

    def count(f):
        r = c.post("/v1/count", json={"filter": f})
        assert r.status_code == 200, r.text
        return r.json()["count"]

    assert count({"must": [group]}) == 40
    assert count({"must": [group, {"key": "payload.color", "match": "red"}]}) == 20
    assert count({"must": [group, {"key": "payload.n", "range": {"gte": 10, "lt": 15}}]}) == 5
    assert count({"must": [group, {"under": "sneaker"}]}) == 20
    assert count({"must": [group, {"under": "footwear"}]}) == 40
    assert count({"must": [group], "must_not": [{"key": "payload.n", "in": [1, 2]}]}) == 38
    assert count({"must": [{"key": "label", "match": "bag.n.04"}]}) > 0
    assert c.post("/v1/count", json={}).json()["count"] == before + 40
    # scroll: pages in id order, every item once, with and without a filter
    assert _scroll(c, {"filter": {"must": [group]}, "limit": 7}) == [it["id"] for it in items]
    everything = _scroll(c, {"limit": 33})
    assert everything == sorted(everything) and len(set(everything)) == before + 40
    r = c.post("/v1/scroll", json={"filter": {"must": [group]}, "limit": 3, "with_payload": True})
    page = r.json()["items"]
    assert [p["payload"]["n"] for p in page] == [0, 1, 2]
    r = c.post("/v1/scroll", json={"cursor": "!!not-a-cursor"})
    assert 400 <= r.status_code < 500 and detail_of(r).startswith("cursor")
    # delete by ids, then by filter
    r = c.post("/v1/items/delete", json={"ids": ["pb-000", "pb-001", "absent"]}, headers=AUTH)
    assert r.status_code == 200 and r.json() == {"deleted": 2}, r.text
    r = c.post("/v1/items/delete", json={"filter": {"must": [group]}}, headers=AUTH)
    assert r.status_code == 200 and r.json() == {"deleted": 38}, r.text
    assert server.items() == before and count({"must": [group]}) == 0


def test_a_bad_batch_stores_nothing_and_the_limits_hold(server):
    c, rng = server.client, np.random.default_rng(1)
    before = server.items()
    items = _items(server.dim, 6, "bad-", rng)
    items[3]["vector"] = [0.9] * server.dim
    r = c.post("/v1/items/batch", json={"items": items}, headers=AUTH)
    assert r.status_code == 422 and "items[3].vector: norm" in detail_of(r), r.text
    items = _items(server.dim, 6, "bad-", rng)
    items[4]["label"] = "snekaer"
    r = c.post("/v1/items/batch", json={"items": items}, headers=AUTH)
    assert r.status_code == 422 and "items[4].label" in detail_of(r), r.text
    assert server.items() == before
    assert c.post("/v1/items/get", json={"ids": ["bad-000"]}).json() == {"items": []}
    # HYPSEARCH_MAX_BATCH_ITEMS of the server's environment holds on every replica
    many = _items(server.dim, MAX_BATCH + 1, "lim-", rng)
    r = c.post("/v1/items/batch", json={"items": many}, headers=AUTH)
    assert r.status_code == 413 and "HYPSEARCH_MAX_BATCH_ITEMS" in detail_of(r), r.text
    r = c.post("/v1/items/get", json={"ids": [f"x{j}" for j in range(MAX_BATCH + 1)]})
    assert r.status_code == 413
    assert server.items() == before
    # bad filters: 422 naming the part, never a 500
    for body, where in (
        ({"filter": {"must": [{"key": "x"}]}}, "filter.must[0]"),
        ({"filter": {"must": [{"under": "snekaer"}]}}, "filter.must[0].under"),
        ({"filter": {"must": [{"key": "payload.n", "range": {"gt": "a"}}]}}, "filter.must[0]"),
    ):
        for path in ("/v1/count", "/v1/scroll"):
            r = c.post(path, json=body)
            assert r.status_code == 422 and where in detail_of(r), (path, r.text)
        r = c.post("/v1/items/delete", json=body, headers=AUTH)
        assert r.status_code == 422 and where in detail_of(r), r.text
    assert server.items() == before


def test_search_filter_with_vector_payload_max_distance(server):
    c, rng = server.client, np.random.default_rng(2)
    items = _items(server.dim, 30, "sf-", rng, group="sf")
    assert c.post("/v1/items/batch", json={"items": items}, headers=AUTH).status_code == 200
    f = {
        "must": [{"key": "payload.group", "match": "sf"}, {"key": "payload.color", "match": "red"}]
    }
    by_id = check_filtered_search(c, items, f)
    reds = {it["id"] for it in items if it["payload"]["color"] == "red"}
    # a vector query with a filter: the exact nearest reds
    q = items[0]["vector"]
    r = c.post("/v1/search", json={"vector": q, "k": 3, "mode": "nearest", "filter": f})
    got = [h["id"] for h in r.json()["results"]]
    x, k = np.asarray(q), server.curvature

    def dist(v):
        v = np.asarray(v)
        num = 2 * k * np.sum((x - v) ** 2)
        return np.arccosh(1 + num / ((1 - k * (x @ x)) * (1 - k * (v @ v)))) / np.sqrt(k)

    want = sorted(reds, key=lambda i: dist(by_id[i]["vector"]))[:3]
    assert got == want
    r = c.post(
        "/v1/items/delete", json={"filter": {"must": [{"key": "payload.group", "match": "sf"}]}},
        headers=AUTH,
    )  # fmt: skip
    assert r.json() == {"deleted": 30}


EDGES = [["sneaker", "shoe"], ["boot", "shoe"], ["shoe", "thing"], ["bag", "thing"]]


def test_collections_aliases_and_snapshots(server):
    """Named collections beside the served index (each its own space), an alias
    that moves atomically, and a snapshot taken, listed, restored after later
    writes; writes without the key refused on each."""
    c, rng = server.client, np.random.default_rng(7)
    name = f"side-{server.kind}"
    r = c.post("/v1/collections", json={"name": name, "space": "poincare:5", "taxonomy": EDGES})
    assert r.status_code == 401, r.text  # no key
    r = c.post(
        "/v1/collections",
        json={"name": name, "space": "poincare:5", "taxonomy": EDGES},
        headers=AUTH,
    )
    assert r.status_code == 201, r.text
    assert r.json()["dim"] == 5 and r.json()["items"] == 0
    bad = c.post("/v1/collections", json={"name": name, "space": "poincare:5"}, headers=AUTH)
    assert bad.status_code == 409 and detail_of(bad)
    base = f"/v1/collections/{name}"
    items = [
        {
            "id": f"c{j}",
            "vector": random_vector(rng, 5, 0.3 + 0.01 * j),
            "label": "boot",
            "payload": {"j": j},
        }
        for j in range(20)
    ]
    assert c.post(f"{base}/items/batch", json={"items": items}).status_code == 401
    r = c.post(f"{base}/items/batch", json={"items": items}, headers=AUTH)
    assert r.status_code == 200 and r.json()["upserted"] == 20, r.text
    hit = c.post(f"{base}/search", json={"vector": items[3]["vector"], "k": 1}).json()
    assert hit["results"][0]["id"] == "c3"
    assert server.items() >= N - 60  # the served collection is another one
    # an alias, moved atomically
    r = c.put(f"/v1/aliases/cur-{server.kind}", json={"collection": name}, headers=AUTH)
    assert r.status_code == 200, r.text
    via = c.post(
        f"/v1/collections/cur-{server.kind}/search", json={"vector": items[5]["vector"], "k": 1}
    )
    assert via.status_code == 200 and via.json()["results"][0]["id"] == "c5"
    assert c.get("/v1/aliases").json()[f"cur-{server.kind}"] == name
    # a snapshot, later writes, the restore: back to the snapshot
    snap = c.post(f"{base}/snapshots", headers=AUTH)
    assert snap.status_code == 201, snap.text
    sid = snap.json()["snapshot"]
    listed = c.get(f"{base}/snapshots").json()
    assert [s["snapshot"] for s in listed] == [sid] and listed[0]["items"] == 20
    more = [{"id": f"m{j}", "vector": random_vector(rng, 5), "label": "bag"} for j in range(5)]
    assert c.post(f"{base}/items/batch", json={"items": more}, headers=AUTH).status_code == 200
    assert c.get(f"{base}/stats").json()["items"] == 25
    assert c.post(f"{base}/snapshots/{sid}/restore").status_code == 401
    r = c.post(f"{base}/snapshots/{sid}/restore", headers=AUTH)
    assert r.status_code == 200 and r.json()["items"] == 20, r.text
    assert c.get(f"{base}/stats").json()["items"] == 20
    got = c.post(f"{base}/items/get", json={"ids": ["c0", "m0"], "with_payload": True}).json()
    assert [(it["id"], it["payload"]["j"]) for it in got["items"]] == [("c0", 0)]
    # the alias first, then the collection
    assert c.delete(f"{base}", headers=AUTH).status_code == 409
    assert c.delete(f"/v1/aliases/cur-{server.kind}", headers=AUTH).status_code == 200
    assert c.delete(f"{base}", headers=AUTH).status_code == 200
    assert c.get(base).status_code == 404


def test_search_batch(server):
    check_search_batch(server.client, server.dim)


def test_a_repeated_label_query_sees_every_write(server):
    """Label queries repeat, and their answers are kept (each index its own; the Ray
    server's serving process the shards' answers, while no shard changes): a write
    that enters the answer, and its deletion, show in the very next query."""
    c = server.client

    def ids(body):
        r = c.post("/v1/search", json=body)
        assert r.status_code == 200, r.text
        return [h["id"] for h in r.json()["results"]], r.json()

    hier = {"label": "sandal", "k": 5, "mode": "hierarchical"}
    ent = {"label": "sandal", "k": 10}
    first, _ = ids(hier)
    first_ent, _ = ids(ent)
    assert ids(hier)[0] == first and ids(ent)[0] == first_ent  # asked again: the same
    # each at the first hit's own point, with its label (as firm, as near; ties go by
    # id): first, then the rest
    r = c.post("/v1/items/get", json={"ids": [first[0], first_ent[0]], "with_vector": True})
    probes = {f"a-kept-{n}": it for n, it in zip(("hier", "ent"), r.json()["items"], strict=True)}
    for pid, it in probes.items():
        body = {"vector": it["vector"], "label": it["label"]}
        assert c.put(f"/v1/items/{pid}", json=body, headers=AUTH).status_code in (200, 201)
    try:
        assert ids(hier)[0] == ["a-kept-hier", *first[:4]]
        assert "a-kept-ent" in ids(ent)[0][:2]
    finally:
        for pid in probes:
            assert c.delete(f"/v1/items/{pid}", headers=AUTH).status_code in (200, 204)
    assert ids(hier)[0] == first and ids(ent)[0] == first_ent


def test_a_shard_killed_during_queries_comes_back_with_every_item(server):
    """Ray only: a shard's actor killed while searches run. Every search is answered
    (200, or 503 naming the shard while it restarts) within seconds -- none waits for
    the restart, none is a 500; the restarted shard holds every item."""
    if server.kind != "ray":
        pytest.skip("a shard actor exists on the Ray server only")
    import hashlib

    c, ray = server.client, server.ray
    before = server.items()
    tag = hashlib.blake2b(str(server.index.resolve()).encode(), digest_size=4).hexdigest()
    victim = ray.get_actor(f"hypsearch-shard-{tag}-0", namespace="hypsearch")
    pid = ray.get(victim.info.remote())["pid"]
    statuses: list[tuple[int, str, float]] = []
    stop = threading.Event()

    def searcher():
        body = {"vector": [0.05] * server.dim, "k": 5, "mode": "nearest"}
        while not stop.is_set():
            t0 = time.monotonic()
            r = c.post("/v1/search", json=body, timeout=120)
            statuses.append((r.status_code, r.text, time.monotonic() - t0))

    threads = [threading.Thread(target=searcher) for _ in range(2)]
    for t in threads:
        t.start()
    time.sleep(0.5)
    ray.kill(victim, no_restart=False)  # Ray restarts it: the store is reopened
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if ray.get(victim.info.remote(), timeout=5)["pid"] != pid:
                break
        except Exception:  # noqa: BLE001 - restarting
            pass
        time.sleep(0.2)
    time.sleep(1.0)
    stop.set()
    for t in threads:
        t.join(150)
    assert not any(t.is_alive() for t in threads)
    codes = {code for code, _, _ in statuses}
    assert codes <= {200, 503}, [(code, text[:200]) for code, text, _ in statuses if code >= 400]
    for code, text, _ in statuses:
        if code == 503:
            assert "shard 0 of 2" in text, text
    assert statuses[-1][0] == 200  # answered again once the shard is back
    slowest = max(s for _, _, s in statuses)
    print(
        f"{len(statuses)} searches, {sum(c == 503 for c, _, _ in statuses)} answered 503, "
        f"slowest {slowest:.2f} s"
    )
    # no hang: a restart took 5.4 s here, for which a search used to wait; now a search
    # that finds its shard down is answered 503 after at most shards.PROBE_SECONDS (1 s)
    assert slowest < 4.0, slowest
    assert ray.get(victim.info.remote())["pid"] != pid
    assert server.items() == before
    r = c.post("/v1/count", json={"filter": {"must": [{"key": "label", "match": "bag.n.04"}]}})
    assert r.status_code == 200 and r.json()["count"] > 0


#: malformed requests: (method, path, raw body) -- each must get its 4xx with a detail
MALFORMED = [
    ("post", "/v1/search", b'{"vector": [0.1, 0.2'),  # not JSON
    ("post", "/v1/search", b'{"vector": [0.1, 0.2], "k": 3}'),  # wrong dimension
    ("post", "/v1/search", b'{"vector": "abc", "k": 3}'),
    ("post", "/v1/search", b'{"label": "no-such-label-zz", "k": 3}'),
    ("post", "/v1/search", b'{"label": "sneaker", "k": 0}'),
    ("post", "/v1/search", b'{"label": "sneaker", "k": 10, "filter": {"must": 7}}'),
    ("post", "/v1/search", b"[1, 2, 3]"),
    ("post", "/v1/search", b"\xff\xfe garbage"),
    ("post", "/v1/items/get", b'{"ids": 5}'),
    ("post", "/v1/count", b'{"filter": {"must": [{"key": "label"}]}}'),
]


def _good_searches(c, bodies, want, stop, lat, bad):
    while not stop.is_set():
        for body, ids in zip(bodies, want, strict=True):
            t0 = time.perf_counter()
            r = c.post("/v1/search", json=body)
            lat.append(time.perf_counter() - t0)
            if r.status_code != 200 or [h["id"] for h in r.json()["results"]] != ids:
                bad.append((body, r.status_code, r.text[:200]))


def test_malformed_requests_under_load_get_4xx_and_slow_nothing(server):
    """Searches run on two connections while two more send either the same searches
    (the control) or malformed requests (bad JSON, wrong dimension or type, an
    unknown label, a bad k or filter, bytes that are not UTF-8) as fast as they are
    answered, the two phases alternated twice: every malformed request gets its 4xx
    with a detail, every search its usual answer, none waits long (see below)."""
    c, dim = server.client, server.dim
    rng = np.random.default_rng(11)
    bodies = [{"vector": random_vector(rng, dim, 0.5), "k": 5} for _ in range(4)]
    bodies += [{"label": "sneaker", "k": 5}, {"label": "bag", "mode": "hierarchical", "k": 5}]
    want = [[h["id"] for h in c.post("/v1/search", json=b).json()["results"]] for b in bodies]
    lat: dict[bool, list[float]] = {False: [], True: []}
    bad: list = []
    answers: list = []

    def sender(cl, stop):
        j = 0
        while not stop.is_set():
            method, path, raw = MALFORMED[j % len(MALFORMED)]
            j += 1
            t0 = time.perf_counter()
            r = cl.request(
                method.upper(), path, content=raw, headers={"Content-Type": "application/json"}
            )
            answers.append((path, raw, r.status_code, detail_of(r), time.perf_counter() - t0))

    def phase(seconds: float, malformed: bool) -> None:
        stop = threading.Event()
        clients = [httpx.Client(base_url=str(c.base_url), timeout=60) for _ in range(4)]
        measured = [
            threading.Thread(
                target=_good_searches, args=(cl, bodies, want, stop, lat[malformed], bad)
            )
            for cl in clients[:2]
        ]
        if malformed:
            others = [threading.Thread(target=sender, args=(cl, stop)) for cl in clients[2:]]
        else:
            others = [
                threading.Thread(target=_good_searches, args=(cl, bodies, want, stop, [], bad))
                for cl in clients[2:]
            ]
        threads = measured + others
        for t in threads:
            t.start()
        time.sleep(seconds)
        stop.set()
        for t in threads:
            t.join(120)
        for cl in clients:
            cl.close()
        assert not any(t.is_alive() for t in threads)

    for malformed in (False, True, False, True):
        phase(3.0, malformed)
    assert not bad, bad[:5]
    assert len(answers) >= len(MALFORMED), len(answers)
    wrong = [(p, raw, s, d) for p, raw, s, d, _ in answers if not (400 <= s < 500 and d)]
    assert not wrong, wrong[:5]
    m0, m1 = float(np.median(lat[False])), float(np.median(lat[True]))
    slowest_bad = max(a[-1] for a in answers)
    print(
        f"{server.kind}: search median {m0 * 1e3:.1f} ms next to searches ({len(lat[False])}), "
        f"{m1 * 1e3:.1f} ms next to {len(answers)} malformed requests ({len(lat[True])}); "
        f"slowest malformed answer {slowest_bad * 1e3:.0f} ms"
    )
    # no stall: a malformed request is answered, and lets the searches be answered,
    # within the time a search takes on the loaded machine. Their cost is not nil:
    # the error path (FastAPI's full stack instead of the search fast path, a
    # pydantic error, difflib suggestions for an unknown label) costs 1.5-4x a
    # search here, so the median is bounded loosely (2.4x and 5x in two runs on
    # the shared 2-core machine at load 5-14)
    assert max(lat[True]) < 2.0 and slowest_bad < 2.0, (max(lat[True]), slowest_bad)
    assert m1 <= 8 * m0 + 0.020, (m0, m1)
