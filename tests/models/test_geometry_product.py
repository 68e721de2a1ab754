"""Product spaces: the string grammar, coordinates, the product metric, validity."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from models.geometry import ProductSpace, numerics, poincare, stereographic
from models.geometry.product import Factor

pytestmark = pytest.mark.usefixtures("torch_single_thread")


@pytest.mark.parametrize(
    ("spec", "canonical"),
    [
        ("poincare:8,sphere:4,euclidean:4", "poincare:8,sphere:4,euclidean:4"),
        ("poincare:8@0.5", "poincare:8@0.5"),
        (
            " poincare : 2 @ 2.5 , sphere:3@1e-06,euclidean:1 ",
            "poincare:2@2.5,sphere:3@1e-06,euclidean:1",
        ),
        ("sphere:2@1.0", "sphere:2"),
        ("euclidean:16", "euclidean:16"),
        ("poincare:4@0.1,poincare:4@3", "poincare:4@0.1,poincare:4@3.0"),
    ],
)
def test_parse_and_str_round_trip(spec, canonical):
    space = ProductSpace.parse(spec)
    assert str(space) == canonical
    assert ProductSpace.parse(str(space)) == space
    assert hash(ProductSpace.parse(str(space))) == hash(space)


def test_fields_and_dim():
    space = ProductSpace.parse("poincare:8@0.5,sphere:4,euclidean:3")
    assert space.dim == 15
    assert space.factors == (
        Factor("poincare", 8, 0.5),
        Factor("sphere", 4, 1.0),
        Factor("euclidean", 3, 1.0),
    )
    assert [f.kind for f in space.factors] == ["poincare", "sphere", "euclidean"]
    assert ProductSpace((("poincare", 8, 0.5), ("sphere", 4, 1.0), ("euclidean", 3))) == space
    with pytest.raises(dataclasses.FrozenInstanceError):
        space.factors = ()


@pytest.mark.parametrize(
    ("spec", "names"),
    [
        ("", "empty"),
        ("hyperbolic:8", "'hyperbolic'"),
        ("poincare", "'poincare'"),
        ("poincare:", "''"),
        ("poincare:0", "'0'"),
        ("poincare:-3", "'-3'"),
        ("poincare:2.5", "'2.5'"),
        ("poincare:8@", "''"),
        ("poincare:8@abc", "'abc'"),
        ("poincare:8@-1", "'-1'"),
        ("poincare:8@0", "'0'"),
        ("poincare:8@nan", "'nan'"),
        ("poincare:8@inf", "'inf'"),
        ("euclidean:4@2", "euclidean:4@2"),
        ("poincare:8,,sphere:2", "''"),
        ("poincare:8,", "''"),
        ("Poincare:8", "'Poincare'"),
    ],
)
def test_bad_strings_name_the_bad_part(spec, names):
    with pytest.raises(ValueError) as err:
        ProductSpace.parse(spec)
    assert names in str(err.value)


def test_bad_factor_tuples():
    with pytest.raises(ValueError):
        ProductSpace(())
    with pytest.raises(ValueError):
        ProductSpace((("torus", 2, 1.0),))
    with pytest.raises(ValueError):
        ProductSpace((("poincare", 0, 1.0),))
    with pytest.raises(ValueError):
        ProductSpace((("sphere", 2, -1.0),))
    with pytest.raises(ValueError):
        ProductSpace((("euclidean", 2, 3.0),))


def _sample(space, n, seed, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, space.dim, generator=gen, dtype=torch.float64)
    parts = []
    for f, a in zip(space.factors, space.split(x), strict=True):
        if f.kind == "poincare":  # random radii, some within 1e-8 of the boundary
            r = torch.rand(n, 1, generator=gen, dtype=torch.float64)
            r[: n // 4] = 1 - 1e-8
            a = a / a.norm(dim=-1, keepdim=True) * r / math.sqrt(f.curvature)
        parts.append(a)
    return torch.cat(parts, -1).to(dtype)


SPACE = ProductSpace.parse("poincare:3@0.5,sphere:2@2,euclidean:2,poincare:2")


def test_split_and_project_contains():
    x = _sample(SPACE, 8, 0)
    parts = SPACE.split(x)
    assert [p.shape[-1] for p in parts] == [3, 2, 2, 2]
    assert torch.equal(torch.cat(parts, -1), x)
    with pytest.raises(ValueError):
        SPACE.split(x[:, :5])
    assert SPACE.contains(x).all()
    bad = x.clone()
    bad[0, 0] = 10.0  # outside the first ball
    bad[1, 4] = 1e6  # far out on the sphere chart: valid
    bad[2, 6] = float("nan")
    bad[3, 7] = 0.9999999  # second Poincaré factor (c = 1): on the edge but inside...
    bad[3, 8] = 0.1  # ...pushed outside by the other coordinate
    ok = SPACE.contains(bad)
    assert ok.tolist() == [False, True, False, False] + [True] * 4
    projected = SPACE.project(torch.where(torch.isnan(bad), 0.0, bad))
    assert SPACE.contains(projected).all()
    # project leaves valid points alone and only touches Poincaré factors
    assert torch.equal(SPACE.project(x), x)
    assert projected[1, 4] == 1e6


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_product_distance_is_root_sum_of_squares(dtype):
    x, y = _sample(SPACE, 12, 1, dtype), _sample(SPACE, 12, 2, dtype)
    xs, ys = SPACE.split(x), SPACE.split(y)
    d = [
        poincare.dist(xs[0], ys[0], c=0.5),
        stereographic.dist(xs[1], ys[1], k=2.0),
        (xs[2] - ys[2]).norm(dim=-1),
        poincare.dist(xs[3], ys[3], c=1.0),
    ]
    want = torch.sqrt(sum(t.double() ** 2 for t in d))
    rtol = 1e-5 if dtype == torch.float32 else 1e-13
    assert torch.allclose(SPACE.dist(x, y).double(), want, rtol=rtol)
    assert torch.allclose(SPACE.factor_dists(x, y).double(), torch.stack(d, -1).double(), rtol=rtol)
    assert SPACE.dist(x, y, keepdim=True).shape == (12, 1)
    assert (SPACE.dist(x, x) == 0).all()
    assert torch.allclose(SPACE.dist(x, y), SPACE.dist(y, x), rtol=rtol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_product_pairwise_matches_dist(dtype):
    x, y = _sample(SPACE, 9, 3, dtype), _sample(SPACE, 7, 4, dtype)
    pw = SPACE.pairwise_dist(x, y)
    assert pw.shape == (9, 7) and pw.dtype == dtype
    rtol = 1e-5 if dtype == torch.float32 else 1e-10
    assert torch.allclose(pw, SPACE.dist(x[:, None, :], y[None, :, :]), rtol=rtol)
    assert (SPACE.pairwise_dist(x, x).diagonal() == 0).all()


def test_single_factor_products_match_the_factor():
    x, y = (
        _sample(ProductSpace.parse("poincare:4@2.5"), 6, 5),
        _sample(ProductSpace.parse("poincare:4@2.5"), 6, 6),
    )
    assert torch.equal(ProductSpace.parse("poincare:4@2.5").dist(x, y), poincare.dist(x, y, c=2.5))
    e = ProductSpace.parse("euclidean:4")
    assert torch.allclose(e.dist(x, y), (x - y).norm(dim=-1), rtol=1e-14)
    assert torch.allclose(e.pairwise_dist(x, y), torch.cdist(x, y), rtol=1e-10)
    s = ProductSpace.parse("sphere:4@0.7")
    assert torch.allclose(s.dist(x, y), stereographic.dist(x, y, k=0.7), rtol=1e-14)
    assert (s.dist(x * 1e3, -x * 1e3) <= math.pi / math.sqrt(0.7) + 1e-9).all()


def test_product_triangle_inequality_and_gradients():
    x, y, z = (_sample(SPACE, 6, s) for s in (7, 8, 9))
    dxy, dyz, dxz = SPACE.pairwise_dist(x, y), SPACE.pairwise_dist(y, z), SPACE.pairwise_dist(x, z)
    assert ((dxy[:, :, None] + dyz[None]) - dxz[:, None, :]).min() >= -1e-9
    xg = x.clone().requires_grad_()
    (SPACE.dist(xg, x) + SPACE.dist(xg, y) + SPACE.pairwise_dist(xg, y).sum()).sum().backward()
    assert torch.isfinite(xg.grad).all()


def test_expmap0_logmap0_round_trip():
    x = _sample(SPACE, 10, 10)
    keep = (
        numerics.one_minus_c_sqnorm(SPACE.split(x)[0], 0.5) > 1e-6
    )  # rounded tangent of far points
    back = SPACE.expmap0(SPACE.logmap0(x))
    assert torch.allclose(back[keep], x[keep], atol=1e-12)
    # tangent vectors within the sphere's injectivity radius (|v| sqrt(k) < pi/2)
    v = 0.3 * torch.randn(
        5, SPACE.dim, generator=torch.Generator().manual_seed(11), dtype=torch.float64
    )
    assert torch.allclose(SPACE.logmap0(SPACE.expmap0(v)), v, atol=1e-10)
