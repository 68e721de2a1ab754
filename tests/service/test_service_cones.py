"""The service over label cones that hold (a tiny taxonomy placed by the cap
construction): holders stored and kept over a restart, cone levels of the
hierarchical mode against a brute-force cone test, the taxonomy option, the
label and item routes' cone fields, and /v1/embed's first label."""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np
import pytest

from indexing import HyperbolicIndex
from models.geometry import cones as mcones
from models.geometry import poincare_np
from models.labels import LabelEmbedding
from models.taxonomy.graph import Taxonomy
from service.runtime import Runtime, runtime_for
from tests.support.cones import cap_labels
from tests.support.server import app_client

EDGES = [  # child, parent (a tree)
    ("footwear", "entity"),
    ("clothing", "entity"),
    ("shoe", "footwear"),
    ("sandal", "footwear"),
    ("sneaker", "shoe"),
    ("boot", "shoe"),
    ("coat", "clothing"),
    ("dress", "clothing"),
]
SPEC = mcones.cone_spec("cap", theta0=2.5, beta=0.5)
DIM = 4


def _labels() -> LabelEmbedding:
    return cap_labels(Taxonomy.from_edges(EDGES), DIM, seed=1)


LABELS = _labels()
POINTS = {n: LABELS.embeddings[j].double().numpy() for j, n in enumerate(LABELS.taxonomy.names)}


def margin(label: str, y: np.ndarray) -> float:
    return float(mcones.membership_margin_np(POINTS[label], y, SPEC, c=1.0))


def firmness(label: str, y: np.ndarray) -> float:
    """Margin over the cone's aperture (indexing.entailment), computed here apart."""
    return margin(label, y) / float(mcones.aperture_np(POINTS[label], SPEC, c=1.0))


def scores_of(firm: list[float]) -> list[float]:
    """Firmness clipped to [0, 1] and capped by the score before it."""
    out, cur = [], 1.0
    for f in firm:
        cur = min(cur, max(0.0, min(1.0, f)))
        out.append(cur)
    return out


def deepest_ref(y: np.ndarray) -> str | None:
    """Brute force: of the labels whose cones hold ``y``, the deepest."""
    held = [n for n in POINTS if margin(n, y) >= 0]
    return max(held, key=LABELS.taxonomy.depth) if held else None


def _beyond(label: str, rng, step: float) -> np.ndarray:
    """A point on the label's ray, ``step`` farther from the origin, jittered a little."""
    p = POINTS[label]
    r = np.linalg.norm(p)
    # the root sits at the origin: its items at right angles to its children
    # (which are antipodal), outside both children's caps
    f = POINTS["footwear"] / np.linalg.norm(POINTS["footwear"])
    u = p / r if r > 0 else np.eye(DIM)[np.argmin(np.abs(f))] - f * f[np.argmin(np.abs(f))]
    u = u / np.linalg.norm(u)
    u = u + rng.normal(0, 0.01, DIM)
    u /= np.linalg.norm(u)
    rho = 2 * np.arctanh(r) + step
    return np.tanh(rho / 2) * u


@pytest.fixture(scope="module")
def items():
    """Points beyond every label on its ray (held by it, not by its children),
    labelled by it, by another label, or not at all."""
    rng = np.random.default_rng(0)
    out = {}
    names = sorted(POINTS)
    for lab in names:
        for j in range(8):
            y = _beyond(lab, rng, rng.uniform(0.5, 3.0))
            label = [lab, None, names[j % len(names)]][j % 3]
            out[f"{lab}-{j}"] = (y, label)
    return out


def _open(path, items=None) -> Runtime:
    index = HyperbolicIndex(dim=DIM, curvature=1.0, path=path)
    rt = runtime_for(index, LABELS, taxonomy=LABELS.taxonomy)
    if items:
        ids = list(items)
        rt.upsert(ids, np.array([items[i][0] for i in ids]), [items[i][1] for i in ids])
    return rt


@pytest.fixture(scope="module")
def served(tmp_path_factory, items):
    rt = _open(tmp_path_factory.mktemp("cones") / "index", items)
    with app_client(rt) as client:
        yield rt, client
    rt.close()


def test_the_cones_hold_and_the_items_are_spread(served, items):
    rt, _ = served
    assert rt.cones_hold and rt.cones_held_share == 1.0 and rt.default_levels == "cone"
    holders = {i: deepest_ref(y) for i, (y, _) in items.items()}
    assert all(h == i.split("-")[0] for i, h in holders.items())  # held by its own label
    for i in items:
        assert rt.index.get(i).holder == holders[i]


