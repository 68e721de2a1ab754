"""The REST API in process (FastAPI's TestClient) around a small real index.

Real parts throughout: WordNet taxonomy, trained label embeddings and image
model (tiny), a durable index in tmp_path, Pillow decoding, the micro-batcher.
"""

from __future__ import annotations

import io
import json
import logging
import struct
import threading
import time
import zlib

import numpy as np
import pytest

from tests.support.rest import detail_of
from tests.support.server import (
    app_client,
    fmnist_test_split,
    needs_data,
    png_bytes,
    runtime_fixture,
)

pytestmark = needs_data

KEY = "s3cret-key-for-tests"


rt = runtime_fixture("api", 600)


@pytest.fixture(scope="module")
def client(rt):
    with app_client(rt, batch_max_wait_ms=5) as c:
        yield c


@pytest.fixture(scope="module")
def picture():
    """A real Fashion-MNIST sneaker (row 0 of the test split is an ankle boot; find a sneaker)."""
    data = fmnist_test_split()
    row = int(np.flatnonzero(data.targets == 7)[0])
    return png_bytes(data.images[row])


# ---------------------------------------------------------------- ops


def test_health_ready_stats(client, rt):
    assert client.get("/healthz").json() == {"status": "ok"}
    assert client.get("/readyz").status_code == 200
    s = client.get("/v1/stats").json()
    assert s["items"] == len(rt.index) and s["dim"] == rt.dim and s["curvature"] == rt.curvature
    assert set(s) >= {"items", "dim", "curvature", "model"}


def test_request_id_is_echoed(client):
    r = client.get("/healthz", headers={"X-Request-ID": "abc-123"})
    assert r.headers["x-request-id"] == "abc-123"
    a, b = (client.get("/healthz").headers["x-request-id"] for _ in range(2))
    assert len(a) == 24 and a != b


# ---------------------------------------------------------------- search by label


def test_label_word_resolves_to_the_sense_with_items(client):
    r = client.post("/v1/search", json={"label": "sneaker", "k": 5})
    assert r.status_code == 200
    assert r.json()["query"]["label"] == "gym_shoe.n.01"
    for plural, node in (
        ("sneakers", "gym_shoe.n.01"),
        ("trousers", "trouser.n.01"),
        ("Dresses", "dress.n.01"),
    ):
        assert client.get(f"/v1/labels/{plural}").json()["name"] == node
    # "bag": WordNet's first sense is bag.n.01; the Fashion-MNIST items are bag.n.04
    assert client.post("/v1/search", json={"label": "bag"}).json()["query"]["label"] == "bag.n.04"


def test_hierarchical_levels_in_order(client, rt):
    r = client.post(
        "/v1/search",
        json={"label": "sneaker", "mode": "hierarchical", "k": 200, "levels": "taxonomy"},
    )
    body = r.json()
    hits = body["results"]
    assert len(hits) == 200
    levels = [h["level"] for h in hits]
    assert levels == sorted(levels) and levels[0] == 0 and max(levels) >= 1
    chain = rt.chain("gym_shoe.n.01")
    scores = [h["score"] for h in hits]
    assert scores == sorted(scores, reverse=True) and all(0 <= x <= 1 for x in scores)
    for lvl in set(levels):
        group = [h for h in hits if h["level"] == lvl]
        assert {h["via"] for h in group} == {chain[lvl]}
        for h in group:  # level i: under chain[i], not under chain[i-1]
            assert h["label"] == chain[lvl] or chain[lvl] in rt.taxonomy.ancestors(h["label"])
            if lvl:
                assert not (
                    h["label"] == chain[lvl - 1]
                    or chain[lvl - 1] in rt.taxonomy.ancestors(h["label"])
                )
    n_sneakers = rt.items_under("gym_shoe.n.01")
    assert levels.count(0) == n_sneakers
    assert all(h["label"] == "gym_shoe.n.01" for h in hits if h["level"] == 0)


