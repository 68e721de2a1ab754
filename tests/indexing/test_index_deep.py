"""Points at hyperbolic radius 15-35: where float32 cannot rank (DESIGN: test every
layer there).  Results must still equal float64 brute force."""

from __future__ import annotations

import numpy as np
import pytest

from indexing import HyperbolicIndex
from indexing.geometry import PoincareIndexSpace
from tests.support.cloud import assert_geodesic, brute_force, cloud, make_ids, recall_at


def deep_cloud(n: int, n_queries: int, *, seed: int, c: float = 1.0):
    """Clusters of points at hyperbolic radius 15-35: each cluster a random direction
    and radius; members spread by about one unit of hyperbolic distance."""
    rng = np.random.default_rng(seed)
    n_clusters = 20
    dirs = rng.standard_normal((n_clusters, 8))
    dirs /= np.linalg.norm(dirs, axis=1, keepdims=True)
    radii = rng.uniform(15.0, 34.0, n_clusters)

    def sample(m):
        k = rng.integers(0, n_clusters, m)
        r = radii[k] + rng.uniform(-0.5, 0.5, m)
        # angular spread ~ e^-r: a hyperbolic distance of order one at that radius
        d = dirs[k] + np.exp(-r)[:, None] * rng.standard_normal((m, 8))
        d /= np.linalg.norm(d, axis=1, keepdims=True)
        s = np.sqrt(c)
        return d * (np.tanh(s * r / 2) / s)[:, None]

    return sample(n), sample(n_queries)


def test_deep_cloud_is_deep():
    x, q = deep_cloud(500, 10, seed=1)
    sp = PoincareIndexSpace(8, 1.0)
    assert sp.deep(x).all() and sp.deep(q).all()
    assert (np.linalg.norm(x, axis=1) < 1).all()
    # float32 collapses many of them onto the same coordinates (or the sphere)
    x32 = x.astype(np.float32)
    assert len(np.unique(x32, axis=0)) < len(x) or (np.linalg.norm(x32, axis=1) >= 1).any()


@pytest.mark.parametrize("backend", ["exact", "graph", "hnsw"])
def test_deep_points_search_exactly(backend):
    x, q = deep_cloud(3000, 30, seed=2)
    ix = HyperbolicIndex(8, backend=backend)
    ix.add(x, make_ids(len(x)))
    ids, dist = ix.search(q, k=10)
    order, bf = brute_force(x, q, 10)
    np.testing.assert_array_equal(ids, np.array(make_ids(len(x)))[order])
    assert_geodesic(dist, bf)
    assert (bf[:, -1] < 10).all()  # genuine neighbourhoods, not a far-apart scatter


def test_mixed_shallow_and_deep_with_hnsw():
    xs, qs = cloud(4000, 30, dim=8, seed=3)
    xd, qd = deep_cloud(600, 30, seed=4)
    x = np.concatenate([xs, xd])
    q = np.concatenate([qs, qd])
    ids_all = make_ids(len(x))
    ix = HyperbolicIndex(8, backend="hnsw")
    ix.add(x, ids_all, labels=["s"] * len(xs) + ["d"] * len(xd))
    assert len(ix._backend._deep) == len(xd)
    order, bf = brute_force(x, q, 10)
    found, dist = ix.search(q, k=10)
    assert recall_at(found[:30], np.array(ids_all)[order[:30]]) >= 0.98
    np.testing.assert_array_equal(found[30:], np.array(ids_all)[order[30:]])  # deep queries
    # filters across both parts, and deletes of deep items
    f, _ = ix.search(qd, k=5, labels={"d"})
    assert all(s in set(ids_all[len(xs) :]) for s in f.ravel())
    gone = ids_all[len(xs) : len(xs) + 300]
    ix.delete(gone)
    f, _ = ix.search(qd, k=10)
    assert not set(f.ravel()) & set(gone)
    # snapshot round trip keeps deep items out of the graph
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        ix.save(tmp)
        re = HyperbolicIndex.load(tmp)
        assert re._backend._deep == ix._backend._deep
        a, da = re.search(q, k=10)
        b, db = ix.search(q, k=10)
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(da, db)