@pytest.mark.parametrize("query", ["sneaker", "sandal", "coat", "shoe"])
def test_cone_levels_match_a_brute_force_cone_test(served, items, query):
    """Level i: the item's own point is in the cone of chain[i] and not of chain[i-1]
    (membership_margin_np over the chain), for labelled and unlabelled items; each
    level ordered by firmness in its cone (then id); scores never increase."""
    rt, client = served
    body = client.post("/v1/search", json={"label": query, "mode": "hierarchical", "k": 1000})
    assert body.status_code == 200, body.text
    hits = body.json()["results"]
    chain = rt.chain(query, "cone")
    assert chain[0] == query and chain[-1] == "entity"
    q = POINTS[query]
    want = []
    for i, (y, _) in items.items():
        held = [lvl for lvl, lab in enumerate(chain) if margin(lab, y) >= 0]
        if held:
            want.append((held[0], -firmness(chain[held[0]], y), i))
    want.sort()
    assert [(h["id"], h["level"], h["via"]) for h in hits] == [
        (i, lvl, chain[lvl]) for lvl, _, i in want
    ]
    assert any(items[h["id"]][1] is None for h in hits)  # unlabelled items have levels too
    dist = [float(poincare_np.dist(q, items[h["id"]][0], c=1.0)) for h in hits]
    np.testing.assert_allclose([h["distance"] for h in hits], dist, rtol=1e-9)
    np.testing.assert_allclose([h["score"] for h in hits], scores_of([-w[1] for w in want]))
    # the fast path and the routes share the field; per_level keeps each level's nearest
    few = client.post(
        "/v1/search",
        json={"label": query, "mode": "hierarchical", "k": 1000, "per_level": 2},
    ).json()["results"]
    for lvl in {h["level"] for h in hits}:
        assert [h["id"] for h in few if h["level"] == lvl] == [
            h["id"] for h in hits if h["level"] == lvl
        ][:2]


def test_taxonomy_levels_option(served, items):
    rt, client = served
    body = {"label": "sneaker", "mode": "hierarchical", "k": 1000, "levels": "taxonomy"}
    hits = client.post("/v1/search", json=body).json()["results"]
    chain = rt.chain("sneaker")
    tax = LABELS.taxonomy

    def level(label):
        for lvl, lab in enumerate(chain):
            if label == lab or lab in tax.ancestors(label):
                return lvl
        return None

    got = [(h["id"], h["level"]) for h in hits]
    want = sorted(
        (level(lab), -firmness(chain[level(lab)], y), i)
        for i, (y, lab) in items.items()
        if lab is not None
    )
    assert got == [(i, lvl) for lvl, _, i in want]
    # the image search's query parameters take the field too (validated)
    r = client.post("/v1/search", json={**body, "levels": "cones"})
    assert r.status_code == 422 and "levels" in r.text


def test_label_route_has_vector_and_cone(served):
    _, client = served
    body = client.get("/v1/labels/shoe").json()
    np.testing.assert_array_equal(body["vector"], POINTS["shoe"])
    cone = body["cone"]
    assert {k: cone[k] for k in SPEC} == SPEC
    assert cone["aperture"] == pytest.approx(
        float(mcones.aperture_np(POINTS["shoe"], SPEC, c=1.0)), rel=1e-12
    )
    root = client.get("/v1/labels/entity").json()["cone"]["aperture"]
    assert root > cone["aperture"] > 0


def test_item_route_has_holder_and_payload(served, items):
    rt, client = served
    v = _beyond("boot", np.random.default_rng(5), 1.0)
    r = client.put("/v1/items/new-boot", json={"vector": v.tolist()})
    assert r.status_code in (200, 201), r.text
    body = client.get("/v1/items/new-boot").json()
    assert body["holder"] == "boot" == deepest_ref(v)
    assert body["payload"]["label_source"] == "predicted"
    got = client.get("/v1/items/sandal-1").json()
    assert got["holder"] == "sandal" and got["label"] is None
    rt.delete(["new-boot"])