def test_hierarchical_per_level(client, rt):
    body = {"label": "sandal", "mode": "hierarchical", "k": 1000, "per_level": 4}
    body["levels"] = "taxonomy"
    hits = client.post("/v1/search", json=body).json()["results"]
    levels = [h["level"] for h in hits]
    assert levels == sorted(levels) and len(set(levels)) >= 3
    assert all(levels.count(v) <= 4 for v in set(levels))
    full = client.post("/v1/search", json={**body, "per_level": None, "k": 1000}).json()["results"]
    for lvl in set(levels):  # each level's few are that level's nearest
        want = [h["id"] for h in full if h["level"] == lvl][:4]
        assert [h["id"] for h in hits if h["level"] == lvl] == want


def test_nearest_mode_has_null_level_and_ascending_distances(client):
    body = {"label": "coat", "k": 20, "mode": "nearest"}
    hits = client.post("/v1/search", json=body).json()["results"]
    assert len(hits) == 20
    assert all(h["level"] is None and h["via"] is None for h in hits)
    d = [h["distance"] for h in hits]
    assert d == sorted(d)
    assert [h["score"] for h in hits] == pytest.approx([1 / (1 + x) for x in d])


@pytest.mark.parametrize("mode", ["nearest", "hierarchical"])
def test_offset_pages_through_one_ranking(client, mode):
    full = client.post("/v1/search", json={"label": "dress", "k": 30, "mode": mode}).json()[
        "results"
    ]
    page = client.post(
        "/v1/search", json={"label": "dress", "k": 10, "offset": 10, "mode": mode}
    ).json()
    assert [h["id"] for h in page["results"]] == [h["id"] for h in full[10:20]]


def test_under_filters_to_a_subtree(client, rt):
    hits = client.post("/v1/search", json={"label": "coat", "k": 50, "under": "footwear"}).json()[
        "results"
    ]
    assert hits
    foot = "footwear.n.02"
    assert all(foot in rt.taxonomy.ancestors(h["label"]) for h in hits)
    hier = client.post(
        "/v1/search", json={"label": "sandal", "k": 50, "under": "footwear", "mode": "hierarchical"}
    ).json()["results"]
    assert hier and all(foot in rt.taxonomy.ancestors(h["label"]) for h in hier)


# ---------------------------------------------------------------- search by id and vector


def test_search_by_id_leaves_the_item_out(client, rt):
    item = rt.index.get("fashion-mnist-test-0")
    body = client.post("/v1/search", json={"id": "fashion-mnist-test-0", "k": 10}).json()
    assert body["query"]["label"] == item.label
    assert "fashion-mnist-test-0" not in [h["id"] for h in body["results"]]
    assert len(body["results"]) == 10
    h = client.post(
        "/v1/search", json={"id": "fashion-mnist-test-0", "k": 10, "mode": "hierarchical"}
    ).json()
    assert "fashion-mnist-test-0" not in [x["id"] for x in h["results"]]
    assert h["results"][0]["level"] == 0


def test_search_by_vector(client, rt):
    x = rt.index.get("fashion-mnist-test-5").vector
    body = client.post("/v1/search", json={"vector": x.tolist(), "k": 3}).json()
    assert body["results"][0]["id"] == "fashion-mnist-test-5"
    assert body["results"][0]["distance"] == pytest.approx(0, abs=1e-9)
    assert body["query"]["label"] in rt.used_labels()
    assert body["query"]["distance_to_origin"] == pytest.approx(float(rt.distance_to_origin(x)))


def test_disk_layout(client):
    body = client.post(
        "/v1/search", json={"label": "sneaker", "k": 8, "mode": "hierarchical", "disk": True}
    ).json()
    pts = body["disk"]["points"]
    kinds = [p["kind"] for p in pts]
    assert kinds.count("query") == 1 and kinds.count("result") == 8 and "label" in kinds
    assert all(p["x"] ** 2 + p["y"] ** 2 < 1 for p in pts)
    # the hierarchy stays readable: every label is drawn farther out than its parent
    labels = {p["name"]: p for p in pts if p["kind"] == "label"}
    chain = [n for n in ("gym_shoe.n.01", "shoe.n.01", "footwear.n.02") if n in labels]
    assert len(chain) == 3 and labels["gym_shoe.n.01"]["parent"] == "shoe.n.01"
    r = {n: (labels[n]["x"] ** 2 + labels[n]["y"] ** 2) ** 0.5 for n in chain}
    assert r["footwear.n.02"] < r["shoe.n.01"] < r["gym_shoe.n.01"]
    origin = next(p for p in pts if p["kind"] == "origin")
    assert origin["x"] == 0 and origin["y"] == 0
    assert "disk" not in client.post("/v1/search", json={"label": "sneaker"}).json()


