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
