"""models.geometry against an independent 50-digit mpmath evaluation on random points.

Points are drawn (seeded) at relative gaps 1 - sqrt(c)|x| of 0.5 and 1e-2, and
with norms within 1e-5 and, in float64, 1e-10 of 1/sqrt(c) (hyperbolic radius
up to about 24/sqrt(c)), for c in {0.1, 1, 2.5}; mpmath evaluates the
textbook formulas (arcosh, artanh, arccos, Möbius addition as written) on the
exact values of the given float inputs. Tolerances, relative: float64 1e-12 at every gap (the gap
1 - c|x|^2 is formed without cancellation, so nothing degrades towards the
boundary: measured worst 2e-14); float32 2e-5 (inputs rounded to float32
first and fed to mpmath as such).
"""

from __future__ import annotations

import math
import zlib

import pytest
import torch

from models.geometry import cones, poincare

pytestmark = pytest.mark.usefixtures("torch_single_thread")


mpmath = pytest.importorskip("mpmath")
mp = mpmath.MPContext()  # a private 50-digit context: the global mpmath.mp is left alone
mp.dps = 50
mpf = mp.mpf

CURVATURES = [0.1, 1.0, 2.5]
# ("rel", g): 1 - sqrt(c)|x| = g;  ("abs", e): |x| = 1/sqrt(c) - e
GAPS = {
    torch.float64: [("rel", 0.5), ("rel", 1e-2), ("abs", 1e-5), ("abs", 1e-10)],
    torch.float32: [("rel", 0.5), ("rel", 1e-2), ("abs", 1e-5)],
}
RTOL = {torch.float64: 1e-12, torch.float32: 2e-5}


# -- mpmath reference formulas (plain textbook forms) -------------------------


def _v(t):
    return [mpf(float(a)) for a in t.reshape(-1).tolist()]


def _dot(a, b):
    return mp.fsum(p * q for p, q in zip(a, b, strict=True))


def _scale(s, a):
    return [s * t for t in a]


def _add(a, b):
    return [p + q for p, q in zip(a, b, strict=True)]


def m_madd(x, y, c):
    xy, x2, y2 = _dot(x, y), _dot(x, x), _dot(y, y)
    num = _add(_scale(1 + 2 * c * xy + c * y2, x), _scale(1 - c * x2, y))
    return _scale(1 / (1 + 2 * c * xy + c * c * x2 * y2), num)


def m_dist(x, y, c):
    d = [p - q for p, q in zip(x, y, strict=True)]
    z = 2 * c * _dot(d, d) / ((1 - c * _dot(x, x)) * (1 - c * _dot(y, y)))
    return mp.acosh(1 + z) / mp.sqrt(c)


def m_expmap0(v, c):
    n = mp.sqrt(_dot(v, v))
    sc = mp.sqrt(c)
    return _scale(mp.tanh(sc * n) / (sc * n), v)


def m_logmap0(y, c):
    n = mp.sqrt(_dot(y, y))
    sc = mp.sqrt(c)
    return _scale(mp.atanh(sc * n) / (sc * n), y)


def m_expmap(x, v, c):
    lam = 2 / (1 - c * _dot(x, x))
    n = mp.sqrt(_dot(v, v))
    sc = mp.sqrt(c)
    return m_madd(x, _scale(mp.tanh(sc * lam * n / 2) / (sc * n), v), c)


def m_logmap(x, y, c):
    w = m_madd(_scale(-1, x), y, c)
    n = mp.sqrt(_dot(w, w))
    lam = 2 / (1 - c * _dot(x, x))
    sc = mp.sqrt(c)
    return _scale(2 / (sc * lam) * mp.atanh(sc * n) / n, w)


def m_matvec(M, x, c):
    mx = [_dot(row, x) for row in M]
    nx, nmx = mp.sqrt(_dot(x, x)), mp.sqrt(_dot(mx, mx))
    sc = mp.sqrt(c)
    return _scale(mp.tanh(nmx / nx * mp.atanh(sc * nx)) / (sc * nmx), mx)


