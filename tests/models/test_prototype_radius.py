"""Scaled prototypes (``prototype_radius``): poincare.toward, Space.scale, training, serving."""

from __future__ import annotations

import mpmath
import numpy as np
import pytest
import torch

from models.geometry import poincare
from models.vision.heads import EuclideanSpace, PoincareSpace
from tests.support.cones import tiny_train

# ---------------------------------------------------------------- poincare.toward


def _mp_add(x, y, c):
    """Möbius addition in 60 digits (lists of mpf)."""
    xy = sum(a * b for a, b in zip(x, y, strict=True))
    x2, y2 = sum(a * a for a in x), sum(b * b for b in y)
    den = 1 + 2 * c * xy + c * c * x2 * y2
    return [
        ((1 + 2 * c * xy + c * y2) * a + (1 - c * x2) * b) / den for a, b in zip(x, y, strict=True)
    ]


def _toward_mp(x: np.ndarray, y: np.ndarray, t: float, c: float) -> np.ndarray:
    mpmath.mp.dps = 60
    c = mpmath.mpf(c)
    X = [mpmath.mpf(float(v)) for v in x]
    Y = [mpmath.mpf(float(v)) for v in y]
    u = _mp_add([-a for a in X], Y, c)
    n = mpmath.sqrt(sum(a * a for a in u))
    r = mpmath.tanh(mpmath.sqrt(c) * t / 2) / mpmath.sqrt(c)
    return np.array([float(v) for v in _mp_add(X, [a / n * r for a in u], c)])


@pytest.mark.parametrize("c", [1.0, 0.5, 2.0])
def test_toward_against_60_digits_and_near_the_boundary(c):
    rng = np.random.default_rng(1)
    for gap in (0.3, 1e-3, 1e-7):
        x = rng.standard_normal(5)
        x = x / np.linalg.norm(x) * 0.4 / np.sqrt(c)
        y = rng.standard_normal(5)
        y = y / np.linalg.norm(y) * (1 - gap) / np.sqrt(c)
        for t in (0.5, 2.0, 6.0):
            got = poincare.toward(torch.from_numpy(x), torch.from_numpy(y), t, c=c).numpy()
            np.testing.assert_allclose(got, _toward_mp(x, y, t, c), rtol=1e-10, atol=1e-13)
            # an independent float64 check: on the geodesic, at distance t from x
            X, Y, G = (torch.from_numpy(v) for v in (x, y, got))
            assert float(poincare.dist(X, G, c=c)) == pytest.approx(t, rel=1e-9)
            dxy = float(poincare.dist(X, Y, c=c))
            assert float(poincare.dist(G, Y, c=c)) == pytest.approx(abs(dxy - t), rel=1e-6)


def test_toward_same_point_and_finite_gradients():
    x = torch.tensor([[0.2, -0.1, 0.3], [0.1, 0.1, 0.1]], dtype=torch.float64)
    y = torch.tensor([[0.2, -0.1, 0.3], [0.0, 0.9999999, 0.0]], dtype=torch.float64)
    g = poincare.toward(x, y, 1.5, c=1.0)
    assert torch.equal(g[0], x[0])  # no direction: x itself
    xg, yg = x[1:].clone().requires_grad_(True), y[1:].clone().requires_grad_(True)
    poincare.toward(xg, yg, 1.5, c=1.0).sum().backward()
    assert torch.isfinite(xg.grad).all() and torch.isfinite(yg.grad).all()


# ---------------------------------------------------------------- Space.scale


def test_scaled_prototypes_keep_direction_and_depth_order():
    rng = np.random.default_rng(2)
    m = torch.tensor([0.3, 0.1, -0.2, 0.0], dtype=torch.float64)
    v = torch.from_numpy(rng.standard_normal((6, 4)) * 3)
    p = poincare.mobius_add(m.expand_as(v), poincare.expmap0(v, c=1.0), c=1.0)  # 6 label points
    d = poincare.dist(m.expand_as(p), p, c=1.0)
    q = PoincareSpace(1.0, base=m, scale=0.25).from_ball(p)
    dq = poincare.dist(m.expand_as(q), q, c=1.0)
    np.testing.assert_allclose(dq.numpy(), 0.25 * d.numpy(), rtol=1e-9)  # depth order kept
    # on the geodesic from m to p: d(m, q) + d(q, p) = d(m, p)
    np.testing.assert_allclose((dq + poincare.dist(q, p, c=1.0)).numpy(), d.numpy(), rtol=1e-9)
    assert torch.equal(PoincareSpace(1.0, base=m).from_ball(p), p)  # scale 0: the label points
    # the twin: the tangent vectors of the same stand-ins
    t = EuclideanSpace(1.0, base=m, scale=0.25).from_ball(p)
    want = poincare.logmap0(poincare.mobius_add(-m.expand_as(q), q, c=1.0), c=1.0)
    np.testing.assert_allclose(t.numpy(), want.numpy(), rtol=1e-9, atol=1e-12)


# ---------------------------------------------------------------- training and serving


def _class_distances(model):
    seen = model.seen_classes
    protos = model.prototypes(seen)
    base = model.head.base.detach()
    return poincare.dist(base.expand_as(protos), protos, c=model.curvature)


