"""Batched searches (searching.search_many, the search batcher) and the search fast
path (service.fastpath), around a small real index.

What must hold: a batch answers every query exactly as the one-query path
(query_point + search) does, errors included and kept to their own query; the
fast path answers what the route answers, byte for byte, and leaves every
error to the route.
"""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from tests.support.server import (
    app_client,
    artifacts,
    needs_data,
    runtime_fixture,
    write_index,
)

pytestmark = needs_data


rt = runtime_fixture("batched", 400)


def _queries(rt):
    """A mixed batch: every kind of query, both modes, windows, filters, and bad ones."""
    from service.searching import Query

    rng = np.random.default_rng(0)
    item = rt.index.get("fashion-mnist-test-7")
    far = rng.normal(size=rt.dim)
    far *= 0.97 / np.linalg.norm(far) / np.sqrt(rt.curvature)
    return [
        Query(vector=item.vector.tolist(), k=5),
        Query(vector=far.tolist(), k=10),
        Query(vector=far.tolist(), k=10, offset=7),
        Query(vector=(item.vector * 0.5).tolist(), k=3, mode="hierarchical"),
        Query(vector=far.tolist(), k=8, under="footwear"),
        Query(label="sneaker", k=10),
        Query(label="sneaker", k=10, mode="hierarchical"),
        Query(label="coat", k=12, mode="hierarchical", per_level=3),
        Query(label="dress", k=10, offset=10, mode="hierarchical"),
        Query(label="sandal", k=6, under="footwear", mode="hierarchical"),
        Query(item_id="fashion-mnist-test-3", k=10),
        Query(item_id="fashion-mnist-test-3", k=4, offset=2, mode="hierarchical"),
        Query(point=item.vector, point_label="gym_shoe.n.01", k=5),
        Query(point=far, k=5),
        # each of these fails alone
        Query(label="snekaer", k=5),
        Query(vector=[0.1, 0.2], k=5),
        Query(vector=[0.5] * rt.dim, k=5),
        Query(item_id="no-such-item", k=5),
        Query(label="sneaker", k=5, under="nothing-like-this"),
        Query(label="sneaker", k=5, mode="sideways"),
        Query(k=5),
    ]


def _one(rt, q):
    """The one-query path the routes took before batching."""
    from service import searching
    from service.errors import ApiError

    try:
        if q.point is not None:
            x = q.point
            lab = q.point_label or rt.nearest_used_labels(x[None])[0]
            exclude = None
        else:
            x, lab, exclude = searching.query_point(
                rt, vector=q.vector, label=q.label, item_id=q.item_id
            )
        return searching.search(
            rt,
            x,
            lab,
            k=q.k,
            offset=q.offset,
            mode=q.mode,
            under=q.under,
            exclude=exclude,
            per_level=q.per_level,
        )
    except ApiError as e:
        return e


def _same(got, want):
    from service.errors import ApiError

    if isinstance(want, ApiError):
        assert isinstance(got, ApiError), got
        assert (got.status, got.detail, got.extra) == (want.status, want.detail, want.extra)
        return
    assert not isinstance(got, Exception), got
    assert got.query_label == want.query_label
    np.testing.assert_array_equal(got.query_vector, want.query_vector)
    assert got.query_radius == pytest.approx(want.query_radius, rel=1e-14)
    assert got.chain == want.chain
    assert [(h.id, h.label, h.level, h.via) for h in got.hits] == [
        (h.id, h.label, h.level, h.via) for h in want.hits
    ]
    np.testing.assert_allclose(
        [h.distance for h in got.hits], [h.distance for h in want.hits], rtol=1e-12, atol=1e-12
    )


def test_search_many_answers_each_query_as_one_search(rt):
    from service import searching
    from service.errors import ApiError

    queries = _queries(rt)
    got = searching.search_many(rt, queries)
    assert len(got) == len(queries)
    for q, g in zip(queries, got, strict=True):
        _same(g, _one(rt, q))
    assert sum(isinstance(g, ApiError) for g in got) == 7
    # nothing else in the batch: the same answers one by one
    for q, g in zip(queries, got, strict=True):
        _same(searching.search_many(rt, [q])[0], g)
    assert searching.search_many(rt, []) == []


