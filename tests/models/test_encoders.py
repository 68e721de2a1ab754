"""Encoders, hyperbolic heads, objectives and few-shot prototypes."""

from __future__ import annotations

import pytest
import torch

from models.geometry import poincare
from models.training import losses
from models.vision.encoders import EncoderConfig, build_encoder, load_backbone
from models.vision.heads import EuclideanSpace, HeadConfig, PoincareSpace, build_head

torch.set_num_threads(1)


@pytest.mark.parametrize(
    "cfg, shape",
    [
        (EncoderConfig("conv4", 1, 28, [8, 8, 16, 16]), (3, 1, 28, 28)),
        (EncoderConfig("conv4", 1, 28, [8, 8, 16, 16], 2, True, 0.2), (3, 1, 28, 28)),
        (EncoderConfig("resnet18", 3, 32, [8]), (3, 3, 32, 32)),
        (EncoderConfig("resnet18", 3, 96, [4]), (2, 3, 96, 96)),
    ],
)
def test_encoder_shapes(cfg, shape):
    torch.manual_seed(0)
    enc = build_encoder(cfg)
    f = enc(torch.randn(shape))
    assert f.shape == (shape[0], enc.out_features)
    assert torch.isfinite(f).all()


def test_conv4_layouts():
    """Pool-first blocks compute the original block (max pooling commutes with ReLU and with a
    batch norm of positive scale); the original layout keeps its parameter names, so models
    saved before the option existed load unchanged."""
    torch.manual_seed(0)
    old = build_encoder(EncoderConfig("conv4", 1, 28, [4, 8, 8, 8])).eval()
    new = build_encoder(EncoderConfig("conv4", 1, 28, [4, 8, 8, 8], pool_first=True)).eval()
    assert "blocks.0.1.running_mean" in old.state_dict()  # conv, BN, ReLU, pool
    assert "blocks.0.2.running_mean" in new.state_dict()  # conv, pool, BN, ReLU
    with torch.no_grad():
        for b_old, b_new in zip(old.blocks, new.blocks, strict=True):
            b_new[0].weight.copy_(b_old[0].weight)
            bn_old, bn_new = b_old[1], b_new[2]
            bn_old.weight.uniform_(0.5, 2.0)  # positive scales
            bn_old.bias.normal_()
            bn_old.running_mean.normal_()
            bn_old.running_var.uniform_(0.5, 2.0)
            bn_new.load_state_dict(bn_old.state_dict())
    x = torch.randn(5, 1, 28, 28)
    assert torch.allclose(old(x), new(x), atol=1e-5)
    deep = build_encoder(EncoderConfig("conv4", 1, 28, [4, 8, 8, 8], depth=2))
    assert sum(isinstance(m, torch.nn.Conv2d) for m in deep.modules()) == 8
    with pytest.raises(ValueError, match="at least one convolution"):
        build_encoder(EncoderConfig("conv4", 1, 28, [4, 8, 8, 8], depth=0))


def test_load_backbone(tmp_path):
    from safetensors.torch import save_file

    torch.manual_seed(0)
    cfg = EncoderConfig("conv4", 1, 28, [8, 8, 16, 16])
    src, dst = build_encoder(cfg), build_encoder(cfg)
    save_file(
        {"module." + k: v.contiguous() for k, v in src.state_dict().items()},
        tmp_path / "b.safetensors",
    )
    info = load_backbone(dst, tmp_path / "b.safetensors")
    assert info["loaded"] == len(src.state_dict()) and not info["missing"]
    for k, v in src.state_dict().items():
        assert torch.equal(v, dst.state_dict()[k])
    torch.save({"state_dict": src.state_dict()}, tmp_path / "b.pt")
    assert load_backbone(build_encoder(cfg), tmp_path / "b.pt")["loaded"] == len(src.state_dict())
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="junk.pt: cannot read"):
        load_backbone(dst, tmp_path / "junk.pt")
    other = build_encoder(EncoderConfig("resnet18", 3, 32, [4]))
    with pytest.raises(ValueError, match="no tensor matches"):
        load_backbone(other, tmp_path / "b.safetensors")


@pytest.mark.parametrize("mobius", [False, True])
def test_hyperbolic_head_inside_ball_finite_gradients(mobius):
    torch.manual_seed(0)
    c = 0.7
    head = build_head(HeadConfig(in_features=16, dim=5, curvature=c, clip_r=9.0, mobius=mobius))
    with torch.no_grad():
        head.base.copy_(poincare.expmap0(torch.full((5,), 2.0, dtype=torch.float64), c=c))
    feats = (torch.randn(32, 16) * torch.logspace(-6, 4, 32)[:, None]).requires_grad_()
    z = head(feats)
    assert z.dtype == torch.float64 and z.shape == (32, 5)
    assert (z.norm(dim=1) < 1 / c**0.5).all()
    # distance from the base point is at most 2r/sqrt(c) (clipping)
    d = poincare.dist(head.base.expand_as(z), z, c=c)
    assert float(d.detach().max()) <= 2 * 9.0 / c**0.5 + 1e-6
    z.sum().backward()
    assert torch.isfinite(feats.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in head.parameters() if p.grad is not None)


