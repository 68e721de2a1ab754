"""Collections, aliases and snapshots over REST, through the Python client
(:mod:`service.client`), against a real uvicorn server on 127.0.0.1.

The default collection is a small Fashion-MNIST index with the test image model;
other collections get their own dimension and taxonomy. Covered: every client
method of the default collection, collections with their own spaces, an alias
swapped while searches run, a snapshot round trip with a corrupted upload
refused, and a restart (with an API key) that keeps collections and aliases.
"""

from __future__ import annotations

import base64
import tarfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

from service.client import Client, HypsearchError
from tests.support.server import (
    LoopbackServer,
    artifacts,
    fmnist_test_split,
    free_port,
    needs_data,
    png_bytes,
)

pytestmark = needs_data

KEY = "collections-test-key"
EDGES = [["sneaker", "shoe"], ["boot", "shoe"], ["shoe", "thing"], ["bag", "thing"]]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    torch.set_num_threads(1)
    art = artifacts(tmp_path_factory)
    folder = tmp_path_factory.mktemp("collections")
    (folder / "data").mkdir()
    srv = LoopbackServer(art, folder, n=200, data_roots=str(folder / "data"))
    yield art, folder, srv
    srv.stop()


@pytest.fixture
def hs(env):
    with Client(env[2].url, timeout=60) as c:
        yield c


def _ball(rng, n: int, dim: int, scale: float = 0.3) -> np.ndarray:
    x = rng.normal(size=(n, dim))
    return x / np.linalg.norm(x, axis=1, keepdims=True) * rng.uniform(0.05, scale, (n, 1))


def test_client_on_the_default_collection(env, hs):
    art, folder, _ = env
    assert hs.health() == {"status": "ok"} and hs.ready()
    st = hs.stats()
    assert st["items"] == 200 and st["dim"] == art.labels.dim
    assert "hypsearch_request_seconds" in hs.metrics()
    near = hs.search(label="sneaker", k=5)
    assert near["query"]["label"] == "gym_shoe.n.01" and len(near["results"]) == 5
    hier = hs.search_hierarchical(label="sneaker", k=20, levels="taxonomy")
    levels = [h["level"] for h in hier["results"]]
    assert levels == sorted(levels) and levels[0] == 0
    first = near["results"][0]["id"]
    by_id = hs.search(id=first, k=3)
    assert first not in [h["id"] for h in by_id["results"]]
    item = hs.get(first)
    by_vec = hs.search(item["vector"], k=1)
    assert by_vec["results"][0]["id"] == first
    data = fmnist_test_split()
    pic = png_bytes(data.images[0])
    own = hs.search_image(pic, k=1)
    assert own["results"][0]["id"] == "fashion-mnist-test-0"
    emb = hs.embed(pic)
    assert len(emb["vector"]) == art.labels.dim and len(emb["labels"]) == 5
    assert "gym_shoe.n.01" in hs.labels("gym", limit=5)
    assert hs.label("sneaker")["name"] == "gym_shoe.n.01"
    # items: put a vector, a picture; read, picture, delete
    v = (np.asarray(item["vector"]) * 0.9).tolist()
    put = hs.put("client/one", v, label="sandal")
    assert put["label"] == "sandal.n.01"
    assert hs.get("client/one")["label"] == "sandal.n.01"
    assert hs.put("client/pic", image=pic, label="boot")["label"] == "boot.n.01"
    assert hs.image("client/pic")[:8] == b"\x89PNG\r\n\x1a\n"
    assert hs.delete("client/one") == {"id": "client/one", "deleted": True}
    with pytest.raises(HypsearchError) as e:
        hs.get("client/one")
    assert e.value.status == 404 and "client/one" in e.value.detail
    with pytest.raises(HypsearchError) as e:
        hs.search(label="snekaer")
    assert e.value.status == 422 and e.value.body["suggestions"]
    with pytest.raises(HypsearchError) as e:
        hs.search([2.0] * art.labels.dim)
    assert e.value.status == 422
    # index jobs: a folder under the data roots
    shop = folder / "data" / "shop" / "sandal"
    shop.mkdir(parents=True)
    for i in range(2):
        (shop / f"{i}.png").write_bytes(png_bytes(data.images[10 + i]))
    job = hs.start_job(str(folder / "data" / "shop"))
    deadline = time.monotonic() + 120
    while hs.job(job["id"])["state"] in ("queued", "running"):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert hs.job(job["id"])["state"] == "succeeded"
    assert hs.jobs()[0]["id"] == job["id"]
    assert hs.get("sandal/0.png")["label"] == "sandal.n.01"
    with pytest.raises(HypsearchError) as e:
        hs.cancel_job("nope")
    assert e.value.status == 404
    # no server at all: status 0
    with (
        Client(f"http://127.0.0.1:{free_port()}", timeout=2) as gone,
        pytest.raises(HypsearchError) as e,
    ):
        gone.health()
    assert e.value.status == 0


