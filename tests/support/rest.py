"""Small helpers of the REST tests: a random vector of the ball, an error's detail, the
batch search checked against single searches (in process and on real servers alike)."""

from __future__ import annotations

import numpy as np


def random_vector(rng, dim: int, r: float = 0.5) -> list[float]:
    """A random direction at Euclidean norm ``r`` (a point of the unit ball), as a list."""
    d = rng.standard_normal(dim)
    return (d / np.linalg.norm(d) * r).tolist()


def detail_of(r) -> str:
    """The non-empty string ``detail`` of an error answer."""
    body = r.json()
    assert isinstance(body.get("detail"), str) and body["detail"], body
    return body["detail"]


def check_search_batch(client, dim: int) -> list[dict]:
    """``POST /v1/search/batch`` of three searches (label, id with payloads, vector in
    hierarchical mode) answers each as ``POST /v1/search`` does, and a bad search is
    refused with a 422 naming it; the searches sent."""
    searches = [
        {"label": "sneaker", "k": 3},
        {"id": "fashion-mnist-test-0", "k": 2, "with_payload": True},
        {"vector": [0.05] * dim, "k": 4, "mode": "hierarchical"},
    ]
    r = client.post("/v1/search/batch", json={"searches": searches})
    assert r.status_code == 200, r.text
    answers = r.json()["answers"]
    assert [len(a["results"]) for a in answers] == [3, 2, 4]
    assert all("payload" in h for h in answers[1]["results"])
    for s, a in zip(searches, answers, strict=True):
        assert a == client.post("/v1/search", json=s).json()
    r = client.post("/v1/search/batch", json={"searches": [searches[0], {"label": "snekaer"}]})
    assert r.status_code == 422 and detail_of(r).startswith("searches[1].label"), r.text
    return searches


def check_filtered_search(client, items: list[dict], f: dict) -> dict:
    """Label searches under the filter ``f`` (group and colour red) over ``items``: in
    nearest and hierarchical mode only red items with their payloads and no vectors;
    with vectors (the stored ones) and no payloads, by distance; ``max_distance``
    cuts between the second and third hit. The items by id."""
    reds = {it["id"] for it in items if it["payload"]["color"] == "red"}
    for mode in ("nearest", "hierarchical"):
        body = {"label": "sneaker", "k": 5, "mode": mode, "filter": f, "with_payload": True}
        r = client.post("/v1/search", json=body)
        assert r.status_code == 200, r.text
        res = r.json()["results"]
        assert len(res) == 5, mode
        assert all(h["id"] in reds and h["payload"]["color"] == "red" for h in res)
        assert all("vector" not in h for h in res)
    body = {"label": "sneaker", "k": 5, "mode": "nearest", "filter": f, "with_vector": True}
    res = client.post("/v1/search", json=body).json()["results"]
    by_id = {it["id"]: it for it in items}
    for h in res:
        np.testing.assert_allclose(h["vector"], by_id[h["id"]]["vector"])
        assert "payload" not in h
    dists = [h["distance"] for h in res]
    assert dists == sorted(dists)
    cut = (res[1]["distance"] + res[2]["distance"]) / 2
    res2 = client.post("/v1/search", json={**body, "max_distance": cut}).json()["results"]
    assert [h["id"] for h in res2] == [h["id"] for h in res[:2]]
    return by_id
