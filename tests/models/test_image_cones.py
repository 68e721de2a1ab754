"""Images inside their classes' cones: deepest holding label, cone term, eval's cone keys."""

from __future__ import annotations

import numpy as np
import pytest

from models.geometry import cones
from models.labels.construct import cap_construction
from models.prototypes import Prototypes, deepest_holder, label_cone_spec
from models.taxonomy.graph import Taxonomy
from tests.support.cones import CAP, cap_labels, hand_tree, in_class_share, tiny_train


def brute_deepest(x, names, pts, tax, spec, c=1.0):
    """Independent: every label whose cone holds x (membership_margin_np >= 0); the deepest."""
    out = []
    for p in x:
        held = [
            n
            for n, q in zip(names, pts, strict=True)
            if cones.membership_margin_np(q, p, spec, c=c) >= 0
        ]
        out.append(max(held, key=tax.depth) if held else None)
    return out


def test_deepest_holder_against_brute_force_on_a_hand_made_tree():
    tax = hand_tree()
    emb = cap_labels(tax)
    names = tax.names
    pts = emb.embeddings.numpy()
    rng = np.random.default_rng(1)
    # points pushed out along each label's direction (inside its cap), jittered, and random ones
    near = []
    for p in pts:
        for _ in range(5):
            q = p + rng.normal(scale=0.02, size=p.shape)
            nrm = np.linalg.norm(q)
            r = min(0.999, np.linalg.norm(p) + abs(rng.normal(scale=0.2)))
            near.append(q / max(nrm, 1e-9) * r)
    x = np.concatenate([np.array(near), rng.uniform(-0.6, 0.6, size=(200, 4))])
    got = deepest_holder(x, names, pts, tax.children, CAP, 1.0)
    want = brute_deepest(x, names, pts, tax, CAP)
    fallback = Prototypes.of(names, pts, 1.0)
    for g, w, p in zip(got, want, x, strict=True):
        if w is None:  # no cone holds it: the documented fall-back, the nearest label point
            assert g == fallback.nearest(p[None])[0]
        else:
            assert g == w
    # the leaves' own (pushed-out) points land under the leaf, and some random points fall back
    assert sum(w is not None and tax.depth(w) == 3 for w in want) >= 5
    # a mapping works as well as a callable; a custom fall-back is used
    mapping = {n: tax.children(n) for n in names}
    assert deepest_holder(x, names, pts, mapping, CAP, 1.0) == got
    fb = deepest_holder(x, names, pts, mapping, CAP, 1.0, fallback=lambda r: ["?"] * len(r))
    assert [g for g, w in zip(fb, want, strict=True) if w is None] == ["?"] * want.count(None)
    # one point at a time (a single upsert's descent) answers as the batch, with the
    # labels' parts given or not, both cone families
    from models.prototypes import holder_table

    table = holder_table(names, tax.children)
    for spec in (CAP, {"family": "ganea", "K": 0.1}):
        batch = deepest_holder(x, names, pts, tax.children, spec, 1.0, table=table)
        parts = cones.apex_parts_np(pts, spec, c=1.0)
        for j in range(0, len(x), 3):
            for given in (None, parts):
                one = deepest_holder(
                    x[j], names, pts, tax.children, spec, 1.0, table=table, parts=given
                )
                assert one == [batch[j]], (j, spec["family"])


def test_deepest_holder_one_point_and_label_subset():
    tax = hand_tree()
    emb = cap_labels(tax)
    pts = emb.embeddings.numpy()
    i = tax.index("puppy")
    q = pts[i] * 1.05
    assert deepest_holder(q, tax.names, pts, tax.children, CAP, 1.0) == ["puppy"]
    # without puppy among the labels, its parent holds it
    keep = [n for n in tax.names if n != "puppy"]
    sub = pts[[tax.index(n) for n in keep]]
    assert deepest_holder(q, keep, sub, tax.children, CAP, 1.0) == ["dog"]


