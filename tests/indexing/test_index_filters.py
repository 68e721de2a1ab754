"""Filter expressions (indexing.filters) on a real index: against a brute-force
evaluation written here from the rules (not the module's own reference),
through writes, deletes and a reopen; filtered k-NN recall at 1% selectivity on
a graph index; scroll while writes happen; the errors naming the bad part."""

from __future__ import annotations

import math
import random
import threading

import numpy as np
import pytest

from indexing import HyperbolicIndex, IndexInputError
from indexing.filters import parse_filter

DIM = 8
COLORS = ["red", "green", "blue", "black"]
LABELS = ["cat", "dog", "bird", "fish", "ant"]


def scroll_all(ix, where, size: int) -> list[str]:
    """Every id ``ix.scroll`` gives for ``where``, page after page of ``size``."""
    seen, after = [], None
    while True:
        page, after = ix.scroll(where, size, after)
        seen += page
        if after is None:
            return seen


def _points(rng: np.random.Generator, n: int) -> np.ndarray:
    d = rng.standard_normal((n, DIM))
    return d / np.linalg.norm(d, axis=1, keepdims=True) * rng.uniform(0.05, 0.9, (n, 1))


def _payload(r: random.Random) -> dict | None:
    if r.random() < 0.05:
        return None
    p: dict = {}
    if r.random() < 0.9:
        p["color"] = r.choice(COLORS)
    if r.random() < 0.9:
        p["price"] = r.choice([r.randint(0, 100), round(r.uniform(0, 100), 2)])
    if r.random() < 0.5:
        p["tags"] = r.sample(["a", "b", "c", "d", 3, True], r.randint(0, 3))
    if r.random() < 0.3:
        p["flag"] = r.choice([True, False, 1, 0, "yes"])
    if r.random() < 0.6:
        p["shop"] = {"city": r.choice(["oslo", "rome", "lima"]), "stars": r.randint(1, 5)}
    if r.random() < 0.1:
        p["price"] = None
    return p


# ---------------------------------------------------------------- brute force, from the rules


def _get(payload, path):
    v = payload
    for seg in path:
        if not isinstance(v, dict) or seg not in v:
            return (False, None)
        v = v[seg]
    return (True, v)


