"""Images inside their classes' cones: deepest holding label, cone term, eval's cone keys."""

from __future__ import annotations

import numpy as np
import pytest

from models.geometry import cones
from models.labels import LabelEmbedding
from models.labels.construct import cap_construction
from models.prototypes import Prototypes, deepest_holder, label_cone_spec
from models.taxonomy import Taxonomy

CAP = cones.cone_spec("cap")


def hand_tree() -> Taxonomy:
    edges = [
        ("animal", "thing"),
        ("tool", "thing"),
        ("dog", "animal"),
        ("cat", "animal"),
        ("bird", "animal"),
        ("puppy", "dog"),
        ("kitten", "cat"),
        ("hammer", "tool"),
        ("saw", "tool"),
    ]
    return Taxonomy.from_edges(edges)


def cap_labels(tax: Taxonomy, dim: int = 4, seed: int = 0) -> LabelEmbedding:
    place = cap_construction(tax, dim, seed=seed)
    emb = LabelEmbedding(
        taxonomy=tax,
        embeddings=place.points,
        curvature=1.0,
        config={"init": "cap", "cone_theta0": 2.5, "cone_beta": 0.5},
        metrics={"finished": True},
    )
    emb.cone = dict(CAP)  # the attribute of newer label checkpoints
    return emb


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


def test_label_cone_spec_fallbacks():
    tax = hand_tree()
    emb = cap_labels(tax)
    assert label_cone_spec(emb)["family"] == "cap"
    emb.cone = None
    assert label_cone_spec(emb) == CAP  # from the cap init's config
    emb.config = {}
    assert label_cone_spec(emb)["family"] == "ganea"


if __name__ == "__main__":  # pragma: no cover
    pytest.main([__file__, "-q"])