# ---------------------------------------------------------------- labels


def test_label_autocompletion(client):
    names = client.get("/v1/labels", params={"prefix": "sne", "limit": 5}).json()
    assert "sneaker" in names and len(names) <= 5
    assert all(n.startswith("sne") for n in names)
    assert client.get("/v1/labels", params={"prefix": "GYM_"}).json()[0].startswith("gym_")


def test_label_detail(client, rt):
    body = client.get("/v1/labels/sneaker").json()
    assert body["name"] == "gym_shoe.n.01"
    assert body["parents"] == rt.taxonomy.parents("gym_shoe.n.01")
    assert body["items"] == rt.items_under("gym_shoe.n.01") > 0
    assert set(body["ancestors"]) == rt.taxonomy.ancestors("gym_shoe.n.01")
    assert body["depth"] == rt.taxonomy.depth("gym_shoe.n.01")
    foot = client.get("/v1/labels/footwear.n.02").json()
    assert foot["items"] >= body["items"]
    r = client.get("/v1/labels/snekaer")
    assert r.status_code == 404 and "snekaer" in detail_of(r)
    assert "sneaker" in r.json()["suggestions"]


# ---------------------------------------------------------------- items


def test_item_read_write_delete(client, rt):
    v = (rt.label_point("coat.n.01") * 0.999).tolist()
    r = client.put("/v1/items/user/coat-1", json={"vector": v, "label": "coat"})
    assert r.status_code == 200, r.text
    assert r.json()["label"] == "coat.n.01" and r.json()["label_source"] == "given"
    got = client.get("/v1/items/user/coat-1").json()
    assert got["vector"] == pytest.approx(v) and got["label"] == "coat.n.01"
    hits = client.post("/v1/search", json={"vector": v, "k": 1}).json()["results"]
    assert hits[0]["id"] == "user/coat-1"
    # no label: the nearest prototype among the labels in use
    r = client.put("/v1/items/user/unlabelled", json={"vector": v})
    assert r.json()["label"] in rt.used_labels() and r.json()["label_source"] == "predicted"
    assert client.delete("/v1/items/user/coat-1").json() == {"id": "user/coat-1", "deleted": True}
    assert client.get("/v1/items/user/coat-1").status_code == 404
    assert client.delete("/v1/items/user/coat-1").status_code == 404
    assert client.delete("/v1/items/user/unlabelled").status_code == 200
    ids = [h["id"] for h in client.post("/v1/search", json={"vector": v, "k": 5}).json()["results"]]
    assert "user/coat-1" not in ids


def test_item_image(client, picture):
    r = client.get("/v1/items/fashion-mnist-test-3/image")
    assert r.status_code == 200 and r.headers["content-type"] == "image/png"
    from PIL import Image

    im = Image.open(io.BytesIO(r.content))
    assert im.size == (28, 28)
    expected = fmnist_test_split().images[3]
    assert np.array_equal(np.asarray(im), expected)
    assert client.get("/v1/items/nope/image").status_code == 404


