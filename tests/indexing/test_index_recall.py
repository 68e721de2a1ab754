"""Recall of the approximate backend against exact float64 search."""

from __future__ import annotations

import numpy as np

from indexing import HyperbolicIndex
from tests.support.cloud import (
    assert_geodesic,
    brute_force,
    cloud,
    exact_fixture,
    make_ids,
    recall_at,
)

big = exact_fixture("hnsw", 20_000, 200, seed=21)


def test_truth_is_brute_force(big):
    x, q, truth, tdist, _ = big
    order, bf = brute_force(x, q[:15], 10)
    np.testing.assert_array_equal(truth[:15], np.array(make_ids(len(x)))[order])
    assert_geodesic(tdist[:15], bf)


def test_hnsw_recall_default_params(big):
    x, q, truth, tdist, hnsw = big
    ids, dist = hnsw.search(q, k=10)
    r = recall_at(ids, truth)
    assert r >= 0.99, r
    # whatever was found carries its exact distance: never below the truth
    assert (dist >= tdist - 1e-12).all()


def test_hnsw_recall_rises_with_ef(big):
    x, q, truth, _, hnsw = big
    low = recall_at(hnsw.search(q, k=10, ef=16)[0], truth)
    high = recall_at(hnsw.search(q, k=10, ef=512)[0], truth)
    assert high >= 0.995 and high > low


def test_recentring_beats_plain_l2(big):
    # the plain "l2 top-ef + exact re-rank" search (passes=1) misses the
    # ancestors of deep points; the re-centred passes find them
    x, q, truth, _, hnsw = big
    backend = hnsw._backend
    default = backend._p["passes"]
    assert default >= 2
    backend._p["passes"] = 1
    try:
        plain = recall_at(hnsw.search(q, k=10)[0], truth)
    finally:
        backend._p["passes"] = default
    assert plain < recall_at(hnsw.search(q, k=10)[0], truth)


def test_hnsw_recall_with_graph_filter(big):
    x, q, truth, _, _ = big
    labels = [f"L{j % 4}" for j in range(len(x))]
    ix = HyperbolicIndex(16, backend="hnsw", filter_exact_threshold=1000)
    ix.add(x, make_ids(len(x)), labels=labels)
    exact = HyperbolicIndex(16, backend="exact")
    exact.add(x, make_ids(len(x)), labels=labels)
    want = {"L0", "L2"}
    ids, _ = ix.search(q[:100], k=10, labels=want)
    t, _ = exact.search(q[:100], k=10, labels=want)
    assert recall_at(ids, t) >= 0.98
    assert all(labels[int(s[1:])] in want for s in ids.ravel())


def test_knn_errors_never_leak(big, monkeypatch):
    x, q, truth, tdist, hnsw = big
    idx = hnsw._backend._index

    class Failing:
        def __getattr__(self, name):
            return getattr(idx, name)

        def knn_query(self, *a, **kw):
            raise RuntimeError(
                "Cannot return the results in a contiguous 2D array. Probably ef or M is too small"
            )

    monkeypatch.setattr(hnsw._backend, "_index", Failing())
    ids, dist = hnsw.search(q[:20], k=10)
    np.testing.assert_array_equal(ids, truth[:20])  # fell back to the exact scan
    np.testing.assert_array_equal(dist, tdist[:20])


def test_heavy_deletes_small_remaining_set():
    # many deleted graph nodes and a tiny live set: hnswlib would fail to
    # return k results; the index answers exactly instead
    x, q = cloud(1500, 10, seed=9)
    ix = HyperbolicIndex(16, backend="hnsw", M=4, ef_construction=20)
    ix.add(x, make_ids(1500))
    ix.delete(make_ids(1500)[:400])  # 27%: no compaction yet
    ids, dist = ix.search(q, k=30)
    order, bf = brute_force(x[400:], q, 30)
    assert recall_at(ids, np.array(make_ids(1500))[400:][order]) >= 0.9
    assert ids.shape == (10, 30) and (np.diff(dist, axis=1) >= 0).all()