def test_embed_first_label_is_the_deepest_holding_cone(served):
    """A point inside the cap of ``shoe`` but outside its children's: the first
    label is ``shoe`` even where a child's point is nearer."""
    rt, _ = served
    rng = np.random.default_rng(2)
    for _ in range(20):
        y = _beyond("shoe", rng, rng.uniform(0.5, 4.0))
        assert margin("shoe", y) >= 0
        assert all(margin(ch, y) < 0 for ch in ("sneaker", "boot"))
        labs = rt.embed_labels(y, 5)
        assert labs[0][0] == "shoe"
        assert len({n for n, _ in labs}) == 5
        near = [n for n, _ in rt.nearest_nodes(y, 5) if n != "shoe"]
        assert [n for n, _ in labs[1:]] == near[:4]
    # a point no cone but the root's holds: the root first
    far = _beyond("entity", rng, 0.1)
    assert rt.embed_labels(far, 5)[0][0] == deepest_ref(far)


def test_holders_survive_a_restart(tmp_path, items):
    rt = _open(tmp_path / "index", items)
    fp = rt.index.cones.fingerprint()
    holders = {i: rt.index.get(i).holder for i in items}
    rt.close()
    index = HyperbolicIndex.open(tmp_path / "index")  # no cones given: the stored ones
    assert index.cones is not None and index.cones.fingerprint() == fp
    assert index.cones.spec == SPEC
    assert {i: index.get(i).holder for i in items} == holders
    index.close()
    rt = _open(tmp_path / "index")  # the same labels: nothing recomputed, same holders
    assert {i: rt.index.get(i).holder for i in items} == holders
    hits = rt.index.search_hierarchical(POINTS["coat"], rt.chain("coat", "cone"), rt.cones.held_by)
    assert hits and hits[0].level == 0
    rt.close()


def test_cone_and_taxonomy_levels_agree_on_well_labelled_items(tmp_path, items):
    from service.crosscheck import level_agreement

    good = {i: v for i, v in items.items() if v[1] == i.split("-")[0]}
    rt = _open(tmp_path / "good", good)
    got = level_agreement(rt)
    assert got["agreement"] == 1.0 and got["holder_agreement"] == 1.0
    assert got["pairs"] == got["queries"] * len(good)
    rt.close()
    rt = _open(tmp_path / "all", items)  # a third of the labels are another node's
    got = level_agreement(rt)
    assert 0.5 < got["agreement"] < 1.0 and got["holder_agreement"] < 1.0
    rt.close()


@pytest.mark.parametrize("cone_weight, levels", [(0.0, "taxonomy"), (1.0, "cone")])
def test_cone_levels_by_default_only_for_a_model_that_places_images_in_cones(
    tmp_path, cone_weight, levels
):
    """A model trained without the cone term puts no image inside its class's
    cone: its runtime groups by the taxonomy chain and /v1/embed answers the
    nearest nodes; with the cone term (or with no model), by cone."""
    from models.images.preprocess import Preprocess
    from models.vision.encoders import EncoderConfig
    from models.vision.heads import HeadConfig
    from models.vision.image_model import ImageModel

    leaves = [n for n in LABELS.taxonomy.names if not LABELS.taxonomy.children(n)]
    model = ImageModel(
        EncoderConfig("conv4", 1, 28, [4, 4, 8, 8]),
        HeadConfig(in_features=8, dim=DIM, clip_r=5.0),
        Preprocess(),
        LABELS,
        [(n, n) for n in leaves],
        config={"cone_weight": cone_weight},
    )
    assert model.places_in_cones is (cone_weight > 0)
    index = HyperbolicIndex(dim=DIM, curvature=1.0, path=tmp_path / "index")
    rt = runtime_for(index, LABELS, taxonomy=LABELS.taxonomy, model=model)
    try:
        assert rt.cones_held_share == 1.0  # the labels' cones hold either way
        assert rt.default_levels == levels and rt.cones_hold is (levels == "cone")
        x = _beyond("shoe", np.random.default_rng(1), 1.0)
        near = [n for n, _ in rt.nearest_nodes(x, 5)]
        got = [n for n, _ in rt.embed_labels(x, 5)]
        assert got[0] == ("shoe" if levels == "cone" else near[0])
    finally:
        rt.close()


PARENT = dict(EDGES)


