"""Evaluation metrics against brute-force computations on tiny sets."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from models.geometry import poincare
from models.labels import LabelEmbedding
from models.taxonomy.graph import Taxonomy
from models.training.evaluate import (
    auroc,
    backoff_hits,
    backoff_predict,
    hop_map,
    label_hits,
    mistake_severity,
    ranked_neighbours,
    retrieval_metrics,
)
from models.vision.heads import EuclideanSpace, PoincareSpace

torch.set_num_threads(1)


def _points(n=14, dim=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return poincare.expmap0(torch.randn(n, dim, generator=g, dtype=torch.float64), c=1.0)


def _brute_ranking(z, i):
    d = [(float(poincare.dist(z[i], z[j], c=1.0)), j) for j in range(len(z)) if j != i]
    return [j for _, j in sorted(d)]


def test_retrieval_metrics_brute_force():
    z = _points()
    t = np.array([0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 2])
    m = retrieval_metrics(z, t, PoincareSpace(1.0), ks=(1, 2, 5))
    rec = {k: 0.0 for k in (1, 2, 5)}
    aps = []
    for i in range(len(z)):
        order = _brute_ranking(z, i)
        rel = [t[j] == t[i] for j in order]
        for k in rec:
            rec[k] += any(rel[:k]) / len(z)
        R = int((t == t[i]).sum()) - 1
        aps.append(sum(np.mean(rel[: r + 1]) for r in range(R) if rel[r]) / R)
    for k in rec:
        assert m[f"recall@{k}"] == pytest.approx(rec[k])
    assert m["map@r"] == pytest.approx(np.mean(aps))
    # a perfect clustering scores 1
    tight = torch.cat(
        [torch.full((5, 2), 0.1 * k) + 1e-3 * torch.arange(5)[:, None] for k in range(3)]
    )
    p = retrieval_metrics(tight.double(), np.repeat([0, 1, 2], 5), EuclideanSpace(1.0))
    assert p["recall@1"] == 1.0 and p["map@r"] == 1.0


def test_ranked_neighbours_chunks_agree():
    z = _points(30)
    a = ranked_neighbours(z, PoincareSpace(1.0), 10, chunk=7)
    b = ranked_neighbours(z, PoincareSpace(1.0), 10, chunk=1000)
    assert torch.equal(a, b)
    assert a[3].tolist() == _brute_ranking(z, 3)[:10]


def _tax():
    return Taxonomy.from_edges(
        [("a1", "a"), ("a2", "a"), ("b1", "b"), ("a", "r"), ("b", "r"), ("b1x", "b1")]
    )


def test_hop_map_brute_force():
    tax = _tax()
    nodes = ["a1", "a2", "b1"]  # a1-a2: 2 hops, a1-b1: 4 hops
    z = _points(12, seed=3)
    t = np.array([0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2])
    k = 5
    got = hop_map(z, t, nodes, tax, PoincareSpace(1.0), hops=(0, 2, 4), k=k)
    for h in (0, 2, 4):
        aps = []
        for i in range(len(z)):
            order = _brute_ranking(z, i)[:k]
            rel = [tax.hops(nodes[t[i]], nodes[t[j]]) <= h for j in order]
            total = sum(tax.hops(nodes[t[i]], nodes[t[j]]) <= h for j in range(len(z)) if j != i)
            prec = [np.mean(rel[: r + 1]) for r in range(k)]
            aps.append(sum(p for p, r in zip(prec, rel, strict=True) if r) / min(k, total))
        assert got[str(h)] == pytest.approx(np.mean(aps)), h
    assert got["4"] == pytest.approx(1.0)  # everything is within 4 hops


def test_label_hits_brute_force():
    tax = _tax()
    g = torch.Generator().manual_seed(1)
    emb = poincare.expmap0(torch.randn(len(tax), 2, generator=g, dtype=torch.float64), c=1.0)
    labels = LabelEmbedding(tax, emb, 1.0)
    z = _points(9, dim=2, seed=5)
    nodes = ["a1", "a2", "b1x"] * 3
    space = PoincareSpace(1.0)
    for cands in (tax.names, ["a", "a1", "b", "b1", "r"]):
        got = label_hits(z, nodes, cands, labels, space, ks=(1, 2))
        hits1 = hits2 = exact = 0
        for zi, node in zip(z, nodes, strict=True):
            d = sorted((float(poincare.dist(zi, emb[tax.index(c)], c=1.0)), c) for c in cands)
            ok = {node, *tax.parents(node)}
            hits1 += d[0][1] in ok
            hits2 += d[0][1] in ok or d[1][1] in ok
            exact += d[0][1] == node
        assert got["hier_hit@1"] == pytest.approx(hits1 / 9)
        assert got["hier_hit@2"] == pytest.approx(hits2 / 9)
        assert got["nearest_label_acc"] == pytest.approx(exact / 9)


def test_mistake_severity_brute_force():
    """Nearest of three class prototypes; a1-a2 are siblings (2 hops), a1-b1 cousins (4)."""
    tax = _tax()
    seen = ["a1", "a2", "b1"]
    protos = _points(3, dim=2, seed=7)
    z = _points(30, dim=2, seed=8)
    nodes = [seen[i % 3] for i in range(30)]
    got = mistake_severity(z, nodes, seen, protos, PoincareSpace(1.0), tax)
    hops = []
    for zi, node in zip(z, nodes, strict=True):
        d = [float(poincare.dist(zi, p, c=1.0)) for p in protos]
        pred = seen[int(np.argmin(d))]
        hops.append(0 if pred == node else 2 if {node, pred} == {"a1", "a2"} else 4)
    hops = np.array(hops, dtype=float)
    assert 0 < (hops > 0).mean() < 1  # some right, some wrong: the case tests both
    assert got["rate"] == pytest.approx((hops > 0).mean())
    assert got["severity"] == pytest.approx(hops[hops > 0].mean())
    assert got["avg_hops@1"] == pytest.approx(hops.mean())
    assert mistake_severity(z[:0], [], seen, protos, PoincareSpace(1.0), tax)["rate"] == 0.0


def test_backoff_prediction_brute_force():
    """The most specific candidate holding >= threshold of the posterior over trained classes."""
    tax = _tax()  # r -> a -> {a1, a2}; r -> b -> b1 -> b1x
    g = torch.Generator().manual_seed(2)
    emb = poincare.expmap0(torch.randn(len(tax), 2, generator=g, dtype=torch.float64), c=1.0)
    labels = LabelEmbedding(tax, emb, 1.0)
    space = PoincareSpace(1.0)
    seen = ["a1", "a2", "b1"]
    p = {n: emb[tax.index(n)] for n in tax.names}
    # exactly at a prototype: the class (tau small: a confident posterior)
    z = torch.stack([p["a1"], p["b1"]])
    preds, backed = backoff_predict(z, seen, tax.names, labels, space, tau=0.01)
    assert preds == ["a1", "b1"] and not backed.any()
    # trained classes excluded (zero-shot candidates): the lowest ancestor holding the mass
    preds, _ = backoff_predict(z, seen, ["a", "b", "r", "b1x"], labels, space, tau=0.01)
    assert preds == ["a", "b"]
    # brute force at a moderate temperature
    zs = _points(20, dim=2, seed=7)
    for cands in (tax.names, ["a", "b", "r", "b1x", "a2"]):
        preds, _ = backoff_predict(zs, seen, cands, labels, space, tau=0.7, threshold=0.6)
        for zi, got in zip(zs, preds, strict=True):
            d = torch.stack([poincare.dist(zi, p[c], c=1.0) for c in seen])
            post = torch.softmax(-d / 0.7, 0)
            best = None
            for v in cands:
                below = [k for k, c in enumerate(seen) if c == v or c in tax.descendants(v)]
                mass = float(post[below].sum()) if below else 0.0
                if mass >= 0.6:
                    key = (len(below), -tax.depth(v), float(poincare.dist(zi, p[v], c=1.0)))
                    best = min(best or (key, v), (key, v))
            if best is None:  # nothing qualifies: the nearest candidate
                best = (None, min(cands, key=lambda v: float(poincare.dist(zi, p[v], c=1.0))))
            assert got == best[1]
    h = backoff_hits(["a", "a1", "r"], ["a1", "a1", "a1"], tax)
    assert h == {"hier_hit@1": pytest.approx(2 / 3), "acc": pytest.approx(1 / 3)}


def test_auroc_brute_force_with_ties():
    rng = np.random.default_rng(0)
    pos = rng.integers(0, 5, 30).astype(float)
    neg = rng.integers(0, 4, 20).astype(float)
    brute = np.mean(
        [1.0 if p > n else 0.5 if p == n else 0.0 for p, n in itertools.product(pos, neg)]
    )
    assert auroc(pos, neg) == pytest.approx(brute)
    assert auroc([2, 3], [0, 1]) == 1.0 and auroc([0, 1], [2, 3]) == 0.0
