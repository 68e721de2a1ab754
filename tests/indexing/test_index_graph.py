"""The graph backend (indexing/backends/graph.py): a proximity graph built with
the hyperbolic metric, searched with a beam and re-ranked in float64."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from indexing import HyperbolicIndex, IndexInputError
from indexing.backends import graph as graph_backend
from indexing.backends import graph_params
from tests.support.cloud import (
    against_exact,
    assert_geodesic,
    brute_force,
    cloud,
    exact_dist,
    exact_fixture,
    make_ids,
    recall_at,
)

big = exact_fixture("graph", 20_000, 200, seed=31)


def test_recall_and_exact_distances(big):
    x, q, truth, tdist, graph = big
    ids, dist = graph.search(q, k=10)
    assert recall_at(ids, truth) >= 0.99
    assert dist.dtype == np.float64
    assert (np.diff(dist, axis=1) >= 0).all()
    # every distance is the float64 distance of the item returned
    for i in range(0, len(q), 20):
        rows = [int(s[1:]) for s in ids[i]]
        assert_geodesic(dist[i], exact_dist(q[i], x[rows]))
    # where the graph found the true neighbour, the distance is the truth's
    hit = ids[:, 0] == truth[:, 0]
    assert hit.mean() >= 0.99
    np.testing.assert_array_equal(dist[hit, 0], tdist[hit, 0])


def test_recall_rises_with_ef(big):
    x, q, truth, _, graph = big
    low = recall_at(graph.search(q, k=10, ef=10)[0], truth)
    high = recall_at(graph.search(q, k=10, ef=200)[0], truth)
    assert high >= 0.998
    assert high > low


def test_every_node_is_reachable(big):
    graph = big[-1]
    backend = graph._backend
    assert backend.name == "graph"
    assert backend.unreachable() == 0


def test_deleted_items_never_come_back_and_results_stay_exact():
    x, q = cloud(6000, 30, seed=32)
    ids = make_ids(len(x))
    ix = HyperbolicIndex(16, backend="graph", R=16)
    ix.add(x, ids)
    gone = set(ids[::4])  # 25%: below the compaction threshold, tombstones in the graph
    assert ix.delete(sorted(gone)) == len(gone)
    assert ix.stats()["slots"] == len(x)  # not compacted: the graph routes through tombstones
    keep = np.array([j for j in range(len(x)) if ids[j] not in gone])
    found, dist = ix.search(q, k=10)
    assert not gone & set(found.ravel().tolist())
    order, bf = brute_force(x[keep], q, 10)
    truth = np.array(ids)[keep][order]
    assert recall_at(found, truth) >= 0.97
    assert ix._backend.unreachable() == 0


def test_batches_of_near_duplicates_stay_reachable():
    """Tight clusters added one batch at a time (near-duplicate images): every
    search for a cluster's centre returns the whole cluster, after every add."""
    dim, size = 8, 40
    base, _ = cloud(3000, dim=dim, seed=2)
    ix = HyperbolicIndex(dim, backend="graph")
    ix.add(base, make_ids(3000, "base"))
    rng = np.random.default_rng(6)
    centres = rng.standard_normal((25, dim))
    centres = 0.5 * centres / np.linalg.norm(centres, axis=1, keepdims=True)
    for b in range(len(centres)):
        pts = centres[b] + 1e-4 * rng.standard_normal((size, dim))
        ix.add(pts, [f"b{b}_{j}" for j in range(size)])
        for c in range(b + 1):
            found, _ = ix.search(centres[c], k=size)
            got = sum(s.startswith(f"b{c}_") for s in found[0])
            assert got == size, f"after batch {b}: {got} of cluster {c}"
    assert ix._backend.unreachable() == 0


