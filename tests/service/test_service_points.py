"""Batches, filters, scroll and count over REST (in process, a small real index):
batch upsert all or nothing, delete by ids and by filter, get many, batch
search, with_vector / with_payload / max_distance, the request limits."""

from __future__ import annotations

import base64

import numpy as np
import pytest

from tests.support.rest import (
    check_filtered_search,
    check_search_batch,
    detail_of,
    random_vector,
)
from tests.support.server import (
    app_client,
    fmnist_test_split,
    needs_data,
    png_bytes,
    runtime_fixture,
)

pytestmark = needs_data

rt = runtime_fixture("points", 300)
KEY = "s3cret-key-for-tests"


@pytest.fixture(scope="module")
def client(rt):
    with app_client(rt, batch_max_wait_ms=5, max_batch_items=50, max_batch_searches=4) as c:
        yield c


def _items(rt, n, prefix, rng, **payload):
    return [
        {
            "id": f"{prefix}{j}",
            "vector": random_vector(rng, rt.dim, rng.uniform(0.2, 0.8)),
            "label": "sneaker" if j % 2 else "sandal",
            "payload": {"n": j, "color": ["red", "blue"][j % 2], **payload},
        }
        for j in range(n)
    ]


def test_batch_upsert_get_count_scroll_delete(client, rt):
    rng = np.random.default_rng(0)
    before = len(rt)
    items = _items(rt, 40, "pb-", rng, group="pb")
    r = client.post("/v1/items/batch", json={"items": items})
    assert r.status_code == 200, r.text
    assert r.json() == {"upserted": 40} and len(rt) == before + 40
    # get many: in the order asked, absent ids left out, vector/payload on request
    r = client.post("/v1/items/get", json={"ids": ["pb-3", "nope", "pb-1"]})
    got = r.json()["items"]
    assert [g["id"] for g in got] == ["pb-3", "pb-1"] and "payload" not in got[0]
    assert got[0]["label"] == "gym_shoe.n.01" and "vector" not in got[0]
    r = client.post(
        "/v1/items/get", json={"ids": ["pb-3"], "with_vector": True, "with_payload": True}
    )
    g = r.json()["items"][0]
    np.testing.assert_allclose(g["vector"], items[3]["vector"])
    assert g["payload"] == {"n": 3, "color": "blue", "group": "pb", "label_source": "given"}
    # count with filters (payload, label, under, nested)
    group = {"key": "payload.group", "match": "pb"}
    count = lambda f: client.post("/v1/count", json={"filter": f}).json()["count"]  # noqa: E731
    assert count({"must": [group]}) == 40
    assert count({"must": [group, {"key": "payload.color", "match": "red"}]}) == 20
    assert count({"must": [group, {"key": "payload.n", "range": {"gte": 10, "lt": 15}}]}) == 5
    assert count({"must": [group, {"under": "sneaker"}]}) == 20
    assert count({"must": [group, {"under": "footwear"}]}) == 40
    assert (
        count({"must": [group], "must_not": [{"should": [{"key": "payload.n", "in": [1, 2]}]}]})
        == 38
    )
    assert client.post("/v1/count", json={}).json()["count"] == len(rt)
    # scroll: pages in id order, every item once
    seen, cursor = [], None
    while True:
        r = client.post(
            "/v1/scroll", json={"filter": {"must": [group]}, "limit": 7, "cursor": cursor}
        )
        assert r.status_code == 200, r.text
        seen += [it["id"] for it in r.json()["items"]]
        cursor = r.json()["next_cursor"]
        if cursor is None:
            break
    assert seen == sorted(it["id"] for it in items)
    r = client.post("/v1/scroll", json={"cursor": "!!not-a-cursor"})
    assert r.status_code == 400 and detail_of(r).startswith("cursor:")
    # delete by ids, then by filter
    r = client.post("/v1/items/delete", json={"ids": ["pb-0", "pb-1", "absent"]})
    assert r.json() == {"deleted": 2}
    r = client.post("/v1/items/delete", json={"filter": {"must": [group]}})
    assert r.json() == {"deleted": 38} and len(rt) == before
    assert count({"must": [group]}) == 0


