"""Identities of the Poincaré ball and the κ-stereographic model, broadcasting, and gradients."""

from __future__ import annotations

import math

import pytest
import torch

from models.geometry import cones, numerics, poincare, stereographic

pytestmark = pytest.mark.usefixtures("torch_single_thread")


DTYPES = [torch.float32, torch.float64]
CURVATURES = [0.1, 1.0, 2.5]
# smallest boundary gap used per dtype (1 - sqrt(c)|x|), and a coordinate tolerance
GAP = {torch.float64: 1e-10, torch.float32: 1e-5}
ATOL = {torch.float64: 1e-12, torch.float32: 2e-5}


def _points(n, d, c, gaps, dtype, seed):
    """n points per gap in ``gaps``, random directions, plus a few random interior points."""
    gen = torch.Generator().manual_seed(seed)
    u = torch.randn(len(gaps) * n, d, generator=gen, dtype=torch.float64)
    u = u / u.norm(dim=-1, keepdim=True)
    radii = torch.tensor([1 - g for g in gaps for _ in range(n)], dtype=torch.float64)[:, None]
    inner = torch.rand(n, 1, generator=gen, dtype=torch.float64) * torch.randn(
        n, d, generator=gen, dtype=torch.float64
    )
    inner = inner / (1 + inner.norm(dim=-1, keepdim=True))
    return (torch.cat([u * radii, inner]) / math.sqrt(c)).to(dtype)


def _grid(dtype, c, seed=0, n=4, d=5):
    return _points(n, d, c, [0.5, 1e-2, GAP[dtype]], dtype, seed)


params = pytest.mark.parametrize(
    ("dtype", "c"),
    [(dt, c) for dt in DTYPES for c in CURVATURES],
    ids=lambda p: str(p).replace("torch.", ""),
)


# -- metric identities ---------------------------------------------------------


@params
def test_dist_symmetric_zero_diagonal_positive(dtype, c):
    x = _grid(dtype, c, 1)
    y = _grid(dtype, c, 2)
    dxy, dyx = poincare.dist(x, y, c=c), poincare.dist(y, x, c=c)
    assert torch.allclose(dxy, dyx, rtol=1e-6 if dtype == torch.float32 else 1e-14, atol=0)
    assert (poincare.dist(x, x, c=c) == 0).all()
    assert (poincare.pairwise_dist(x, x, c=c).diagonal() == 0).all()
    assert (dxy > 0).all()
    assert dxy.dtype == dtype


@params
def test_triangle_inequality(dtype, c):
    x, y, z = (_grid(dtype, c, s) for s in (3, 4, 5))
    dxy = poincare.pairwise_dist(x, y, c=c).double()
    dyz = poincare.pairwise_dist(y, z, c=c).double()
    dxz = poincare.pairwise_dist(x, z, c=c).double()
    # d(x_i, z_k) <= d(x_i, y_j) + d(y_j, z_k) for all i, j, k
    slack = (dxy[:, :, None] + dyz[None, :, :]) - dxz[:, None, :]
    tol = 1e-4 if dtype == torch.float32 else 1e-9
    assert slack.min() >= -tol * dxz.max()


@params
def test_pairwise_agrees_with_dist(dtype, c):
    x, y = _grid(dtype, c, 6), _grid(dtype, c, 7)
    near = x + 1e-7 * torch.randn(
        x.shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64
    ).to(dtype)
    near = poincare.project(near, c=c)
    for a, b in ((x, y), (x, near), (x, x)):
        pw = poincare.pairwise_dist(a, b, c=c)
        br = poincare.dist(a[:, None, :], b[None, :, :], c=c)
        assert pw.shape == (a.shape[0], b.shape[0])
        rtol = 1e-5 if dtype == torch.float32 else 1e-9
        assert torch.allclose(pw, br, rtol=rtol, atol=0)
        za = poincare.pairwise_dist_arg(a, b, c=c)
        assert torch.allclose(poincare.dist_from_arg(za, c=c), br, rtol=rtol, atol=0)


