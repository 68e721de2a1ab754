"""The auxiliary objectives of issue 12 (models.training.objectives): each loss, HMLR against an
independent formula, HIER's LCA on a tiny tree, sampled negatives, the product head
through an index, the unsupervised run's cluster taxonomy."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from models.geometry import poincare
from models.images.augment import Augment
from models.training.config import MAX_HOP_CLASSES
from models.training.losses import Prototypes, build_criterion, expected_hops, prototype_ce
from models.training.objectives import (
    HMLR,
    SSLHead,
    cluster_levels,
    contrastive_loss,
    hier_lca,
    hier_loss,
    hmlr_logits,
    log_ratio_loss,
    merge_levels,
    sampled_columns,
)
from models.training.run import TrainConfig, TrainError, train
from models.training.setup import class_hops
from models.vision.heads import make_space
from tests.support.training import needs_fmnist, small_labels, tiny_config


@pytest.fixture(scope="module")
def labels():
    torch.set_num_threads(1)
    return small_labels()


BALL = make_space("poincare", 1.0)


def _falls(loss_of, params, steps=30, lr=0.05):
    """The loss is finite with finite gradients, and lower after a few Adam steps."""
    opt = torch.optim.Adam(params, lr=lr)
    first = None
    for _ in range(steps):
        loss = loss_of()
        assert torch.isfinite(loss)
        opt.zero_grad()
        loss.backward()
        for p in params:
            assert p.grad is not None and torch.isfinite(p.grad).all()
        opt.step()
        first = float(loss.detach()) if first is None else first
    assert float(loss_of().detach()) < first
    return first


def _toy(n=24, d=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    v = (torch.randn(n, d, generator=g, dtype=torch.float64) * 0.5).requires_grad_()
    y = torch.arange(n) % 3
    return v, y


def test_hier_loss_falls_and_lca_of_a_tiny_tree():
    # a tree in the ball: root R at the origin, inner nodes A and B, leaves a1, a2 / b1, b2
    e = torch.eye(2, dtype=torch.float64)
    at = lambda v, r: poincare.expmap0(v * r, c=1.0)  # noqa: E731
    A, B = at(e[0], 1.5), at(e[1], 1.5)
    a1 = at(torch.tensor([1.0, 0.15], dtype=torch.float64) / 1.011, 3.0)
    a2 = at(torch.tensor([1.0, -0.15], dtype=torch.float64) / 1.011, 3.0)
    b1 = at(torch.tensor([0.15, 1.0], dtype=torch.float64) / 1.011, 3.0)
    R = torch.zeros(2, dtype=torch.float64)
    proxies = torch.stack([R, A, B])
    pts = torch.stack([a1, a2, b1])
    d = BALL.pairwise(pts, proxies)  # (3, 3)
    assert hier_lca(d[[0]], d[[1]]).item() == 1  # LCA(a1, a2) = A
    assert hier_lca(d[[0]], d[[2]]).item() == 0  # LCA(a1, b1) = R
    assert hier_lca(d[[0]], d[[1]], d[[2]]).item() == 0  # LCA(a1, a2, b1) = R

    v, y = _toy(d=2)
    pv = (torch.randn(6, 2, dtype=torch.float64) * 0.3).requires_grad_()
    gen = torch.Generator().manual_seed(0)

    def loss():
        gen.manual_seed(0)  # the same triplets each step
        z = poincare.expmap0(v, c=1.0)
        return hier_loss(z, y, poincare.expmap0(pv, c=1.0), BALL, gen=gen)

    _falls(loss, [v, pv])


def _np_mobius_add(x, y, c):
    xy, x2, y2 = (x * y).sum(-1), (x * x).sum(-1), (y * y).sum(-1)
    num = (1 + 2 * c * xy + c * y2)[..., None] * x + (1 - c * x2)[..., None] * y
    return num / (1 + 2 * c * xy + c * c * x2 * y2)[..., None]


def test_hmlr_logits_against_the_float64_formula():
    rng = np.random.default_rng(3)
    c = 0.7
    z = rng.normal(size=(5, 3)) * 0.3
    p = rng.normal(size=(4, 3)) * 0.3
    a = rng.normal(size=(4, 3))
    want = np.zeros((5, 4))
    for i in range(5):
        for k in range(4):
            w = _np_mobius_add(-p[k], z[i], c)
            lam = 2 / (1 - c * p[k] @ p[k])
            na = np.linalg.norm(a[k])
            arg = 2 * math.sqrt(c) * (w @ a[k]) / ((1 - c * w @ w) * na)
            want[i, k] = lam * na / math.sqrt(c) * math.asinh(arg)
    got = hmlr_logits(*(torch.from_numpy(t) for t in (z, p, a)), c).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)

    head = HMLR(3, 4, 1.0, "poincare", torch.zeros(4, dtype=torch.float64))
    v, y = _toy()
    _falls(
        lambda: torch.nn.functional.cross_entropy(head(poincare.expmap0(v, c=1.0)), y),
        [v, head.a, head.p],
    )


@pytest.mark.parametrize("kind", ["hyperbolic", "euclidean"])
def test_contrastive_losses_fall(kind):
    v, _ = _toy()
    g = torch.Generator().manual_seed(1)
    noise = torch.randn(v.shape, generator=g, dtype=torch.float64) * 0.05

    def loss():
        z1 = poincare.expmap0(v, c=1.0)
        z2 = poincare.expmap0(v + noise, c=1.0)
        return contrastive_loss(z1, z2, BALL, kind, 0.2)

    _falls(loss, [v])


@pytest.mark.parametrize("kind", ["byol", "barlow"])
def test_ssl_terms_fall_on_two_views(kind):
    torch.manual_seed(0)
    enc = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 16))
    head = SSLHead(kind, enc, 16, hidden=32, out=8)
    g = torch.Generator().manual_seed(0)
    pix = torch.rand(32, 1, 8, 8, generator=g)
    aug = Augment("ssl")
    x = torch.cat([aug(pix, torch.Generator().manual_seed(s)) for s in (1, 2)])
    params = [p for p in [*enc.parameters(), *head.parameters()] if p.requires_grad]
    ctx = torch.autocast("cpu", enabled=False)

    def loss():
        out = head.loss(x, enc(x), ctx)
        if kind == "byol":
            head.update_target(enc, 0.9)
        return out

    _falls(loss, params, steps=25, lr=0.01)


def test_ssl_views_degenerate_to_brightness_on_grey():
    g = torch.Generator().manual_seed(0)
    grey = torch.rand(8, 1, 12, 12, generator=g)
    out = Augment("ssl")(grey, torch.Generator().manual_seed(4))
    assert out.shape == grey.shape and out.min() >= 0 and out.max() <= 1
    rgb = torch.rand(64, 3, 12, 12, generator=g)
    out = Augment("ssl", flip=False)(rgb, torch.Generator().manual_seed(4))
    grey_rows = (out[:, 0] == out[:, 1]).flatten(1).all(1) & (out[:, 1] == out[:, 2]).flatten(
        1
    ).all(1)
    assert 0 < int(grey_rows.sum()) < 64  # some views turned grey (p = 0.2), not all


def test_log_ratio_on_cluster_levels():
    g = torch.Generator().manual_seed(0)
    centres = torch.randn(4, 3, generator=g, dtype=torch.float64) * 0.6
    pts = torch.cat(
        [centres[i] + 0.05 * torch.randn(10, 3, generator=g, dtype=torch.float64) for i in range(4)]
    )
    z0 = poincare.expmap0(pts, c=1.0)
    assign, parent = cluster_levels(z0, BALL, [2, 4])
    assert assign.shape == (40, 2)
    # nested: every finest cluster lies in one coarse cluster
    for k in np.unique(assign[:, 1]):
        assert len(np.unique(assign[assign[:, 1] == k, 0])) == 1
        assert parent[1, k] == assign[assign[:, 1] == k, 0][0]
    # the four blobs are the four finest clusters
    for i in range(4):
        assert len(np.unique(assign[i * 10 : (i + 1) * 10, 1])) == 1
    target = merge_levels(torch.from_numpy(assign))
    assert target.min() == 1 and target.max() <= 3 and torch.equal(target, target.T)
    v = (torch.randn(40, 3, generator=g, dtype=torch.float64) * 0.5).requires_grad_()

    def loss():
        g2 = torch.Generator().manual_seed(0)
        return log_ratio_loss(poincare.expmap0(v, c=1.0), target, BALL, gen=g2)

    _falls(loss, [v])


def test_sampled_negatives_equal_the_full_softmax_when_all_are_sampled():
    g = torch.Generator().manual_seed(0)
    m, k = 30, 4
    points = poincare.expmap0(torch.randn(m, 3, generator=g, dtype=torch.float64) * 0.5, c=1.0)
    target = torch.tensor([2, 7, 11, 20])
    exclude = torch.zeros(k, m, dtype=torch.bool)
    exclude[0, [5, 6]] = True
    exclude[2, 25] = True
    protos = Prototypes(points[target], points, target, exclude)
    z = poincare.expmap0(torch.randn(16, 3, generator=g, dtype=torch.float64) * 0.5, c=1.0)
    y = torch.arange(16) % k
    full = prototype_ce(z, points, target[y], BALL, 1.0, 0.3, exclude=exclude[y])
    from models.training.losses import build_criterion

    cfg = TrainConfig(negative_sample=m, tau=1.0)  # more than the others: all sampled
    assert torch.allclose(build_criterion(cfg, BALL, protos)(z, y), full)
    cfg = TrainConfig(negative_sample=5, tau=1.0)
    sampled = build_criterion(cfg, BALL, protos)(z, y)
    assert torch.isfinite(sampled) and not torch.allclose(sampled, full)
    cols = sampled_columns(m, target, 5, torch.Generator().manual_seed(0))
    assert len(cols) == 9 and set(target.tolist()) <= set(cols.tolist())
    assert torch.equal(sampled_columns(m, target, m, None), torch.arange(m))


def test_auto_negative_sample_keeps_every_node_of_a_small_taxonomy_and_samples_a_large_one():
    from models.training.losses import AUTO_FULL_NODES, AUTO_NEGATIVE_SAMPLE, negative_sample_of

    cfg = TrainConfig()
    assert cfg.negative_sample == "auto"
    assert negative_sample_of(cfg, 1788) == 0  # the default taxonomy: the full softmax
    assert negative_sample_of(cfg, AUTO_FULL_NODES) == 0
    assert negative_sample_of(cfg, 10699) == AUTO_NEGATIVE_SAMPLE  # artifact.n.01's
    assert negative_sample_of(TrainConfig(negative_sample=0), 10699) == 0  # asked for all
    assert negative_sample_of(TrainConfig(negative_sample=7), 100) == 7
    # a large taxonomy's auto loss is the sampled one (it differs from the full
    # softmax), a small one's the full one
    g = torch.Generator().manual_seed(1)
    for m, sampled in ((AUTO_FULL_NODES, False), (AUTO_FULL_NODES + AUTO_NEGATIVE_SAMPLE, True)):
        pts = poincare.expmap0(torch.randn(m, 3, generator=g, dtype=torch.float64), c=1.0)
        target = torch.tensor([0, m // 2])
        protos = Prototypes(pts[target], pts, target, None)
        z = poincare.expmap0(torch.randn(8, 3, generator=g, dtype=torch.float64) * 0.5, c=1.0)
        y = torch.arange(8) % 2
        full = prototype_ce(z, pts, target[y], BALL, 1.0, 0.3)
        got = build_criterion(TrainConfig(tau=1.0), BALL, protos)(z, y)
        assert torch.allclose(got, full) != sampled
    for bad in (-1, "some", 2.5, True):
        with pytest.raises(TrainError, match="negative sample"):
            TrainConfig(negative_sample=bad).validate()


def test_expected_hops_against_a_float64_loop_and_its_gradient():
    g = torch.Generator().manual_seed(3)
    z = (
        poincare.expmap0(torch.randn(12, 4, generator=g, dtype=torch.float64), c=1.0) * 0.9
    ).requires_grad_()
    classes = poincare.expmap0(torch.randn(3, 4, generator=g, dtype=torch.float64) * 2, c=1.0)
    y = torch.tensor([0, 1, 2] * 4)
    hops = torch.tensor([[0, 2, 4], [2, 0, 4], [4, 4, 0]], dtype=torch.float32)
    got = expected_hops(z, classes, y, hops, BALL, tau=0.5)
    want = 0.0
    for i in range(12):
        d = [float(BALL.dist(z[i].detach(), c)) for c in classes]
        w = [math.exp(-v / 0.5) for v in d]
        want += sum(wk / sum(w) * float(hops[int(y[i]), k]) for k, wk in enumerate(w)) / 12
    assert math.isclose(float(got.detach()), want, rel_tol=1e-9)
    got.backward()
    assert torch.isfinite(z.grad).all() and z.grad.abs().sum() > 0
    # a posterior on a sibling costs less than one on a cousin: two images of class 0,
    # each sure of a wrong class
    z2 = torch.stack([classes[1], classes[2]])
    per = [
        float(expected_hops(z2[[i]], classes, torch.tensor([0]), hops, BALL, 0.01)) for i in (0, 1)
    ]
    assert per[0] == pytest.approx(2, abs=1e-6) and per[1] == pytest.approx(4, abs=1e-6)
    # a step on the term moves a point torn between a sibling (class 1) and a cousin
    # (class 2) of its class towards the sibling; the three lie mirror-symmetric about the
    # point's plane, so the cross-entropy of class 0 alone would not prefer either
    sym = torch.tensor([[0.0, 0.0, 0.5, 0.0], [0.5, 0.3, 0.0, 0.0], [0.5, -0.3, 0.0, 0.0]])
    x = torch.tensor([[0.5, 0.0, 0.0, 0.0]], dtype=torch.float64, requires_grad=True)
    sym = sym.to(torch.float64)
    expected_hops(x, sym, torch.tensor([0]), hops, BALL, 0.5).backward()
    d1 = BALL.pairwise(poincare.project(x.detach() - 0.01 * x.grad, c=1.0), sym)[0]
    assert float(d1[1]) < float(d1[2])
    # near the boundary (|z| = 1 - 1e-9) it stays finite
    edge = (classes[0] / classes[0].norm() * (1 - 1e-9)).reshape(1, -1).requires_grad_()
    v = expected_hops(edge, classes, torch.tensor([1]), hops, BALL, 0.1)
    v.backward()
    assert torch.isfinite(v) and torch.isfinite(edge.grad).all()


@needs_fmnist
def test_hop_weight_adds_the_term_and_trains(labels):
    seen = ["sandal.n.01", "gym_shoe.n.01", "shirt.n.01"]
    h = class_hops(labels.taxonomy, seen)
    assert h.shape == (3, 3) and (h.diagonal() == 0).all() and (h == h.T).all()
    assert all(
        int(h[i, j]) == labels.taxonomy.hops(seen[i], seen[j]) for i in range(3) for j in range(3)
    )
    classes = BALL.from_ball(labels.embeddings[[labels.taxonomy.index(n) for n in seen]])
    protos = Prototypes(classes, classes, torch.arange(3), hops=h)
    z = torch.zeros(5, classes.shape[1], dtype=torch.float64)
    y = torch.tensor([0, 1, 2, 0, 1])
    plain = build_criterion(
        TrainConfig(tau=0.5), BALL, Prototypes(classes, classes, torch.arange(3))
    )(z, y)
    with_hops = build_criterion(TrainConfig(tau=0.5), BALL, protos)(z, y)
    assert float(with_hops - plain) == pytest.approx(
        float(expected_hops(z, classes, y, h, BALL, 0.5))
    )
    # the default: on (weight 1) up to MAX_HOP_CLASSES classes, off beyond; hops squared
    assert TrainConfig().resolved_hop_weight(10) == 1.0 and TrainConfig().hop_power == 2.0
    assert TrainConfig().resolved_hop_weight(MAX_HOP_CLASSES + 1) == 0.0
    assert TrainConfig(hop_weight=0.0).resolved_hop_weight(10) == 0.0
    with pytest.raises(TrainError, match="hop weight"):
        TrainConfig(hop_weight=-1).validate()
    with pytest.raises(TrainError, match="hop power"):
        TrainConfig(hop_weight=1, hop_power=0).validate()
    m = train(
        tiny_config(limit=400, epochs=2, time_budget=None, hop_weight=0.5), labels, progress=False
    )
    hist = m.metrics["history"]
    assert all(np.isfinite(h["loss"]) for h in hist) and hist[1]["loss"] < hist[0]["loss"]
    assert m.config["hop_weight"] == 0.5


@needs_fmnist
def test_each_objective_trains(labels):
    torch.set_num_threads(1)
    for kw in (
        dict(hier_weight=1.0, classifier="hmlr"),
        dict(contrastive="hyperbolic", ssl="byol"),
        dict(ssl="barlow", geometry="euclidean", hier_weight=1.0),
        dict(negative_sample=3),
    ):
        m = train(tiny_config(limit=400, epochs=2, time_budget=None, **kw), labels, progress=False)
        hist = m.metrics["history"]
        assert all(np.isfinite(h["loss"]) for h in hist) and hist[1]["loss"] < hist[0]["loss"], kw
    with pytest.raises(TrainError, match="unknown ssl"):
        train(tiny_config(ssl="simclr"), labels, progress=False)
    with pytest.raises(TrainError, match="--space.*prototype"):
        train(tiny_config(space="poincare:4,sphere:2"), labels, progress=False)


@needs_fmnist
def test_learned_curvature_moves_and_is_saved(labels, tmp_path):
    """--curvature learn: log c gets finite gradients through the loss and moves; the
    saved model's curvature is the learned value and its embeddings lie in that ball."""
    torch.set_num_threads(1)
    from models.vision.heads import HeadConfig, HyperbolicHead
    from models.vision.image_model import ImageModel

    head = HyperbolicHead(HeadConfig(in_features=6, dim=4, learn_curvature=True))
    space = make_space("poincare", 1.0)
    space.learned = head.curvature
    feats = torch.randn(16, 6, generator=torch.Generator().manual_seed(0))
    y = torch.arange(16) % 4
    from models.training.losses import circle_loss

    loss = circle_loss(head(feats), y, space)
    loss.backward()
    assert head.log_c.grad is not None and torch.isfinite(head.log_c.grad)
    assert head.log_c.grad.abs() > 0  # the loss depends on c

    cfg = tiny_config(loss="circle", limit=400, epochs=2, time_budget=None,
                      learn_curvature=True, curvature=0.5)  # fmt: skip
    model = train(cfg, labels, progress=False)
    c = model.curvature
    assert c != 0.5 and 1e-3 <= c <= 1e2
    path = tmp_path / "m.safetensors"
    model.save(path)
    back = ImageModel.load(path)
    assert back.curvature == pytest.approx(c, rel=1e-12)
    from models.images.datasets import load_fashion_mnist
    from tests.support.training import FMNIST

    images = load_fashion_mnist("test", FMNIST).images[:8]
    z = back.embed(images)
    assert torch.all(c * (z * z).sum(-1) < 1)  # points of the learned ball
    assert torch.allclose(z, model.embed(images), atol=1e-9)