def test_put_picture(client, picture, rt):
    r = client.put(
        "/v1/items/upload/sneaker-1",
        files={"file": ("s.png", picture, "image/png")},
        data={"label": "sneaker"},
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["label"] == "gym_shoe.n.01" and body["image"] == "/v1/items/upload/sneaker-1/image"
    img = client.get(body["image"])
    assert img.status_code == 200 and img.content.startswith(b"\x89PNG")
    # the picture's embedding is the one /v1/embed gives
    e = client.post("/v1/embed", files={"file": ("s.png", picture, "image/png")}).json()
    assert body["vector"] == pytest.approx(e["vector"])
    assert client.delete("/v1/items/upload/sneaker-1").status_code == 200


# ---------------------------------------------------------------- pictures


def test_embed(client, picture, rt):
    r = client.post("/v1/embed", files={"file": ("s.png", picture, "image/png")})
    assert r.status_code == 200
    body = r.json()
    assert len(body["vector"]) == rt.dim and body["distance_to_origin"] > 0
    labs = body["labels"]
    assert len(labs) == 5 and all(lab["label"] in rt.taxonomy for lab in labs)
    # labels[0]: the deepest holding label when the labels' cones hold, then the nearest
    x = np.asarray(body["vector"])
    holder = rt.holder_of(x) if rt.cones_hold else None
    near = [n for n, _ in rt.nearest_nodes(x, 5)]
    rest = labs if holder is None else labs[1:]
    if holder is not None:
        assert labs[0]["label"] == holder
    assert [lab["label"] for lab in rest] == [n for n in near if n != holder][: len(rest)]
    assert [x["distance"] for x in rest] == sorted(x["distance"] for x in rest)
    assert len({lab["label"] for lab in labs}) == 5


def test_search_by_picture(client, picture, rt):
    r = client.post(
        "/v1/search/image", files={"file": ("s.png", picture, "image/png")}, params={"k": 7}
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert len(body["results"]) == 7 and body["query"]["label"] in rt.used_labels()
    # the same picture as JPEG and as RGB: decoded and embedded too
    from PIL import Image

    buf = io.BytesIO()
    Image.open(io.BytesIO(picture)).convert("RGB").resize((200, 200)).save(buf, "JPEG")
    r = client.post(
        "/v1/search/image",
        files={"file": ("s.jpg", buf.getvalue(), "image/jpeg")},
        params={"k": 3, "mode": "hierarchical"},
    )
    assert r.status_code == 200 and r.json()["results"][0]["level"] == 0


def test_large_jpeg_is_decoded_reduced(client):
    """5200 x 5200 = 27 Mpx is over the 25 Mpx limit, but a JPEG decodes at 1/8 scale."""
    from PIL import Image

    buf = io.BytesIO()
    Image.new("L", (5200, 5200), 200).save(buf, "JPEG", quality=50)
    r = client.post("/v1/embed", files={"file": ("big.jpg", buf.getvalue(), "image/jpeg")})
    assert r.status_code == 200, r.text
    buf = io.BytesIO()
    Image.new("L", (5200, 5200), 200).save(buf, "PNG")
    r = client.post("/v1/embed", files={"file": ("big.png", buf.getvalue(), "image/png")})
    assert r.status_code == 413 and "27,040,000 pixels" in detail_of(r)


def test_micro_batching_groups_concurrent_requests():
    from service.batching import MicroBatcher

    sizes = []

    def embed(images):
        time.sleep(0.01)
        return np.array([[float(im[0, 0])] for im in images])

    b = MicroBatcher(embed, max_size=8, max_wait=0.05, on_batch=lambda n, s: sizes.append(n))
    try:
        futures = [b.submit(np.full((2, 2), i, dtype=np.uint8)) for i in range(20)]
        assert [float(f.result(5)[0]) for f in futures] == [float(i) for i in range(20)]
    finally:
        b.close()
    assert max(sizes) == 8 and sum(sizes) == 20


def test_micro_batcher_with_two_workers_overlaps_batches_and_stops_both():
    """Two workers (a sharded index's searches): while one batch waits (its shards'
    answers), the next is formed and answered; every caller still gets its own
    result or error; close stops both workers and fails nothing answered."""
    from service.batching import BatcherClosed, MicroBatcher

    inside, most = [0], [0]
    lock = threading.Lock()

    def embed(items):
        with lock:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        time.sleep(0.05)  # a round trip to the shards
        with lock:
            inside[0] -= 1
        return [ValueError(f"bad {i}") if i % 7 == 3 else i * 10 for i in items]

    b = MicroBatcher(embed, max_size=4, max_wait=0.0, workers=2)
    try:
        futures = [b.submit(i) for i in range(24)]
        for i, f in enumerate(futures):
            if i % 7 == 3:
                with pytest.raises(ValueError, match=f"bad {i}"):
                    f.result(10)
            else:
                assert f.result(10) == i * 10
    finally:
        b.close()
    assert most[0] == 2  # two batches at once, never more
    assert not any(t.is_alive() for t in b._threads)
    with pytest.raises(BatcherClosed):
        b.submit(1)
    with pytest.raises(ValueError, match="workers"):
        MicroBatcher(embed, workers=0)


def test_batch_metrics_after_concurrent_searches(rt, picture):
    with app_client(rt, batch_max_wait_ms=30, batch_max_size=16) as c:
        out = []

        def go():
            out.append(
                c.post(
                    "/v1/search/image", files={"file": ("s.png", picture, "image/png")}
                ).status_code
            )

        threads = [threading.Thread(target=go) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert out == [200] * 8
        text = c.get("/metrics").text
        count = [
            ln for ln in text.splitlines() if ln.startswith("hypsearch_embed_batch_size_count")
        ]
        batches = float(count[0].split()[-1])
        assert batches < 8  # some requests shared a forward pass
        assert 'route="/v1/search/image"' in text and "hypsearch_index_items" in text


# ---------------------------------------------------------------- bad input


def _bomb_png(w: int, h: int) -> bytes:
    """A PNG whose header announces w x h pixels (and holds almost nothing)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        )

    ihdr = struct.pack(">IIBBBBB", w, h, 8, 0, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + chunk(b"IDAT", zlib.compress(b"\x00" * 64))
        + chunk(b"IEND", b"")
    )


BAD_SEARCHES = [
    ({"label": "sneaker", "k": 0}, 422, "k"),
    ({"label": "sneaker", "k": 1001}, 422, "k"),
    ({"label": "sneaker", "offset": -1}, 422, "offset"),
    ({"label": "sneaker", "offset": 9995, "k": 10}, 422, "offset + k"),
    ({"label": "sneaker", "mode": "sideways"}, 422, "mode"),
    ({}, 422, "exactly one of vector, label, id"),
    ({"label": "sneaker", "id": "fashion-mnist-test-1"}, 422, "exactly one"),
    ({"vector": [0.1, 0.2]}, 422, "vector: expected 10 numbers"),
    ({"vector": [0.5] * 10}, 422, "outside the ball"),
    ({"vector": []}, 422, "vector"),
    ({"vector": ["a"] * 10}, 422, "vector[0]"),
    ({"label": "snekaer"}, 422, "unknown label 'snekaer'"),
    ({"label": ""}, 422, "label"),
    ({"label": "sneaker", "under": "nothing-like-this"}, 422, "under"),
    ({"id": "no-such-item"}, 404, "no item 'no-such-item'"),
    ({"label": "sneaker", "colour": "red"}, 422, "colour"),
]


@pytest.mark.parametrize("body,status,words", BAD_SEARCHES)
def test_bad_search_input(client, body, status, words):
    r = client.post("/v1/search", json=body)
    assert r.status_code == status, r.text
    assert words in detail_of(r)


def test_bad_json(client):
    r = client.post(
        "/v1/search",
        content=b'{"vector": [NaN, 0, 0, 0, 0, 0, 0, 0, 0, 0]}',
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 422 and "vector[0]" in detail_of(r)
    r = client.post(
        "/v1/search", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert r.status_code == 422 and detail_of(r)
    r = client.put(
        "/v1/items/x",
        content=b'{"vector": [Infinity]}',
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 422 and "vector[0]" in detail_of(r)


def test_bad_uploads(client, rt, picture):
    def up(data, path="/v1/search/image", name="x.png"):
        return client.post(path, files={"file": (name, data, "image/png")})

    r = up(b"hello, not a picture")
    assert r.status_code == 415 and "file" in detail_of(r)
    r = up(picture[: len(picture) // 2])
    assert r.status_code == 422 and "does not decode" in detail_of(r)
    r = up(b"")
    assert r.status_code == 422 and "empty" in detail_of(r)
    r = up(_bomb_png(60_000, 60_000))
    assert r.status_code == 413 and "pixels" in detail_of(r)
    r = up(_bomb_png(60_000, 60_000), path="/v1/embed")
    assert r.status_code == 413
    r = client.post("/v1/search/image", data={"nofile": "x"})
    assert r.status_code == 422 and "file" in detail_of(r)
    r = client.post(
        "/v1/search/image", files={"file": ("s.png", picture, "image/png")}, params={"k": 0}
    )
    assert r.status_code == 422 and "k" in detail_of(r)
    r = client.put("/v1/items/x", content=b"vector=1", headers={"content-type": "text/plain"})
    assert r.status_code == 415 and "content-type" in detail_of(r)


def test_upload_size_limit(rt, picture):
    with app_client(rt, max_upload_bytes=len(picture) - 1) as c:
        r = c.post("/v1/search/image", files={"file": ("s.png", picture, "image/png")})
        assert r.status_code == 413 and "limit" in detail_of(r)
        big = b"\x89PNG" + b"\x00" * 200_000  # over the body cap: refused before parsing
        r = c.post("/v1/embed", files={"file": ("s.png", big, "image/png")})
        assert r.status_code == 413 and "limit" in detail_of(r)
        # one upload rule: every route that takes a picture answers the same 413
        files = {"file": ("s.png", picture, "image/png")}
        answers = [
            c.post("/v1/search/image", files=files),
            c.post("/v1/embed", files=files),
            c.put("/v1/items/too-big", files=files),
        ]
        assert [a.status_code for a in answers] == [413] * 3
        assert len({a.content for a in answers}) == 1, [a.text for a in answers]
        assert c.get("/v1/items/too-big").status_code == 404


def test_json_body_limit(rt):
    """A JSON body is parsed whole before any field is checked: it has its own,
    smaller cap (HYPSEARCH_MAX_JSON_BYTES), with or without a content length,
    while pictures keep the upload cap."""
    v = (rt.label_point("shirt.n.01") * 0.99).tolist()
    ok = {"vector": v, "k": 3}
    pad = {"vector": v, "k": 3, "pad": "x" * 5000}
    with app_client(rt, max_json_bytes=4096) as c:
        assert c.post("/v1/search", json=ok).status_code == 200
        r = c.post("/v1/search", json=pad)
        assert r.status_code == 413 and "HYPSEARCH_MAX_JSON_BYTES" in detail_of(r)
        body = json.dumps(pad).encode()

        def chunks():  # no content-length: counted while it is read
            for i in range(0, len(body), 1000):
                yield body[i : i + 1000]

        r = c.post("/v1/search", content=chunks(), headers={"content-type": "application/json"})
        assert r.status_code == 413 and "HYPSEARCH_MAX_JSON_BYTES" in detail_of(r)
        r = c.put("/v1/items/j1", json=pad)
        assert r.status_code == 413 and c.get("/v1/items/j1").status_code == 404


def test_api_key_guards_writes_and_jobs(rt):
    v = (rt.label_point("shirt.n.01") * 0.99).tolist()
    with app_client(rt, api_key=KEY) as c:
        r = c.put("/v1/items/k1", json={"vector": v})
        assert (
            r.status_code == 401
            and "Bearer" in detail_of(r)
            and r.headers["www-authenticate"] == "Bearer"
        )
        r = c.put(
            "/v1/items/k1", json={"vector": v}, headers={"Authorization": "Bearer wrong-key-123"}
        )
        assert r.status_code == 401 and "wrong" in detail_of(r)
        assert c.delete("/v1/items/k1").status_code == 401
        assert c.post("/v1/index/jobs", json={"path": "/tmp"}).status_code == 401
        auth = {"Authorization": f"Bearer {KEY}"}
        # jobs name server-side paths: listing and reading them need the key too
        assert c.get("/v1/index/jobs").status_code == 401
        assert c.get("/v1/index/jobs/nope").status_code == 401
        assert c.get("/v1/index/jobs/nope", headers=auth).status_code in (404, 503)
        assert c.put("/v1/items/k1", json={"vector": v}, headers=auth).status_code == 200
        assert c.post("/v1/search", json={"id": "k1"}).status_code == 200  # reads need no key
        assert c.delete("/v1/items/k1", headers=auth).status_code == 200


def test_placeholder_api_key_is_refused():
    from pydantic import ValidationError

    from service.settings import Settings

    with pytest.raises(ValidationError, match="api_key"):
        Settings(api_key="changeme")


def test_unknown_paths_and_methods(client):
    r = client.get("/v1/nothing")
    assert r.status_code == 404 and "/v1/nothing" in detail_of(r)
    r = client.get("/v1/search")
    assert r.status_code == 405 and "GET" in detail_of(r)
    assert json.loads(client.get("/v1/items/").text)["detail"]


def test_api_docs_are_served(client):
    r = client.get("/docs")
    assert r.status_code == 200 and "swagger" in r.text.lower()
    spec = client.get("/openapi.json").json()
    assert {
        "/v1/search",
        "/v1/search/image",
        "/v1/embed",
        "/v1/labels",
        "/v1/labels/{name}",
    } <= set(spec["paths"])
    assert spec["components"]["schemas"]["SearchIn"]["examples"]
    for src in ("/static/swagger/swagger-ui-bundle.js", "/static/swagger/swagger-ui.css"):
        if src in r.text:  # served locally when swagger-ui-bundle is installed
            assert client.get(src).status_code == 200


def test_page_is_served(client):
    r = client.get("/")
    assert r.status_code == 200 and "text/html" in r.headers["content-type"]
    assert "hypsearch" in r.text


def test_not_ready_until_loaded(tmp_path, caplog):
    """Loading runs in the background: /healthz answers at once, /readyz and the
    routes that need the artifacts 503 until loading is done (here: it fails).
    Why it failed names the artifact's path: in the log, never in an answer."""
    from fastapi.testclient import TestClient

    from service.app import create_app
    from service.settings import Settings

    bad = tmp_path / "model.safetensors"
    bad.write_bytes(b"not a checkpoint")
    app = create_app(
        Settings(model=bad, index=tmp_path / "index", log_json=False, log_level="ERROR")
    )
    with caplog.at_level(logging.ERROR, logger="service"), TestClient(app) as c:
        assert c.get("/healthz").status_code == 200
        deadline = time.monotonic() + 30
        while "failed" not in c.get("/readyz").json()["detail"]:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        r = c.get("/readyz")
        assert r.status_code == 503 and "log" in detail_of(r)
        answers = [r]
        r = c.post("/v1/search", json={"label": "sneaker"})
        assert r.status_code == 503 and "could not load" in detail_of(r)
        answers += [r, c.post("/v1/search/image", files={"file": ("q.png", b"x", "image/png")})]
        answers += [c.get("/v1/stats"), c.get("/v1/items/x")]
        for r in answers:
            assert r.status_code == 503
            assert str(tmp_path) not in r.text and "safetensors" not in r.text, r.text
        assert "hypsearch_ready 0.0" in c.get("/metrics").text
    assert "model.safetensors" in caplog.text  # the log says which file


def test_concurrent_writes_and_searches(rt):
    """Writers and readers at once: no error, and the tallies match the index after."""
    from service import searching

    rng = np.random.default_rng(0)
    base = rt.label_point("shirt.n.01") * 0.99
    errors: list[BaseException] = []
    stop = threading.Event()

    def writer(w: int) -> None:
        try:
            for j in range(40):
                i = f"conc/{w}/{j % 7}"
                lab = ["shirt.n.01", "coat.n.01", "sandal.n.01"][j % 3]
                v = base + rng.normal(scale=1e-3, size=base.shape)
                rt.upsert([i], v[None], [lab])
                if j % 3 == 2:
                    rt.delete([i])
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    def reader() -> None:
        try:
            while not stop.is_set():
                for mode in ("nearest", "hierarchical"):
                    x, q, _ = searching.query_point(rt, label="shirt")
                    searching.search(rt, x, q, k=20, mode=mode, under="clothing")
                rt.items_under("clothing.n.01")
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    readers = [threading.Thread(target=reader) for _ in range(3)]
    writers = [threading.Thread(target=writer, args=(w,)) for w in range(3)]
    for t in readers + writers:
        t.start()
    for t in writers:
        t.join()
    stop.set()
    for t in readers:
        t.join()
    assert not errors, errors[0]
    live = [i for i in rt.index.ids() if i.startswith("conc/")]
    counts = rt.label_counts()
    total = sum(counts.values())
    assert total == len(rt.index)
    for i in live:
        assert rt.label_of(i) == rt.index.get(i).label
    rt.delete(live)