def test_pairwise_dist_batched_leading_dims():
    x = _grid(torch.float64, 1.0, 8)[:14].reshape(2, 7, 5)
    y = _grid(torch.float64, 1.0, 9)[:6]
    pw = poincare.pairwise_dist(x, y[None], c=1.0)
    assert pw.shape == (2, 7, 6)
    assert torch.allclose(
        pw, poincare.dist(x[..., :, None, :], y[None, None], c=1.0), rtol=1e-12, atol=0
    )


def test_dist_arg_is_monotone_proxy():
    c = 2.5
    q = _grid(torch.float64, c, 10)[:1]
    x = _grid(torch.float64, c, 11)
    z = poincare.dist_arg(q, x, c=c)
    d = poincare.dist(q, x, c=c)
    assert torch.equal(torch.argsort(z), torch.argsort(d))
    assert torch.allclose(torch.acosh(1 + z) / math.sqrt(c), d, rtol=1e-9, atol=0)


# -- maps: round trips ----------------------------------------------------------


@params
def test_expmap0_logmap0_round_trip(dtype, c):
    x = _grid(dtype, c, 12)
    assert torch.allclose(
        poincare.expmap0(poincare.logmap0(x, c=c), c=c), x, rtol=0, atol=ATOL[dtype] / math.sqrt(c)
    )
    # tangent -> ball -> tangent: conditioning grows like exp(2 sqrt(c)|v|) u
    gen = torch.Generator().manual_seed(0)
    v = torch.randn(20, 5, generator=gen, dtype=torch.float64)
    v = (
        v
        / v.norm(dim=-1, keepdim=True)
        * torch.linspace(0, 4, 20, dtype=torch.float64)[:, None]
        / math.sqrt(c)
    ).to(dtype)
    back = poincare.logmap0(poincare.expmap0(v, c=c), c=c)
    assert torch.allclose(back, v, rtol=1e-3 if dtype == torch.float32 else 1e-11, atol=1e-6)


@params
def test_expmap_logmap_round_trip(dtype, c):
    x = _grid(dtype, c, 13)
    y = _grid(dtype, c, 14)
    v = poincare.logmap(x, y, c=c)
    # exp_x(v) in coordinates has condition number about exp(sqrt(c) d) g(x): a
    # tangent vector at a point 1e-10 from the boundary cannot, in float64,
    # aim at a point 40 units away to better than ~1e-6 (rounding v alone does
    # that); such pairs are left to the next assertion.
    d = poincare.dist(x, y, c=c).double()
    ok = torch.exp(math.sqrt(c) * d) * poincare.gap(x.double(), c=c) < 1e3
    assert ok.sum() >= 12
    back = poincare.expmap(x, v, c=c)
    assert torch.allclose(back[ok], y[ok], rtol=0, atol=10 * ATOL[dtype] / math.sqrt(c))
    # at the boundary, moderate steps (lambda_x |w| sqrt(c) ~ 2) invert; the
    # rounded coordinates of exp_x(w) fix log_x to about u/g(x) relative
    xb = x[poincare.gap(x, c=c) < 0.1]
    gen = torch.Generator().manual_seed(5)
    w = torch.randn(xb.shape, generator=gen, dtype=torch.float64).to(dtype)
    w = w / poincare.lambda_x(xb, c=c, keepdim=True) / math.sqrt(c)
    back = poincare.logmap(xb, poincare.expmap(xb, w, c=c), c=c)
    rel = (back - w).double().norm(dim=-1) / w.double().norm(dim=-1)
    bound = 1e-12 + 50 * torch.finfo(dtype).eps / poincare.gap(xb.double(), c=c)
    assert (rel <= bound).all()
    # |log_x y| = d(x, y) / lambda_x
    lam = poincare.lambda_x(x, c=c)
    d = poincare.dist(x, y, c=c)
    rtol = 1e-4 if dtype == torch.float32 else 1e-12
    assert torch.allclose(v.double().norm(dim=-1) * lam.double(), d.double(), rtol=rtol, atol=0)


