"""models.geometry.ranking: membership, the gap floor, the deep test and the
ranking proxy against the exact distances of models.geometry.poincare."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
import torch

from models.geometry import numerics, poincare, ranking
from models.geometry import poincare_np as pnp

pytestmark = pytest.mark.usefixtures("torch_single_thread")


def test_one_floor_for_the_gap():
    assert ranking.GAP_FLOOR == numerics.eps(torch.float64, "boundary")
    beyond = np.array([[1 - 1e-17, 0.0]])  # nearer the boundary than the floor
    assert ranking.fast_gap(beyond, 1.0)[0] == ranking.GAP_FLOOR
    assert pnp.gap(beyond, c=1.0)[0] == ranking.GAP_FLOOR
    assert float(poincare.gap(torch.from_numpy(beyond), c=1.0)[0]) == ranking.GAP_FLOOR


@pytest.mark.parametrize("c", [0.1, 1.0, 2.5])
def test_membership_and_deep(c):
    r = 1 / math.sqrt(c)
    x = np.array(
        [
            [0.0, 0.0],
            [0.5 * r, 0.0],
            [r * (1 - 1e-7), 0.0],
            [r * (1 + 1e-12), 0.0],
            [2 * r, 0.0],
            [np.nan, 0.0],
        ]
    )
    assert ranking.inside_ball(x, c).tolist() == [True, True, True, False, False, False]
    # a member's plain gap is positive: the proxy weight is finite
    members = x[ranking.inside_ball(x, c)]
    assert np.isfinite(ranking.proxy_weight(members, c)).all()
    assert ranking.is_deep(x[:3], c).tolist() == [False, False, True]
    assert (
        ranking.is_deep(x[:3], c).tolist()
        == (ranking.fast_gap(x[:3], c) < ranking.DEEP_GAP).tolist()
    )


@pytest.mark.parametrize("c", [0.1, 1.0, 2.5])
def test_proxy_orders_and_corrects_to_the_distance(c):
    rng = np.random.default_rng(7)
    u = rng.normal(size=(60, 5))
    u /= np.linalg.norm(u, axis=1, keepdims=True)
    x = u * (np.tanh(rng.uniform(0, 10, size=(60, 1)) / 2) / math.sqrt(c))
    q, items = x[:4], x[4:]
    w = ranking.proxy_weight(items, c)
    keys = ranking.proxy_key_rows(
        q, np.broadcast_to(items, (4, *items.shape)), np.broadcast_to(w, (4, len(w)))
    )
    # an independent float64 computation of |x - q|^2 w(x)
    for i in range(4):
        for j in range(len(items)):
            diff = [float(a) - float(b) for a, b in zip(items[j], q[i], strict=True)]
            want = sum(v * v for v in diff) / (1.0 - c * sum(float(v) ** 2 for v in items[j]))
            assert keys[i, j] == pytest.approx(want, rel=1e-9)
    exact = pnp.pairwise_dist(q, items, c=c)
    np.testing.assert_array_equal(np.argsort(keys, axis=1), np.argsort(exact, axis=1))
    z = ranking.key_to_arg(keys, q, c)
    d = np.vectorize(ranking.arcosh1p)(z) / math.sqrt(c)
    np.testing.assert_allclose(d, exact, rtol=1e-9)


def test_ranking_loads_without_torch():
    code = "import sys; import models.geometry.ranking; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
