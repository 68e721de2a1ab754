"""The analytic distance gradient of models.geometry.sparse against poincare.dist and autograd."""

from __future__ import annotations

import pytest
import torch

from models.geometry import poincare
from models.geometry.sparse import dist_and_grad, fast_gap


def _points(gen, shape, max_radius):
    v = torch.randn(*shape, generator=gen, dtype=torch.float64)
    rho = torch.rand(*shape[:-1], 1, generator=gen, dtype=torch.float64) * max_radius
    return v / v.norm(dim=-1, keepdim=True) * torch.tanh(rho / 2)


@pytest.mark.parametrize("c", [0.1, 1.0, 2.5])
@pytest.mark.parametrize("max_radius", [2.0, 12.0, 25.0])
def test_value_and_gradient_match_autograd(c, max_radius):
    gen = torch.Generator().manual_seed(int(c * 10 + max_radius))
    x = _points(gen, (16, 5), max_radius) / c**0.5
    y = _points(gen, (16, 7, 5), max_radius) / c**0.5
    d, gx, gy = dist_and_grad(x, y, c=c)
    xr = x.clone().requires_grad_(True)
    yr = y.clone().requires_grad_(True)
    ref = poincare.dist(xr[:, None, :], yr, c=c)
    torch.testing.assert_close(d, ref.detach(), rtol=1e-9 if max_radius < 20 else 1e-6, atol=1e-12)
    w = torch.randn(16, 7, generator=gen, dtype=torch.float64)
    (ref * w).sum().backward()
    rtol = 1e-7 if max_radius < 20 else 1e-4
    torch.testing.assert_close((w[..., None] * gx).sum(1), xr.grad, rtol=rtol, atol=1e-10)
    torch.testing.assert_close(w[..., None] * gy, yr.grad, rtol=rtol, atol=1e-10)


def test_zero_distance_has_zero_finite_gradient():
    x = torch.tensor([[0.3, -0.2], [0.0, 0.0]], dtype=torch.float64)
    d, gx, gy = dist_and_grad(x, x[:, None, :], c=1.0)
    assert torch.equal(d, torch.zeros_like(d))
    assert torch.isfinite(gx).all() and torch.isfinite(gy).all()
    assert float(gx.abs().max()) == 0.0


def test_fast_gap_is_floored_inside_the_ball():
    x = torch.tensor([[0.6, 0.8], [0.3, 0.4], [2.0, 0.0]], dtype=torch.float64)
    g = fast_gap(x, c=1.0)
    assert g[1] == pytest.approx(0.75)
    assert bool((g > 0).all())


@pytest.mark.parametrize("c", [0.5, 1.0, 2.5])
def test_euclidean_ball_is_the_hyperbolic_ball(c):
    """Points on the Euclidean sphere (centre, radius) are at hyperbolic distance r from x."""
    gen = torch.Generator().manual_seed(5)
    x = _points(gen, (6, 4), 14.0) / c**0.5
    r = torch.rand(6, generator=gen, dtype=torch.float64) * 5 + 0.1
    centre, radius = poincare.euclidean_ball(x, r, c=c)
    u = torch.randn(6, 50, 4, generator=gen, dtype=torch.float64)
    u = u / u.norm(dim=-1, keepdim=True)
    on_sphere = centre[:, None, :] + radius[:, None, None] * u
    d = poincare.dist(x[:, None, :], on_sphere, c=c)
    torch.testing.assert_close(d, r[:, None].expand_as(d), rtol=1e-6, atol=1e-8)
    c_inf, r_inf = poincare.euclidean_ball(
        x, torch.full((6,), float("inf"), dtype=torch.float64), c=c
    )
    assert torch.equal(c_inf, x) and bool(torch.isinf(r_inf).all())
