"""Holding labels (entailment cones) and hierarchical search vs a brute-force reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from indexing import HierarchicalHit, HyperbolicIndex, IndexInputError, LabelCones
from models.geometry import cones as mcones
from tests.support.cloud import chain_up, exact_dist

PARENT = {
    "entity": None,
    "animal": "entity",
    "plant": "entity",
    "canine": "animal",  # no prototype: passed over when walking up
    "dog": "canine",
    "cat": "animal",
    "tree": "plant",
}
POLAR = {  # prototypes: (norm, angle in degrees); caps that nest (a laminar family)
    "entity": (0.0, 0.0),  # the origin: its cap holds every point
    "animal": (0.65, -70.0),  # cap of 66 degrees: [-136, -4]
    "plant": (0.65, 70.0),  # [4, 136]
    "dog": (0.9, -100.0),  # 33 degrees: [-133, -67]
    "cat": (0.9, -40.0),  # [-73, -7]
    "tree": (0.9, 70.0),  # [37, 103]
}
SPEC = mcones.cone_spec("cap", theta0=2.5, beta=0.5)


def _pt(r, deg):
    a = np.deg2rad(deg)
    return np.array([r * np.cos(a), r * np.sin(a)])


PROTOS = {lab: _pt(*rt) for lab, rt in POLAR.items()}
CHILDREN: dict[str, set[str]] = {}
for _c, _p in PARENT.items():
    if _p is not None:
        CHILDREN.setdefault(_p, set()).add(_c)


def descendants(label: str) -> set[str]:
    out, todo = set(), [label]
    while todo:
        for ch in CHILDREN.get(todo.pop(), ()):
            if ch not in out:
                out.add(ch)
                todo.append(ch)
    return out


def chain_of(label: str) -> list[str]:
    return chain_up(PARENT, label)


def _cone_parent(label: str) -> str | None:
    """The nearest ancestor with a prototype."""
    p = PARENT[label]
    while p is not None and p not in PROTOS:
        p = PARENT[p]
    return p


def holder_ref(x: np.ndarray) -> str | None:
    """Brute force, one item at a time, in torch: from the roots down through the
    prototype labels whose cone holds ``x`` (the one of largest margin); ``None``
    when no root's cone holds it."""
    xt = torch.from_numpy(x)

    def margin(lab):
        return float(mcones.membership_margin(torch.from_numpy(PROTOS[lab]), xt, SPEC, c=1.0))

    cur = None
    while True:
        kids = [lab for lab in PROTOS if _cone_parent(lab) == cur and margin(lab) >= 0]
        if not kids:
            return cur
        cur = max(kids, key=margin)


def hierarchical_ref(items, holders, q, chain, k, offset):
    seen: set[str] = set()
    ranked = []
    for lvl, lab in enumerate(chain):
        d = descendants(lab) | {lab}
        level = d - seen
        seen |= d
        sel = [i for i in items if holders[i] in level]
        if sel:
            dist = exact_dist(q, np.array([items[i] for i in sel]))
            for j in np.argsort(dist, kind="stable"):
                ranked.append((sel[j], float(dist[j]), lvl, lab))
    return ranked[offset : offset + k]


@pytest.fixture(scope="module")
def items():
    rng = np.random.default_rng(3)
    out = {}
    n = 0
    for lab in ("dog", "cat", "tree", "animal", "plant"):
        r, deg = POLAR[lab]
        spread = 30.0 if lab in ("animal", "plant") else 8.0  # degrees
        for _ in range(60):  # beyond each prototype, many inside its cone
            out[f"x{n}"] = _pt(rng.uniform(0.9, 0.995), deg + rng.normal(0, spread))
            n += 1
    for _ in range(60):  # anywhere
        out[f"x{n}"] = _pt(rng.uniform(0.1, 0.95), rng.uniform(-180, 180))
        n += 1
    return out


@pytest.fixture(scope="module")
def holders(items):
    return {i: holder_ref(x) for i, x in items.items()}


def make_cones():
    return LabelCones(PROTOS, PARENT.get, curvature=1.0, spec=SPEC)


