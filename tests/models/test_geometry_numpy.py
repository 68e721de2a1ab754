"""models.geometry.poincare_np (numpy float64 twins) against the torch functions and
the 60-digit reference (tests/data/geometry_reference.json, through tests/conftest.py)."""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
import torch

from models.geometry import numerics, poincare
from models.geometry import poincare_np as pnp

pytestmark = pytest.mark.usefixtures("torch_single_thread")


def _gap(p, c):
    return 1 - math.sqrt(c) * math.sqrt(sum(t * t for t in p))


def _rtol(case):
    return 1e-10 if min(_gap(case["x"], case["c"]), _gap(case["y"], case["c"])) < 1e-5 else 1e-12


def _rel(got, want) -> float:
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def _points(n, d, c, seed):
    """Random directions at gaps 1 - sqrt(c)|x| from 1e-12 to 0.9, plus the origin."""
    rng = np.random.default_rng(seed)
    u = rng.normal(size=(n, d))
    u /= np.linalg.norm(u, axis=1, keepdims=True)
    gaps = 10.0 ** rng.uniform(-12, np.log10(0.9), size=(n, 1))
    x = u * (1 - gaps) / math.sqrt(c)
    return np.concatenate([x, np.zeros((1, d))])


def test_reference_cases_present(geometry_reference):
    assert len(geometry_reference["cases"]) == 45


def test_reference_distances(reference_case):
    case = reference_case
    c, rtol = case["c"], _rtol(case)
    x, y = np.array(case["x"]), np.array(case["y"])
    assert _rel(pnp.dist(x, y, c=c), case["dist_xy"]) <= rtol
    assert _rel(pnp.dist(y, x, c=c), case["dist_xy"]) <= rtol
    assert _rel(pnp.pairwise_dist(x[None], y[None], c=c)[0, 0], case["dist_xy"]) <= rtol
    # the distance to the origin against 60 digits (mpmath, from the float64 input)
    with mpmath.workdps(60):
        r = mpmath.sqrt(sum(mpmath.mpf(t) ** 2 for t in case["x"]))
        sc = mpmath.sqrt(mpmath.mpf(c))
        want = float(2 / sc * mpmath.atanh(sc * r))
    assert _rel(pnp.distance_to_origin(x, c=c), want) <= rtol
    # and the same numbers as the torch functions, to a few ulp
    tx, ty = torch.tensor(x), torch.tensor(y)
    assert _rel(pnp.dist(x, y, c=c), poincare.dist(tx, ty, c=c)) <= 1e-14
    assert _rel(pnp.distance_to_origin(x, c=c), poincare.distance_to_origin(tx, c=c)) <= 1e-14


@pytest.mark.parametrize("c", [0.1, 1.0, 2.5])
@pytest.mark.parametrize("d", [1, 2, 10, 16, 128])
def test_gap_is_the_compensated_gap_of_torch(c, d):
    x = _points(200, d, c, seed=d)
    got = pnp.one_minus_c_sqnorm(x, c)
    want = numerics.one_minus_c_sqnorm(torch.tensor(x), c).numpy()
    np.testing.assert_allclose(got, want, rtol=4e-16, atol=0)
    # the floor of poincare.gap: points on and outside the boundary stay finite
    out = np.zeros((2, d))
    out[:, 0] = [1.0 / math.sqrt(c), 2.0 / math.sqrt(c)]
    np.testing.assert_array_equal(pnp.gap(out, c=c), poincare.gap(torch.tensor(out), c=c).numpy())


def test_gap_near_the_boundary_keeps_its_digits():
    # |x| = 1 - 1e-12 in d = 10: the naive 1 - |x|^2 keeps about 4 digits
    rng = np.random.default_rng(3)
    u = rng.normal(size=10)
    x = u / np.linalg.norm(u) * (1 - 1e-12)
    with mpmath.workdps(60):
        want = float(1 - sum(mpmath.mpf(t) ** 2 for t in x))
    assert abs(pnp.gap(x, c=1.0) - want) / want < 1e-13


@pytest.mark.parametrize("c", [0.1, 1.0, 2.5])
def test_distances_match_torch_on_random_points(c):
    x = _points(60, 10, c, seed=1)
    y = _points(40, 10, c, seed=2)
    tx, ty = torch.tensor(x), torch.tensor(y)
    np.testing.assert_allclose(
        pnp.distance_to_origin(x, c=c),
        poincare.distance_to_origin(tx, c=c).numpy(),
        rtol=1e-14,
        atol=0,
    )
    np.testing.assert_allclose(
        pnp.dist(x[:41], y, c=c), poincare.dist(tx[:41], ty, c=c).numpy(), rtol=1e-14, atol=0
    )
    table = pnp.pairwise_dist(x, y, c=c)
    assert table.shape == (61, 41)
    # every entry is dist() of its pair (computed from the differences) ...
    np.testing.assert_allclose(
        table, poincare.dist(tx[:, None], ty[None], c=c).numpy(), rtol=1e-14, atol=0
    )
    # ... and agrees with the torch table (Gram form with exact fallback)
    np.testing.assert_allclose(
        table, poincare.pairwise_dist(tx, ty, c=c).numpy(), rtol=1e-9, atol=1e-12
    )
    # the nearest row of y for each x: the same as with torch
    torch_nearest = torch.argmin(poincare.pairwise_dist(tx, ty, c=c), dim=1).numpy()
    np.testing.assert_array_equal(np.argmin(table, axis=1), torch_nearest)


def test_pairwise_in_blocks_and_with_given_gaps(monkeypatch):
    c = 1.0
    x, y = _points(300, 10, c, seed=4), _points(50, 10, c, seed=5)
    whole = pnp.pairwise_dist(x, y, c=c)
    monkeypatch.setattr(pnp, "_CHUNK_ELEMS", 10 * 50 * 7)  # blocks of 7 rows
    np.testing.assert_array_equal(pnp.pairwise_dist(x, y, c=c), whole)
    np.testing.assert_array_equal(pnp.pairwise_dist(x, y, c=c, gy=pnp.gap(y, c=c)), whole)


def test_zero_on_the_diagonal_and_at_the_origin():
    x = _points(20, 10, 1.0, seed=6)
    assert (pnp.dist(x, x, c=1.0) == 0).all()
    assert (np.diag(pnp.pairwise_dist(x, x, c=1.0)) == 0).all()
    assert pnp.distance_to_origin(np.zeros(10), c=1.0) == 0.0
    assert pnp.distance_to_origin(np.zeros(10), c=1.0).shape == ()


def test_bad_input():
    with pytest.raises(ValueError, match="curvature"):
        pnp.distance_to_origin(np.zeros(3), c=0.0)
    with pytest.raises(ValueError, match="curvature"):
        pnp.dist(np.zeros(3), np.zeros(3), c=float("nan"))
    with pytest.raises(ValueError, match="pairwise"):
        pnp.pairwise_dist(np.zeros((2, 3)), np.zeros((2, 4)), c=1.0)
    with pytest.raises(ValueError, match="last dimension"):
        pnp.distance_to_origin(0.5, c=1.0)