def test_single_inserts_skip_the_flood_fill_and_stay_reachable(monkeypatch):
    """One item at a time into a graph of small degree (lists overflow and hand edges
    on): the flood fill over every node runs only when an insertion could have cut a
    node off (new entry points, a hand-off left over), and after every insertion
    every node is still reachable and every near-duplicate cluster found whole."""
    from indexing.backends import _graph_kernels as K

    dim = 8
    base, _ = cloud(4000, dim=dim, seed=5)
    ix = HyperbolicIndex(dim, backend="graph", R=16)
    ix.add(base, make_ids(len(base), "base"))
    floods = {"n": 0}
    real = K.reachable

    def counted(*args):  # the real flood fill, counted
        floods["n"] += 1
        return real(*args)

    monkeypatch.setattr(K, "reachable", counted)
    rng = np.random.default_rng(8)
    extra, _ = cloud(150, dim=dim, seed=9)
    centres = rng.standard_normal((5, dim))
    centres = 0.6 * centres / np.linalg.norm(centres, axis=1, keepdims=True)
    dups = [c + 1e-5 * rng.standard_normal((10, dim)) for c in centres]
    points = [*extra, *np.concatenate(dups)]
    names = [f"x{j}" for j in range(len(extra))]
    names += [f"d{c}_{j}" for c in range(len(dups)) for j in range(10)]
    order = rng.permutation(len(points))
    for n, j in enumerate(order.tolist()):
        ix.add(points[j][None], [names[j]])
        if n % 25 == 0:
            before = floods["n"]
            assert ix._backend.unreachable() == 0, f"after insert {n}"
            floods["n"] = before  # the check above is the test's own
    assert floods["n"] < len(points) // 2, floods
    assert ix._backend.unreachable() == 0
    for c in range(len(dups)):
        found, _ = ix.search(centres[c], k=10)
        assert sum(s.startswith(f"d{c}_") for s in found[0]) == 10
    found, _ = ix.search(np.stack(points[: len(extra)]), k=1)
    assert np.mean([f[0] == n for f, n in zip(found, names, strict=False)]) >= 0.97


def test_snapshot_round_trip_restores_the_graph(tmp_path):
    x, q = cloud(5000, 40, seed=33)
    ids = make_ids(len(x))
    ix = HyperbolicIndex(16, backend="graph", path=tmp_path / "ix")
    ix.add(x, ids)
    ix.delete(ids[:100])
    before = ix.search(q, k=10)
    adj = ix._backend._adj[: len(x)].copy()
    ix.save()
    ix.close()
    again = HyperbolicIndex.load(tmp_path / "ix")
    assert again.backend == "graph"
    np.testing.assert_array_equal(again._backend._adj[: len(x)], adj)  # restored, not rebuilt
    after = again.search(q, k=10)
    np.testing.assert_array_equal(before[0], after[0])
    np.testing.assert_array_equal(before[1], after[1])
    # writes after the snapshot are replayed into the restored graph
    again.add(x[:50] * 0.5, [f"new{j}" for j in range(50)])
    again.close()
    third = HyperbolicIndex.load(tmp_path / "ix")
    # (a beam wider than the one calibrated on the first 5,000 items: the new
    # ones lie in an empty region of the ball)
    found, _ = third.search(x[:50] * 0.5, k=1, ef=64)
    assert found[:, 0].tolist() == [f"new{j}" for j in range(50)]
    third.close()


def test_a_graph_saved_under_another_default_degree_is_restored_not_rebuilt(
    tmp_path, monkeypatch, caplog
):
    """An index above 40-d saved when the default degree was 32 (before WIDE_R) opens
    with its own graph and answers as before: no rebuild, no warning."""
    from indexing.backends import graph as graph_module

    x, q = cloud(2500, 20, dim=44, seed=35)
    ids = make_ids(len(x))
    monkeypatch.setattr(graph_module, "degree_default", lambda dim, product=False: 32)
    ix = HyperbolicIndex(44, backend="graph", path=tmp_path / "ix")
    ix.add(x, ids)
    assert ix._backend.params["R"] == 32
    before = ix.search(q, k=10)
    adj = ix._backend._adj[: len(x)].copy()
    ix.save()
    ix.close()
    monkeypatch.undo()
    assert graph_params.degree_default(44) == graph_params.WIDE_R != 32
    with caplog.at_level("WARNING"):
        again = HyperbolicIndex.load(tmp_path / "ix")
    try:
        assert not [r for r in caplog.records if "rebuilding" in r.getMessage()]
        assert again._backend.params["R"] == 32
        np.testing.assert_array_equal(again._backend._adj[: len(x)], adj)
        after = again.search(q, k=10)
        np.testing.assert_array_equal(before[0], after[0])
        again.add(x[:20] * 0.5, [f"new{j}" for j in range(20)])  # inserts keep its degree
        assert int(again._backend._deg[: again._backend._n].max()) <= 48
    finally:
        again.close()