def test_a_sharded_runtime_answers_a_batch_as_one_index_with_a_call_a_shard(rt, tmp_path):
    """The same items in three (local) shards: the batch's answers are the one index's,
    query by query (errors too), and all its label searches -- entailment, hierarchical
    by the shards' own cones, per level, filtered -- go to each shard together: one
    call a shard for the plain nearest queries, one for each round of the others
    (per-level queries ask level after level)."""
    from indexing.sharded import ShardedIndex
    from service import searching
    from service.runtime import runtime_for
    from tests.support.server import FMNIST, small_taxonomy

    items = rt.index.get_many(rt.index.ids())
    sharded = ShardedIndex(tmp_path / "ix", shards=3, dim=rt.dim, curvature=rt.curvature)
    sharded.add(
        np.stack([it.vector for it in items]),
        [it.id for it in items],
        labels=[it.label for it in items],
        payloads=[it.payload for it in items],
    )
    srt = runtime_for(sharded, rt.labels, rt.model, data_dir=FMNIST, taxonomy=small_taxonomy())
    calls: list[list[tuple]] = []  # each fan-out: (server method, index method) a shard
    fan_out = sharded._shards.run

    def counted(batch, **kw):
        calls.append([(m, a[0] if m == "call" else None) for _, m, a, _ in batch])
        return fan_out(batch, **kw)

    try:
        queries = _queries(rt)
        for q, g in zip(queries, searching.search_many(srt, queries), strict=True):
            _same(g, _one(rt, q))  # one index's answer, query by query
        sharded._shards.run = counted
        got = searching.search_many(srt, queries)
        for q, g in zip(queries, got, strict=True):
            _same(g, _one(rt, q))
    finally:
        sharded._shards.run = fan_out
        srt.close()
    rounds = [c for c in calls if c[0][0] == "many"]
    assert rounds and all(c == [("many", None)] * 3 for c in rounds)
    # the first round holds all eleven label, hierarchical and filtered searches; the
    # per-level query asks its levels one round after another
    assert len(rounds) <= len(rt.chain(rt.resolve("coat"), rt.default_levels))
    # the rest: the items of the id queries (one shard each) and one search a shard
    # for each window of the plain nearest queries
    others = [c for c in calls if c[0][0] != "many"]
    assert {m for c in others for m in c} <= {("call", "get"), ("call", "search")}
    assert sum(len(c) == 3 for c in others) == 4  # the windows 5, 10, 11 and 17


def test_answer_json_is_the_models_json_byte_for_byte(rt):
    """answer_json writes plain dicts; the bytes are those of the validated SearchOut
    (every mode, windows, groups, with vectors and payloads, a label query's null
    levels), and an answer the models refuse is refused as they refuse it."""
    import pydantic

    from service import searching
    from service.pipeline import answer_json, answer_model

    extra = [
        searching.Query(label="footwear", k=6, mode="entailment", group_by="children"),
        searching.Query(label="sneaker", k=4, with_vector=True, with_payload=True),
        searching.Query(vector=_queries(rt)[1].vector, k=3, with_payload=True),
    ]
    answers = [a for a in searching.search_many(rt, _queries(rt) + extra)]
    answers = [a for a in answers if isinstance(a, searching.Answer)]
    assert len(answers) == 17
    # this fixture's images lie outside the cones (no groups): groups of real hits
    a, b = answers[5], answers[-2]
    grouped = searching.Answer(a.query_label, a.query_vector, a.query_radius, [], None)
    grouped.groups = [searching.Group("sneaker", 7, a.hits), searching.Group("x", 2, b.hits)]
    grouped.mode = "entailment"
    answers.append(grouped)
    assert any(h.extra and "payload" in h.extra for a in answers for h in a.hits)
    for a in answers:
        want = answer_model(rt, a).model_dump_json(exclude_unset=True).encode()
        assert answer_json(rt, a) == want
    bad = answers[0]
    bad.hits[0].score = float("nan")
    with pytest.raises(pydantic.ValidationError):
        answer_json(rt, bad)