@needs_fmnist
def test_product_model_builds_an_index_and_answers_search(labels, tmp_path):
    torch.set_num_threads(1)
    from indexing.batches import open_index
    from service.ingest.build import build_index
    from service.ingest.plans import plan_dataset

    cfg = tiny_config(
        loss="circle",
        space="poincare:4,sphere:2,euclidean:2",
        limit=600,
        epochs=1,
        time_budget=None,
    )
    model = train(cfg, labels, progress=False)
    path = tmp_path / "m.safetensors"
    model.save(path)
    from models.vision.image_model import ImageModel

    model = ImageModel.load(path)
    assert model.geometry == "product" and model.dim == 8
    plan = plan_dataset("fashion-mnist", "test", "/usr/share/datasets/fashion-mnist")
    plan.sources = plan.sources[:200]
    index = open_index(tmp_path / "idx", dim=8, curvature=1.0, space=model.head_cfg.space)
    try:
        build_index(model, index, plan, batch_size=100, progress=False)
        assert len(index) == 200 and index.space == "poincare:4,sphere:2,euclidean:2"
        q = model.embed(plan.images[:3])
        ids, dist = index.search(q.numpy(), k=5)
        assert ids.shape == (3, 5) and ids[0][0] == plan.sources[0].id
        assert dist[0][0] == pytest.approx(0.0, abs=1e-9)
        want = model.space.pairwise(q, model.embed(plan.images[:200]))
        assert np.allclose(np.sort(want.numpy(), axis=1)[:, :5], dist, atol=1e-9)
    finally:
        index.close()

    from indexing import HyperbolicIndex
    from service.runtime import StartupError, runtime_for

    other = HyperbolicIndex(dim=8, curvature=1.0, space="poincare:4,sphere:4")
    with pytest.raises(StartupError, match="cannot fill the product-space index poincare:4,sph"):
        runtime_for(other, None, model)

    # `hypsearch serve` serves it: search by picture, /v1/embed without labels,
    # label features refused with a 422 that says why
    from service.client import Client, HypsearchError
    from tests.support.server import Server, png_bytes

    args = ["--model", str(path), "--index", str(tmp_path / "idx")]
    srv = Server(args, tmp_path / "serve.log")
    try:
        srv.wait_ready()
        with Client(srv.url, timeout=60) as hs:
            stats = hs.stats()
            assert stats["items"] == 200 and stats["space"] == "poincare:4,sphere:2,euclidean:2"
            png = png_bytes(plan.images[0])
            emb = hs.embed(png)
            assert emb["labels"] == [] and len(emb["vector"]) == 8
            z0 = model.embed(plan.images[:1])[0].numpy()
            assert np.allclose(emb["vector"], z0, atol=1e-5)  # PNG round trip of uint8 pixels
            hits = hs.search_image(png, k=3)["results"]
            assert hits[0]["id"] == plan.sources[0].id and hits[0]["distance"] < 1e-4
            with pytest.raises(HypsearchError) as e:
                hs.search(label="bag.n.04")
            assert e.value.status == 422 and "product space" in e.value.detail
    finally:
        srv.stop()