def test_label_cone_spec_survives_a_checkpoint(tmp_path):
    from models.labels import LabelEmbedding

    emb = cap_labels(hand_tree())
    assert label_cone_spec(emb) == CAP
    emb.save(tmp_path / "l.safetensors")
    assert label_cone_spec(LabelEmbedding.load(tmp_path / "l.safetensors")) == CAP


# ---------------------------------------------------------------- training and evaluation


def test_cone_term_pulls_images_inside_their_class_cone(fm_cap):
    labels, data, test = fm_cap
    without = in_class_share(tiny_train(labels, data, cone_weight=0.0), labels, test)
    with_ = in_class_share(tiny_train(labels, data, cone_weight=3.0), labels, test)
    assert with_ >= without + 0.04, (without, with_)  # measured: 0.0 and 0.065


def test_eval_cone_keys_against_brute_force(fm_cap):
    from models.training.evaluate import evaluate_model

    labels, data, test = fm_cap
    model = tiny_train(labels, data, cone_weight=3.0, epochs=1, holdout=["sandal.n.01"])
    out = evaluate_model(model, test, ood=False, delta=False)
    keys = ("in_class", "in_ancestors_mean", "in_all_ancestors", "in_other_class")
    for k in (*keys, "deepest_hier_hit@1"):
        assert 0.0 <= out["cones"][k] <= 1.0
    # brute force: one membership_margin_np call per (image, label) pair
    tax = labels.taxonomy
    z = model.embed(test.images).numpy()
    P = {n: labels.embeddings.numpy()[tax.index(n)] for n in tax.names}
    seen = list(model.seen_classes)

    def inside(n, p):
        return float(cones.membership_margin_np(P[n], p, CAP, c=1.0)) >= 0

    own, anc_mean, anc_all, other, parent = [], [], [], [], []
    for p, t in zip(z, test.targets, strict=True):
        node = test.classes[t][1]
        if node == "sandal.n.01":
            parent.append(any(inside(a, p) for a in tax.parents(node)))
            continue
        anc = sorted(tax.ancestors(node))
        own.append(inside(node, p))
        anc_mean.append(np.mean([inside(a, p) for a in anc]))
        anc_all.append(all(inside(a, p) for a in anc))
        up = tax.ancestors(node) | {node}
        other.append(any(inside(k, p) for k in seen if k not in up))
    got = out["cones"]
    assert got["images"] == len(own)
    assert got["in_class"] == pytest.approx(np.mean(own))
    assert got["in_ancestors_mean"] == pytest.approx(np.mean(anc_mean))
    assert got["in_all_ancestors"] == pytest.approx(np.mean(anc_all))
    assert got["in_other_class"] == pytest.approx(np.mean(other))
    zs = out["zero_shot"]
    assert zs["in_parent_cone"] == pytest.approx(np.mean(parent))
    for k in ("cone_hier_hit@1", "cone_hier_hit@1_all_nodes", "in_parent_cone"):
        assert 0.0 <= zs[k] <= 1.0


def test_deepest_holder_level_by_level_equals_the_point_by_point_descent(monkeypatch):
    """A DAG (shared children) with overlapping Ganea cones, so 'largest margin' decides;
    the level-wise descent (points grouped by the label they reached, in chunks) gives
    the same labels as the plain descent over all margins, point by point."""
    import models.prototypes as prototypes

    rng = np.random.default_rng(3)
    edges = [(f"a{i}", "root") for i in range(4)]
    edges += [(f"b{i}", f"a{i % 4}") for i in range(12)] + [("b0", "a1"), ("b5", "a2")]
    edges += [(f"c{i}", f"b{i % 12}") for i in range(30)] + [("c3", "b7")]
    tax = Taxonomy.from_edges(edges)
    names = tax.names
    pts = np.zeros((len(names), 5))
    for n in sorted(names, key=tax.depth):  # each node near its (first) parent's direction
        par = tax.parents(n)
        up = pts[tax.index(par[0])] if par else None
        d = rng.normal(size=5) if up is None else up / np.linalg.norm(up) + rng.normal(0, 0.02, 5)
        pts[tax.index(n)] = d / np.linalg.norm(d) * (0.2 + 0.1 * tax.depth(n))
    spec = cones.cone_spec("ganea", K=0.1)
    near = pts[rng.integers(0, len(names), 600)] * rng.uniform(1.0, 1.4, (600, 1))
    x = np.concatenate([near, rng.uniform(-0.5, 0.5, size=(200, 5))])
    x *= np.minimum(1.0, 0.98 / np.linalg.norm(x, axis=1, keepdims=True))
    want = brute_descent(x, names, pts, tax.children, spec)
    assert len({w for w in want if w is not None}) >= 10  # many labels reached, deep ones too
    assert sum(w is not None and w.startswith("c") for w in want) >= 20
    monkeypatch.setattr(prototypes, "_CHUNK", 200)  # several chunks per label
    got = deepest_holder(x, names, pts, tax.children, spec, 1.0, fallback=lambda r: [None] * len(r))
    assert got == want


