"""Entailment cones: apertures, angles, membership, pairwise form, small-angle accuracy."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from models.geometry import cones, poincare

pytestmark = pytest.mark.usefixtures("torch_single_thread")


CURVATURES = [0.1, 1.0, 2.5]


def _unit(n, d, seed):
    u = torch.randn(n, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return u / u.norm(dim=-1, keepdim=True)


@pytest.mark.parametrize("K", [0.1, 0.5])
@pytest.mark.parametrize("c", CURVATURES)
def test_inner_radius_and_half_aperture(c, K):
    r = cones.inner_radius(c=c, K=K)
    rz = r * math.sqrt(c)
    assert math.isclose(K * (1 - rz * rz) / rz, 1.0, rel_tol=1e-14)
    u = _unit(1, 3, 0)
    r_ball = 1 / math.sqrt(c)
    norms = torch.tensor(
        [0.0, 0.5 * r, r, r + 0.1 * (r_ball - r), r + 0.6 * (r_ball - r), 0.99 * r_ball],
        dtype=torch.float64,
    )
    psi = cones.half_aperture(norms[:, None] * u, c=c, K=K)
    # clamped below the inner radius, pi/2 there, decreasing outside
    assert torch.allclose(psi[:3], torch.full((3,), math.pi / 2, dtype=torch.float64), atol=1e-6)
    assert (psi[3:].diff() < 0).all() and psi[2] > psi[3]
    z = norms[3:] * math.sqrt(c)
    assert torch.allclose(psi[3:], torch.asin(K * (1 - z * z) / z), rtol=1e-13)
    assert torch.is_tensor(cones.inner_radius(c=torch.tensor(c), K=K))


def test_half_aperture_keeps_digits_at_the_boundary():
    """psi ~ K (1 - |z|^2): 2e-13 at hyperbolic radius 30 (gap not computed as 1 - |z|^2)."""
    for c in CURVATURES:
        x = _unit(4, 6, 1) * poincare.radius_to_norm(30 / math.sqrt(c), c=c)
        g = poincare.gap(x, c=c)
        t = math.sqrt(c) * x.norm(dim=-1)
        assert torch.allclose(cones.half_aperture(x, c=c), torch.asin(0.1 * g / t), rtol=1e-14)
        assert (cones.half_aperture(x, c=c) < 1e-12).all()


@pytest.mark.parametrize("c", CURVATURES)
def test_cone_angle_special_configurations(c):
    u = _unit(5, 4, 2)
    x = u * 0.6 / math.sqrt(c)
    assert (cones.cone_angle(x, x, c=c) == 0).all()
    assert (cones.cone_angle(x, x * 1.4, c=c).abs() < 1e-15).all()  # further out on the ray
    assert torch.allclose(
        cones.cone_angle(x, x * 0.3, c=c), torch.full((5,), math.pi, dtype=torch.float64)
    )
    assert torch.allclose(
        cones.cone_angle(x, torch.zeros_like(x), c=c),
        torch.full((5,), math.pi, dtype=torch.float64),
    )
    y = _unit(5, 4, 3) * 0.8 / math.sqrt(c)
    xi = cones.cone_angle(x, y, c=c)
    assert ((xi >= 0) & (xi <= math.pi)).all()
    # same angle for the unit ball evaluated on sqrt(c) x
    assert torch.allclose(
        xi, cones.cone_angle(x * math.sqrt(c), y * math.sqrt(c), c=1.0), rtol=1e-13
    )
    # it is the angle between x and log_x(y) (the ball is conformal)
    v = poincare.logmap(x, y, c=c)
    cosang = (v * x).sum(-1) / (v.norm(dim=-1) * x.norm(dim=-1))
    assert torch.allclose(xi, torch.acos(cosang), atol=1e-7)


def test_tiny_angles_are_accurate():
    """Angles of 1e-12 at hyperbolic radius 28: the arccos closed form cannot resolve them."""
    mpmath = pytest.importorskip("mpmath")
    mp = mpmath.MPContext()
    mp.dps = 90  # the closed form cancels ~26 digits at the boundary and ~23 more in acos
    c = 1.0
    x = torch.tensor([0.6, 0.8, 0.0], dtype=torch.float64) * poincare.radius_to_norm(28.0, c=c)
    for eps in (1e-6, 1e-9, 1e-12):
        y = poincare.project(
            x * (1 + 1e-14) + torch.tensor([0.0, 0.0, eps], dtype=torch.float64) * 1e-13, c=c
        )
        X = [mp.mpf(float(t)) for t in x]
        Y = [mp.mpf(float(t)) for t in y]
        xy = mp.fsum(a * b for a, b in zip(X, Y, strict=True))
        x2 = mp.fsum(a * a for a in X)
        y2 = mp.fsum(b * b for b in Y)
        d2 = mp.fsum((a - b) ** 2 for a, b in zip(X, Y, strict=True))
        want = mp.acos(
            (xy * (1 + x2) - x2 * (1 + y2))
            / (mp.sqrt(x2) * mp.sqrt(d2) * mp.sqrt(1 + x2 * y2 - 2 * xy))
        )
        got = cones.cone_angle(x, y, c=c).item()
        pw = cones.pairwise_cone_angle(x[None], y[None], c=c).item()
        assert 0 < float(want) < 1e-3
        assert abs(got - float(want)) <= 1e-9 * float(want) + 1e-18
        assert abs(pw - float(want)) <= 1e-9 * float(want) + 1e-18


@pytest.mark.parametrize("c", CURVATURES)
def test_in_cone_and_energy(c):
    x = _unit(6, 3, 4) * 0.7 / math.sqrt(c)
    assert cones.in_cone(x, x, c=c).all()
    assert cones.in_cone(x, x * 1.3, c=c).all()
    assert not cones.in_cone(x, -x, c=c).any()
    assert (cones.cone_energy(x, x * 1.3, c=c) == 0).all()
    e = cones.cone_energy(x, -x, c=c)
    assert torch.allclose(e, math.pi - cones.half_aperture(x, c=c))
    # tol widens the cone
    y = poincare.project(x * 1.2 + 0.05 / math.sqrt(c) * _unit(6, 3, 5), c=c)
    xi, psi = cones.cone_angle(x, y, c=c), cones.half_aperture(x, c=c)
    assert torch.equal(cones.in_cone(x, y, c=c, tol=0.0), xi <= psi)
    assert cones.in_cone(x, y, c=c, tol=math.pi).all()


@pytest.mark.parametrize("c", CURVATURES)
def test_cones_are_nested(c):
    """Ganea et al.: y in cone(x) implies cone(y) within cone(x) (checked on samples)."""
    gen = torch.Generator().manual_seed(6)
    x = torch.tensor([[0.5, 0.1, 0.0]], dtype=torch.float64) / math.sqrt(c)
    # points around the ray through x, at every radius
    dirs = x / x.norm() + 0.12 * torch.randn(1500, 3, generator=gen, dtype=torch.float64)
    radii = torch.rand(1500, 1, generator=gen, dtype=torch.float64) * 0.999 / math.sqrt(c)
    pts = dirs / dirs.norm(dim=-1, keepdim=True) * radii
    ys = pts[cones.in_cone(x, pts, c=c, K=0.1)]
    assert ys.shape[0] >= 20
    inside = cones.in_cone(ys[:, None, :], pts[None, :, :], c=c, K=0.1)  # z in cone(y)
    holds = cones.in_cone(x, pts, c=c, K=0.1)  # z in cone(x)
    assert inside.any()
    assert (~inside | holds[None, :]).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("c", CURVATURES)
def test_pairwise_matches_broadcast(c, dtype):
    gen = torch.Generator().manual_seed(7)
    apex = torch.cat([_unit(6, 5, 8) * 0.5, _unit(6, 5, 9) * (1 - 1e-4)]) / math.sqrt(c)
    # points near the apexes' rays (flagged pairs), far points, and the apexes themselves
    along = apex * 1.0001 + 1e-7 * torch.randn(
        apex.shape, generator=gen, dtype=torch.float64
    ) / math.sqrt(c)
    others = _unit(20, 5, 10) * torch.rand(20, 1, generator=gen, dtype=torch.float64) / math.sqrt(c)
    pts = poincare.project(torch.cat([along, others, apex]), c=c)
    apex, pts = apex.to(dtype), pts.to(dtype)
    pw = cones.pairwise_cone_energy(apex, pts, c=c, K=0.1)
    br = cones.cone_energy(apex[:, None, :], pts[None, :, :], c=c, K=0.1)
    assert pw.shape == (12, 44) and pw.dtype == dtype
    atol = 1e-5 if dtype == torch.float32 else 1e-12
    assert torch.allclose(pw, br, rtol=0, atol=atol)
    ang = cones.pairwise_cone_angle(apex, pts, c=c)
    assert torch.allclose(
        ang, cones.cone_angle(apex[:, None, :], pts[None, :, :], c=c), rtol=0, atol=atol
    )
    assert (ang[:, -12:].diagonal() == 0).all()


def test_pairwise_leading_dims_and_tensor_curvature():
    c = torch.tensor(0.8, dtype=torch.float64)
    a = _unit(6, 3, 11).reshape(2, 3, 3) * 0.6
    b = _unit(4, 3, 12) * 0.7
    out = cones.pairwise_cone_energy(a, b[None], c=c)
    assert out.shape == (2, 3, 4)
    assert torch.allclose(
        out, cones.cone_energy(a[..., :, None, :], b[None, None], c=0.8), atol=1e-13
    )


def test_cone_energy_gradient_flows_to_both_points():
    x = (_unit(3, 4, 13) * 0.5).requires_grad_()
    y = (-_unit(3, 4, 14) * 0.5).requires_grad_()
    cones.cone_energy(x, y, c=1.0).sum().backward()
    assert torch.isfinite(x.grad).all() and torch.isfinite(y.grad).all()
    assert x.grad.abs().sum() > 0 and y.grad.abs().sum() > 0


# ------------------------------------------------------------------ cone families

CAP = {"family": "cap", "theta0": 2.5, "beta": 0.5}


def _at_radius(u, rho, c):
    return u * (math.tanh(rho / 2) / math.sqrt(c))


@pytest.mark.parametrize("c", CURVATURES)
def test_cap_margin_against_mpmath_and_numpy_twin_up_to_the_boundary(c):
    import mpmath
    import numpy as np

    mpmath.mp.dps = 60
    u = _unit(12, 5, 3)
    rho = torch.tensor([0.0, 0.5, 3.0, 10.0, 20.0, 30.0, 34.0, 1.0, 7.0, 15.0, 25.0, 2.0])
    x = u * (torch.tanh(rho.double() / 2) / math.sqrt(c))[:, None]
    x[0] = 0.0
    y = torch.roll(x, 1, 0) * 0.999 + 1e-9 * u
    got = cones.membership_margin(x, y, CAP, c=c)
    twin = cones.membership_margin_np(x.numpy(), y.numpy(), CAP, c=c)
    assert torch.isfinite(got).all() and np.isfinite(twin).all()
    for i in range(len(x)):
        xs = [mpmath.mpf(float(v)) for v in x[i]]
        ys = [mpmath.mpf(float(v)) for v in y[i]]

        def theta(p):
            t = mpmath.sqrt(c) * mpmath.sqrt(sum(v * v for v in p))
            return min(mpmath.pi, 2.5 * mpmath.sqrt((1 - t) / (1 + t)))

        nx, ny = mpmath.sqrt(sum(v * v for v in xs)), mpmath.sqrt(sum(v * v for v in ys))
        if nx == 0 or ny == 0:
            ang = 0
        else:
            d = mpmath.sqrt(sum((a / nx - b / ny) ** 2 for a, b in zip(xs, ys, strict=True)))
            ang = 2 * mpmath.asin(d / 2)
        want = float(theta(xs) - ang - theta(ys))
        assert abs(float(got[i]) - want) <= 1e-12 * max(1.0, abs(want))
        assert abs(float(twin[i]) - want) <= 1e-12 * max(1.0, abs(want))


def test_cap_nesting_is_exact_for_tiny_caps():
    # a chain of caps at radius 30, each inside the last by a tiny margin
    u = _unit(1, 4, 0)[0]
    v = _unit(1, 4, 1)[0]
    v = v - (v @ u) * u
    v = v / v.norm()
    x = _at_radius(u, 30.0, 1.0)
    th = float(cones.cap_aperture(x, c=1.0, **{"theta0": 2.5, "beta": 0.5}))
    for rho, frac, inside in [(31.0, 0.3, True), (31.0, 0.5, False)]:
        ang = frac * th
        w = math.cos(ang) * u + math.sin(ang) * v
        y = _at_radius(w, rho, 1.0)
        # y's cap is e^(-1/2) = 0.607 of x's: inside iff 0.607 + frac <= 1
        assert bool(cones.contains(x, y, CAP, c=1.0)) is inside


def test_pairwise_membership_matches_broadcast_for_both_families():
    x = _unit(7, 4, 5) * 0.9
    y = _unit(9, 4, 6) * torch.linspace(0.0, 0.99, 9, dtype=torch.float64)[:, None]
    for spec in (CAP, {"family": "ganea", "K": 0.1}):
        pw = cones.pairwise_membership_margin(x, y, spec, c=1.0, block=40)
        bc = cones.membership_margin(x[:, None, :], y[None, :, :], spec, c=1.0)
        torch.testing.assert_close(pw, bc, rtol=0, atol=1e-12)
        twin = cones.membership_margin_np(x[:, None, :].numpy(), y[None, :, :].numpy(), spec, c=1.0)
        torch.testing.assert_close(torch.from_numpy(twin), bc, rtol=0, atol=1e-12)


@pytest.mark.parametrize("c", CURVATURES)
def test_margins_to_prepared_targets_are_the_margins_bit_for_bit(c):
    """margin_targets_np + margin_to_targets_np (the targets' parts computed once, for
    many apexes) give exactly membership_margin_np's values, both families, with points
    at the origin, near the boundary and equal to the apex among the targets."""
    r = 1 / math.sqrt(c)
    y = _unit(60, 5, 7) * torch.linspace(0.0, 0.999999, 60, dtype=torch.float64)[:, None] * r
    x = _unit(12, 5, 8) * torch.linspace(0.0, 0.99, 12, dtype=torch.float64)[:, None] * r
    y[3] = x[4]
    for spec in (CAP, {"family": "ganea", "K": 0.1}):
        targets = cones.margin_targets_np(y.numpy(), spec, c=c)
        held = 0
        for apex in x.numpy():
            want = cones.membership_margin_np(apex, y.numpy(), spec, c=c)
            got = cones.margin_to_targets_np(apex, targets, spec, c=c)
            assert got.tobytes() == want.tobytes()
            held += int((got >= 0).sum())
        assert 0 < held < x.shape[0] * y.shape[0]  # inside and outside were both tested
        # the apexes' parts computed once and indexed, pairs as deepest_holder makes them
        apex = cones.apex_parts_np(x.numpy(), spec, c=c)
        rows = np.arange(x.shape[0]).repeat(y.shape[0])
        pts = np.tile(np.arange(y.shape[0]), x.shape[0])
        got = cones.margin_of_parts_np(
            tuple(a[rows] for a in apex), tuple(t[pts] for t in targets), spec, c=c
        )
        want = cones.membership_margin_np(x.numpy()[rows], y.numpy()[pts], spec, c=c)
        assert got.tobytes() == want.tobytes()


def test_cone_spec_format_and_parse():
    assert cones.format_cone(CAP) == "cone=cap theta0=2.5 beta=0.5"
    assert cones.parse_cone("# curvature=1.0 dim=10 cone=cap theta0=2.5 beta=0.5") == CAP
    assert cones.parse_cone(["cone=ganea"]) == {"family": "ganea", "K": 0.1}
    for bad in ({"family": "cone"}, {"family": "cap", "theta0": 4.0}, {"family": "ganea", "x": 1}):
        with pytest.raises(ValueError):
            cones.cone_spec(**bad)
    with pytest.raises(ValueError):
        cones.parse_cone("# curvature=1.0 dim=10")


def test_cap_margin_gradient_is_finite_at_the_origin_and_equal_points():
    x = torch.zeros(2, 3, dtype=torch.float64, requires_grad=True)
    y = torch.tensor([[0.3, 0.1, 0.0], [0.0, 0.0, 0.0]], dtype=torch.float64, requires_grad=True)
    cones.membership_margin(x, y, CAP, c=1.0).sum().backward()
    assert torch.isfinite(x.grad).all() and torch.isfinite(y.grad).all()
    z = torch.tensor([[0.5, 0.2, 0.1]], dtype=torch.float64, requires_grad=True)
    m = cones.membership_margin(z, z, CAP, c=1.0)
    m.sum().backward()
    assert float(m.detach()) == 0.0 and torch.isfinite(z.grad).all()