def m_lorentz(x, c):
    x2 = _dot(x, x)
    return [(1 + c * x2) / (mp.sqrt(c) * (1 - c * x2))] + _scale(2 / (1 - c * x2), x)


def m_midpoint(points, w, c):
    ks = [_scale(2 / (1 + c * _dot(p, p)), p) for p in points]
    gs = [1 / mp.sqrt(1 - c * _dot(k, k)) for k in ks]
    den = mp.fsum(wi * g for wi, g in zip(w, gs, strict=True))
    m = [
        mp.fsum(wi * g * k[j] for wi, g, k in zip(w, gs, ks, strict=True)) / den
        for j in range(len(ks[0]))
    ]
    return _scale(1 / (1 + mp.sqrt(1 - c * _dot(m, m))), m)


def m_xi(x, y, c):
    sc = mp.sqrt(c)
    x, y = _scale(sc, x), _scale(sc, y)
    xy, x2, y2 = _dot(x, y), _dot(x, x), _dot(y, y)
    d = [p - q for p, q in zip(x, y, strict=True)]
    num = xy * (1 + x2) - x2 * (1 + y2)
    den = mp.sqrt(x2) * mp.sqrt(_dot(d, d)) * mp.sqrt(1 + x2 * y2 - 2 * xy)
    return mp.acos(num / den)


def m_psi(x, c, K):
    n = mp.sqrt(c * _dot(x, x))
    return mp.asin(K * (1 - n * n) / n)


# -- helpers ------------------------------------------------------------------


def _points(n, d, c, gap, dtype, gen):
    u = torch.randn(n, d, generator=gen, dtype=torch.float64)
    u = u / u.norm(dim=-1, keepdim=True)
    return (u * (1 - gap) / math.sqrt(c)).to(dtype)


def _rel(got, want):
    got = [mpf(float(a)) for a in torch.as_tensor(got).reshape(-1).tolist()]
    want = want if isinstance(want, list) else [want]
    num = mp.sqrt(mp.fsum((a - b) ** 2 for a, b in zip(got, want, strict=True)))
    den = mp.sqrt(mp.fsum(b * b for b in want))
    return float(num / den)


def _cases():
    for dtype in (torch.float64, torch.float32):
        for c in CURVATURES:
            for kind, g in GAPS[dtype]:
                gap = (
                    g if kind == "rel" else g * math.sqrt(c)
                )  # relative gap of |x| = 1/sqrt(c) - g
                yield pytest.param(dtype, c, gap, id=f"{str(dtype)[6:]}-c{c}-{kind}{g:.0e}")


@pytest.mark.parametrize(("dtype", "c", "gap"), list(_cases()))
def test_against_mpmath(dtype, c, gap):
    gen = torch.Generator().manual_seed(zlib.crc32(f"{dtype}-{c}-{gap}".encode()))
    d = 5
    cm = mpf(c)
    rtol = RTOL[dtype]
    x = _points(3, d, c, gap, dtype, gen)
    y = torch.cat([_points(2, d, c, gap, dtype, gen), _points(1, d, c, 0.3, dtype, gen)])
    v = torch.randn(3, d, generator=gen, dtype=torch.float64).to(dtype) * 0.8
    M = torch.randn(4, d, generator=gen, dtype=torch.float64).to(dtype)

    d_xy = poincare.dist(x, y, c=c)
    pw = poincare.pairwise_dist(x, y, c=c)
    for i in range(3):
        xi, yi = _v(x[i]), _v(y[i])
        want = m_dist(xi, yi, cm)
        assert _rel(d_xy[i], want) < rtol
        assert _rel(pw[i, i], want) < rtol
        assert _rel(poincare.dist_from_arg(poincare.dist_arg(x[i], y[i], c=c), c=c), want) < rtol
        assert _rel(poincare.mobius_add(x[i], y[i], c=c), m_madd(xi, yi, cm)) < rtol
        assert _rel(poincare.logmap0(x[i], c=c), m_logmap0(xi, cm)) < rtol
        assert _rel(poincare.logmap(x[i], y[i], c=c), m_logmap(xi, yi, cm)) < rtol
        assert _rel(poincare.expmap(x[i], v[i], c=c), m_expmap(xi, _v(v[i]), cm)) < rtol
        assert _rel(poincare.expmap0(v[i], c=c), m_expmap0(_v(v[i]), cm)) < rtol
        assert (
            _rel(poincare.mobius_matvec(M, x[i], c=c), m_matvec([_v(r) for r in M], xi, cm)) < rtol
        )
        assert _rel(poincare.to_lorentz(x[i], c=c), m_lorentz(xi, cm)) < rtol
        assert _rel(poincare.distance_to_origin(x[i], c=c), m_dist(xi, [mpf(0)] * d, cm)) < rtol
        assert _rel(cones.cone_angle(x[i], y[i], c=c), m_xi(xi, yi, cm)) < rtol
        assert _rel(cones.half_aperture(x[i], c=c, K=0.1), m_psi(xi, cm, mpf("0.1"))) < rtol
    w = torch.tensor([0.5, 1.0, 2.0], dtype=dtype)
    mid = poincare.einstein_midpoint(torch.cat([x[:2], y[2:]]), w, c=c)
    want = m_midpoint([_v(p) for p in torch.cat([x[:2], y[2:]])], [mpf(float(t)) for t in w], cm)
    assert _rel(mid, want) < rtol