def test_search_many_keeps_any_failure_to_its_own_query(rt):
    """Errors that are not ApiErrors (the index refusing k = 0, a point of the wrong
    dimension) fail their own query only; the rest of the batch is answered."""
    from indexing import IndexInputError
    from service import searching

    good = [searching.Query(label="coat", k=5), searching.Query(vector=_queries(rt)[0].vector)]
    bad = [searching.Query(label="sneaker", k=0), searching.Query(point=np.zeros(3), k=5)]
    got = searching.search_many(rt, [good[0], bad[0], good[1], bad[1]])
    assert isinstance(got[1], IndexInputError)
    assert isinstance(got[3], ValueError)
    with pytest.raises(IndexInputError):
        x, lab, _ = searching.query_point(rt, label="sneaker")
        searching.search(rt, x, lab, k=0)
    _same(got[0], _one(rt, good[0]))
    _same(got[2], _one(rt, good[1]))


def test_search_many_windows_of_one_batch(rt):
    """Plain nearest queries of different windows in one batch (one index search each)."""
    from service import searching

    x = rt.index.get("fashion-mnist-test-11").vector
    v = x.tolist()
    queries = [searching.Query(vector=v, k=k, offset=o) for k in (1, 5, 20) for o in (0, 3)]
    got = searching.search_many(rt, queries)
    full = [h.id for h in searching.search_many(rt, [searching.Query(vector=v, k=30)])[0].hits]
    for q, g in zip(queries, got, strict=True):
        assert [h.id for h in g.hits] == full[q.offset : q.offset + q.k]


def test_batcher_keeps_each_error_with_its_caller(rt):
    from service import searching
    from service.batching import MicroBatcher
    from service.errors import ApiError

    sizes = []
    b = MicroBatcher(
        lambda qs: searching.search_many(rt, qs),
        max_size=64,
        max_wait=0.02,
        on_batch=lambda n, s: sizes.append(n),
    )
    try:
        queries = _queries(rt) * 3
        futures = [b.submit(q) for q in queries]
        for q, f in zip(queries, futures, strict=True):
            want = _one(rt, q)
            if isinstance(want, ApiError):
                with pytest.raises(ApiError) as err:
                    f.result(30)
                _same(err.value, want)
            else:
                _same(f.result(30), want)
    finally:
        b.close()
    assert sum(sizes) == len(queries) and max(sizes) > 1


def test_batcher_run_is_awaitable_and_batches_concurrent_callers(rt):
    from service import searching
    from service.batching import MicroBatcher

    sizes = []
    b = MicroBatcher(
        lambda qs: searching.search_many(rt, qs),
        max_wait=0.0,
        on_batch=lambda n, s: sizes.append(n),
    )
    labels = ["sneaker", "coat", "dress", "bag", "sandal", "shirt", "trouser", "boot"] * 4

    async def main():
        return await asyncio.gather(*(b.run(searching.Query(label=lab, k=5)) for lab in labels))

    try:
        answers = asyncio.run(main())
    finally:
        b.close()
    for lab, a in zip(labels, answers, strict=True):
        _same(a, _one(rt, searching.Query(label=lab, k=5)))
    assert sum(sizes) == len(labels) and len(sizes) < len(labels)


# ---------------------------------------------------------------- the fast path


def _bodies(rt):
    item = rt.index.get("fashion-mnist-test-7")
    return [
        {"vector": item.vector.tolist(), "k": 5},
        {"vector": item.vector.tolist(), "k": 5, "offset": 2, "mode": "hierarchical"},
        {"label": "sneaker", "k": 10, "mode": "hierarchical"},
        {"label": "coat", "k": 12, "mode": "hierarchical", "per_level": 3},
        {"label": "sandal", "k": 6, "under": "footwear"},
        {"id": "fashion-mnist-test-3", "k": 4},
        {"label": "dress", "k": 3, "disk": True},
    ]


BAD = [
    {"label": "sneaker", "k": 0},
    {"label": "sneaker", "offset": 9995, "k": 10},
    {"label": "sneaker", "mode": "sideways"},
    {},
    {"vector": [0.1, 0.2]},
    {"label": "snekaer"},
    {"label": "sneaker", "under": "nothing-like-this"},
    {"id": "no-such-item"},
    {"label": "sneaker", "colour": "red"},
]