def test_logmap_at_origin_is_logmap0_and_expmap_at_origin_is_expmap0():
    c = 1.0
    y = _grid(torch.float64, c, 15)
    zero = torch.zeros_like(y)
    assert torch.allclose(
        poincare.logmap(zero, y, c=c), poincare.logmap0(y, c=c), rtol=1e-13, atol=0
    )
    v = torch.randn(5, 5, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    assert torch.allclose(
        poincare.expmap(zero[:5], v, c=c), poincare.expmap0(v, c=c), rtol=1e-13, atol=0
    )


def test_expmap0_reaches_far_points_in_float64():
    """geoopt clamps tanh at 15; we reach hyperbolic radius 35 (and project beyond)."""
    for c in CURVATURES:
        v = torch.tensor([[17.0 / math.sqrt(c), 0.0], [100.0, 0.0]], dtype=torch.float64)
        x = poincare.expmap0(v, c=c)
        rho = poincare.distance_to_origin(x, c=c) * math.sqrt(c)
        # at radius 34 the gap is 3e-15: neighbouring float64 points differ by ~0.03 in radius
        assert abs(rho[0].item() - 34.0) < 0.05
        assert (x.norm(dim=-1) <= numerics.max_norm(c, torch.float64) * (1 + 1e-16)).all()


@params
def test_mobius_add_left_cancellation_and_identity(dtype, c):
    x = _grid(dtype, c, 16)
    y = _grid(dtype, c, 17)
    # x (+) . maps the ball onto itself with a stretch of about 1/g(x) near -x:
    # cancellation is checked for x away from the boundary, every y
    xi = x[poincare.gap(x, c=c) > 1e-2]
    yi = y[: xi.shape[0]]
    out = poincare.mobius_add(-xi, poincare.mobius_add(xi, yi, c=c), c=c)
    assert torch.allclose(out, yi, rtol=0, atol=50 * ATOL[dtype] / math.sqrt(c))
    zero = torch.zeros_like(x)
    assert torch.allclose(poincare.mobius_add(x, zero, c=c), x, rtol=0, atol=ATOL[dtype])
    assert torch.allclose(poincare.mobius_add(zero, x, c=c), x, rtol=0, atol=ATOL[dtype])
    # d(x, y) = 2/sqrt(c) artanh(sqrt(c) |(-x) (+) y|) (artanh of a rounded norm: interior only)
    y_in = _points(xi.shape[0], x.shape[-1], c, [0.3], dtype, 18)[: xi.shape[0]]
    w = poincare.mobius_add(-xi, y_in, c=c).double()
    d = 2 / math.sqrt(c) * torch.atanh(math.sqrt(c) * w.norm(dim=-1))
    assert torch.allclose(
        d, poincare.dist(xi, y_in, c=c).double(), rtol=1e-4 if dtype == torch.float32 else 1e-9
    )


@params
def test_lorentz_and_klein_round_trips(dtype, c):
    x = _grid(dtype, c, 19)
    h = poincare.to_lorentz(x, c=c)
    assert h.shape[-1] == x.shape[-1] + 1
    assert torch.allclose(poincare.from_lorentz(h, c=c), x, rtol=0, atol=ATOL[dtype] / math.sqrt(c))
    # on the hyperboloid: -h0^2 + |hs|^2 = -1/c (relative to h0^2)
    hd = h.double()
    mink = -(hd[..., 0] ** 2) + (hd[..., 1:] ** 2).sum(-1)  # cancels: compare relative to h0^2
    assert (((mink * c + 1) / (c * hd[..., 0] ** 2)).abs() < 10 * torch.finfo(dtype).eps).all()
    inner = x[poincare.gap(x, c=c) > 1e-3]  # Klein coordinates square the gap
    assert inner.shape[0] >= 4
    k = poincare.to_klein(inner, c=c)
    assert (c * (k.double() ** 2).sum(-1) < 1).all()
    assert torch.allclose(
        poincare.from_klein(k, c=c), inner, rtol=0, atol=ATOL[dtype] / math.sqrt(c)
    )


@params
def test_einstein_midpoint(dtype, c):
    x = _grid(dtype, c, 20)
    # identical points, also at the boundary: the midpoint is the point
    same = x[:, None, :].expand(-1, 4, -1)
    mid = poincare.einstein_midpoint(same, torch.rand(x.shape[0], 4, dtype=dtype) + 0.1, c=c)
    assert mid.shape == x.shape
    assert torch.allclose(mid, x, rtol=0, atol=4 * ATOL[dtype] / math.sqrt(c))
    # two points, equal weights: the geodesic midpoint
    y = _grid(dtype, c, 21)
    pair = torch.stack([x, y], dim=-2)
    m = poincare.einstein_midpoint(pair, c=c).double()
    dxm, dym = poincare.dist(x.double(), m, c=c), poincare.dist(y.double(), m, c=c)
    dxy = poincare.dist(x.double(), y.double(), c=c)
    keep = poincare.gap(m, c=c) > 1e-3  # far from both ends: well-conditioned in coordinates
    rtol = 1e-3 if dtype == torch.float32 else 1e-8
    assert keep.sum() >= 4
    assert torch.allclose(dxm[keep], dxy[keep] / 2, rtol=rtol)
    assert torch.allclose(dym[keep], dxy[keep] / 2, rtol=rtol)
    # a single point with all the weight
    w = torch.zeros(x.shape[0], 2, dtype=dtype)
    w[:, 1] = 1
    assert torch.allclose(
        poincare.einstein_midpoint(pair, w, c=c), y, rtol=0, atol=4 * ATOL[dtype] / math.sqrt(c)
    )


@params
def test_mobius_matvec_identity_and_zero(dtype, c):
    x = _grid(dtype, c, 22)
    eye = torch.eye(x.shape[-1], dtype=dtype)
    assert torch.allclose(
        poincare.mobius_matvec(eye, x, c=c), x, rtol=0, atol=4 * ATOL[dtype] / math.sqrt(c)
    )
    assert (poincare.mobius_matvec(torch.zeros(3, x.shape[-1], dtype=dtype), x, c=c) == 0).all()
    # M (x) x = expmap0(M logmap0(x))
    M = (
        torch.randn(
            3, x.shape[-1], generator=torch.Generator().manual_seed(0), dtype=torch.float64
        ).to(dtype)
        * 0.3
    )
    want = poincare.expmap0(poincare.logmap0(x, c=c) @ M.T, c=c)
    assert torch.allclose(
        poincare.mobius_matvec(M, x, c=c), want, rtol=0, atol=10 * ATOL[dtype] / math.sqrt(c)
    )


# -- projections, radii, clipping ------------------------------------------------


@params
def test_project_and_max_norm(dtype, c):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(50, 3, generator=gen, dtype=torch.float64).to(dtype) * 5
    p = poincare.project(x, c=c)
    r_max = numerics.max_norm(c, dtype)
    norms = p.double().norm(dim=-1)
    assert (norms <= r_max * (1 + 4 * torch.finfo(dtype).eps)).all()
    assert (numerics.one_minus_c_sqnorm(p.double(), c) > 0).all()
    inside = _grid(dtype, c, 23)
    assert torch.equal(poincare.project(inside, c=c), inside)
    assert poincare.max_norm(c, dtype) == r_max


def test_radius_norm_conversions():
    for c in CURVATURES:
        rho = torch.tensor([0.0, 0.1, 3.0, 15.0, 30.0], dtype=torch.float64) / math.sqrt(c)
        r = poincare.radius_to_norm(rho, c=c)
        back = poincare.norm_to_radius(r, c=c)
        assert torch.allclose(back[:4], rho[:4], rtol=1e-10, atol=1e-15)
        assert (
            abs(back[4].item() - rho[4].item()) < 1e-2 * rho[4].item()
        )  # r rounds at 1e-13 of 1/sqrt(c)
        x = r[:, None] * torch.tensor([[0.6, 0.8]], dtype=torch.float64)
        d0 = poincare.distance_to_origin(x, c=c)
        assert torch.allclose(d0[:4], back[:4], rtol=1e-9, atol=0)
        assert torch.allclose(d0[4:], back[4:], rtol=1e-4, atol=0)  # rounding x at gap 1e-13
    assert math.isclose(
        poincare.norm_to_radius(0.5, c=1.0).item(), 2 * math.atanh(0.5), rel_tol=1e-15
    )
    assert math.isclose(poincare.radius_to_norm(1.0, c=1.0).item(), math.tanh(0.5), rel_tol=1e-15)


def test_lambda_x():
    x = _grid(torch.float64, 1.0, 24)
    assert torch.allclose(poincare.lambda_x(x, c=1.0), 2 / (1 - (x * x).sum(-1)), rtol=1e-4)
    assert poincare.lambda_x(x, c=1.0, keepdim=True).shape == (x.shape[0], 1)
    assert poincare.lambda_x(torch.zeros(3), c=2.0).eq(2).all()


def test_clip_features():
    x = torch.tensor([[3.0, 4.0], [0.3, 0.4], [0.0, 0.0]])
    out = poincare.clip_features(x, 2.3)
    assert torch.allclose(out[0].norm(), torch.tensor(2.3))
    assert torch.equal(out[1:], x[1:])
    x = x.requires_grad_()
    poincare.clip_features(x, 1.0).sum().backward()
    assert torch.isfinite(x.grad).all()
    with pytest.raises(ValueError):
        poincare.clip_features(x, 0.0)


# -- curvature handling ------------------------------------------------------------


def test_tensor_curvature_and_its_gradient():
    x = _grid(torch.float64, 0.5, 25)
    y = _grid(torch.float64, 0.5, 26)
    c = torch.tensor(0.5, dtype=torch.float64, requires_grad=True)
    d = poincare.dist(x, y, c=c)
    assert torch.allclose(d, poincare.dist(x, y, c=0.5), rtol=1e-14, atol=0)
    d.sum().backward()
    assert torch.isfinite(c.grad) and c.grad != 0


def test_bad_curvature_rejected():
    x = torch.zeros(2, 3)
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError):
            poincare.dist(x, x, c=bad)