def test_collections_with_their_own_spaces(env, hs):
    art, _, _ = env
    rng = np.random.default_rng(0)
    four = hs.create_collection("four", "poincare:4")  # the default taxonomy, placed in 4-D
    assert four["dim"] == 4 and four["items"] == 0 and four["labels"] == len(art.labels.taxonomy)
    six = hs.create_collection("six", "poincare:6@0.5", taxonomy=EDGES)
    assert six["dim"] == 6 and six["curvature"] == 0.5 and six["labels"] == 5
    with pytest.raises(HypsearchError) as e:
        hs.create_collection("four", "poincare:4")
    assert e.value.status == 409
    for name, space in (("bad name", "poincare:4"), ("ok", "poincare:1"), ("ok", "nonsense")):
        with pytest.raises(HypsearchError) as e:
            hs.create_collection(name, space)
        assert e.value.status == 422, e.value.detail
    for kw in ({"model": "default"}, {"taxonomy": EDGES}):  # a product space: vectors only
        with pytest.raises(HypsearchError) as e:
            hs.create_collection("prod", "poincare:8,sphere:4,euclidean:4", **kw)
        assert e.value.status == 422 and "product" in e.value.detail
    names = {c["name"]: c for c in hs.collections()}
    assert {"default", "four", "six"} <= set(names) and names["six"]["space"] == "poincare:6@0.5"

    c4, c6 = hs.collection("four"), hs.collection("six")
    x4, x6 = _ball(rng, 30, 4), _ball(rng, 30, 6, scale=0.5)
    for i in range(30):
        c4.put(f"f{i}", x4[i], label="sneaker")
        c6.put(f"s{i}", x6[i], label="boot" if i % 2 else "bag")
    assert c4.stats()["items"] == 30 and c6.stats()["items"] == 30 and c6.stats()["dim"] == 6
    assert hs.stats()["items"] >= 200  # the default collection is untouched
    hit = c6.search(x6[3], k=1)["results"][0]
    assert hit["id"] == "s3" and hit["label"] == "boot"
    assert c4.search(label="sneaker", k=50)["query"]["label"] == "gym_shoe.n.01"
    level0 = [h for h in c6.search_hierarchical(label="boot", k=30)["results"] if h["level"] == 0]
    assert {h["id"] for h in level0} <= {f"s{i}" for i in range(1, 30, 2)}
    assert c6.label("shoe")["children"] == ["boot", "sneaker"]
    assert c6.get("s3")["label"] == "boot"
    with pytest.raises(HypsearchError) as e:
        c6.put("wrong", x4[0])  # a 4-D vector in a 6-D collection
    assert e.value.status == 422 and "6" in e.value.detail
    with pytest.raises(HypsearchError) as e:
        c6.search(label="sneakers-that-are-not-there")
    assert e.value.status == 422
    with pytest.raises(HypsearchError) as e:
        hs.collection("missing").search(x4[0])
    assert e.value.status == 404 and "missing" in e.value.detail
    with pytest.raises(HypsearchError) as e:
        hs.collection("bad name").stats()
    assert e.value.status == 422
    # the default's model, shared: pictures into a collection of the model's space
    c = art.labels.curvature
    hs.create_collection("pics", f"poincare:{art.labels.dim}@{c}", model="default")
    pics = hs.collection("pics")
    data = fmnist_test_split()
    for r in range(3):
        pics.put(f"p{r}", image=png_bytes(data.images[r]))
    assert pics.search_image(png_bytes(data.images[1]), k=1)["results"][0]["id"] == "p1"
    assert len(pics.embed(png_bytes(data.images[1]))["labels"]) == 5
    with pytest.raises(HypsearchError) as e:
        c6.search_image(png_bytes(data.images[1]))
    assert e.value.status == 503  # no model in that collection
    # drop: not the default; a dropped collection is gone
    with pytest.raises(HypsearchError) as e:
        hs.drop_collection("default")
    assert e.value.status == 409
    assert hs.drop_collection("pics") == {"name": "pics", "dropped": True}
    with pytest.raises(HypsearchError) as e:
        pics.stats()
    assert e.value.status == 404