def test_fast_path_answers_what_the_route_answers(rt):
    with app_client(rt) as fast, app_client(rt, search_fast_path=False) as slow:
        for body in _bodies(rt) + BAD:
            a, b = fast.post("/v1/search", json=body), slow.post("/v1/search", json=body)
            assert a.status_code == b.status_code, (body, a.text, b.text)
            assert a.content == b.content, body
            assert a.headers["content-type"] == b.headers["content-type"]
        for raw, ctype in (
            (b"{not json", "application/json"),
            (b'{"vector": [NaN, 0, 0, 0, 0, 0, 0, 0, 0, 0]}', "application/json"),
            (b'{"label": "sneaker"}', "text/plain"),
            (b'{"label": "sneaker"}', "application/json; charset=utf-8"),
            (b'[{"label": "sneaker"}]', "application/json"),
        ):
            h = {"content-type": ctype}
            a = fast.post("/v1/search", content=raw, headers=h)
            b = slow.post("/v1/search", content=raw, headers=h)
            assert (a.status_code, a.content) == (b.status_code, b.content), raw


def test_fast_path_upserts_as_the_route_upserts(rt):
    """PUT /v1/items/{id} with a JSON body: the fast path's answer is the route's, byte
    for byte (each item written once by each app, then read back), with and without
    the API key; every refusal is the route's own, and nothing refused is written."""
    item = rt.index.get("fashion-mnist-test-7")
    v = (item.vector * 0.5).tolist()
    good = [
        {"vector": v, "label": "sneaker"},
        {"vector": v, "label": "coat", "payload": {"price": 3.5, "tags": ["a", "b"]}},
        {"vector": v},  # the label predicted
    ]
    bad = [
        {"vector": v, "label": "snekaer"},
        {"vector": [0.1, 0.2]},
        {"vector": [0.9] * rt.dim},
        {"vector": v, "colour": "red"},
        {"label": "sneaker"},
    ]
    key = "fast-path-test-key"
    for settings in ({}, {"api_key": key}):
        auth = {"authorization": f"Bearer {key}"} if settings else {}
        with (
            app_client(rt, **settings) as fast,
            app_client(rt, search_fast_path=False, **settings) as slow,
        ):
            for j, body in enumerate(good):
                a = fast.put(f"/v1/items/fp-{len(settings)}-{j}-a", json=body, headers=auth)
                b = slow.put(f"/v1/items/fp-{len(settings)}-{j}-b", json=body, headers=auth)
                assert a.status_code == b.status_code == 200, (a.text, b.text)
                assert a.content.replace(b"-a", b"-b") == b.content
                got = fast.get(f"/v1/items/fp-{len(settings)}-{j}-a").json()
                assert got["label"] == a.json()["label"]
            for j, body in enumerate(bad):
                a = fast.put(f"/v1/items/bad-{j}", json=body, headers=auth)
                b = slow.put(f"/v1/items/bad-{j}", json=body, headers=auth)
                assert 400 <= a.status_code < 500, body
                assert (a.status_code, a.content) == (b.status_code, b.content), body
                assert fast.get(f"/v1/items/bad-{j}").status_code == 404
            if settings:  # no key, a wrong key: the route's 401, nothing written
                for h in ({}, {"authorization": "Bearer nope-nope-nope"}):
                    a = fast.put("/v1/items/nokey", json=good[0], headers=h)
                    b = slow.put("/v1/items/nokey", json=good[0], headers=h)
                    assert a.status_code == b.status_code == 401
                    assert a.json() == b.json()
                assert fast.get("/v1/items/nokey").status_code == 404
    # with the route's runtime dependency failing, a 200 came from the fast path
    from service.deps import get_runtime
    from service.errors import ApiError

    async def broken():
        raise ApiError(418, "the route answered")

    with app_client(rt) as c:
        c.app.dependency_overrides[get_runtime] = broken
        r = c.put("/v1/items/fp-itself", json=good[1], headers={"X-Request-ID": "w-1"})
        assert r.status_code == 200 and r.json()["payload"]["price"] == 3.5
        assert r.headers["x-request-id"] == "w-1"
        assert c.put("/v1/items/fp-bad", json=bad[0]).status_code == 418
        r = c.put("/v1/collections/default/items/fp-coll", json=good[0])
        assert r.status_code == 200 and r.json()["label"] == "gym_shoe.n.01"
    assert rt.index.get("fp-itself") is not None and rt.index.get("fp-coll") is not None
    rt.delete(["fp-itself", "fp-coll"])
    for j in range(len(good)):
        rt.delete([f"fp-{n}-{j}-{s}" for n in (0, 1) for s in "ab"])