def test_concurrent_searches_agree_with_a_serial_run(big):
    x, q, truth, _, graph = big
    serial = graph.search(q, k=10)
    out: dict[int, tuple] = {}
    errors: list[BaseException] = []

    def run(t):
        try:
            for _ in range(3):
                out[t] = graph.search(q[t::4], k=10)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for t in range(4):
        np.testing.assert_array_equal(out[t][0], serial[0][t::4])
        np.testing.assert_array_equal(out[t][1], serial[1][t::4])


@pytest.mark.parametrize(
    "params, pattern",
    [
        ({"R": 1}, "R must be >= 2"),
        ({"alpha": 0.5}, "alpha must be >= 1"),
        ({"ef": 0}, "ef must be >= 1"),
        ({"mates": -1}, "mates must be >= 0"),
        ({"degree": 8}, "unknown parameters"),
    ],
)
def test_bad_parameters(params, pattern):
    with pytest.raises(IndexInputError, match=pattern):
        HyperbolicIndex(8, backend="graph", **params)


PRODUCT = "poincare:8,sphere:4,euclidean:4"


def _product_cloud(n, nq, seed):
    p, pq = cloud(n, nq, dim=8, seed=seed)
    rng = np.random.default_rng(seed)

    def rest(m):
        return np.hstack([rng.standard_normal((m, 4)) * 0.7, rng.standard_normal((m, 4)) * 0.5])

    return np.hstack([p, rest(n)]), np.hstack([pq, rest(nq)])


def test_product_graph_against_the_exact_scan():
    x, q = _product_cloud(6000, 100, seed=36)
    ids_all = make_ids(len(x))
    graph = HyperbolicIndex(space=PRODUCT, backend="graph")
    exact = HyperbolicIndex(space=PRODUCT, backend="exact")
    for ix in (graph, exact):
        ix.add(x, ids_all)
    assert graph.backend == "graph" and graph._backend._dtype == np.float64
    assert graph._backend.unreachable() == 0
    gi, gd = graph.search(q, k=10)
    ei, ed = exact.search(q, k=10)
    assert recall_at(gi, ei) >= 0.99
    hit = gi == ei
    np.testing.assert_array_equal(gd[hit], ed[hit])  # the same exact distances
    # a filter routes through the filtered-out nodes
    keep = set(ids_all[::3])
    fi, fd = graph.search(q, k=5, filter_ids=keep)
    assert set(fi.ravel()) <= keep
    fe, _ = exact.search(q, k=5, filter_ids=keep)
    assert recall_at(fi, fe) >= 0.95


def test_auto_uses_the_graph_for_products():
    x, _ = _product_cloud(1200, 1, seed=37)
    ix = HyperbolicIndex(space=PRODUCT, auto_threshold=1000)
    ix.add(x, make_ids(len(x)))
    assert ix.backend == "graph"


def test_builds_are_deterministic():
    x, q = cloud(4000, 20, seed=38)
    adj, order, found, ef = [], [], [], []
    for _ in range(2):
        ix = HyperbolicIndex(16, backend="graph", seed=7)
        ix.add(x, make_ids(len(x)))
        b = ix._backend
        ef.append(b.ef_auto)
        adj.append(b._adj[: b._n].copy())
        order.append(b._n2s[: b._n].copy())
        found.append(ix.search(q, k=10, ef=16))
    np.testing.assert_array_equal(adj[0], adj[1])
    np.testing.assert_array_equal(order[0], order[1])  # the same node renumbering
    np.testing.assert_array_equal(found[0][0], found[1][0])
    np.testing.assert_array_equal(found[0][1], found[1][1])
    assert ef[0] is not None and ef[0] == ef[1]  # the same calibration


def _edges_by_slot(ix) -> dict[int, list[int]]:
    b = ix._backend
    return {
        int(b._n2s[v]): sorted(int(b._n2s[u]) for u in b._adj[v, : b._deg[v]])
        for v in range(b._n)
        if b._flags[v]
    }