def brute_descent(x, names, pts, children_of, spec, c=1.0, tol=0.0):
    """Independent: every (point, label) margin, then the walk from the roots to the
    held child of largest margin (ties: the first listed); None where no root holds."""
    row = {n: j for j, n in enumerate(names)}
    kids = [[row[k] for k in children_of(n) if k in row] for n in names]
    is_child = {j for k in kids for j in k}
    roots = [j for j in range(len(names)) if j not in is_child]
    m = cones.membership_margin_np(pts[None, :, :], x[:, None, :], spec, c=c)
    out = []
    for b in range(len(x)):
        cur, cand = None, roots
        while True:
            ok = [j for j in cand if m[b, j] >= -tol]
            if not ok:
                break
            cur = max(ok, key=lambda j: m[b, j])
            cand = kids[cur]
        out.append(None if cur is None else names[cur])
    return out


@pytest.mark.parametrize("chunk", [7, 4_000_000])
def test_deepest_holder_descent_equals_the_brute_force_walk(monkeypatch, chunk):
    """A random DAG of 600 nodes (some of two parents, some folded), cap points, and
    points near every label and at random: the descent answers as the full walk."""
    import models.prototypes as protos

    rng = np.random.default_rng(3)
    edges, names = [], ["n0"]
    for i in range(1, 600):
        p = int(rng.integers(0, i)) if i > 30 else 0
        edges.append((f"n{i}", f"n{p}"))
        if i > 60 and rng.random() < 0.05:
            edges.append((f"n{i}", f"n{int(rng.integers(1, i))}"))
        names.append(f"n{i}")
    tax = Taxonomy.from_edges(edges)
    pts = cap_construction(tax, 6, seed=1).points.numpy()
    near = pts[np.repeat(np.arange(len(pts)), 2)]
    scale = (
        1 + rng.uniform(0, 0.3, size=(len(near), 1)) * (1 - np.linalg.norm(near, axis=1))[:, None]
    )
    x = np.concatenate(
        [np.clip(near * scale, -0.9999, 0.9999), rng.uniform(-0.5, 0.5, size=(300, 6))]
    )
    x = x / np.maximum(1, np.linalg.norm(x, axis=1, keepdims=True) / 0.99999)
    monkeypatch.setattr(protos, "_CHUNK", chunk)
    want = brute_descent(x, tax.names, pts, tax.children, CAP)
    got = deepest_holder(
        x, tax.names, pts, tax.children, CAP, 1.0, fallback=lambda r: [None] * len(r)
    )
    assert got == want
    assert sum(w is not None and tax.depth(w) >= 3 for w in want) > 100
    # with a tolerance, and on a subset of the labels (children not listed are skipped)
    keep = [n for n in tax.names if int(n[1:]) % 3]
    sub = pts[[tax.index(n) for n in keep]]
    got = deepest_holder(
        x, keep, sub, tax.children, CAP, 1.0, tol=1e-3, fallback=lambda r: [None] * len(r)
    )
    assert got == brute_descent(x, keep, sub, tax.children, CAP, tol=1e-3)