def test_broadcasting_over_leading_dims():
    c = 1.0
    x = _grid(torch.float64, c, 27)[:3]
    y = _grid(torch.float64, c, 28)[:4]
    d = poincare.dist(x[:, None, :], y[None, :, :], c=c)
    assert d.shape == (3, 4)
    assert poincare.dist(x[:, None, :], y[None, :, :], c=c, keepdim=True).shape == (3, 4, 1)
    assert poincare.mobius_add(x[:, None, :], y[None, :, :], c=c).shape == (3, 4, 5)
    assert poincare.logmap(x[:, None, :], y[None, :, :], c=c).shape == (3, 4, 5)
    assert torch.allclose(d[1, 2], poincare.dist(x[1], y[2], c=c))


# -- κ-stereographic --------------------------------------------------------------------


def test_stereographic_negative_k_is_poincare():
    x, y = _grid(torch.float64, 2.0, 29), _grid(torch.float64, 2.0, 30)
    assert torch.equal(stereographic.dist(x, y, k=-2.0), poincare.dist(x, y, c=2.0))
    assert torch.equal(stereographic.expmap0(x, k=-2.0), poincare.expmap0(x, c=2.0))
    assert torch.equal(stereographic.logmap0(x, k=-2.0), poincare.logmap0(x, c=2.0))
    assert torch.equal(stereographic.mobius_add(x, y, k=-2.0), poincare.mobius_add(x, y, c=2.0))
    assert torch.equal(stereographic.project(x * 3, k=-2.0), poincare.project(x * 3, c=2.0))
    assert torch.equal(
        stereographic.pairwise_dist(x, y, k=-2.0), poincare.pairwise_dist(x, y, c=2.0)
    )