def test_alias_swaps_atomically_under_concurrent_searches(env, hs):
    rng = np.random.default_rng(1)
    for name in ("blue", "green"):
        hs.create_collection(name, "poincare:3", taxonomy=EDGES)
        x = _ball(rng, 40, 3)
        for i in range(40):
            hs.collection(name).put(f"{name}-{i}", x[i], label="bag")
    hs.set_alias("live", "blue")
    assert hs.aliases()["live"] == "blue"
    live = hs.collection("live")
    q = _ball(rng, 1, 3)[0]
    stop = threading.Event()
    seen: list[str] = []
    errors: list[str] = []

    def searcher():
        while not stop.is_set():
            try:
                ids = [h["id"] for h in live.search(q, k=5)["results"]]
            except HypsearchError as e:  # pragma: no cover - the assertion below reports it
                errors.append(str(e))
                continue
            kinds = {i.split("-")[0] for i in ids}
            if len(kinds) != 1 or len(ids) != 5:
                errors.append(f"mixed answer {ids}")
            seen.append(kinds.pop())

    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(searcher) for _ in range(4)]
        for i in range(20):
            out = hs.set_alias("live", "green" if i % 2 == 0 else "blue")
            assert out["previous"] == ("blue" if i % 2 == 0 else "green")
            time.sleep(0.02)
        stop.set()
        for f in futures:
            f.result()
    assert not errors, errors[:5]
    assert {"blue", "green"} <= set(seen)
    assert hs.aliases()["live"] == "blue"
    # an alias names a collection; a collection targeted by one is not dropped
    with pytest.raises(HypsearchError) as e:
        hs.drop_collection("blue")
    assert e.value.status == 409 and "live" in e.value.detail
    with pytest.raises(HypsearchError) as e:
        hs.set_alias("blue", "green")  # the name of a collection
    assert e.value.status == 409
    with pytest.raises(HypsearchError) as e:
        hs.set_alias("other", "nowhere")
    assert e.value.status == 404
    assert hs.collection_info("live")["name"] == "blue"