def test_unsupervised_run_writes_a_cluster_taxonomy(tmp_path):
    pytest.importorskip("PIL")
    torch.set_num_threads(1)
    from service.cli import main
    from tests.support.training import shapes_folder

    shapes_folder(tmp_path / "imgs", n=30)
    out = tmp_path / "u.safetensors"
    rc = main(
        ["train", "--images", str(tmp_path / "imgs"), "--unsupervised", "--out", str(out),
         "--cluster-levels", "2,5", "--epochs", "2", "--batch-size", "16", "--dim", "4",
         "--input-size", "28", "--time-budget", "0", "--quiet", "--json"]
    )  # fmt: skip
    assert rc == 0
    tsv = tmp_path / "u.safetensors.clusters.tsv"
    from models.vision.image_model import ImageModel

    model = ImageModel.load(out)
    tax = model.labels.taxonomy
    leaves = [n for _, n in model.classes]
    assert 2 <= len(leaves) <= 5 and all(n.startswith("cluster.2.") for n in leaves)
    assert all(
        tax.parents(n) and next(iter(tax.parents(n))).startswith("cluster.1.") for n in leaves
    )
    assert "clusters" in tax.ancestors(leaves[0])
    lines = tsv.read_text().splitlines()
    assert f"{leaves[0]}\tclusters" in lines
    # the nearest label point of a training image is its finest cluster or an ancestor
    from models.prototypes import Prototypes

    z = model.embed(np.zeros((2, 28, 28), np.uint8))
    got = Prototypes.of_labels(model.labels).nearest(z.numpy())
    assert all(g in tax for g in got)
    assert json.loads(json.dumps(model.metrics["clusters"]))["levels"] == [2, 5]

    # an index of the same pictures (a manifest without labels: each item gets its cluster)
    # and the service's hierarchical mode along the cluster tree
    rows = ["id,path"] + [
        f"{p.parent.name}-{p.stem},{p}" for p in sorted((tmp_path / "imgs").rglob("*.png"))
    ]
    (tmp_path / "list.csv").write_text("\n".join(rows) + "\n")
    idx = tmp_path / "idx"
    cmd = ["index", "build", "--model", str(out), "--images", str(tmp_path / "list.csv")]
    assert main([*cmd, "--out", str(idx), "--quiet", "--json"]) == 0
    from indexing import HyperbolicIndex
    from service.runtime import runtime_for
    from tests.support.server import app_client

    rt = runtime_for(HyperbolicIndex.load(idx), model.labels, model)
    try:
        used = rt.used_labels()
        assert used and set(used) <= set(leaves)
        with app_client(rt) as client:
            r = client.post(
                "/v1/search",
                json={"label": used[0], "k": 60, "mode": "hierarchical", "levels": "taxonomy"},
            )
            assert r.status_code == 200, r.text
            hits = r.json()["results"]
            first = [h for h in hits if h["level"] == 0]
            assert first and all(h["label"] == used[0] for h in first)
    finally:
        rt.close()