def test_the_graph_does_not_depend_on_build_threads_or_the_layout(monkeypatch):
    # the insertion kernels run over index ranges on the caller's threads, and
    # a bulk insertion renews the node layout as the graph doubles: neither
    # may change a single edge (in slot terms) or the calibrated width
    from indexing.backends import graph as graph_backend

    x, q = cloud(9000, 20, seed=41)
    built = []
    for threads, relayout in ((1, 10**9), (2, 1024)):
        monkeypatch.setattr(graph_backend, "RELAYOUT_MIN", relayout)
        ix = HyperbolicIndex(16, backend="graph", seed=3, build_threads=threads)
        ix.add(x, make_ids(len(x)))
        built.append((_edges_by_slot(ix), ix._backend.ef_auto, ix.search(q, k=10, ef=24)))
    (e1, ef1, f1), (e2, ef2, f2) = built
    assert len(e1) == len(x) and e1 == e2
    assert ef1 is not None and ef1 == ef2
    np.testing.assert_array_equal(f1[0], f2[0])
    np.testing.assert_array_equal(f1[1], f2[1])


def test_renumbered_graph_answers_like_the_exact_scan(tmp_path):
    x, q = cloud(6000, 100, seed=39)
    ids = make_ids(len(x))
    # filter_exact_threshold=0: filtered searches go through the graph too
    graph = HyperbolicIndex(16, backend="graph", path=tmp_path / "ix", filter_exact_threshold=0)
    exact = HyperbolicIndex(16, backend="exact")
    for ix in (graph, exact):
        ix.add(x[:5000], ids[:5000])
    b = graph._backend
    n = b._n
    # the bulk insertion renumbered the nodes (breadth-first), the slots did not move
    assert not (b._n2s[:n] == np.arange(n)).all()
    np.testing.assert_array_equal(b._s2n[b._n2s[:n]], np.arange(n))
    # the node arrays follow the renumbering: node j holds slot n2s[j]'s point
    np.testing.assert_allclose(b._x[:n], x[b._n2s[:n]].astype(b._dtype))

    def same(k=10, **kw):
        gi, gd = graph.search(q, k=k, ef=64, **kw)
        ei, ed = exact.search(q, k=k, **kw)
        assert recall_at(gi, ei) >= 0.99
        hit = gi == ei
        assert hit.mean() >= 0.98
        np.testing.assert_array_equal(gd[hit], ed[hit])
        return gi

    same()
    # writes after the renumbering: new slots, deletions, a filter
    for ix in (graph, exact):
        ix.add(x[5000:], ids[5000:])
        ix.delete(ids[:600:3])
    found = same()
    assert not set(found.ravel()) & set(ids[:600:3])
    keep = set(ids[1::4])
    assert set(same(k=5, filter_ids=keep).ravel()) <= keep
    # a snapshot keeps the node order
    graph.save()
    again = HyperbolicIndex.load(tmp_path / "ix")
    np.testing.assert_array_equal(again._backend._n2s[: b._n], b._n2s[: b._n])
    np.testing.assert_array_equal(again.search(q, k=10)[0], graph.search(q, k=10)[0])
    again.close()


def test_precision_auto_follows_the_depth_of_the_data():
    shallow, _ = cloud(3000, seed=34)
    ix = HyperbolicIndex(16, backend="graph")
    ix.add(shallow, make_ids(len(shallow)))
    assert ix._backend._dtype == np.float32
    # half the points pushed out to 1 - |x| in [1e-7, 1e-6] (deep: gap below 1e-5)
    deep, q = cloud(6000, 40, seed=35)
    rng = np.random.default_rng(35)
    for pts in (deep, q):
        sel = rng.random(len(pts)) < 0.5
        r = 1.0 - 10.0 ** -rng.uniform(6.0, 7.0, size=int(sel.sum()))
        pts[sel] *= (r / np.linalg.norm(pts[sel], axis=1))[:, None]
    assert ix._backend.space.deep(deep).mean() > 0.01
    results = {}
    for precision in ("auto", "float32"):
        g = HyperbolicIndex(16, backend="graph", precision=precision)
        g.add(deep, make_ids(len(deep)))
        backend = g._backend
        if precision == "auto":
            assert backend._dtype == np.float64 and not backend._deep
            # deep data: the wider graph of DEEP_DEFAULTS
            assert backend.params["R"] == 48 and backend.params["min_degree"] == 16
            assert backend.params["ef_construction"] == 96  # not the narrow 16-d one
        else:
            assert backend._dtype == np.float32 and backend._deep  # scanned exactly
            assert backend.params["ef_construction"] == graph_params.NARROW_EF_CONSTRUCTION
        results[precision] = g.search(q, k=10)
    order, bf = brute_force(deep, q, 10)
    truth = np.array(make_ids(len(deep)))[order]
    for precision, (found, dist) in results.items():
        assert recall_at(found, truth) >= 0.98, precision
        hit = found[:, 0] == truth[:, 0]
        assert_geodesic(dist[hit, 0], bf[hit, 0])