def test_fast_path_answers_itself_and_leaves_the_rest_to_the_route(rt):
    """With the route's search dependency failing, what still answers 200 came from
    the fast path; errors and `disk: true` show the route's answer."""
    from service.deps import get_searcher
    from service.errors import ApiError

    async def broken():
        raise ApiError(418, "the route answered")

    with app_client(rt) as c:
        c.app.dependency_overrides[get_searcher] = broken
        r = c.post("/v1/search", json={"label": "sneaker", "k": 3}, headers={"X-Request-ID": "r-1"})
        assert r.status_code == 200 and len(r.json()["results"]) == 3
        assert r.headers["x-request-id"] == "r-1"
        r = c.post("/v1/search", json={"label": "sneaker", "k": 3, "disk": True})
        assert r.status_code == 418
        r = c.post("/v1/search", json={"label": "snekaer"})
        assert r.status_code == 418  # the route, not a fast-path error
        r = c.post(
            "/v1/search", content=b'{"label": "sneaker"}', headers={"content-type": "text/plain"}
        )
        assert r.status_code in (418, 422)
        metrics = c.get("/metrics").text
    count = 'hypsearch_request_seconds_count{method="POST",route="/v1/search",status="200"}'
    assert f"{count} 1.0" in metrics
    assert "hypsearch_search_batch_size_count" in metrics
    with app_client(rt, search_fast_path=False) as c:
        c.app.dependency_overrides[get_searcher] = broken
        assert c.post("/v1/search", json={"label": "sneaker", "k": 3}).status_code == 418