def test_snapshot_round_trip_and_corrupt_upload(env, hs, tmp_path):
    rng = np.random.default_rng(2)
    hs.create_collection("snap", "poincare:5", taxonomy=EDGES)
    c = hs.collection("snap")
    x = _ball(rng, 50, 5)
    for i in range(50):
        c.put(f"i{i}", x[i], label="boot")
    sid = hs.create_snapshot("snap")
    listed = hs.snapshots("snap")
    assert [s["snapshot"] for s in listed] == [sid] and listed[0]["items"] == 50
    tar = hs.download_snapshot(sid, tmp_path / "snap.tar", "snap")
    assert tar.stat().st_size == listed[0]["bytes"]
    before = c.search(x[7], k=5)
    # later writes, then a restore by id: back to the snapshot
    for i in range(50, 60):
        c.put(f"i{i}", _ball(rng, 1, 5)[0], label="bag")
    c.delete("i0")
    assert c.stats()["items"] == 59
    out = hs.restore_snapshot(sid, "snap")
    assert out["restored"] and out["items"] == 50
    assert c.stats()["items"] == 50 and c.get("i0")["label"] == "boot"
    assert c.search(x[7], k=5)["results"] == before["results"]
    # a corrupted upload is refused and changes nothing
    c.put("after", x[1] * 0.5, label="bag")
    data = bytearray(tar.read_bytes())
    with tarfile.open(tar) as tf:  # one byte inside each file of the snapshot, and a header
        spots = [m.offset_data + m.size // 2 for m in tf.getmembers()] + [100]
    assert len(spots) >= 4
    for pos in spots:
        bad = bytearray(data)
        bad[pos] ^= 0x55
        (tmp_path / "bad.tar").write_bytes(bytes(bad))
        with pytest.raises(HypsearchError) as e:
            hs.upload_snapshot(tmp_path / "bad.tar", "snap")
        assert e.value.status == 422, e.value.detail
        assert c.stats()["items"] == 51 and c.get("after")["label"] == "bag"
    (tmp_path / "junk.tar").write_bytes(b"not a tar at all" * 100)
    with pytest.raises(HypsearchError) as e:
        hs.upload_snapshot(tmp_path / "junk.tar", "snap")
    assert e.value.status == 422
    with pytest.raises(HypsearchError) as e:
        hs.upload_snapshot(tar, "snap", sha256="0" * 64)
    assert e.value.status == 422 and "sha256" in e.value.detail
    # the downloaded snapshot, uploaded: restored (and kept as a snapshot)
    up = hs.upload_snapshot(tar, "snap", sha256=listed[0]["sha256"])
    assert up["items"] == 50 and c.stats()["items"] == 50
    with pytest.raises(HypsearchError):
        c.get("after")
    assert len(hs.snapshots("snap")) == 2
    # into another collection of the same space
    hs.create_collection("copy", "poincare:5", taxonomy=EDGES)
    hs.upload_snapshot(tar, "copy")
    assert hs.collection("copy").search(x[7], k=5)["results"] == before["results"]
    # another space: refused, the collection as it was
    with pytest.raises(HypsearchError) as e:
        hs.upload_snapshot(tar, "four")
    assert e.value.status == 422 and "space" in e.value.detail
    assert hs.collection("four").stats()["items"] == 30
    # the default collection: snapshot and download (restored in place: test_restore_default)
    dsid = hs.create_snapshot()
    hs.download_snapshot(dsid, tmp_path / "default.tar")
    assert dsid in [s["snapshot"] for s in hs.snapshots()]
    with pytest.raises(HypsearchError) as e:
        hs.restore_snapshot("20260101T000000-00000000", "snap")
    assert e.value.status == 404
    assert hs.delete_snapshot(sid, "snap")["deleted"]
    assert sid not in [s["snapshot"] for s in hs.snapshots("snap")]


@pytest.mark.parametrize("where", ["default", "vdb"])
def test_batches_filters_scroll_count_through_the_client(env, hs, where):
    """The vector-database routes (SPEC's batch, filter, scroll and count shapes),
    on the default collection and under /v1/collections/{name}/."""
    art, _, _ = env
    rng = np.random.default_rng(3)
    if where == "default":
        c, dim, labels, prefix = hs, art.labels.dim, ("sandal", "boot"), "vdb-"
    else:
        hs.create_collection("vdb", "poincare:3", taxonomy=EDGES)
        c, dim, labels, prefix = hs.collection("vdb"), 3, ("bag", "boot"), ""
    n0 = c.count()
    x = _ball(rng, 40, dim)
    items = [
        {
            "id": f"{prefix}{i:02d}",
            "vector": x[i].tolist(),
            "label": labels[i % 2],
            "payload": {"color": "red" if i < 10 else "blue", "price": float(i)},
        }
        for i in range(40)
    ]
    assert c.upsert_batch(items) == 40
    assert c.count() == n0 + 40
    red = {"must": [{"key": "payload.color", "match": "red"}]}
    assert c.count(red) == 10
    cheap = {"must": [{"key": "payload.price", "range": {"lt": 5}}, red]}
    assert c.count(cheap) == 5
    got = c.get_many([f"{prefix}03", "absent"], with_payload=True, with_vector=True)
    assert [g["id"] for g in got] == [f"{prefix}03"]
    assert got[0]["payload"]["price"] == 3.0 and len(got[0]["vector"]) == dim
    hit = c.search(x[3], k=3, filter=red, with_payload=True)["results"]
    assert hit[0]["id"] == f"{prefix}03" and all(h["payload"]["color"] == "red" for h in hit)
    answers = c.search_batch(
        [{"vector": x[5].tolist(), "k": 1}, {"vector": x[25].tolist(), "k": 1}]
    )
    assert [a["results"][0]["id"] for a in answers] == [f"{prefix}05", f"{prefix}25"]
    pages = c.scroll(red, limit=4)
    assert len(pages["items"]) == 4 and pages["next_cursor"] is not None
    every = [it["id"] for it in c.scroll_all(red, limit=3)]
    assert every == sorted(every) and len(every) == 10 == len(set(every))
    assert c.delete_many(filter=red) == 10
    assert c.delete_many(ids=[f"{prefix}10", f"{prefix}11", "absent"]) == 2
    assert c.count() == n0 + 28
    with pytest.raises(HypsearchError) as e:
        c.count({"must": [{"key": "payload.price", "range": {"between": 1}}]})
    assert e.value.status == 422
    with pytest.raises(HypsearchError) as e:
        c.upsert_batch([{"id": "bad", "vector": [0.1] * (dim + 1)}])
    assert e.value.status == 422
    assert c.count() == n0 + 28  # all or nothing
    if where == "default":
        assert hs.delete_many(ids=[f"{prefix}{i:02d}" for i in range(40)]) == 28


PRODUCT = "poincare:8,sphere:4,euclidean:4"


def _product_points(rng, n: int) -> np.ndarray:
    return np.hstack([_ball(rng, n, 8, 0.6), rng.normal(size=(n, 4)), rng.normal(size=(n, 4))])


def _product_dist(a: np.ndarray, b: np.ndarray) -> float:
    """sqrt(d_ball^2 + d_sphere^2 + d_euclid^2), curvatures 1 (sphere: stereographic)."""

    def ball(x, y):
        num = 2 * np.sum((x - y) ** 2)
        return np.arccosh(1 + num / ((1 - x @ x) * (1 - y @ y)))

    def sphere(x, y):  # the stereographic model of the unit sphere, lifted to R^5
        def lift(z):
            s = z @ z
            return np.append(2 * z, 1 - s) / (1 + s)

        return np.arccos(np.clip(lift(x) @ lift(y), -1, 1))

    d = [ball(a[:8], b[:8]), sphere(a[8:12], b[8:12]), np.linalg.norm(a[12:] - b[12:])]
    return float(np.sqrt(sum(v * v for v in d)))


def test_product_space_collection(env, hs, tmp_path):
    rng = np.random.default_rng(5)
    info = hs.create_collection("prod", PRODUCT)
    assert info["space"] == PRODUCT and info["dim"] == 16 and info["labels"] == 0
    c = hs.collection("prod")
    assert c.stats()["space"] == PRODUCT and c.stats()["dim"] == 16
    assert hs.stats()["space"].startswith("poincare:")
    x = _product_points(rng, 60)
    items = [
        {"id": f"p{i:02d}", "vector": x[i].tolist(), "payload": {"odd": i % 2 == 1, "i": i}}
        for i in range(50)
    ]
    assert c.upsert_batch(items) == 50
    for i in range(50, 60):
        assert c.put(f"p{i:02d}", x[i])["label"] is None
    assert c.count() == 60
    odd = {"must": [{"key": "payload.odd", "match": True}]}
    assert c.count(odd) == 25
    # nearest by vector: the product distance, exact (the collection is small)
    q = _product_points(rng, 1)[0]
    hits = c.search(q, k=5)["results"]
    want = sorted((_product_dist(q, x[i]), f"p{i:02d}") for i in range(60))[:5]
    assert [h["id"] for h in hits] == [w[1] for w in want]
    assert np.allclose([h["distance"] for h in hits], [w[0] for w in want], rtol=1e-6)
    by_id = c.search(id="p07", k=3)["results"]
    assert "p07" not in [h["id"] for h in by_id]
    assert by_id[0]["distance"] == pytest.approx(
        min(_product_dist(x[7], x[i]) for i in range(60) if i != 7), rel=1e-6
    )
    got = c.search(q, k=4, filter=odd, with_payload=True)["results"]
    assert len(got) == 4 and all(h["payload"]["odd"] for h in got)
    answers = c.search_batch([{"vector": x[3].tolist(), "k": 1}, {"vector": x[8].tolist(), "k": 1}])
    assert [a["results"][0]["id"] for a in answers] == ["p03", "p08"]
    item = c.get("p03")
    assert np.allclose(item["vector"], x[3])
    assert item["distance_to_origin"] == pytest.approx(_product_dist(x[3], np.zeros(16)), rel=1e-6)
    assert [it["id"] for it in c.scroll_all(odd, limit=7)] == [f"p{i:02d}" for i in range(1, 50, 2)]
    assert len(c.get_many(["p01", "p02", "nope"])) == 2
    # label features: 422 saying why
    for call in (
        lambda: c.search(label="sneaker"),
        lambda: c.search_hierarchical(q),
        lambda: c.search(q, under="shoe"),
        lambda: c.search(q, disk=True),
        lambda: c.put("labelled", x[0], label="boot"),
        lambda: c.count({"must": [{"under": "shoe"}]}),
        lambda: c.label("shoe"),
    ):
        with pytest.raises(HypsearchError) as e:
            call()
        assert e.value.status == 422 and "product space" in e.value.detail, e.value.detail
    bad = x[0].copy()
    bad[:8] = 1.0  # the ball factor's norm is outside the ball
    with pytest.raises(HypsearchError) as e:
        c.search(bad)
    assert e.value.status == 422 and "0:8" in e.value.detail
    with pytest.raises(HypsearchError) as e:
        c.put("outside", bad)
    assert e.value.status == 422
    pic = png_bytes(fmnist_test_split().images[0])
    for call in (
        lambda: c.search_image(pic),
        lambda: c.embed(pic),
        lambda: c.put("pic", image=pic),
        lambda: c.upsert_batch([{"id": "pic", "image": base64.b64encode(pic).decode()}]),
    ):  # no model of that space
        with pytest.raises(HypsearchError) as e:
            call()
        assert e.value.status == 422 and "product space" in e.value.detail, e.value.detail
    # deletes, then a snapshot round trip
    assert c.delete_many(filter=odd) == 25 and c.delete("p00")["deleted"]
    sid = hs.create_snapshot("prod")
    assert hs.snapshots("prod")[0]["space"] == PRODUCT
    c.put("later", x[1])
    assert hs.restore_snapshot(sid, "prod")["items"] == 34
    assert c.count() == 34 and c.search(x[2], k=1)["results"][0]["id"] == "p02"
    # kept: the restart test opens it again


def test_search_image_with_a_filter(env, hs):
    import httpx

    pic = png_bytes(fmnist_test_split().images[5])  # a picture no other test puts
    plain = hs.search_image(pic, k=5)["results"]
    assert plain[0]["id"] == "fashion-mnist-test-5" and plain[0]["distance"] < 1e-6
    not_own = {"must_not": [{"key": "id", "match": "fashion-mnist-test-5"}]}
    got = hs.search_image(pic, k=4, filter=not_own)["results"]
    assert [h["id"] for h in got] == [h["id"] for h in plain[1:5]]
    label = plain[0]["label"]
    same = hs.search_image(pic, k=5, filter={"must": [{"key": "label", "match": label}]})
    assert same["results"] and all(h["label"] == label for h in same["results"])
    # the filter is the JSON body's: the same answer as /v1/search with that point
    vec = hs.get("fashion-mnist-test-5")["vector"]
    by_vec = hs.search(vec, k=4, filter=not_own)["results"]
    assert [h["id"] for h in by_vec][:2] == [h["id"] for h in got][:2]
    bad = {"must": [{"key": "payload.price", "range": {"between": 1}}]}
    with pytest.raises(HypsearchError) as e:
        hs.search_image(pic, filter=bad)
    assert e.value.status == 422 and e.value.detail.startswith("filter")
    for text in ("{nope", "[1, 2]"):
        r = httpx.post(
            f"{env[2].url}/v1/search/image",
            files={"file": ("q.png", pic, "image/png")},
            data={"filter": text},
            timeout=60,
        )
        assert r.status_code == 422 and r.json()["detail"].startswith("filter:"), r.text


def test_restart_keeps_collections_and_needs_the_key(env):
    """Last in the module: restarts the server (with an API key) over the same home."""
    art, folder, srv = env
    with Client(srv.url) as hs:
        before = {c["name"]: c["items"] for c in hs.collections()}
        probe = hs.collection("six").search([0.1] * 6, k=3)
    srv.stop()
    again = LoopbackServer(art, folder, api_key=KEY)
    try:
        with Client(again.url) as anon, Client(again.url, api_key=KEY) as hs:
            assert {c["name"]: c["items"] for c in anon.collections()} == before
            assert anon.aliases()["live"] == "blue"
            assert anon.collection("six").search([0.1] * 6, k=3) == probe
            assert anon.collection("live").stats()["dim"] == 3
            assert anon.collection("prod").stats()["space"] == PRODUCT  # a product space
            assert anon.collection("prod").get("p02")["label"] is None
            for call in (
                lambda: anon.collection("six").put("x", [0.0] * 6),
                lambda: anon.create_collection("nokey", "poincare:3"),
                lambda: anon.set_alias("live", "green"),
                lambda: anon.create_snapshot("six"),
                lambda: anon.drop_collection("six"),
            ):
                with pytest.raises(HypsearchError) as e:
                    call()
                assert e.value.status == 401
            hs.collection("six").put("x", [0.0] * 6, label="bag")
            assert hs.collection("six").stats()["items"] == 31
    finally:
        again.stop()