def test_deep_graph_snapshot_keeps_its_parameters(tmp_path):
    x, q = cloud(3000, 20, seed=40)
    r = 1.0 - 10.0 ** -np.random.default_rng(40).uniform(6.0, 7.0, size=len(x))
    x *= (r / np.linalg.norm(x, axis=1))[:, None]
    ix = HyperbolicIndex(16, backend="graph", path=tmp_path / "ix")
    ix.add(x, make_ids(len(x)))
    assert ix._backend.params["R"] == 48
    before = ix.search(q, k=10)
    adj = ix._backend._adj[: len(x)].copy()
    ix.save()
    ix.close()
    again = HyperbolicIndex.load(tmp_path / "ix")
    assert again._backend.params["R"] == 48 and again._backend._dtype == np.float64
    np.testing.assert_array_equal(again._backend._adj[: len(x)], adj)  # restored, not rebuilt
    np.testing.assert_array_equal(again.search(q, k=10)[0], before[0])
    again.close()
    # a given R is kept on deep data
    given = HyperbolicIndex(16, backend="graph", R=24)
    given.add(x, make_ids(len(x)))
    assert given._backend.params["R"] == 24 and given._backend.params["min_degree"] == 16


def test_bad_precision():
    with pytest.raises(IndexInputError, match="precision must be"):
        HyperbolicIndex(8, backend="graph", precision="half")


# -- the calibrated default beam width -------------------------------------------


def _graph(x, **params):
    ix = HyperbolicIndex(x.shape[1], backend="graph", **params)
    ix.add(x, make_ids(len(x)))
    return ix


def test_the_default_beam_is_calibrated_on_the_data_and_reaches_the_target():
    x, q = cloud(8000, 200, seed=41)
    ix = _graph(x)
    backend = ix._backend
    assert backend.ef_auto in graph_params.EF_LADDER
    assert backend.ef == backend.ef_auto
    found, _ = ix.search(q, k=10)  # ef=None: the calibrated width
    truth = np.array(make_ids(len(x)))[brute_force(x, q, 10)[0]]
    assert recall_at(found, truth) >= 0.98
    # a stricter target never gets a narrower beam; target 0 keeps the table
    strict = _graph(x, target_recall=0.999)._backend
    assert strict.ef_auto >= backend.ef_auto
    table = _graph(x, target_recall=0)._backend
    assert table.ef_auto is None
    assert table.ef == graph_params.default_ef(16, len(x))


@pytest.mark.parametrize("lo", [0, 3, 17])
def test_the_calibration_finds_the_first_passing_width_with_few_probes(lo):
    """The ladder search (galloping then bisection) returns what a scan one
    width at a time returns, for a monotone test, probing each width at most
    once and never more than about 2 log2 of the ladder's length."""
    top = len(graph_params.EF_LADDER) - 1
    for answer in range(lo, top + 2):
        probed = []

        def passes(i, answer=answer, probed=probed):
            probed.append(i)
            return i >= answer

        assert graph_params.first_true(passes, lo, top) == min(answer, top)
        assert len(probed) == len(set(probed)) and all(lo <= i <= top for i in probed)
        assert len(probed) <= 2 * int(np.ceil(np.log2(top + 2)))


def test_easy_data_get_a_narrower_beam_than_hard_data():
    """Well separated tight clusters (every neighbour list inside one cluster)
    need a narrower beam than the hierarchical cloud in 32 dimensions (a strict
    target: at 6,000 points both pass 0.99 with the narrowest width)."""
    rng = np.random.default_rng(3)
    centres = rng.standard_normal((40, 16))
    centres *= 0.5 / np.linalg.norm(centres, axis=1, keepdims=True)
    easy = (centres[:, None, :] + 1e-3 * rng.standard_normal((40, 150, 16))).reshape(-1, 16)
    hard, _ = cloud(6000, dim=32, seed=42)
    strict = {"target_recall": 0.999}
    assert _graph(easy, **strict)._backend.ef_auto < _graph(hard, **strict)._backend.ef_auto