def test_fast_path_under_concurrent_clients(rt):
    """Many threads at once: every answer is the one a lone request gets."""
    bodies = _bodies(rt)[:6] * 6
    with app_client(rt) as c:
        want = [c.post("/v1/search", json=b).content for b in bodies]
        got: list[bytes | None] = [None] * len(bodies)

        def go(j):
            got[j] = c.post("/v1/search", json=bodies[j]).content

        threads = [threading.Thread(target=go, args=(j,)) for j in range(len(bodies))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert got == want


TOYS = [["sneaker", "shoe"], ["boot", "shoe"], ["shoe", "thing"], ["bag", "thing"]]


def _toys(c, dim: int) -> None:
    """The collection ``toys`` (its own taxonomy, the same items every time) and the
    alias ``play`` naming it."""
    r = c.post("/v1/collections", json={"name": "toys", "space": f"poincare:{dim}",
                                        "taxonomy": TOYS})  # fmt: skip
    assert r.status_code == 201, r.text
    rng = np.random.default_rng(4)
    x = rng.normal(size=(40, dim))
    x *= rng.uniform(0.1, 0.9, (40, 1)) / np.linalg.norm(x, axis=1, keepdims=True)
    labels = ["sneaker", "boot", "shoe", "bag", "thing"]
    items = [{"id": f"t{j}", "vector": v, "label": labels[j % 5]} for j, v in enumerate(x.tolist())]
    assert c.post("/v1/collections/toys/items/batch", json={"items": items}).status_code == 200
    assert c.put("/v1/aliases/play", json={"collection": "toys"}).status_code == 200


def test_fast_path_answers_collection_searches_as_the_route(rt, tmp_path):
    """``/v1/collections/{name}/search`` (a collection, an alias, the default one):
    the fast path's answers are the route's, byte for byte; an unknown or invalid
    name, and every error, are the route's own."""
    dim = rt.dim
    paths = ["toys", "play", "default", "nope", "-bad-", "toys/extra"]
    bodies = [
        {"label": "shoe", "k": 5},
        {"label": "shoe", "k": 10, "mode": "hierarchical"},
        {"label": "thing", "k": 4, "offset": 3},
        {"vector": [0.1] * dim, "k": 3},
        {"label": "nothing-like-this"},
        {"label": "shoe", "k": 0},
    ]
    with (
        app_client(rt, home=tmp_path / "fast") as fast,
        app_client(rt, home=tmp_path / "slow", search_fast_path=False) as slow,
    ):
        _toys(fast, dim)
        _toys(slow, dim)
        for name in paths:
            for body in bodies:
                url = f"/v1/collections/{name}/search"
                a, b = fast.post(url, json=body), slow.post(url, json=body)
                assert (a.status_code, a.content) == (b.status_code, b.content), (url, body)
        assert fast.post("/v1/collections/toys/search", json=bodies[0]).status_code == 200
        assert fast.post("/v1/collections/nope/search", json=bodies[0]).status_code == 404


def test_fast_path_answers_collection_searches_itself(rt, tmp_path):
    """With the route's search dependency failing, a collection's search still answers
    200 (the fast path), labelled in the metrics with the collection route."""
    from service.deps import get_searcher
    from service.errors import ApiError

    async def broken():
        raise ApiError(418, "the route answered")

    with app_client(rt, home=tmp_path) as c:
        _toys(c, rt.dim)
        c.app.dependency_overrides[get_searcher] = broken
        for name in ("toys", "play"):
            r = c.post(f"/v1/collections/{name}/search", json={"label": "shoe", "k": 3})
            assert r.status_code == 200 and len(r.json()["results"]) == 3
        r = c.post("/v1/collections/toys/search", json={"label": "shoe", "disk": True})
        assert r.status_code == 418
        metrics = c.get("/metrics").text
    count = (
        'hypsearch_request_seconds_count{method="POST",'
        'route="/v1/collections/{collection}/search",status="200"}'
    )
    assert f"{count} 2.0" in metrics


# ---------------------------------------------------------------- the fast path for pictures


def test_one_parser_for_the_image_route_and_the_fast_path(rt):
    """The route declares exactly the parameters of ImageSearchParams (the model the
    fast path validates), and both build their Query with searching.query_of."""
    from service import searching
    from service.errors import ApiError
    from service.schemas import ImageSearchParams, SearchIn
    from service.settings import Settings

    with app_client(rt) as c:
        doc = c.get("/openapi.json").json()
    params = doc["paths"]["/v1/search/image"]["post"]["parameters"]
    assert [p["name"] for p in params] == list(ImageSearchParams.model_fields)
    assert all(p["in"] == "query" for p in params)
    settings = Settings(index=rt.index.path)
    q = searching.query_of(
        ImageSearchParams(k=4, offset=2, mode="hierarchical", under="footwear"), settings
    )
    assert q == searching.Query(k=4, offset=2, mode="hierarchical", under="footwear")
    q = searching.query_of(SearchIn(id="fashion-mnist-test-3", k=7, per_level=2), settings)
    assert q == searching.Query(k=7, item_id="fashion-mnist-test-3", per_level=2)
    with pytest.raises(ApiError) as err:
        searching.query_of(SearchIn(label="coat", k=20), Settings(index=rt.index.path, max_k=10))
    assert err.value.status == 422 and "k:" in err.value.detail


@pytest.fixture(scope="module")
def pictures():
    from tests.support.server import fmnist_test_split, png_bytes

    data = fmnist_test_split()
    rows = [int(np.flatnonzero(data.targets == t)[0]) for t in range(10)]
    return [png_bytes(data.images[r]) for r in rows]


IMAGE_PARAMS = [
    {},
    {"k": 5},
    {"k": 4, "offset": 3, "mode": "hierarchical"},
    {"k": 6, "mode": "hierarchical", "per_level": 2},
    {"k": 5, "under": "footwear"},
    {"k": 5, "colour": "red"},  # unknown parameters are ignored, as FastAPI does
    {"k": 3, "disk": "true"},
]
BAD_IMAGE_PARAMS = [
    {"k": 0},
    {"k": ""},
    {"mode": "sideways"},
    {"offset": 9995, "k": 10},
    {"under": "nothing-like-this"},
    {"per_level": 0},
]


def test_image_fast_path_answers_what_the_route_answers(rt, pictures):
    def up(c, params, data=pictures[7], name="q.png", field="file"):
        return c.post("/v1/search/image", params=params, files={field: (name, data, "image/png")})

    with (
        app_client(rt, batch_max_wait_ms=1) as fast,
        app_client(rt, batch_max_wait_ms=1, search_fast_path=False) as slow,
    ):
        for params in IMAGE_PARAMS + BAD_IMAGE_PARAMS:
            for pic in pictures[:3]:
                a, b = up(fast, params, pic), up(slow, params, pic)
                assert (a.status_code, a.content) == (b.status_code, b.content), params
        for data in (b"hello, not a picture", b"", pictures[0][:60]):
            a, b = up(fast, {}, data), up(slow, {}, data)
            assert (a.status_code, a.content) == (b.status_code, b.content), data
            assert a.status_code in (415, 422)
        a, b = up(fast, {}, field="picture"), up(slow, {}, field="picture")
        assert (a.status_code, a.content) == (b.status_code, b.content)
        assert a.status_code == 422
        for name in ("default", "nope"):  # the same under the collection routes
            url = f"/v1/collections/{name}/search/image"
            files = {"file": ("q.png", pictures[7], "image/png")}
            a = fast.post(url, params={"k": 4}, files=files)
            b = slow.post(url, params={"k": 4}, files=files)
            assert (a.status_code, a.content) == (b.status_code, b.content), url
    # the upload limit of the settings holds on the fast path too
    with app_client(rt, max_upload_bytes=100) as c:
        r = up(c, {})
        assert r.status_code == 413 and "100 bytes" in r.json()["detail"]


def test_image_fast_path_answers_itself(rt, pictures):
    from service.deps import get_searcher
    from service.errors import ApiError

    async def broken():
        raise ApiError(418, "the route answered")

    with app_client(rt, batch_max_wait_ms=1) as c:
        c.app.dependency_overrides[get_searcher] = broken
        files = {"file": ("q.png", pictures[5], "image/png")}
        r = c.post("/v1/search/image", params={"k": 4}, files=files)
        assert r.status_code == 200 and len(r.json()["results"]) == 4
        assert r.json()["query"]["label"] in rt.used_labels()
        assert c.post("/v1/search/image", params={"disk": True}, files=files).status_code == 418
        r = c.post("/v1/collections/default/search/image", params={"k": 4}, files=files)
        assert r.status_code == 200 and len(r.json()["results"]) == 4
        files = {"file": ("q.png", b"not a picture", "image/png")}
        assert c.post("/v1/search/image", files=files).status_code == 418
        metrics = c.get("/metrics").text
    count = 'hypsearch_request_seconds_count{method="POST",route="/v1/search/image",status="200"}'
    assert f"{count} 1.0" in metrics


def test_large_pictures_are_decoded_off_the_event_loop(rt):
    """A picture over 512 x 512 pixels is decoded in the thread pool (either path)."""
    import io

    from PIL import Image

    from service.imaging import announced_pixels

    buf = io.BytesIO()
    Image.new("L", (700, 600), 128).save(buf, "PNG")
    big = buf.getvalue()
    assert announced_pixels(big) == 700 * 600 and announced_pixels(b"nope") is None
    for fast_path in (True, False):
        with app_client(rt, batch_max_wait_ms=1, search_fast_path=fast_path) as c:
            r = c.post("/v1/search/image", files={"file": ("big.png", big, "image/png")})
            assert r.status_code == 200 and len(r.json()["results"]) == 10


def test_an_app_that_loads_its_artifacts_freezes_them_for_the_gc(tmp_path_factory):
    """After loading, the loaded objects sit in the permanent generation (full
    collections under load no longer scan them); searches work as before."""
    import gc
    import time

    from fastapi.testclient import TestClient

    from service.app import create_app
    from service.settings import Settings

    art = artifacts(tmp_path_factory)
    assert art.model_path is not None
    ix = write_index(art, tmp_path_factory.mktemp("frozen") / "ix", 50)
    gc.unfreeze()
    home = tmp_path_factory.mktemp("frozen-home")
    settings = Settings(
        model=art.model_path, index=ix, home=home, log_json=False, log_level="WARNING"
    )
    try:
        with TestClient(create_app(settings)) as c:
            deadline = time.monotonic() + 60
            while c.get("/readyz").status_code != 200:
                assert time.monotonic() < deadline, c.get("/readyz").text
                time.sleep(0.05)
            frozen = gc.get_freeze_count()
            assert frozen > 10_000
            r = c.post("/v1/search", json={"label": "sneaker", "k": 3})
            assert r.status_code == 200 and len(r.json()["results"]) == 3
            # a collection opened while the app runs: its objects are frozen too
            r = c.post("/v1/collections", json={"name": "toys", "space": "poincare:4",
                                                "taxonomy": TOYS})  # fmt: skip
            assert r.status_code == 201, r.text
            assert gc.get_freeze_count() > frozen
            r = c.post("/v1/collections/toys/search", json={"label": "shoe", "k": 3})
            assert r.status_code == 200
    finally:
        gc.unfreeze()


def _starlette_file(content_type: bytes, body: bytes):
    """What the general parser (Starlette's, as FastAPI uses it) reads as the one file
    named 'file', or None when the body is not exactly that."""
    from starlette.datastructures import UploadFile
    from starlette.requests import Request

    from service.fastpath import _replay

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/",
        "query_string": b"",
        "headers": [(b"content-type", content_type), (b"content-length", b"%d" % len(body))],
    }

    async def parse():
        async with Request(scope, _replay(body, None)).form() as form:
            items = list(form.multi_items())
            if len(items) != 1 or items[0][0] != "file" or not isinstance(items[0][1], UploadFile):
                return None
            return await items[0][1].read()

    try:
        return asyncio.run(parse())
    except Exception:  # noqa: BLE001 - the general parser refuses it
        return None


