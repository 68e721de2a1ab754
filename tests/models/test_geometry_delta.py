"""Gromov δ-hyperbolicity: trees, brute force, Euclidean and hyperbolic samples."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from models.geometry import delta

pytestmark = pytest.mark.usefixtures("torch_single_thread")


def _tree_metric(n, seed):
    """Path lengths of a random weighted tree (node i > 0 hangs off a random earlier node)."""
    rng = np.random.default_rng(seed)
    parent = [-1] + [int(rng.integers(0, i)) for i in range(1, n)]
    weight = [0.0] + list(rng.uniform(0.1, 3.0, n - 1))
    depth = np.zeros(n)
    anc = [[0]]
    for i in range(1, n):
        depth[i] = depth[parent[i]] + weight[i]
        anc.append(anc[parent[i]] + [i])
    D = np.zeros((n, n))
    for i in range(n):
        for j in range(n):
            lca = max(set(anc[i]) & set(anc[j]), key=lambda k: depth[k])
            D[i, j] = depth[i] + depth[j] - 2 * depth[lca]
    return D


def _brute_delta(D, base):
    """max over x, y, z of min((x|z)_w, (y|z)_w) - (x|y)_w."""
    n = D.shape[0]
    gp = 0.5 * (D[base][:, None] + D[base][None, :] - D)
    best = -math.inf
    for x, y, z in itertools.product(range(n), repeat=3):
        best = max(best, min(gp[x, z], gp[y, z]) - gp[x, y])
    return best


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_tree_metric_has_zero_delta(seed):
    D = _tree_metric(40, seed)
    for base in (0, 7, 39):
        assert abs(delta.gromov_delta(D, base=base)) < 1e-12
    # through delta_hyperbolicity: points are node ids, the metric looks the tree up
    Dt = torch.as_tensor(D)
    ids = np.arange(40, dtype=float)[:, None]
    res = delta.delta_hyperbolicity(ids, metric=lambda p, q: Dt[p[:, 0].long()][:, q[:, 0].long()])
    assert res["delta"] < 1e-12 and res["delta_rel"] < 1e-12  # rounding of the Gromov products
    assert res["diameter"] == pytest.approx(D.max())
    assert res["suggested_curvature"] > 1e20


@pytest.mark.parametrize("seed", [0, 1])
def test_matches_brute_force(seed):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((14, 3))
    D = np.linalg.norm(X[:, None] - X[None], axis=-1)
    for base in (0, 5):
        assert math.isclose(
            delta.gromov_delta(D, base=base), _brute_delta(D, base), rel_tol=1e-12, abs_tol=1e-12
        )
    # a 4-cycle with unit edges: delta_w = 1 for every base point
    C4 = np.array([[0, 1, 2, 1], [1, 0, 1, 2], [2, 1, 0, 1], [1, 2, 1, 0]], dtype=float)
    assert delta.gromov_delta(C4) == pytest.approx(1.0) == _brute_delta(C4, 0)


def test_blocking_does_not_change_the_result(monkeypatch):
    rng = np.random.default_rng(3)
    X = rng.standard_normal((150, 4))
    D = torch.cdist(torch.as_tensor(X), torch.as_tensor(X))
    full = delta.gromov_delta(D)
    monkeypatch.setattr(delta, "_BLOCK_ELEMS", 150 * 9)  # 3x3 blocks: many partial ones
    assert delta.gromov_delta(D) == full
    assert delta.gromov_delta(D.numpy()) == full
    assert delta.gromov_delta(D.float()) == pytest.approx(full, rel=1e-5)


def test_bad_input():
    with pytest.raises(ValueError):
        delta.gromov_delta(np.zeros((3, 4)))
    with pytest.raises(ValueError):
        delta.gromov_delta(np.zeros((3, 3)), base=3)
    with pytest.raises(ValueError):
        delta.delta_hyperbolicity(np.zeros((5, 2)), metric="manhattan")


def test_euclidean_circle_and_grid_are_not_hyperbolic():
    t = np.linspace(0, 2 * np.pi, 120, endpoint=False)
    circle = np.stack([np.cos(t), np.sin(t)], 1)
    res = delta.delta_hyperbolicity(circle)
    assert set(res) == {"delta", "diameter", "delta_rel", "suggested_curvature"}
    assert res["diameter"] == pytest.approx(2.0, rel=1e-3)
    assert res["delta_rel"] > 0.4
    assert res["delta_rel"] == pytest.approx(2 * res["delta"] / res["diameter"])
    assert res["suggested_curvature"] == pytest.approx((0.144 / res["delta_rel"]) ** 2)
    grid = np.stack(np.meshgrid(np.arange(10), np.arange(10)), -1).reshape(-1, 2).astype(float)
    assert delta.delta_hyperbolicity(grid)["delta_rel"] > 0.4


@pytest.mark.parametrize("c", [1.0, 0.5])
def test_poincare_samples_are_hyperbolic(c):
    """Uniform samples of a hyperbolic disk of radius R: delta -> ln(2)/sqrt(c), small delta_rel."""
    rng = np.random.default_rng(4)
    R = 12.0
    u = rng.random(250)
    r = np.arccosh(1 + u * (np.cosh(R) - 1))  # area density sinh(r)
    th = rng.random(250) * 2 * np.pi
    x = np.stack([np.cos(th), np.sin(th)], 1) * (np.tanh(r / 2) / math.sqrt(c))[:, None]
    hyp = delta.delta_hyperbolicity(x, metric="poincare", c=c)
    assert hyp["delta"] <= math.log(2) / math.sqrt(c) + 1e-6
    assert hyp["delta_rel"] < 0.1
    assert hyp["suggested_curvature"] > 1.0
    flat = delta.delta_hyperbolicity(x, metric="euclidean")
    assert flat["delta_rel"] > 3 * hyp["delta_rel"]


def test_sampling_and_callable_metric():
    rng = np.random.default_rng(5)
    X = rng.standard_normal((400, 6))
    a = delta.delta_hyperbolicity(X, n_samples=100, seed=1)
    b = delta.delta_hyperbolicity(torch.as_tensor(X), n_samples=100, seed=1)
    c = delta.delta_hyperbolicity(X, n_samples=100, seed=2)
    assert a == b
    assert a != c
    idx = np.random.default_rng(1).choice(400, size=100, replace=False)
    direct = delta.gromov_delta(np.linalg.norm(X[idx][:, None] - X[idx][None], axis=-1))
    assert a["delta"] == pytest.approx(direct, rel=1e-9)
    # a callable metric (here: the sup norm)
    d = delta.delta_hyperbolicity(X[:50], metric=lambda p, q: (p[:, None] - q[None]).abs().amax(-1))
    assert d["diameter"] == pytest.approx(np.abs(X[:50, None] - X[None, :50]).max(-1).max())
