"""The entailment candidates an index keeps for unfiltered label queries
(indexing.HyperbolicIndex.entailment_candidates): the same answer as a fresh
ranking every time, after every kind of change to the index."""

from __future__ import annotations

import numpy as np

from indexing import HyperbolicIndex, LabelCones
from indexing.entailment import candidates

DIM = 3
# a root at the origin, two children along the axes, a grandchild beyond each
POINTS = {
    "root": np.array([0.05, 0.05, 0.0]),
    "a": np.array([0.3, 0.0, 0.0]),
    "b": np.array([0.0, 0.3, 0.0]),
    "a1": np.array([0.6, 0.05, 0.0]),
    "b1": np.array([0.05, 0.6, 0.0]),
}
PARENT = {"root": None, "a": "root", "b": "root", "a1": "a", "b1": "b"}


def _cones() -> LabelCones:
    return LabelCones(POINTS, PARENT, K=0.1)


def _fresh(ix: HyperbolicIndex, apex: str, want: int):
    """The ranking computed now, apart from the index's kept answers."""
    t, cones = ix._live.table, ix._cones
    q = POINTS[apex]
    held = candidates(t, cones, apex, q, want, outside=False)
    return held if held.n_held >= want else candidates(t, cones, apex, q, want)


def _same(a, b) -> None:
    assert a.held == b.held and a.counts == b.counts and a.paths == b.paths
    assert a.outside == b.outside and a.n_outside == b.n_outside


def _points(n: int, seed: int) -> np.ndarray:
    """Around the rays of a and b, and in random directions."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, DIM)) * 0.3
    x[: n // 3, 0] += 2.0
    x[n // 3 : 2 * n // 3, 1] += 2.0
    return x * (rng.uniform(0.2, 0.95, (n, 1)) / np.linalg.norm(x, axis=1, keepdims=True))


def test_kept_candidates_follow_every_change(tmp_path):
    ix = HyperbolicIndex(DIM, path=tmp_path / "ix", cones=_cones(), backend="exact")
    try:
        ix.add(_points(300, 1), [f"i{j}" for j in range(300)])
        first = ix.entailment_candidates("a", POINTS["a"], 20)
        assert ix.entailment_candidates("a", POINTS["a"], 20) is first  # kept
        _same(first, _fresh(ix, "a", 20))
        assert first.n_held > 0

        def check(why: str) -> None:
            for apex in ("a", "a1", "root"):
                got = ix.entailment_candidates(apex, POINTS[apex], 20)
                _same(got, _fresh(ix, apex, 20))
            assert ix.entailment_candidates("a", POINTS["a"], 20) is not first, why

        # a new item deep in a's cone: the firmest now
        ix.add(np.array([[0.95, 0.0, 0.0]]), ["deep"])
        check("after an add")
        got = ix.entailment_candidates("a", POINTS["a"], 20)
        assert "deep" in {i for v in got.held.values() for _, i, _ in v}
        first = got
        ix.delete(["deep"])
        check("after a delete")
        first = ix.entailment_candidates("a", POINTS["a"], 20)
        ix.add(np.array([[0.95, 0.0, 0.0]]), ["i0"])  # an upsert moves an item
        check("after an upsert")
        first = ix.entailment_candidates("a", POINTS["a"], 20)
        # another query point or another want is another question
        other = ix.entailment_candidates("a", POINTS["a1"], 20)
        assert other is not first
        _same(other, candidates(ix._live.table, ix._cones, "a", POINTS["a1"], 20, outside=False)
              if other.n_held >= 20 else
              candidates(ix._live.table, ix._cones, "a", POINTS["a1"], 20))  # fmt: skip
        # cones changed: the holders (and the answers) follow
        ix.set_cones(LabelCones({**POINTS, "a": np.array([0.1, 0.0, 0.0])}, PARENT, K=0.1))
        check("after new cones")
        # a filter is never served from the kept answers
        ix.add(np.array([[0.9, 0.01, 0.0]]), ["tagged"], labels=["a1"])
        f = ix.entailment_candidates("a", POINTS["a"], 20, labels=["a1"])
        assert f.n_held + f.n_outside == 1
        assert ix.entailment_candidates("a", POINTS["a"], 20).n_held > 1
    finally:
        ix.close()


def test_kept_hierarchical_answers_follow_every_change(tmp_path):
    """Cone levels of a label (descendants by the index's own cones, no filter) are
    kept too; a lambda around the same function is never kept, so it gives the
    fresh answer to compare with."""
    ix = HyperbolicIndex(DIM, path=tmp_path / "ix", cones=_cones(), backend="exact")
    try:
        ix.add(_points(300, 2), [f"i{j}" for j in range(300)])
        cones = ix._cones
        chain = ["a1", "a", "root"]

        def both(k: int = 15, offset: int = 0):
            kept = ix.search_hierarchical(POINTS["a1"], chain, cones.held_by, k, offset,
                                          firmness=True)  # fmt: skip
            fresh = ix.search_hierarchical(
                POINTS["a1"], chain, lambda lab: cones.held_by(lab), k, offset, firmness=True
            )
            assert kept == fresh
            return kept

        first = both()
        assert len(first) == 15 and {h.level for h in first} >= {0}
        n_kept = len(ix._cand_cache)
        assert both() == first and len(ix._cand_cache) == n_kept  # from the kept answer
        ix.add(np.array([[0.97, 0.03, 0.0]]), ["deepest"])
        after = both()
        assert after != first and "deepest" in {h.id for h in after}
        ix.delete(["deepest"])
        assert both() == first
        assert both(5, 3) == first[3:8]
    finally:
        ix.close()