def test_the_calibrated_beam_survives_a_snapshot(tmp_path):
    x, _ = cloud(4000, seed=43)
    ix = HyperbolicIndex(16, backend="graph", path=tmp_path / "ix")
    ix.add(x, make_ids(len(x)))
    ef = ix._backend.ef_auto
    assert ef is not None
    ix.save()
    ix.close()
    again = HyperbolicIndex.load(tmp_path / "ix")
    assert again._backend.ef_auto == ef
    again.close()


@pytest.mark.parametrize("bad", [-0.1, 1.5])
def test_target_recall_out_of_range_is_refused(bad):
    with pytest.raises(IndexInputError, match="target_recall must be in"):
        HyperbolicIndex(16, backend="graph", target_recall=bad)


def test_graph_and_exact_return_the_same_float64_distances():
    """One formula for every backend (IndexSpace.dist_rows and the graph kernel:
    models.geometry.kernels), so a hit found by both has bit-identical distances."""
    x, q, truth, tdist, graph = against_exact("graph", 6000, 60, seed=44)
    found, dist = graph.search(q, k=10)
    same = found == truth
    assert same.mean() > 0.9
    np.testing.assert_array_equal(dist[same], tdist[same])


@pytest.mark.parametrize("space", ["poincare:24@0.5", PRODUCT])
def test_the_rerank_bound_changes_no_answer(monkeypatch, space):
    # the kernel skips the exact distance of candidates whose ranking key
    # proves them farther than the k-th found: every answer must equal the
    # one with every candidate re-ranked (fresh queries, near-duplicates of
    # items, a wide and a narrow beam)
    from indexing.backends import _graph_kernels

    rng = np.random.default_rng(42)
    if space == PRODUCT:
        x, q = _product_cloud(6000, 150, seed=43)
    else:
        x, q = cloud(6000, 150, dim=24, seed=43, curvature=0.5)
    near = x[:150] + 1e-7 * rng.standard_normal((150, x.shape[1]))
    if space != PRODUCT:
        near = x[:150] * (1 - 1e-7)  # stays inside the ball
    # shells: 60 items around a centre at radii that differ by less than a
    # float32 step, so the keys cannot order them and only the exact
    # distances can: a bound that skipped any of them would change the answer
    centres = x[rng.choice(len(x), 5, replace=False)] * 0.6
    shells = []
    for p in centres:
        u = rng.standard_normal((60, x.shape[1]))
        u /= np.linalg.norm(u, axis=1, keepdims=True)
        shells.append(p + 1e-4 * (1 + 1e-9 * rng.random((60, 1))) * u)
    x = np.vstack([x, *shells])
    qq = np.vstack([q, near, centres])
    ix = HyperbolicIndex(space=space, backend="graph")
    ix.add(x, make_ids(len(x)))
    assert _graph_kernels.rerank_bound(space != PRODUCT, True, 24, 0.5) is not None
    with_bound = [ix.search(qq, k=10, ef=ef) for ef in (16, 128)]
    monkeypatch.setattr(_graph_kernels, "rerank_bound", lambda *a: None)
    for ef, (ids, d) in zip((16, 128), with_bound, strict=True):
        ids0, d0 = ix.search(qq, k=10, ef=ef)
        np.testing.assert_array_equal(ids, ids0)
        np.testing.assert_array_equal(d, d0)


def test_the_construction_beam_follows_the_dimension():
    narrow = HyperbolicIndex(16, backend="graph")._backend.params["ef_construction"]
    assert narrow == graph_params.NARROW_EF_CONSTRUCTION < 96
    assert HyperbolicIndex(32, backend="graph")._backend.params["ef_construction"] == 96
    product = HyperbolicIndex(space=PRODUCT, backend="graph")._backend.params
    assert product["ef_construction"] == 96
    wide = HyperbolicIndex(64, backend="graph")._backend.params["ef_construction"]
    assert wide == graph_params.WIDE_EF_CONSTRUCTION > 96
    given = HyperbolicIndex(64, backend="graph", ef_construction=50)._backend.params
    assert given["ef_construction"] == 50