def test_cli_bad_objective_options(tmp_path, capsys):
    from service.cli import main

    out = str(tmp_path / "m.safetensors")
    labels = tmp_path / "l.safetensors"
    small_labels().save(labels)
    cases = [
        (["--dataset", "fashion-mnist"], "--labels LABELS is required"),
        (["--dataset", "fashion-mnist", "--labels", str(labels), "--space", "cube:3",
          "--loss", "circle"], "--space cube:3: "),
        (["--dataset", "fashion-mnist", "--labels", str(labels), "--space", "poincare:4"],
         "--space: the prototype loss needs label points"),
        (["--dataset", "fashion-mnist", "--labels", str(labels), "--unsupervised", "--loss",
          "circle"], "--unsupervised needs a label-free loss"),
        (["--dataset", "fashion-mnist", "--labels", str(labels), "--curvature", "learn"],
         "--curvature learn: needs a label-free loss"),
        (["--dataset", "fashion-mnist", "--labels", str(labels), "--curvature", "learn:-1",
          "--loss", "circle"], "'learn:-1': expected a positive curvature"),
        (["--dataset", "fashion-mnist", "--labels", str(labels), "--hop-weight", "-1"],
         "--hop-weight"),
        (["--dataset", "fashion-mnist", "--labels", str(labels), "--hop-power", "0"],
         "--hop-power"),
    ]  # fmt: skip
    for extra, message in cases:
        try:
            rc = main(["train", *extra, "--out", out, "--quiet"])
        except SystemExit as e:  # argparse's own usage errors
            rc = e.code
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and len(err) == 1 and message in err[0], (extra, err)