@pytest.mark.parametrize("dtype", DTYPES)
def test_stereographic_continuous_through_zero(dtype):
    gen = torch.Generator().manual_seed(31)
    x = torch.randn(10, 4, generator=gen, dtype=torch.float64).to(dtype)
    y = torch.randn(10, 4, generator=gen, dtype=torch.float64).to(dtype)
    flat = 2 * (x - y).double().norm(dim=-1)  # κ = 0: 4x the Euclidean metric
    tol = 1e-4 if dtype == torch.float32 else 1e-5
    for k in (-1e-6, 0.0, 1e-6):
        assert torch.allclose(stereographic.dist(x, y, k=k).double(), flat, rtol=tol)
        assert torch.allclose(stereographic.expmap0(x, k=k), x, rtol=tol)
        assert torch.allclose(stereographic.logmap0(x, k=k), x, rtol=tol)
        assert torch.allclose(stereographic.mobius_add(x, y, k=k), x + y, rtol=tol, atol=tol)
        assert torch.allclose(
            stereographic.pairwise_dist(x, y, k=k).diagonal().double(), flat, rtol=tol
        )
    # and the first-order term is continuous too: d(k) - d(0) changes sign with k
    d_neg = stereographic.dist(x, y, k=-1e-3).double()
    d_pos = stereographic.dist(x, y, k=1e-3).double()
    assert ((d_neg - flat) * (d_pos - flat) <= 0).all()