def test_single_file_part_reads_what_the_general_parser_reads(pictures):
    import httpx

    from service.fastpath import single_file_part

    rng = np.random.default_rng(1)
    tricky = b"\r\n--not-the-boundary\r\n\r\n" + bytes(rng.integers(0, 256, 3000, dtype=np.uint8))
    bodies = []
    for data in (pictures[0], tricky, b"", b"--"):
        req = httpx.Request("POST", "http://x/", files={"file": ("q.png", data, "image/png")})
        bodies.append((req.headers["content-type"].encode(), req.read()))
    b = b"b0undary"
    ct = b"multipart/form-data; boundary=" + b
    quoted = b'multipart/form-data; boundary="' + b + b'"'

    def part(headers: bytes, data: bytes) -> bytes:
        return b"--" + b + b"\r\n" + headers + b"\r\n\r\n" + data + b"\r\n"

    disp = b'Content-Disposition: form-data; name="file"; filename="a.png"'
    end = b"--" + b + b"--\r\n"
    bodies += [
        (ct, part(disp, b"abc") + end),
        (quoted, part(disp, b"abc") + end),
        (ct, part(disp, b"abc") + end[:-2]),  # no CRLF after the close delimiter
        (ct, part(disp + b"\r\nContent-Type: image/png", b"abc") + end),
        (ct, b"a preamble\r\n" + part(disp, b"abc") + end),
        (ct, part(disp, b"abc") + part(b'Content-Disposition: form-data; name="k"', b"5") + end),
        (ct, part(b'Content-Disposition: form-data; name="file"', b"abc") + end),  # a field
        (ct, part(b'Content-Disposition: form-data; name="other"; filename="a"', b"x") + end),
        (ct, part(disp + b"\r\nContent-Transfer-Encoding: base64", b"YWJj") + end),
        (ct, part(disp, b"abc") + b"--" + b + b"--\r\nepilogue"),
        (ct, part(disp, b"abc")),  # no close delimiter
        (b"multipart/form-data", part(disp, b"abc") + end),  # no boundary
    ]
    fast_reads = 0
    for content_type, body in bodies:
        got = single_file_part(content_type, body)
        if got is not None:
            fast_reads += 1
            assert got == _starlette_file(content_type, body), body[:200]
    assert fast_reads >= 8