def test_visited_stamps_wrap_without_changing_answers():
    """The visited buffers hold uint8 stamps, cleared every 255 searches: one
    call of 700 queries on one thread wraps them twice and answers as the same
    queries asked one at a time (fresh buffers' first stamps) do."""
    x, q = cloud(5000, 700, seed=44)
    ix = _graph(x)
    graph_backend.set_search_threads(1)
    try:
        ids, d = ix.search(q, k=10)
        for i in (0, 254, 255, 256, 510, 699):
            one_ids, one_d = ix.search(q[i : i + 1], k=10)
            np.testing.assert_array_equal(one_ids[0], ids[i])
            np.testing.assert_array_equal(one_d[0], d[i])
    finally:
        graph_backend.set_search_threads(0)
    assert all(item[0].dtype == np.uint8 for item in ix._backend._visited._free)


def test_a_batch_is_searched_region_by_region():
    """The insertion searches run in the order of ``region_order``: every node of
    the batch once, grouped by its nearest entry point and within that by its
    second nearest (by the entries' keys), the order within such a cell kept
    (the graph itself does not depend on it: the determinism and layout tests
    above)."""
    from indexing.backends import _graph_kernels

    x, _ = cloud(3000, 1, seed=45)
    b = _graph(x[:2000])._backend
    ex, eaux = b._start[1], b._start[2]
    nodes = np.arange(b._n, dtype=np.int64)[::-1].copy()
    keys = np.arange(len(b._entries), dtype=np.int64)[::-1].copy()
    perm = _graph_kernels.region_order(b._graph, b._met, nodes, b._start, keys)
    assert sorted(perm.tolist()) == list(range(len(nodes)))
    out = nodes[perm]
    # the nearest entry of each node, by the proxy key, independently in numpy
    w = eaux[:, 0]
    xs = np.asarray(b._x[: b._n], dtype=np.float64)
    key = ((xs[out][:, None, :] - np.asarray(ex, dtype=np.float64)[None]) ** 2).sum(-1) * w
    near = np.argsort(key, axis=1)[:, :3]
    three = np.take_along_axis(key, near, axis=1)
    # no near-tie among the three nearest (the kernel's keys are float32 sums)
    clear = (np.diff(three, axis=1) > 1e-5 * three[:, :1]).all(axis=1)
    assert clear.mean() > 0.98
    span = keys.max() + 1
    region = (keys[near[:, 0]] * span + keys[near[:, 1]])[clear]
    assert (np.diff(region) >= 0).all()  # grouped, regions in key order
    assert len(np.unique(region)) > 10
    for r in np.unique(region):
        inside = perm[clear][region == r].tolist()
        assert inside == sorted(inside)  # the given order within a region


def test_single_upserts_into_a_large_graph_keep_it_whole():
    """Small upserts keep the entry points (picking them again is O(n) each) unless
    a new point lies nearer the origin than the hub, or the hub is deleted; every
    node stays reachable and the answers stay those of the exact scan."""
    x, q = cloud(5000, 40, dim=8, seed=41)
    ix = HyperbolicIndex(8, backend="graph")
    ix.add(x, make_ids(len(x)))
    g = ix._backend
    entries = g._entries.copy()
    hub_slot = int(g._n2s[entries[0]])
    rng = np.random.default_rng(3)
    extra = []
    rim = float(np.linalg.norm(x, axis=1).max())
    for i in range(30):  # points on the rim: the hub and the sample stay
        v = rng.standard_normal(8)
        v *= rim / np.linalg.norm(v)
        ix.add(v[None], [f"s{i}"])
        extra.append(v)
    assert np.array_equal(g._n2s[g._entries], g._n2s[entries])
    near = np.full(8, 1e-6)  # nearer the origin than any point: the new hub
    ix.add(near[None], ["origin"])
    assert g._n2s[g._entries[0]] == ix._live.table.slot_of["origin"]
    ix.delete(["origin"])  # the hub deleted: picked again at the next upsert
    ix.add(extra[0][None] * 0.9999, ["after"])
    assert g._n2s[g._entries[0]] == hub_slot
    assert g.unreachable() == 0
    alive = np.concatenate([x, np.array(extra), extra[0][None] * 0.9999])
    names = np.array(make_ids(len(x)) + [f"s{i}" for i in range(30)] + ["after"])
    order, _ = brute_force(alive, q, 10)
    found, _ = ix.search(q, k=10)
    assert recall_at(found, names[order]) >= 0.99