def test_training_puts_the_trained_classes_at_the_radius(fm_cap):
    from models.training.config import TrainConfig, TrainError

    labels, data, test = fm_cap
    model = tiny_train(labels, data, epochs=2)
    assert TrainConfig().radius_of_prototypes == 2.0
    assert model.head_cfg.prototype_scale > 0
    assert float(_class_distances(model).mean()) == pytest.approx(2.0, rel=1e-9)
    # the images gather around the stand-ins: the nearest trained-class prototype is the class
    # far more often than chance (0.1); measured 0.51
    z = model.embed(test.images)
    pred = poincare.pairwise_dist(z, model.prototypes(model.seen_classes), c=1.0).argmin(1)
    nodes = [test.classes[t][1] for t in test.targets]
    acc = np.mean([model.seen_classes[j] == n for j, n in zip(pred.tolist(), nodes, strict=True)])
    assert acc >= 0.35, acc
    # 0 and the twin and the cone term: the label points themselves
    plain = tiny_train(labels, data, epochs=1, prototype_radius=0.0)
    assert plain.head_cfg.prototype_scale == 0
    assert torch.equal(plain.prototypes(), labels.embeddings.double())
    assert TrainConfig(geometry="euclidean").radius_of_prototypes == 0.0
    assert TrainConfig(cone_weight=1.0).radius_of_prototypes == 0.0
    assert TrainConfig(prototype_radius=3.0, geometry="euclidean").radius_of_prototypes == 3.0
    with pytest.raises(TrainError, match="prototype radius"):
        TrainConfig(prototype_radius=-1.0).validate()


def test_placement_is_the_default_with_cap_labels():
    from models.training.config import TrainConfig

    assert TrainConfig().with_placement(True).placement == "cones"
    assert TrainConfig().with_placement(False).placement == "none"  # no cap cones to fill
    for kw in ({"geometry": "euclidean"}, {"loss": "circle"}, {"placement": "none"}):
        assert TrainConfig(**kw).with_placement(True).placement == "none", kw
    assert TrainConfig(placement="cones").with_placement(False).placement == "cones"


def test_a_placed_scaled_model_embeds_beside_the_label_points(fm_cap, tmp_path):
    """Placement measures from the head's (scaled) prototypes but puts the images beside the
    label points: the embed space's prototypes are the label points again, and the
    saved model reloads with both."""
    from models.vision.image_model import load_model

    labels, data, test = fm_cap
    model = tiny_train(labels, data, epochs=2, placement="cones")
    assert model.head_cfg.prototype_scale > 0
    assert torch.equal(model.prototypes(), labels.embeddings.double())  # placed: label points
    assert not torch.equal(model.head_prototypes(), labels.embeddings.double())
    assert torch.equal(
        model.placement.seen_protos,
        model.head_prototypes()[[labels.taxonomy.index(n) for n in model.seen_classes]],
    )
    # a search by name starts at the anchors, the centres of the placed images; the label
    # points lie 3 inward, nearest to the images squashed to the rim (the least typical)
    anchors = poincare.move_outward(labels.embeddings.double(), 3.0, c=1.0)
    assert torch.allclose(model.search_points(), anchors)
    z = model.embed(test.images)
    nodes = np.array([test.classes[t][1] for t in test.targets])

    def precision(points, k=20):
        d = poincare.pairwise_dist(points, z, c=1.0)
        near = d.argsort(dim=1, stable=True)[:, :k].numpy()
        return np.mean([(nodes[near[j]] == n).mean() for j, n in enumerate(model.seen_classes)])

    rows = [labels.taxonomy.index(n) for n in model.seen_classes]
    from_anchor, from_point = precision(anchors[rows]), precision(labels.embeddings.double()[rows])
    assert from_anchor >= from_point + 0.05, (from_anchor, from_point)  # measured 0.475, 0.39
    path = tmp_path / "m.safetensors"
    model.save(path)
    again = load_model(path)
    assert again.head_cfg.prototype_scale == model.head_cfg.prototype_scale
    assert torch.equal(again.embed(test.images[:40]), model.embed(test.images[:40]))


def test_service_searches_a_label_from_its_prototype(fm_cap, tmp_path):
    """A scaled, unplaced model: the service's label search and nearest labels use the
    stand-ins (where the images are), the label's ``vector`` stays its label point."""
    from fastapi.testclient import TestClient

    from indexing import HyperbolicIndex
    from service.app import create_app
    from service.runtime import open_runtime
    from service.settings import Settings

    labels, data, test = fm_cap
    model = tiny_train(labels, data, epochs=2)
    model.save(tmp_path / "m.safetensors")
    z = model.embed(test.images).numpy()
    nodes = [test.classes[t][1] for t in test.targets]
    index = HyperbolicIndex(dim=model.dim, curvature=model.curvature, path=tmp_path / "idx")
    index.add(z, [f"t{i}" for i in range(len(z))], labels=nodes)
    index.save()
    index.close()
    settings = Settings(model=tmp_path / "m.safetensors", index=tmp_path / "idx", log_json=False)
    with TestClient(create_app(settings, runtime=open_runtime(settings), owns_runtime=True)) as c:
        r = c.post("/v1/search", json={"label": "trouser.n.01", "k": 20, "mode": "nearest"})
        assert r.status_code == 200, r.text
        got = [h["id"] for h in r.json()["results"]]
        proto = model.prototypes(["trouser.n.01"]).numpy()[0]
        d = poincare.pairwise_dist(torch.from_numpy(proto)[None], torch.from_numpy(z), c=1.0)[0]
        assert got == [f"t{i}" for i in d.argsort(stable=True)[:20].tolist()]
        share = np.mean([nodes[int(i[1:])] == "trouser.n.01" for i in got])
        assert share >= 0.3, share  # the trousers gather there (1 in 10 images; measured 0.45)
        lab = c.get("/v1/labels/trouser.n.01").json()
        point = labels.embeddings[labels.taxonomy.index("trouser.n.01")].numpy()
        np.testing.assert_allclose(lab["vector"], point, rtol=0, atol=1e-12)