def test_reference_hierarchy_is_interesting(items, holders):
    nearest = {}
    for i, x in items.items():
        d = {lab: float(exact_dist(x, p[None])[0]) for lab, p in PROTOS.items()}
        nearest[i] = min(d, key=d.get)
    walked = [i for i in items if holders[i] != nearest[i]]
    assert len(walked) >= 10  # items held by an ancestor of their nearest prototype
    counts = {lab: sum(h == lab for h in holders.values()) for lab in PROTOS}
    assert min(counts.values()) >= 10, counts
    assert sum(h == nearest[i] for i, h in holders.items()) >= 50


@pytest.mark.parametrize("backend", ["exact", "graph", "hnsw"])
def test_holding_labels_match_reference(items, holders, backend):
    ix = HyperbolicIndex(2, backend=backend, cones=make_cones())
    ix.add(np.array(list(items.values())), list(items), labels=["?"] * len(items))
    for i in items:
        assert ix.get(i).holder == holders[i], i


@pytest.mark.parametrize("backend", ["exact", "graph", "hnsw"])
@pytest.mark.parametrize("qlabel", ["dog", "cat", "tree"])
def test_hierarchical_search_matches_reference(items, holders, backend, qlabel):
    ix = HyperbolicIndex(2, backend=backend, cones=make_cones())
    ix.add(np.array(list(items.values())), list(items))
    rng = np.random.default_rng(sum(map(ord, qlabel)))
    chain = chain_of(qlabel)
    for _ in range(3):
        q = _pt(rng.uniform(0.6, 0.9), POLAR[qlabel][1] + rng.normal(0, 5))
        for k, offset in [(10, 0), (25, 0), (7, 55), (30, 290), (400, 0)]:
            got = ix.search_hierarchical(q, chain, descendants, k=k, offset=offset)
            want = hierarchical_ref(items, holders, q, chain, k, offset)
            assert [(h.id, h.level, h.via) for h in got] == [(w[0], w[2], w[3]) for w in want]
            np.testing.assert_allclose([h.distance for h in got], [w[1] for w in want], rtol=1e-12)
            assert all(isinstance(h, HierarchicalHit) for h in got)
        # paging: consecutive pages concatenate to the full order
        full = ix.search_hierarchical(q, chain, descendants, k=100)
        pages = sum(
            (
                ix.search_hierarchical(q, chain, descendants, k=9, offset=o)
                for o in range(0, 100, 9)
            ),
            [],
        )
        assert [h.id for h in pages[:100]] == [h.id for h in full]
        assert [h.level for h in full] == sorted(h.level for h in full)


def test_under_filter_uses_holders(items, holders):
    ix = HyperbolicIndex(2, cones=make_cones())
    ix.add(np.array(list(items.values())), list(items))
    under = descendants("animal") | {"animal"}
    ids, _ = ix.search(np.zeros(2), k=1000, under=under)
    assert sorted(ids[0]) == sorted(i for i, h in holders.items() if h in under)


def test_cones_set_later_persist_and_apply_to_new_items(tmp_path, items, holders):
    names = list(items)
    x = np.array(list(items.values()))
    ix = HyperbolicIndex(2, path=tmp_path, backend="exact")
    ix.add(x[:200], names[:200], labels=["lab"] * 200)
    assert ix.get(names[0]).holder == "lab"  # no cones: the label
    ix.set_cones(make_cones())  # recomputes the existing items
    assert all(ix.get(i).holder == holders[i] for i in names[:200])
    ix.close()
    re = HyperbolicIndex.open(tmp_path)  # cones come back from the store
    assert re.cones is not None and re.cones.spec == SPEC
    re.add(x[200:], names[200:])
    assert all(re.get(i).holder == holders[i] for i in names)
    ids, _ = re.search(np.zeros(2), k=1000, under={"tree"})
    assert sorted(ids[0]) == sorted(i for i, h in holders.items() if h == "tree")
    re.set_cones(None)
    assert re.get(names[0]).holder == "lab"


def test_hierarchical_input_errors(items):
    ix = HyperbolicIndex(2, cones=make_cones())
    ix.add(np.array(list(items.values()))[:10], list(items)[:10])
    with pytest.raises(IndexInputError, match="chain: empty"):
        ix.search_hierarchical(np.zeros(2), [], descendants)
    with pytest.raises(IndexInputError, match="chain: expected a sequence"):
        ix.search_hierarchical(np.zeros(2), "dog", descendants)
    with pytest.raises(IndexInputError, match="query: expected one vector"):
        ix.search_hierarchical(np.zeros((2, 2)), ["dog"], descendants)
    with pytest.raises(IndexInputError, match="offset: must be an integer >= 0"):
        ix.search_hierarchical(np.zeros(2), ["dog"], descendants, offset=-1)
    with pytest.raises(IndexInputError, match="cones: prototypes have dimension 2"):
        HyperbolicIndex(3, cones=make_cones())
    with pytest.raises(IndexInputError, match="prototypes"):
        LabelCones({"a": [1.5, 0.0]}, PARENT.get)