def _tier(query: str, y: np.ndarray) -> int:
    """Brute force: ``2 i`` when ``y``'s deepest holding cone is the ``i``-th label up
    the query's chain (a tree: the taxonomy's), ``2 i + 1`` when that label's cone
    holds it first but it lies in another branch, ``2 len(chain)`` when none holds it."""
    chain = [query]
    while chain[-1] in PARENT:
        chain.append(PARENT[chain[-1]])
    for i, a in enumerate(chain):
        if margin(a, y) >= 0:
            return 2 * i + (0 if deepest_ref(y) == a else 1)
    return 2 * len(chain)


def _held_under(rt, query, items):
    """Brute force: item -> (branch below the query label, firmness) for the items
    the query label's cone holds (the branch from the cone chain of each item's
    deepest holding cone)."""
    out = {}
    for i, (y, _) in items.items():
        if margin(query, y) < 0:
            continue
        chain = rt.chain(deepest_ref(y), "cone")
        below = chain[: chain.index(query)] if query in chain else []
        out[i] = (below[-1] if below else query, firmness(query, y))
    return out


@pytest.mark.parametrize("query", ["footwear", "shoe", "sneaker"])
def test_entailment_is_the_default_for_labels_and_holds_first(served, items, query):
    """A label query with no mode: first every item the label's cone holds, the
    firmest of each child branch before the second of any, scores never
    increasing; then the items outside, least far outside first, score 0."""
    rt, client = served
    body = client.post("/v1/search", json={"label": query, "k": len(items)}).json()
    assert body["query"]["mode"] == "entailment"  # auto, resolved
    hits = body["results"]
    held = _held_under(rt, query, items)
    assert {h["id"] for h in hits[: len(held)]} == set(held)
    outside = [items[h["id"]][0] for h in hits[len(held) :]]
    assert all(firmness(query, y) < 0 for y in outside)
    # least far outside first: by tier (the nearest ancestor whose cone holds the item,
    # the items placed at that ancestor itself first), then by firmness
    keys = [(_tier(query, y), -firmness(query, y)) for y in outside]
    assert keys == sorted(keys)
    assert len({t for t, _ in keys}) >= 2  # the tiers are exercised
    assert all(h["score"] == 0 for h in hits[len(held) :])
    scores = [h["score"] for h in hits]
    assert scores == sorted(scores, reverse=True)
    branches = {b for b, _ in held.values() if b != query}
    first = [held[h["id"]][0] for h in hits[: len(branches)]]
    if branches:  # every child branch shows before any branch shows twice
        assert set(first) == branches or len(set(first)) == len(first)
    holder = {i: deepest_ref(items[i][0]) for i in held}
    for lab in set(holder.values()):  # the items of one holding label: by firmness
        f = [held[h["id"]][1] for h in hits if holder.get(h["id"]) == lab]
        assert f == sorted(f, reverse=True)
    nearest = client.post("/v1/search", json={"label": query, "k": 5, "mode": "nearest"})
    d = [h["distance"] for h in nearest.json()["results"]]
    assert d == sorted(d) and nearest.json()["query"]["mode"] == "nearest"
    by_vector = client.post("/v1/search", json={"vector": items[hits[0]["id"]][0].tolist()})
    assert by_vector.json()["query"]["mode"] == "nearest"  # auto, for a vector


def test_group_by_children_and_count_facets(served, items):
    rt, client = served
    held = _held_under(rt, "footwear", items)
    want = {}
    for b, _ in held.values():
        if b != "footwear":
            want[b] = want.get(b, 0) + 1
    body = client.post(
        "/v1/search", json={"label": "footwear", "k": 3, "group_by": "children"}
    ).json()
    assert "results" not in body
    got = {g["label"]: g for g in body["groups"]}
    assert {b: g["count"] for b, g in got.items()} == want
    for b, g in got.items():
        assert len(g["results"]) == min(3, want[b])
        assert all(held[h["id"]][0] == b for h in g["results"])
    c = client.post("/v1/count", json={"label": "footwear", "facet": "children"}).json()
    assert c["count"] == len(held)
    assert {f["label"]: f["count"] for f in c["facets"]} == want
    assert client.post("/v1/count", json={"label": "footwear"}).json() == {"count": len(held)}


@pytest.mark.parametrize(
    "body, words",
    [
        ({"label": "shoe", "mode": "closest"}, ["mode", "entailment"]),
        ({"label": "shoe", "group_by": "parents"}, ["group_by", "children"]),
        ({"vector": [0.1] * DIM, "group_by": "children"}, ["group_by", "label"]),
        ({"label": "shoe", "mode": "nearest", "group_by": "children"}, ["group_by"]),
        ({"label": "no-such-label-xyz"}, ["label"]),
    ],
)
def test_bad_modes_and_groups_are_422_naming_them(served, body, words):
    _, client = served
    r = client.post("/v1/search", json=body)
    assert r.status_code == 422, r.text
    for w in words:
        assert w in r.text
    r = client.post("/v1/count", json={"facet": "children"})
    assert r.status_code == 422 and "facet" in r.text