def test_stereographic_sphere_matches_geoopt_and_great_circles():
    from geoopt.manifolds.stereographic import math as gmath

    gen = torch.Generator().manual_seed(32)
    x = torch.randn(20, 3, generator=gen, dtype=torch.float64)
    y = torch.randn(20, 3, generator=gen, dtype=torch.float64)
    for k in (0.5, 1.0, 3.0):
        ours = stereographic.dist(x, y, k=k)
        theirs = gmath.dist(x, y, k=torch.tensor(k, dtype=torch.float64))
        assert torch.allclose(ours, theirs, rtol=1e-12, atol=1e-13)
        assert (ours <= math.pi / math.sqrt(k) + 1e-12).all()

        # great-circle distance of the points lifted to the sphere of radius 1/sqrt(k)
        def lift(p, k=k):
            p2 = (p * p).sum(-1, keepdim=True)
            return torch.cat(
                [(1 - k * p2) / (1 + k * p2), 2 * math.sqrt(k) * p / (1 + k * p2)], -1
            ) / math.sqrt(k)

        cosang = (lift(x) * lift(y)).sum(-1) * k
        assert torch.allclose(
            ours, torch.acos(cosang.clamp(-1, 1)) / math.sqrt(k), rtol=1e-7, atol=1e-7
        )
        assert torch.allclose(
            stereographic.pairwise_dist(x, y, k=k).diagonal(), ours, rtol=1e-10, atol=1e-12
        )
    assert torch.equal(stereographic.project(x * 100, k=1.0), x * 100)


def test_stereographic_tensor_k_gradient_through_zero():
    x = torch.randn(5, 3, generator=torch.Generator().manual_seed(33), dtype=torch.float64)
    y = x.flip(0)
    for k0 in (-0.5, 0.0, 0.5):
        k = torch.tensor(k0, dtype=torch.float64, requires_grad=True)
        stereographic.dist(x, y, k=k).sum().backward()
        assert torch.isfinite(k.grad)


# -- gradients --------------------------------------------------------------------------


def _finite_grad(f, *inputs):
    inputs = [t.detach().clone().requires_grad_() for t in inputs]
    out = f(*inputs)
    grads = torch.autograd.grad(out.sum(), inputs, allow_unused=True)
    return all(g is None or torch.isfinite(g).all() for g in grads), grads