def test_euclidean_space_prototypes_are_tangent_vectors_at_base():
    c = 1.0
    base = poincare.expmap0(torch.tensor([0.5, -0.2, 0.1], dtype=torch.float64), c=c)
    p = poincare.expmap0(
        torch.tensor([[2.0, 1.0, 0.0], [0.0, -3.0, 1.0]], dtype=torch.float64), c=c
    )
    e = EuclideanSpace(c, base).from_ball(p)
    # |log_0((-m) ⊕ p)| = sqrt(c) d(m, p) / 2
    assert torch.allclose(e.norm(dim=1), poincare.dist(base.expand_as(p), p, c=c) / 2, rtol=1e-10)


def _tiny_problem(seed=0, n=48, k=3, dim=4):
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % k
    centres = torch.randn(k, 6, generator=g) * 2
    x = centres[y] + 0.7 * torch.randn(n, 6, generator=g)
    protos = poincare.expmap0(torch.randn(k, dim, generator=g, dtype=torch.float64), c=1.0)
    return x, y, protos


def _fit(loss_fn, steps=60, dim=4, seed=0):
    torch.manual_seed(seed)
    head = build_head(HeadConfig(in_features=6, dim=dim, curvature=1.0, clip_r=3.0))
    opt = torch.optim.Adam(head.linear.parameters(), lr=0.05)
    values = []
    for _ in range(steps):
        loss = loss_fn(head)
        opt.zero_grad()
        loss.backward()
        opt.step()
        values.append(float(loss.detach()))
    return values


@pytest.mark.parametrize("name", ["prototype", "margin", "circle", "pairwise", "ntxent"])
@pytest.mark.parametrize(
    "space", [PoincareSpace(1.0), EuclideanSpace(1.0)], ids=["poincare", "euclidean"]
)
def test_each_loss_decreases(name, space):
    x, y, protos = _tiny_problem()
    if space.name == "euclidean":
        protos = space.from_ball(protos)
    g = torch.Generator().manual_seed(5)
    noise1 = 0.1 * torch.randn(x.shape, generator=g)
    noise2 = 0.1 * torch.randn(x.shape, generator=g)

    def f(head):
        if name == "prototype":
            return losses.prototype_ce(head(x), protos, y, space, tau=0.5)
        if name == "margin":
            return losses.margin_rank(head(x), protos, y, space, margin=1.0)
        if name == "circle":
            return losses.circle_loss(head(x), y, space)
        z1, z2 = head(x + noise1), head(x + noise2)
        if name == "pairwise":
            return losses.pairwise_ce(z1, z2, space, tau=0.5, y=y)
        return losses.nt_xent(z1, z2, space, tau=0.5)

    values = _fit(f)
    assert all(torch.isfinite(torch.tensor(values)))
    assert sum(values[-5:]) / 5 < 0.9 * sum(values[:5]) / 5, (values[:5], values[-5:])


def test_losses_against_definitions():
    space = PoincareSpace(1.0)
    z = poincare.expmap0(
        torch.tensor([[0.3, 0.1], [-0.2, 0.5], [0.0, -0.4]], dtype=torch.float64), c=1.0
    )
    protos = poincare.expmap0(torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=torch.float64), c=1.0)
    y = torch.tensor([0, 1, 1])
    d = torch.stack([torch.stack([poincare.dist(a, b, c=1.0) for b in protos]) for a in z])
    ce = -torch.log_softmax(-d / 0.3, 1)[torch.arange(3), y].mean()
    assert torch.allclose(losses.prototype_ce(z, protos, y, space, 0.3), ce)
    hinge = torch.stack([(0.5 + d[i, y[i]] - d[i, 1 - y[i]]).clamp_min(0) for i in range(3)]).mean()
    assert torch.allclose(losses.margin_rank(z, protos, y, space, 0.5), hinge)


def test_einstein_midpoint_prototype_of_a_few_examples():
    """A class added from a handful of images: its Einstein midpoint is nearer to its own
    examples than the other class's, and is the midpoint of the geometry module."""
    g = torch.Generator().manual_seed(0)
    space = PoincareSpace(1.0)
    a = poincare.expmap0(
        torch.tensor([2.0, 0.0]).double()
        + 0.2 * torch.randn(5, 2, generator=g, dtype=torch.float64),
        c=1.0,
    )
    b = poincare.expmap0(
        torch.tensor([0.0, 2.0]).double()
        + 0.2 * torch.randn(5, 2, generator=g, dtype=torch.float64),
        c=1.0,
    )
    pa, pb = space.midpoint(a), space.midpoint(b)
    assert torch.allclose(pa, poincare.einstein_midpoint(a, c=1.0))
    da, db = space.pairwise(a, torch.stack([pa, pb])), space.pairwise(b, torch.stack([pa, pb]))
    assert (da.argmin(1) == 0).all() and (db.argmin(1) == 1).all()
    # the midpoint of copies of one point is that point
    same = a[:1].expand(4, -1)
    assert torch.allclose(space.midpoint(same), a[0], atol=1e-12)