def test_batch_with_one_bad_item_stores_nothing(client, rt):
    rng = np.random.default_rng(1)
    before = len(rt)
    cases = [
        (3, {"vector": [0.9] * rt.dim}, 422, "items[3].vector: norm"),
        (2, {"vector": [0.1] * (rt.dim + 1)}, 422, "items[2].vector: expected"),
        (4, {"label": "snekaer"}, 422, "items[4].label"),
        (1, {"id": "bad-0"}, 422, "items[1].id: duplicate id"),
        (5, {"payload": {"image": {"path": "/etc/passwd"}}}, 422, "items[5].payload.image"),
        (0, {"vector": None, "image": "bm90IGEgcGljdHVyZQ=="}, 415, "items[0].image"),
        (2, {"vector": None, "image": "%%%"}, 422, "items[2].image: not base64"),
    ]
    for j, change, status, words in cases:
        items = _items(rt, 6, "bad-", rng)
        items[j].update(change)
        if items[j].get("vector") is None:
            items[j].pop("vector")
        r = client.post("/v1/items/batch", json={"items": items})
        assert r.status_code == status, (change, r.text)
        assert words in detail_of(r), (words, r.text)
        assert len(rt) == before
        assert client.post("/v1/items/get", json={"ids": ["bad-5"]}).json() == {"items": []}
    # both a vector and an image, or neither
    r = client.post("/v1/items/batch", json={"items": [{"id": "x"}]})
    assert r.status_code == 422 and "items[0]" in detail_of(r)


def test_batch_of_pictures_is_embedded(client, rt):
    data = fmnist_test_split()
    rows = [int(np.flatnonzero(data.targets == 7)[0]), int(np.flatnonzero(data.targets == 5)[0])]
    items = [
        {"id": f"pic-{j}", "image": base64.b64encode(png_bytes(data.images[r])).decode()}
        for j, r in enumerate(rows)
    ]
    items.append({"id": "pic-v", "vector": [0.1] * rt.dim, "payload": {"k": 1}})
    r = client.post("/v1/items/batch", json={"items": items})
    assert r.status_code == 200, r.text
    for j in range(len(rows)):
        it = client.get(f"/v1/items/pic-{j}").json()
        assert it["label_source"] == "predicted" and it["image"] == f"/v1/items/pic-{j}/image"
        img = client.get(f"/v1/items/pic-{j}/image")
        assert img.status_code == 200 and img.headers["content-type"] == "image/png"
    assert client.post("/v1/items/delete", json={"ids": ["pic-0", "pic-1", "pic-v"]}).json() == {
        "deleted": 3
    }


def test_search_filter_with_vector_payload_max_distance(client, rt):
    rng = np.random.default_rng(2)
    items = _items(rt, 30, "sf-", rng, group="sf")
    assert client.post("/v1/items/batch", json={"items": items}).status_code == 200
    f = {
        "must": [{"key": "payload.group", "match": "sf"}, {"key": "payload.color", "match": "red"}]
    }
    check_filtered_search(client, items, f)
    plain = client.post("/v1/search", json={"label": "sneaker", "k": 3}).json()["results"]
    assert all("payload" not in h and "vector" not in h for h in plain)
    # a bad filter: 422 naming the part; an unknown label under: suggestions
    r = client.post("/v1/search", json={"label": "sneaker", "filter": {"must": [{"key": "x"}]}})
    assert r.status_code == 422 and detail_of(r).startswith("filter.must[0].key")
    r = client.post(
        "/v1/search", json={"label": "sneaker", "filter": {"must": [{"under": "snekaer"}]}}
    )
    assert r.status_code == 422 and "filter.must[0].under" in detail_of(r)
    assert r.json()["suggestions"]
    client.post(
        "/v1/items/delete", json={"filter": {"must": [{"key": "payload.group", "match": "sf"}]}}
    )


def test_search_batch(client, rt):
    searches = check_search_batch(client, rt.dim)
    r = client.post("/v1/search/batch", json={"searches": [searches[0], {"k": 0, "label": "bag"}]})
    assert r.status_code == 422 and "searches[1].k" in detail_of(r)
    r = client.post("/v1/search/batch", json={"searches": [searches[0]] * 5})
    assert r.status_code == 413 and "HYPSEARCH_MAX_BATCH_SEARCHES" in detail_of(r)


def test_limits_and_write_access(rt):
    rng = np.random.default_rng(3)
    with app_client(rt, max_batch_items=5, api_key=KEY, max_batch_bytes=200_000) as c:
        items = _items(rt, 6, "lim-", rng)
        r = c.post(
            "/v1/items/batch", json={"items": items}, headers={"Authorization": f"Bearer {KEY}"}
        )
        assert r.status_code == 413 and "HYPSEARCH_MAX_BATCH_ITEMS" in detail_of(r)
        r = c.post("/v1/items/batch", json={"items": items[:5]})
        assert r.status_code == 401
        r = c.post("/v1/items/delete", json={"ids": ["lim-0"]})
        assert r.status_code == 401
        big = {"items": [{"id": "x", "vector": [0.0] * rt.dim, "payload": {"s": "x" * 300_000}}]}
        r = c.post("/v1/items/batch", json=big, headers={"Authorization": f"Bearer {KEY}"})
        assert r.status_code == 413 and "HYPSEARCH_MAX_BATCH_BYTES" in detail_of(r)
        r = c.post("/v1/items/get", json={"ids": [f"x{j}" for j in range(6)]})
        assert r.status_code == 413
        assert c.post("/v1/count", json={}).status_code == 200  # reads need no key