def test_busemann_logits_take_the_prototypes_depth_out():
    """prototype_logits="busemann": d(z, p) - d(m, p) for a label point deep along a ray
    barely changes when it moves deeper (its Busemann limit), while d(z, p) grows by the
    step; prototype_ce with those offsets equals the softmax computed by hand."""
    from types import SimpleNamespace

    from models.training.losses import prototype_offsets

    g = torch.Generator().manual_seed(3)
    z = poincare.expmap0(torch.randn(5, 4, generator=g, dtype=torch.float64) * 0.7, c=1.0)
    u = torch.nn.functional.normalize(torch.randn(3, 4, generator=g, dtype=torch.float64), dim=1)
    cfg = SimpleNamespace(prototype_logits="busemann")
    for base in (None, poincare.expmap0(u[0] * 0.3, c=1.0)):
        space = make_space("poincare", 1.0, base=base)
        rel = []
        for rho in (12.0, 18.0):
            p = poincare.expmap0(u * rho / 2, c=1.0)  # hyperbolic radius rho
            off = prototype_offsets(cfg, space, p)
            rel.append(space.pairwise(z, p) - off)
            assert torch.isfinite(rel[-1]).all()
        assert torch.allclose(rel[0], rel[1], atol=1e-3)  # depth-free
        d12 = space.pairwise(z, poincare.expmap0(u * 6.0, c=1.0))
        d18 = space.pairwise(z, poincare.expmap0(u * 9.0, c=1.0))
        assert torch.allclose(d18 - d12, torch.full_like(d12, 6.0), atol=1e-2)  # plain d grows
    y = torch.tensor([0, 1, 2, 0, 1])
    p = poincare.expmap0(u * 4.0, c=1.0)
    off = prototype_offsets(cfg, BALL, p)
    got = prototype_ce(z, p, y, BALL, tau=0.5, offset=off)
    logits = -(BALL.pairwise(z, p) - off) / 0.5
    want = -(logits.log_softmax(1).gather(1, y[:, None])).mean()
    assert torch.allclose(got, want, atol=1e-12)
    assert prototype_offsets(SimpleNamespace(prototype_logits="distance"), BALL, p) is None
    twin = make_space("euclidean", 1.0)
    off = prototype_offsets(cfg, twin, twin.from_ball(p))
    assert torch.allclose(off, torch.full((3,), 4.0, dtype=off.dtype))
