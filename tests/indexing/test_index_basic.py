"""HyperbolicIndex: exactness, API semantics, filters, input validation."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from indexing import HyperbolicIndex, IndexInputError
from indexing.geometry import torch_threads
from models.geometry import ProductSpace
from tests.support.cloud import assert_geodesic, brute_force, cloud, exact_dist, make_ids


@pytest.fixture(scope="module")
def data():
    x, q = cloud(3000, 30, seed=11)
    return x, q, make_ids(len(x))


def _as_idx(ids: np.ndarray) -> np.ndarray:
    return np.vectorize(lambda s: int(s[1:]))(ids)


def test_cloud_has_near_boundary_points(data):
    x, _, _ = data
    norms = np.linalg.norm(x, axis=1)
    assert norms.max() < 1.0
    assert (norms > 0.999).mean() > 0.02
    assert ((norms >= 0.9) & (norms <= 0.999)).mean() > 0.9


@pytest.mark.parametrize("curvature", [1.0, 0.5, 2.0])
def test_exact_backend_is_brute_force(curvature):
    x, q = cloud(3000, 30, seed=3, curvature=curvature)
    ix = HyperbolicIndex(16, curvature, backend="exact")
    ix.add(x, make_ids(len(x)))
    ids, dist = ix.search(q, k=10)
    order, bf = brute_force(x, q, 10, curvature)
    assert ids.shape == (30, 10) and dist.shape == (30, 10)
    assert dist.dtype == np.float64
    np.testing.assert_array_equal(_as_idx(ids), order)
    assert_geodesic(dist, bf)


def test_hnsw_distances_are_exact_float64_and_ascending(data):
    x, q, ids_all = data
    ix = HyperbolicIndex(16, backend="hnsw")
    ix.add(x, ids_all)
    assert ix.backend == "hnsw"
    ids, dist = ix.search(q, k=10)
    assert dist.dtype == np.float64
    assert (np.diff(dist, axis=1) >= 0).all()
    for i in range(len(q)):
        ref = exact_dist(q[i], x[_as_idx(ids[i])])
        assert_geodesic(dist[i], ref)


def test_single_query_vector_and_str_ids(data):
    x, q, ids_all = data
    ix = HyperbolicIndex(16)
    ix.add(x[:100], ids_all[:100])
    ids, dist = ix.search(q[0], k=3)
    assert ids.shape == (1, 3)
    assert isinstance(ids[0, 0], str)


@pytest.mark.parametrize("backend", ["exact", "graph", "hnsw", "auto"])
def test_k_larger_than_n_returns_everything(backend):
    x, q = cloud(7, 4, seed=1)
    ix = HyperbolicIndex(16, backend=backend)
    ix.add(x, make_ids(7))
    ids, dist = ix.search(q, k=50)
    assert ids.shape == (4, 7) and dist.shape == (4, 7)
    assert all(sorted(row) == sorted(make_ids(7)) for row in ids.tolist())
    assert (np.diff(dist, axis=1) >= 0).all()


def test_empty_index_and_empty_filter():
    ix = HyperbolicIndex(4)
    ids, dist = ix.search(np.zeros((2, 4)), k=5)
    assert ids.shape == (2, 0) and dist.shape == (2, 0)
    ix.add(np.full((1, 4), 0.1), ["a"])
    ids, dist = ix.search(np.zeros((2, 4)), k=5, filter_ids=["nope"])
    assert ids.shape == (2, 0)


def test_upsert_replaces_vector_label_and_payload():
    ix = HyperbolicIndex(2)
    ix.add(
        np.array([[0.1, 0.0], [0.0, 0.5]]), ["a", "b"], labels=["x", "y"], payloads=[{"v": 1}, None]
    )
    ix.add(np.array([[0.0, 0.49]]), ["a"], labels=["z"], payloads=[{"v": 2}])
    assert len(ix) == 2
    item = ix.get("a")
    np.testing.assert_array_equal(item.vector, [0.0, 0.49])
    assert item.label == "z" and item.payload == {"v": 2}
    ids, dist = ix.search(np.array([[0.0, 0.49]]), k=2)
    assert ids[0, 0] == "a" and dist[0, 0] == 0.0
    assert ix.search(np.zeros(2), k=5, labels={"x"})[0].shape == (1, 0)
    assert ix.search(np.zeros(2), k=5, labels={"z"})[0].tolist() == [["a"]]
    # same vector again: metadata only
    ix.add(np.array([[0.0, 0.49]]), ["a"], labels=["w"])
    assert ix.get("a").label == "w" and ix.get("a").payload is None


@pytest.mark.parametrize("backend", ["exact", "graph", "hnsw"])
def test_delete_hides(backend, data):
    x, q, ids_all = data
    ix = HyperbolicIndex(16, backend=backend)
    ix.add(x, ids_all)
    ids, _ = ix.search(q, k=5)
    gone = sorted(set(ids.ravel().tolist()))
    assert ix.delete(gone + ["never-existed"]) == len(gone)
    assert ix.delete(gone) == 0
    assert len(ix) == len(x) - len(gone)
    assert all(g not in ix for g in gone) and ix.get(gone[0]) is None
    ids2, dist2 = ix.search(q, k=10)
    assert not set(ids2.ravel().tolist()) & set(gone)
    keep = np.array(sorted(set(range(len(x))) - {int(g[1:]) for g in gone}))
    order, bf = brute_force(x[keep], q, 10)
    if backend == "exact":
        np.testing.assert_array_equal(_as_idx(ids2), keep[order])
        assert_geodesic(dist2, bf)


@pytest.mark.parametrize(
    "backend, params", [("hnsw", {"M": 8, "ef_construction": 50}), ("graph", {"R": 16})]
)
def test_compaction_keeps_results_exact(backend, params):
    x, q = cloud(2000, 10, seed=5)
    ix = HyperbolicIndex(16, backend=backend, **params)
    ix.add(x, make_ids(2000))
    ix.delete(make_ids(2000)[:1200])
    st = ix.stats()
    assert st["slots"] == st["items"] == 800  # compacted: more than 30% were deleted
    ids, dist = ix.search(q, k=10)
    order, bf = brute_force(x[1200:], q, 10)
    assert_geodesic(dist, bf)


def test_auto_switches_backend():
    x, q = cloud(1200, 10, seed=6)
    ix = HyperbolicIndex(16, auto_threshold=500)
    ix.add(x[:400], make_ids(400))
    assert ix.backend == "exact"
    ix.add(x[400:], make_ids(1200)[400:])
    assert ix.backend == "graph"
    ix.delete(make_ids(1200)[:1000])
    assert ix.backend == "exact"
    ids, dist = ix.search(q, k=10)
    order, bf = brute_force(x[1000:], q, 10)
    np.testing.assert_array_equal(_as_idx(ids), order + 1000)


@pytest.fixture(scope="module")
def filter_indexes():
    x, q = cloud(3000, 20, seed=8)
    labels = [f"L{j % 7}" for j in range(len(x))]
    out = {}
    for be, params in (
        ("exact", {}),
        ("hnsw", {}),
        ("hnsw-graph", {"filter_exact_threshold": 0}),
        ("graph", {}),
        ("graph-graph", {"filter_exact_threshold": 0}),
    ):
        ix = HyperbolicIndex(16, backend=be.split("-")[0], **params)
        ix.add(x, make_ids(len(x)), labels=labels)
        out[be] = ix
    return x, q, labels, out


class TestFilters:
    @pytest.fixture()
    def idx(self, filter_indexes):
        return filter_indexes

    @pytest.mark.parametrize("be", ["exact", "hnsw", "hnsw-graph", "graph", "graph-graph"])
    def test_label_filter(self, idx, be):
        x, q, labels, ixs = idx
        ix = ixs[be]
        want = {"L1", "L4"}
        sel = np.array([j for j, lab in enumerate(labels) if lab in want])
        ids, dist = ix.search(q, k=10, labels=want)
        order, bf = brute_force(x[sel], q, 10)
        assert all(labels[i] in want for i in _as_idx(ids).ravel())
        if be in ("exact", "hnsw", "graph"):  # small filtered set: an exact scan
            np.testing.assert_array_equal(_as_idx(ids), sel[order])
            assert_geodesic(dist, bf)
        else:  # the graph, filtering what it returns
            pairs = zip(_as_idx(ids), sel[order], strict=True)
            hits = np.mean([len(set(a) & set(b)) / 10 for a, b in pairs])
            assert hits >= 0.95
            assert (np.diff(dist, axis=1) >= 0).all()

    @pytest.mark.parametrize("be", ["exact", "hnsw", "hnsw-graph", "graph", "graph-graph"])
    def test_filter_leaving_fewer_than_k(self, idx, be):
        x, q, labels, ixs = idx
        few = ["i3", "i77", "i1999"]
        ids, dist = ixs[be].search(q, k=10, filter_ids=few + ["unknown"])
        assert ids.shape == (20, 3)
        assert all(sorted(r) == sorted(few) for r in ids.tolist())
        for i in range(len(q)):
            assert_geodesic(dist[i], np.sort(exact_dist(q[i], x[[int(s[1:]) for s in ids[i]]])))

    def test_filters_intersect(self, idx):
        x, q, labels, ixs = idx
        cand = [f"i{j}" for j in range(0, 100)]
        ids, _ = ixs["exact"].search(q, k=100, filter_ids=cand, labels={"L2"})
        expect = sorted(c for c in cand if labels[int(c[1:])] == "L2")
        assert ids.shape[1] == len(expect)
        assert sorted(ids[0].tolist()) == expect

    def test_under_uses_holding_label(self, idx):
        # without cones the holding label is the item's label
        x, q, labels, ixs = idx
        a, _ = ixs["exact"].search(q, k=10, under={"L3"})
        b, _ = ixs["exact"].search(q, k=10, labels={"L3"})
        np.testing.assert_array_equal(a, b)


class TestBadInputs:
    @pytest.fixture()
    def ix(self):
        ix = HyperbolicIndex(4)
        ix.add(np.full((3, 4), 0.1), ["a", "b", "c"])
        return ix

    def test_outside_ball_message(self, ix):
        v = np.zeros((5, 4))
        v[3, 0] = 1.0000002
        with pytest.raises(IndexInputError) as e:
            ix.add(v, list("vwxyz"))
        assert str(e.value) == (
            "vectors[3]: norm 1.0000002 is outside the ball of curvature 1.0 (must be < 1.0)"
        )
        assert len(ix) == 3  # nothing written

    def test_outside_ball_other_curvature(self):
        ix = HyperbolicIndex(2, curvature=4.0)
        with pytest.raises(
            IndexInputError,
            match=r"vectors\[0\]: norm 0.5 is outside the ball of curvature 4.0 \(must be < 0.5\)",
        ):
            ix.add(np.array([[0.5, 0.0]]), ["a"])
        ix.add(np.array([[0.4999, 0.0]]), ["a"])

    @pytest.mark.parametrize(
        "vectors, ids, pattern",
        [
            (np.array([[0.1, np.nan, 0, 0]]), ["n"], r"vectors\[0\]: contains NaN"),
            (
                np.array([[0.1, 0, 0, 0], [np.inf, 0, 0, 0]]),
                ["m", "n"],
                r"vectors\[1\]: contains an infinite value",
            ),
            (
                np.zeros((2, 3)),
                ["m", "n"],
                r"vectors: expected an array of shape \(n, 4\), got shape \(2, 3\)",
            ),
            (np.zeros(4), ["m"], r"vectors: expected an array of shape"),
            ([["a", "b", "c", "d"]], ["m"], r"vectors: not a numeric array"),
            (np.zeros((2, 4)), ["m", "m"], r"ids\[1\]: duplicate id 'm' \(also at ids\[0\]\)"),
            (np.zeros((2, 4)), ["m", 7], r"ids\[1\]: expected str, got int"),
            (np.zeros((2, 4)), ["m", ""], r"ids\[1\]: empty id"),
            (np.zeros((2, 4)), ["m"], r"ids: 1 ids for 2 vectors"),
            (np.zeros((1, 4)), "m", r"ids: expected a sequence of str"),
        ],
    )
    def test_add_refused(self, ix, vectors, ids, pattern):
        with pytest.raises(IndexInputError, match=pattern):
            ix.add(vectors, ids)
        assert len(ix) == 3

    def test_labels_and_payloads_checked(self, ix):
        with pytest.raises(IndexInputError, match=r"labels\[0\]: expected str or None, got int"):
            ix.add(np.zeros((1, 4)), ["m"], labels=[3])
        with pytest.raises(IndexInputError, match=r"payloads\[0\]: not JSON-serialisable"):
            ix.add(np.zeros((1, 4)), ["m"], payloads=[object()])
        with pytest.raises(IndexInputError, match=r"payloads\[0\]: not JSON-serialisable"):
            ix.add(np.zeros((1, 4)), ["m"], payloads=[{"x": float("nan")}])

    @pytest.mark.parametrize("k", [0, -1, 2.5, True, "3"])
    def test_bad_k(self, ix, k):
        with pytest.raises(IndexInputError, match=r"^k: must be an integer >= 1"):
            ix.search(np.zeros((1, 4)), k=k)

    def test_bad_queries_and_filters(self, ix):
        with pytest.raises(IndexInputError, match=r"queries\[1\]: norm 2.0 is outside the ball"):
            ix.search(np.array([[0, 0, 0, 0], [2.0, 0, 0, 0]]), k=1)
        with pytest.raises(IndexInputError, match=r"queries\[0\]: contains NaN"):
            ix.search(np.array([[np.nan, 0, 0, 0]]), k=1)
        with pytest.raises(
            IndexInputError, match=r"filter_ids: expected a collection of str, got a single str"
        ):
            ix.search(np.zeros(4), k=1, filter_ids="a")
        with pytest.raises(IndexInputError, match=r"labels: contains int"):
            ix.search(np.zeros(4), k=1, labels={1})
        with pytest.raises(IndexInputError, match=r"ef: must be an integer >= 1"):
            ix.search(np.zeros(4), k=1, ef=0)

    def test_bad_construction(self):
        with pytest.raises(IndexInputError, match="dim"):
            HyperbolicIndex(0)
        with pytest.raises(IndexInputError, match="curvature"):
            HyperbolicIndex(4, curvature=-1.0)
        with pytest.raises(IndexInputError, match="backend"):
            HyperbolicIndex(4, backend="faiss")
        with pytest.raises(IndexInputError, match="backend_params"):
            HyperbolicIndex(4, backend="hnsw", efc=3)
        with pytest.raises(IndexInputError, match="space"):
            HyperbolicIndex(space="hyperboloid:4")
        with pytest.raises(IndexInputError, match="dim: 5 does not match"):
            HyperbolicIndex(5, space="poincare:4")

    def test_is_value_error(self, ix):
        with pytest.raises(ValueError):
            ix.delete([1])


class TestProductSpace:
    SPEC = "poincare:8,sphere:4,euclidean:4"

    @staticmethod
    def _data(n, seed):
        p, pq = cloud(n, 20, dim=8, seed=seed)
        rng = np.random.default_rng(seed)

        def other(m):
            return np.concatenate(
                [rng.standard_normal((m, 4)) * 0.7, rng.standard_normal((m, 4)) * 0.5], 1
            )

        return np.concatenate([p, other(n)], 1), np.concatenate([pq, other(20)], 1)

    def test_exact_matches_product_distance(self):
        x, q = self._data(2000, 4)
        # (auto indexes a product above its threshold with the graph: test_index_graph.py)
        ix = HyperbolicIndex(16, space=self.SPEC, backend="exact")
        assert ix.space == self.SPEC and ix.dim == 16
        ix.add(x, make_ids(len(x)))
        assert ix.backend == "exact"
        ids, dist = ix.search(q, k=10)
        ps = ProductSpace.parse(self.SPEC)
        with torch_threads():
            d = ps.pairwise_dist(torch.from_numpy(q), torch.from_numpy(x)).numpy()
        order = np.argsort(d, axis=1, kind="stable")[:, :10]
        np.testing.assert_array_equal(_as_idx(ids), order)
        np.testing.assert_allclose(dist, np.take_along_axis(d, order, 1), rtol=1e-9)
        for i in range(3):  # ProductSpace.dist within a few ulps
            with torch_threads():
                ref = ps.dist(
                    torch.from_numpy(q[i])[None], torch.from_numpy(x[_as_idx(ids[i])])
                ).numpy()
            assert_geodesic(dist[i], ref)

    def test_hnsw_refused_for_products(self):
        with pytest.raises(IndexInputError, match="hnsw supports the Poincaré ball only"):
            HyperbolicIndex(16, space=self.SPEC, backend="hnsw")

    def test_product_validation_names_the_factor(self):
        ix = HyperbolicIndex(space=self.SPEC)
        v = np.zeros((2, 16))
        v[1, 2] = 1.5
        with pytest.raises(
            IndexInputError,
            match=r"vectors\[1\]: coordinates 0:8 \(factor poincare:8\) have norm 1.5",
        ):
            ix.add(v, ["a", "b"])
        v[1, 2] = 0.5
        v[1, 10] = 100.0  # sphere (stereographic) and euclidean factors take any finite point
        ix.add(v, ["a", "b"])
        assert len(ix) == 2

    def test_poincare_space_string(self):
        ix = HyperbolicIndex(space="poincare:3@0.25")
        assert ix.curvature == 0.25 and ix.space == "poincare:3" and ix.dim == 3
        ix.add(np.array([[1.9, 0, 0]]), ["a"])  # radius 2