@contextmanager
def _one_and_sharded(rt, items, path):
    """One exact index and three local shards holding ``items``, with the served cones."""
    from indexing.sharded import ShardedIndex

    single = HyperbolicIndex(dim=DIM, backend="exact")
    sharded = ShardedIndex(path / "ix", shards=3, dim=DIM, backend="exact")
    try:
        for ix in (single, sharded):
            ix.set_cones(rt.cones)
            ids = sorted(items)
            ix.add(np.stack([items[i][0] for i in ids]), ids, labels=[items[i][1] for i in ids])
        yield single, sharded
    finally:
        single.close()
        sharded.close()


@pytest.mark.parametrize("query", ["footwear", "sneaker", "coat"])
def test_sharded_entailment_is_the_one_index_ranking(served, items, query, tmp_path):
    """Three local shards answer the entailment ranking of one index (the held items'
    round robin and the outside's tiers merged from each shard's candidates)."""
    rt, _ = served
    with _one_and_sharded(rt, items, tmp_path) as (single, sharded):
        x = POINTS[query]
        for k, offset in ((len(items), 0), (7, 5)):
            a = single.search_entailment(query, x, k, offset)
            b = sharded.search_entailment(query, x, k, offset)
            assert [h.id for h in a] == [h.id for h in b]
            np.testing.assert_allclose([h.firmness for h in a], [h.firmness for h in b])


def test_sharded_run_calls_answer_each_call_as_alone(served, items, tmp_path):
    """Several searches in one call per shard (a micro-batch's) answer what each asked
    alone of one index answers; a bad call's error is its own answer only; cone levels
    by the cones set on the index travel as their fingerprint, not as a label table."""
    from indexing import IndexInputError
    from indexing.interface import run_calls

    rt, _ = served
    with _one_and_sharded(rt, items, tmp_path) as (single, sharded):
        held = rt.cones.held_by
        table = {lab: held(lab) for lab in POINTS}
        calls = []
        for q in ("footwear", "sneaker", "coat"):
            x, chain = POINTS[q], rt.chain(q, "cone")
            calls += [
                ("search_entailment", (q, x, 7, 2), {}),
                ("entailment_candidates", (q, x, 5), {"labels": {"sneaker", "sandal"}}),
                ("search_hierarchical", (x, chain, held), {"k": 9, "offset": 1, "firmness": True}),
                ("search_hierarchical", (x, chain, table.__getitem__), {"k": 6, "by": "label"}),
                ("search", (np.stack([x, x * 0.5]),), {"k": 4}),
                ("search_entailment", (q, x, 0), {}),  # k = 0: refused, alone
                ("count", (), {}),  # not a search: asked in turn
            ]
        got = run_calls(sharded, calls)
        want = run_calls(single, calls)
        assert len(got) == len(want) == len(calls)
        for (method, _, _), g, w in zip(calls, got, want, strict=True):
            if isinstance(w, Exception):
                assert type(g) is type(w) and str(g) == str(w), (method, g, w)
                assert isinstance(g, IndexInputError)
            elif method == "search":
                np.testing.assert_array_equal(g[0], w[0])
                np.testing.assert_array_equal(g[1], w[1])
            elif method == "entailment_candidates":
                assert g.n_held == w.n_held
                assert sorted(g.branch_counts().items()) == sorted(w.branch_counts().items())
            elif method == "count":
                assert g == w == len(items)
            else:
                assert [h.id for h in g] == [h.id for h in w], method
                np.testing.assert_allclose([h.distance for h in g], [h.distance for h in w])
        # the levels of the index's own cones: the cones' fingerprint, not a table
        own, _ = sharded._plan_search_hierarchical(POINTS["coat"], rt.chain("coat", "cone"), held)
        other, _ = sharded._plan_search_hierarchical(POINTS["coat"], ["coat"], table.__getitem__)
        assert own[0] == "own_levels" and own[1][2] == rt.cones.fingerprint()
        assert other[0] == "call" and other[1][0] == "search_hierarchical"