def _same(a, b) -> bool:
    """JSON equality of two scalars: booleans are not numbers."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return float(a) == float(b)
    return isinstance(a, str) and isinstance(b, str) and a == b


def _brute_cond(c, item) -> bool:
    if not c or any(k in c for k in ("must", "should", "must_not")):
        return _brute(c, item)
    if "under" in c:
        return item["label"] == c["under"]
    key = c["key"]
    if key == "id":
        found, v = True, item["id"]
    elif key == "label":
        found, v = item["label"] is not None, item["label"]
    else:
        found, v = _get(item["payload"], key.split(".")[1:])
    if not found or v is None:
        return False
    vals = v if isinstance(v, list) else [v]
    if "match" in c:
        return any(_same(x, c["match"]) for x in vals)
    if "in" in c:
        return any(_same(x, w) for x in vals for w in c["in"])
    r = c["range"]

    def ok(x):
        if isinstance(x, bool) or not isinstance(x, (int, float)):
            return False
        return (
            ("gt" not in r or x > r["gt"])
            and ("gte" not in r or x >= r["gte"])
            and ("lt" not in r or x < r["lt"])
            and ("lte" not in r or x <= r["lte"])
        )

    return any(ok(x) for x in vals)


def _brute(f, item) -> bool:
    must = f.get("must") or []
    should = f.get("should") or []
    must_not = f.get("must_not") or []
    return (
        all(_brute_cond(c, item) for c in must)
        and (not should or any(_brute_cond(c, item) for c in should))
        and not any(_brute_cond(c, item) for c in must_not)
    )


def _random_cond(r: random.Random, depth: int):
    x = r.random()
    if x < 0.15 and depth < 3:
        return _random_filter(r, depth + 1)
    if x < 0.22:
        return {"under": r.choice(LABELS)}
    key = r.choice(
        ["label", "id", "payload.color", "payload.price", "payload.tags", "payload.flag",
         "payload.shop.city", "payload.shop.stars", "payload.missing"]
    )  # fmt: skip
    if key in ("payload.price", "payload.shop.stars") and r.random() < 0.6:
        bounds = r.sample(["gt", "gte", "lt", "lte"], r.randint(1, 2))
        return {
            "key": key,
            "range": {b: r.choice([r.randint(0, 100), r.uniform(0, 100)]) for b in bounds},
        }
    pool = {
        "label": LABELS,
        "id": [f"i{j}" for j in range(40)],
        "payload.color": COLORS,
        "payload.price": [0, 1, 50, 99.5, 100],
        "payload.tags": ["a", "b", 3, True],
        "payload.flag": [True, False, 1, 0, "yes"],
        "payload.shop.city": ["oslo", "rome", "x"],
        "payload.shop.stars": [1, 2, 3, 5.0],
        "payload.missing": ["a", 1],
    }[key]
    if r.random() < 0.5:
        return {"key": key, "match": r.choice(pool)}
    return {"key": key, "in": r.sample(pool, r.randint(0, min(3, len(pool))))}


def _random_filter(r: random.Random, depth: int = 0) -> dict:
    f = {}
    for clause in ("must", "should", "must_not"):
        if r.random() < 0.6:
            f[clause] = [_random_cond(r, depth) for _ in range(r.randint(0, 3))]
    return f


@pytest.fixture()
def filled(tmp_path):
    rng = np.random.default_rng(0)
    r = random.Random(0)
    n = 2000
    ids = [f"i{j}" for j in range(n)]
    labels = [r.choice(LABELS + [None]) for _ in range(n)]
    payloads = [_payload(r) for _ in range(n)]
    ix = HyperbolicIndex(DIM, path=tmp_path / "ix", backend="exact")
    ix.add(_points(rng, n), ids, labels=labels, payloads=payloads)
    items = {
        i: {"id": i, "label": lab, "payload": p}
        for i, lab, p in zip(ids, labels, payloads, strict=True)
    }
    yield ix, items, r, rng
    ix.close()


def _check(ix, items, filters):
    for f in filters:
        want = sorted(i for i, it in items.items() if _brute(f, it))
        mask = ix.filter_mask(f)
        got = sorted(ix._live.table.ids[s] for s in np.nonzero(mask)[0])
        assert got == want, f
        assert ix.count(f) == len(want)


def test_filters_match_brute_force_through_writes_and_reopen(filled, tmp_path):
    ix, items, r, rng = filled
    filters = [_random_filter(r) for _ in range(160)]
    assert sum(1 for f in filters if 0 < ix.count(f) < len(items)) > 50  # not all trivial
    _check(ix, items, filters)
    # writes after the columns exist: new items, changed payloads (same and new vectors), deletes
    changed = r.sample(sorted(items), 300)
    new = [f"n{j}" for j in range(200)]
    ids = changed[:150] + new
    pts = _points(rng, len(ids))
    for j, i in enumerate(changed[:100]):  # same vector: the slot is kept, metadata changes
        pts[j] = ix.get(i).vector
    pay = [_payload(r) for _ in ids]
    labs = [r.choice(LABELS) for _ in ids]
    ix.add(pts, ids, labels=labs, payloads=pay)
    for i, lab, p in zip(ids, labs, pay, strict=True):
        items[i] = {"id": i, "label": lab, "payload": p}
    gone = changed[150:]
    ix.delete(gone)
    for i in gone:
        del items[i]
    _check(ix, items, filters[:80])
    ix.save()
    ix.close()
    ix2 = HyperbolicIndex.load(tmp_path / "ix")
    try:
        _check(ix2, items, filters[80:])
    finally:
        ix2.close()


def test_search_count_scroll_and_delete_take_a_filter(filled):
    ix, items, r, rng = filled
    f = {
        "must": [
            {"key": "payload.color", "match": "red"},
            {"key": "payload.price", "range": {"lt": 30}},
        ]
    }
    want = {i for i, it in items.items() if _brute(f, it)}
    q = _points(rng, 5)
    got, d = ix.search(q, k=10, where=f)
    assert got.shape == (5, 10) and set(got.ravel()) <= want
    allowed = sorted(want)
    exact, de = ix.search(q, k=10, filter_ids=allowed)
    np.testing.assert_allclose(d, de)
    # scroll: every passing item once, in id order
    assert scroll_all(ix, f, 37) == sorted(want)
    deleted = ix.delete_where(f)
    assert set(deleted) == want and ix.count(f) == 0 and len(ix) == len(items) - len(want)


def test_hierarchical_search_takes_a_filter(filled):
    ix, items, r, rng = filled
    f = {"must": [{"key": "payload.shop.city", "match": "oslo"}]}
    chain = ["cat", "dog"]
    hits = ix.search_hierarchical(_points(rng, 1), chain, lambda lab: [], k=50, by="label", where=f)
    assert hits and all(items[h.id]["payload"]["shop"]["city"] == "oslo" for h in hits)
    assert all(items[h.id]["label"] == chain[h.level] for h in hits)


def test_filtered_graph_search_recall_at_one_percent():
    """20k items, a filter keeping 1% (200): recall@10 against the exact filtered
    answer, with the graph routing through the filtered-out nodes (the exact
    fallback threshold lowered below the 200 allowed items)."""
    rng = np.random.default_rng(1)
    n = 20_000
    x = _points(rng, n)
    ids = [f"p{j:05d}" for j in range(n)]
    payloads = [{"shard": j % 100} for j in range(n)]
    f = {"must": [{"key": "payload.shard", "match": 42}]}
    allowed = [i for i, p in zip(ids, payloads, strict=True) if p["shard"] == 42]
    q = _points(rng, 50)
    exact = HyperbolicIndex(DIM, backend="exact")
    exact.add(x, ids, payloads=payloads)
    truth, _ = exact.search(q, k=10, filter_ids=allowed)
    ix = HyperbolicIndex(DIM, backend="graph", R=16, ef_construction=48, filter_exact_threshold=50)
    ix.add(x, ids, payloads=payloads)
    assert ix.backend == "graph"
    got, _ = ix.search(q, k=10, where=f)
    recall = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(got, truth, strict=True)])
    assert recall >= 0.99, recall


def test_scroll_lists_every_item_once_while_writes_happen(tmp_path):
    rng = np.random.default_rng(2)
    ix = HyperbolicIndex(DIM, path=tmp_path / "ix", backend="exact")
    stable = [f"s{j:04d}" for j in range(1500)]
    ix.add(_points(rng, len(stable)), stable, payloads=[{"keep": True}] * len(stable))
    stop = threading.Event()

    def writer():
        w = np.random.default_rng(3)
        n = 0
        while not stop.is_set():
            ids = [f"{c}{n}" for c in "aks"]  # sorted before, among and after the stable ids
            n += 1
            ix.add(_points(w, 3), ids, payloads=[{"keep": True}] * 3)
            if n % 3 == 0:
                ix.delete([f"k{n - 2}"])

    t = threading.Thread(target=writer)
    t.start()
    try:
        for where in (None, {"must": [{"key": "payload.keep", "match": True}]}):
            seen = scroll_all(ix, where, 50)
            assert len(seen) == len(set(seen))
            assert seen == sorted(seen)
            assert set(stable) <= set(seen)
    finally:
        stop.set()
        t.join()
        ix.close()


BAD = [
    ([], "filter: expected an object"),
    ({"must": {}}, "filter.must: expected a list"),
    ({"musts": []}, "filter: unknown field 'musts'"),
    ({"must": [{"key": "color", "match": 1}]}, "filter.must[0].key: unknown key 'color'"),
    ({"must": [{"key": "payload", "match": 1}]}, "filter.must[0].key: 'payload' names no field"),
    ({"must": [{"key": "payload.a..b", "match": 1}]}, "filter.must[0].key"),
    ({"should": [{"key": "payload.a"}]}, "filter.should[0]: give exactly one of match, in, range"),
    ({"must": [{"key": "payload.a", "match": 1, "in": [1]}]}, "filter.must[0]: give exactly one"),
    ({"must": [{"key": "payload.a", "match": [1]}]}, "filter.must[0].match: expected a string"),
    ({"must": [{"key": "payload.a", "match": None}]}, "filter.must[0].match"),
    ({"must": [{"key": "payload.a", "in": "x"}]}, "filter.must[0].in: expected a list"),
    ({"must": [{"key": "payload.a", "in": [1, {}]}]}, "filter.must[0].in[1]"),
    ({"must": [{"key": "payload.a", "range": {}}]}, "filter.must[0].range: give at least one"),
    ({"must": [{"key": "payload.a", "range": {"gt": "a"}}]}, "filter.must[0].range.gt"),
    ({"must": [{"key": "payload.a", "range": {"gt": True}}]}, "filter.must[0].range.gt"),
    ({"must": [{"key": "payload.a", "range": {"above": 1}}]}, "unknown bound 'above'"),
    ({"must": [{"key": "label", "range": {"gt": 1}}]}, "filter.must[0].range: label values"),
    ({"must": [{"key": "id", "match": 3}]}, "filter.must[0].match: id values are strings"),
    ({"must": [{"under": 3}]}, "filter.must[0].under: expected a label name"),
    ({"must": [{"under": "x", "key": "id"}]}, "filter.must[0]: unexpected 'key'"),
    ({"must": [{"nope": 1}]}, "filter.must[0]: expected {key, match|in|range}"),
    (
        {"must": [{"key": "payload.a", "match": 1, "nope": 2}]},
        "filter.must[0]: unknown field 'nope'",
    ),
    (
        {"must_not": [{"must": [{"must": [{"key": "x"}]}]}]},
        "filter.must_not[0].must[0].must[0].key",
    ),
    ({"must": [{"key": "payload.a", "range": {"gt": math.inf}}]}, "filter.must[0].range.gt"),
]


@pytest.mark.parametrize("bad, words", BAD)
def test_bad_filters_name_the_part(bad, words):
    with pytest.raises(IndexInputError) as e:
        parse_filter(bad)
    assert words in str(e.value)


def test_filter_bounds():
    deep: dict = {"must": []}
    f = deep
    for _ in range(20):
        g: dict = {"must": []}
        f["must"].append(g)
        f = g
    with pytest.raises(IndexInputError, match="nest at most"):
        parse_filter(deep)
    with pytest.raises(IndexInputError, match="at most 256 conditions"):
        parse_filter({"must": [{"key": "id", "match": "a"}] * 1100})