@pytest.mark.parametrize("qlabel", ["dog", "cat", "tree", "animal"])
def test_cone_levels_match_brute_force(items, qlabel):
    """Levels by the cone of each chain label (LabelCones.held_by) against a brute
    force: an item's level is the first chain label whose cone holds its own point
    (membership_margin_np over the chain); items no chain cone holds are left out."""
    cones = make_cones()
    ix = HyperbolicIndex(2, cones=cones)
    ix.add(np.array(list(items.values())), list(items), labels=["?"] * len(items))
    chain = chain_of(qlabel)
    q = PROTOS[qlabel]
    got = ix.search_hierarchical(q, chain, cones.held_by, k=1000)
    want = []
    for i, x in items.items():
        held = [
            lvl
            for lvl, lab in enumerate(chain)
            if lab in PROTOS and mcones.membership_margin_np(PROTOS[lab], x, SPEC, c=1.0) >= 0
        ]
        if held:
            want.append((held[0], float(exact_dist(q, x[None])[0]), i))
    want.sort()
    assert [(h.id, h.level, h.via) for h in got] == [(i, lvl, chain[lvl]) for lvl, _, i in want]
    assert len({h.level for h in got}) >= 2  # the levels are not all one


def test_hierarchical_by_label_and_label_filter(items, holders):
    """``by="label"``: levels from the items' own labels (the taxonomy chain), and
    ``labels`` keeps only items of those labels, whatever their holders."""
    names = list(items)
    labs = [("dog", "cat", "tree")[j % 3] for j in range(len(names))]
    ix = HyperbolicIndex(2, cones=make_cones())
    ix.add(np.array(list(items.values())), names, labels=labs)
    q = PROTOS["dog"]
    chain = chain_of("dog")
    got = ix.search_hierarchical(q, chain, descendants, k=1000, by="label")
    level_of = {"dog": 0, "cat": 2, "tree": 3}  # canine adds nothing, animal cat, entity tree
    want = sorted(
        (level_of[lab], float(exact_dist(q, items[i][None])[0]), i)
        for i, lab in zip(names, labs, strict=True)
        if lab in level_of
    )
    assert [(h.id, h.level) for h in got] == [(i, lvl) for lvl, _, i in want]
    got = ix.search_hierarchical(q, chain, descendants, k=1000, labels={"cat"})
    assert {h.id for h in got} == {
        i for i, lab in zip(names, labs, strict=True) if lab == "cat" and holders[i] is not None
    }
    with pytest.raises(IndexInputError, match="by: must be"):
        ix.search_hierarchical(q, chain, descendants, by="cone")


def test_held_among_is_held_by_on_the_names_asked():
    """``held_among(label, names)`` answers ``held_by(label) & names`` whether it tests
    the points of ``names`` alone (a few names among many labels, the label's whole
    answer not kept yet) or the whole answer: 400 labels of a 3-d ball, caps of every
    size, each asked of a fresh cone set and of one that kept its answers."""
    rng = np.random.default_rng(5)
    d = rng.normal(size=(400, 3))
    d /= np.linalg.norm(d, axis=1, keepdims=True)
    pts = d * rng.uniform(0.0, 0.97, size=(400, 1))
    names = [f"n{i}" for i in range(400)]
    protos = dict(zip(names, pts, strict=True))
    kept = LabelCones(protos, lambda _: None, spec=SPEC)
    asked = names[::7] + ["not-a-label"]  # 58 names: the fast path (< a quarter)
    sizes = []
    for label in names[::13]:
        fresh = LabelCones(protos, lambda _: None, spec=SPEC)
        want = kept.held_by(label) & set(asked)
        assert fresh.held_among(label, asked) == want
        assert kept.held_among(label, asked) == want  # from the kept whole answer
        sizes.append(len(want))
    assert min(sizes) <= 1 < max(sizes)  # leaves and caps that hold many were asked
