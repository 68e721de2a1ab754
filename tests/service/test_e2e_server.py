"""End to end: ``hypsearch serve`` as a real process on loopback, over a real index.

Search by name in hierarchical mode, search by picture, upsert then search,
delete, and restarts (graceful and SIGKILL) that keep every acknowledged write.
"""

from __future__ import annotations

import signal
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest
import torch

from tests.support.server import (
    Server,
    artifacts,
    fmnist_test_split,
    needs_data,
    png_bytes,
    write_index,
)

pytestmark = needs_data


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    torch.set_num_threads(1)
    art = artifacts(tmp_path_factory)
    assert art.model_path is not None, "the image model checkpoint could not be written"
    folder = tmp_path_factory.mktemp("e2e")
    write_index(art, folder / "index", 1000)
    return art, folder


def _serve(setup, name: str) -> Server:
    art, folder = setup
    return Server(
        ["--model", str(art.model_path), "--index", str(folder / "index")], folder / f"{name}.log"
    ).wait_ready()


@pytest.fixture(scope="module")
def reader(setup):
    """One server for the read-only tests."""
    with _serve(setup, "read") as srv, httpx.Client(base_url=srv.url, timeout=60) as c:
        yield c


def test_hierarchical_search_by_name(reader):
    c = reader
    taxonomy = c.get("/v1/labels/sneaker").json()
    assert taxonomy["name"] == "gym_shoe.n.01" and taxonomy["items"] > 0
    body = {"label": "sneaker", "mode": "hierarchical", "k": 300, "levels": "taxonomy"}
    body = c.post("/v1/search", json=body).json()
    assert body["query"]["label"] == "gym_shoe.n.01"
    hits = body["results"]
    levels = [h["level"] for h in hits]
    assert levels == sorted(levels)
    level0 = [h for h in hits if h["level"] == 0]
    assert len(level0) == taxonomy["items"]
    assert all(h["label"] == "gym_shoe.n.01" and h["via"] == "gym_shoe.n.01" for h in level0)
    higher = [h for h in hits if h["level"] > 0]
    assert higher and higher[0]["via"] == taxonomy["parents"][0]
    # within a level the firmest first (tests/service/test_service_cones.py checks the order
    # against a brute force): the scores, in [0, 1], never increase down the ranking
    scores = [h["score"] for h in hits]
    assert all(0.0 <= s <= 1.0 for s in scores) and scores == sorted(scores, reverse=True)
    # every word of the default kind resolves
    for word in (
        "footwear",
        "bag",
        "dress",
        "trousers",
        "sneakers",
        "shoes",
        "boot",
        "coat",
        "shirt",
        "t-shirt",
    ):
        r = c.post("/v1/search", json={"label": word, "mode": "hierarchical", "k": 3})
        assert r.status_code == 200, (word, r.text)
        assert len(r.json()["results"]) == 3
    # stats and metrics of a real process
    assert c.get("/v1/stats").json()["items"] == 1000
    assert (
        'hypsearch_request_seconds_count{method="POST",route="/v1/search",status="200"}'
        in c.get("/metrics").text
    )


def test_search_by_picture_with_concurrent_clients(reader):
    data = fmnist_test_split()
    rows = [int(np.flatnonzero(data.targets == t)[0]) for t in range(10)]
    pictures = [png_bytes(data.images[r]) for r in rows]
    c = reader

    def search(pic: bytes) -> dict:
        r = c.post("/v1/search/image", files={"file": ("q.png", pic, "image/png")}, params={"k": 5})
        assert r.status_code == 200, r.text
        return r.json()

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(search, pictures * 3))
    assert all(len(a["results"]) == 5 for a in answers)
    # a picture that is in the index finds itself first
    own = search(pictures[0])
    assert own["results"][0]["id"] == f"fashion-mnist-test-{rows[0]}"
    assert own["results"][0]["distance"] < 1e-6


def test_writes_survive_restarts(setup):
    art, folder = setup
    v = (art.labels.embeddings[art.labels.taxonomy.index("sandal.n.01")].numpy() * 0.995).tolist()
    with _serve(setup, "write1") as srv, httpx.Client(base_url=srv.url, timeout=30) as c:
        # the banner (Services.announce) is printed once, when the service is ready
        deadline = time.monotonic() + 10
        while f"serving on {srv.url}" not in srv.tail() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert srv.tail().count(f"hypsearch: serving on {srv.url}") == 1, srv.tail()
        r = c.put("/v1/items/e2e/sandal-1", json={"vector": v, "label": "sandal"})
        assert r.status_code == 200, r.text
        hits = c.post("/v1/search", json={"vector": v, "k": 1}).json()["results"]
        assert hits[0]["id"] == "e2e/sandal-1" and hits[0]["label"] == "sandal.n.01"
        assert c.delete("/v1/items/fashion-mnist-test-1").status_code == 200
        assert c.get("/v1/items/fashion-mnist-test-1").status_code == 404
        ids = [
            h["id"]
            for h in c.post("/v1/search", json={"label": "trousers", "k": 1000}).json()["results"]
        ]
        assert "fashion-mnist-test-1" not in ids
    # graceful restart
    with _serve(setup, "write2") as srv, httpx.Client(base_url=srv.url, timeout=30) as c:
        assert c.get("/v1/items/e2e/sandal-1").json()["label"] == "sandal.n.01"
        assert c.get("/v1/items/fashion-mnist-test-1").status_code == 404
        assert (
            c.post("/v1/search", json={"vector": v, "k": 1}).json()["results"][0]["id"]
            == "e2e/sandal-1"
        )
        # a write acknowledged just before a crash is kept too
        assert (
            c.put("/v1/items/e2e/crash", json={"vector": v, "label": "sneaker"}).status_code == 200
        )
        assert c.delete("/v1/items/e2e/sandal-1").status_code == 200
        srv.stop(signal.SIGKILL)
    with _serve(setup, "write3") as srv, httpx.Client(base_url=srv.url, timeout=30) as c:
        assert c.get("/v1/items/e2e/crash").json()["label"] == "gym_shoe.n.01"
        assert c.get("/v1/items/e2e/sandal-1").status_code == 404
        assert c.get("/v1/stats").json()["items"] == 1000  # +2 -1 -1


def test_an_oversized_upload_is_answered_413_to_a_client_that_sends_it_all(reader):
    """urllib sends the whole body before it reads the answer: the server reads
    (and drops) the refused body, so the client sees the 413 and its detail,
    not a connection reset."""
    import json
    import urllib.error
    import urllib.request

    limit = 10_000_000  # HYPSEARCH_MAX_UPLOAD_BYTES' default
    boundary = "hypsearchtestboundary"
    payload = b"\x89PNG\r\n\x1a\n" + bytes(limit + 1_000_000)
    body = (
        (
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="big.png"\r\n'
            "Content-Type: image/png\r\n\r\n"
        ).encode()
        + payload
        + f"\r\n--{boundary}--\r\n".encode()
    )
    for path in ("/v1/search/image", "/v1/embed"):
        req = urllib.request.Request(
            f"{reader.base_url}{path}",
            data=body,
            headers={"Content-Type": f"multipart/form-data; boundary={boundary}"},
            method="POST",
        )
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(req, timeout=60)
        assert err.value.code == 413
        assert "HYPSEARCH_MAX_UPLOAD_BYTES" in json.loads(err.value.read())["detail"]
    assert reader.get("/healthz").status_code == 200  # the server is still there
