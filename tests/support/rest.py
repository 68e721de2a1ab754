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
