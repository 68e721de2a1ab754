"""models.geometry.kernels (numba) against the torch reference distances."""

import numpy as np
import pytest
import torch

from models.geometry import kernels, poincare
from models.geometry.product import ProductSpace


def _points(rng, n, spec):
    ps = ProductSpace.parse(spec)
    parts = []
    for f in ps.factors:
        a = rng.standard_normal((n, f.dim))
        if f.kind == "poincare":
            u = rng.uniform(0.0, 12.0, size=n)  # up to the float64 boundary
            r = 1.0 - 10.0 ** (-u)
            a *= (r / np.linalg.norm(a, axis=1) / np.sqrt(f.curvature))[:, None]
        parts.append(a)
    return ps, np.hstack(parts)


@pytest.mark.parametrize(
    "spec", ["poincare:16", "poincare:5@0.5", "poincare:8,sphere:4,euclidean:4", "sphere:3@2.0"]
)
def test_dist_matches_torch(spec):
    rng = np.random.default_rng(0)
    ps, x = _points(rng, 300, spec)
    _, y = _points(rng, 300, spec)
    y[:5] = x[:5]  # zero distances
    table = kernels.factor_table(ps.factors)
    out = np.empty((300, 1))
    kernels.dist_rows(
        y, kernels.gaps(y, table), x, kernels.gaps(x, table), np.arange(300)[:, None], *table, out
    )
    if len(ps.factors) == 1 and ps.factors[0].kind == "poincare":
        ref = poincare.dist(torch.from_numpy(y), torch.from_numpy(x), c=ps.factors[0].curvature)
    else:
        ref = ps.dist(torch.from_numpy(y), torch.from_numpy(x))
    np.testing.assert_allclose(out[:, 0], ref.numpy(), rtol=1e-12, atol=0)
    assert (out[:5, 0] == 0).all()


def test_padding_is_inf():
    table = kernels.factor_table([("poincare", 2, 1.0)])
    x = np.array([[0.1, 0.2], [0.3, -0.1]])
    g = kernels.gaps(x, table)
    out = np.empty((1, 3))
    kernels.dist_rows(x[:1], g[:1], x, g, np.array([[1, -1, 0]]), *table, out)
    assert out[0, 1] == np.inf and out[0, 2] == 0.0 and 0 < out[0, 0] < np.inf


@pytest.mark.parametrize("dim,c", [(2, 1.0), (10, 0.5), (64, 1.0), (300, 2.0)])
def test_gaps_are_exact_to_a_few_ulps_up_to_the_boundary(dim, c):
    """The compiled gap ``1 - c|x|^2`` (and the sphere's ``1 + k|x|^2``) against
    exact rational arithmetic, for points up to 1e-15 of the radius 1/sqrt(c),
    and against the vectorised numpy twin it replaced."""
    from fractions import Fraction

    from models.geometry.poincare_np import one_minus_c_sqnorm

    rng = np.random.default_rng(dim)
    x = rng.standard_normal((400, dim))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    x *= ((1.0 - 10.0 ** rng.uniform(-15, 0, size=len(x))) / np.sqrt(c))[:, None]
    g = kernels.gaps(x, kernels.factor_table([("poincare", dim, c)]))[:, 0]
    s = kernels.gaps(x, kernels.factor_table([("sphere", dim, c)]))[:, 0]
    assert (g > 0).all()
    for i in range(0, len(x), 8):
        sq = sum(Fraction(float(v)) ** 2 for v in x[i])
        exact = 1 - Fraction(c) * sq
        assert abs(Fraction(float(g[i])) - exact) <= Fraction(2e-15) * exact, i
        exact_s = 1 + Fraction(c) * sq
        assert abs(Fraction(float(s[i])) - exact_s) <= Fraction(2e-16) * exact_s, i
    np.testing.assert_allclose(g, one_minus_c_sqnorm(x, c), rtol=1e-14, atol=0)