GRAD_FUNCS = {
    "dist": lambda x, y, c: poincare.dist(x, y, c=c),
    "pairwise_dist": lambda x, y, c: poincare.pairwise_dist(x, y, c=c),
    "dist_arg": lambda x, y, c: poincare.dist_from_arg(poincare.dist_arg(x, y, c=c), c=c),
    "expmap0": lambda x, y, c: poincare.expmap0(x, c=c),
    "logmap0": lambda x, y, c: poincare.logmap0(x, c=c),
    "expmap": lambda x, y, c: poincare.expmap(x, y, c=c),
    "logmap": lambda x, y, c: poincare.logmap(x, y, c=c),
    "mobius_add": lambda x, y, c: poincare.mobius_add(x, y, c=c),
    "mobius_matvec": lambda x, y, c: poincare.mobius_matvec(
        torch.ones(2, x.shape[-1], dtype=x.dtype), x, c=c
    ),
    "distance_to_origin": lambda x, y, c: poincare.distance_to_origin(x, c=c),
    "cone_energy": lambda x, y, c: cones.cone_energy(x, y, c=c),
    "pairwise_cone_energy": lambda x, y, c: cones.pairwise_cone_energy(x, y, c=c),
    "midpoint": lambda x, y, c: poincare.einstein_midpoint(torch.stack([x, y], -2), c=c),
    "sphere_dist": lambda x, y, c: stereographic.dist(x, y, k=c),
}


@pytest.mark.parametrize("name", list(GRAD_FUNCS))
@params
def test_gradients_finite(name, dtype, c):
    f = GRAD_FUNCS[name]
    d = 4
    zero = torch.zeros(3, d, dtype=dtype)
    far = _points(1, d, c, [GAP[dtype]] * 3, dtype, 40)[:3]
    mid = _points(1, d, c, [0.3] * 3, dtype, 41)[:3]
    cases = {
        "at 0": (zero, zero),
        "0 vs point": (zero, mid),
        "x = y": (mid, mid),
        "x = y at the boundary": (far, far),
        "near the boundary": (far, far.flip(0)),
        "boundary vs interior": (far, mid),
    }
    for label, (x, y) in cases.items():
        ok, grads = _finite_grad(lambda a, b: f(a, b, c), x, y)
        assert ok, f"{name}: non-finite gradient {label}: {grads}"


@pytest.mark.parametrize(
    "name",
    [
        "dist",
        "pairwise_dist",
        "expmap0",
        "logmap0",
        "expmap",
        "logmap",
        "mobius_add",
        "mobius_matvec",
        "midpoint",
        "cone_energy",
    ],
)
def test_gradients_correct_in_the_interior(name):
    """torch.autograd.gradcheck (float64, finite differences) on interior points."""
    f = GRAD_FUNCS[name]
    c = 0.7
    x = _points(1, 3, c, [0.4, 0.2], torch.float64, 50)[:2].requires_grad_()
    y = _points(1, 3, c, [0.3, 0.6], torch.float64, 51)[:2].requires_grad_()
    assert torch.autograd.gradcheck(lambda a, b: f(a, b, c), (x, y), eps=1e-6, atol=1e-6, rtol=1e-5)


def test_smooth_at_the_origin_and_diagonal():
    """expmap0/logmap0 have Jacobian I at 0; logmap_x has Jacobian I at y = x... (up to lambda)."""
    c = 1.3
    v = torch.zeros(3, dtype=torch.float64)
    for fn in (poincare.expmap0, poincare.logmap0):
        J = torch.autograd.functional.jacobian(lambda t, fn=fn: fn(t, c=c), v)
        assert torch.allclose(J, torch.eye(3, dtype=torch.float64), atol=1e-15)
    x = torch.tensor([0.2, -0.1, 0.4], dtype=torch.float64)
    J = torch.autograd.functional.jacobian(lambda t: poincare.logmap(x, t, c=c), x.clone())
    assert torch.allclose(J, torch.eye(3, dtype=torch.float64), atol=1e-12)