@pytest.mark.parametrize("c", CURVATURES)
def test_far_distances_float64(c):
    """Hyperbolic radius 15-35 (gaps 1e-7 .. 1e-15): distances between such points."""
    gen = torch.Generator().manual_seed(7)
    xs = torch.cat([_points(1, 4, c, g, torch.float64, gen) for g in (1e-7, 1e-10, 1e-12, 1e-14)])
    ys = torch.cat([_points(1, 4, c, g, torch.float64, gen) for g in (1e-13, 1e-9, 1e-12, 1e-8)])
    got = poincare.dist(xs, ys, c=c)
    for i in range(4):
        want = m_dist(_v(xs[i]), _v(ys[i]), mpf(c))
        assert _rel(got[i], want) < 1e-12
        assert float(want) * math.sqrt(c) > 25
    # and a point next to its neighbour at the boundary (tiny distance, huge radius)
    x = xs[2]
    y = x * (1 - 1e-15) + 1e-14 * torch.tensor(
        [0.0, 1.0, 0.0, 0.0], dtype=torch.float64
    ) / math.sqrt(c)
    want = m_dist(_v(x), _v(y), mpf(c))
    assert _rel(poincare.dist(x, y, c=c), want) < 1e-12
    assert _rel(poincare.pairwise_dist(x[None], y[None], c=c)[0, 0], want) < 1e-10


@pytest.mark.parametrize("c", CURVATURES)
def test_mobius_difference_of_neighbours_at_the_boundary(c):
    """(-x) (+) y for neighbours 1e-10 from the boundary (distance ~1): the textbook
    form (geoopt's) cancels to nothing there; the form used keeps full precision."""
    from geoopt.manifolds.stereographic import math as gmath

    gen = torch.Generator().manual_seed(11)
    k = torch.tensor(-c, dtype=torch.float64)
    worst_ours = worst_geoopt = 0.0
    for _ in range(5):
        x = _points(1, 5, c, 1e-10, torch.float64, gen)[0]
        y = poincare.expmap(x, 1e-10 * torch.randn(5, generator=gen, dtype=torch.float64), c=c)
        want = m_madd(_v(-x), _v(y), mpf(c))
        worst_ours = max(worst_ours, _rel(poincare.mobius_add(-x, y, c=c), want))
        worst_geoopt = max(worst_geoopt, _rel(gmath.mobius_add(-x, y, k=k), want))
        assert _rel(poincare.logmap(x, y, c=c), m_logmap(_v(x), _v(y), mpf(c))) < 1e-12
    assert worst_ours < 1e-13
    assert worst_geoopt > 1e-3
