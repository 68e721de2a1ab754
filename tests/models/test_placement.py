"""Cone placement (models.vision.placement): placed points inside their node's cone,
never a child's."""

from __future__ import annotations

import mpmath
import numpy as np
import pytest
import torch

from models.geometry import cones, poincare
from models.taxonomy.graph import Taxonomy
from models.training.validation import placement_merit
from models.vision.placement import ConePlacement, PlacementConfig, backoff_choice, class_membership
from tests.support.cones import CAP, around, cap_labels, hand_tree, in_class_share, tiny_train

# ---------------------------------------------------------------- move_outward


def _outward_mp(x: np.ndarray, depth: float, c: float) -> np.ndarray:
    """60 digits: rho = 2 artanh(sqrt(c)|x|)/sqrt(c), norm tanh(sqrt(c)(rho+depth)/2)/sqrt(c)."""
    mpmath.mp.dps = 60
    sc = mpmath.sqrt(mpmath.mpf(c))
    n = mpmath.sqrt(sum(mpmath.mpf(float(v)) ** 2 for v in x))
    rho = 2 / sc * mpmath.atanh(sc * n)
    r = mpmath.tanh(sc * (rho + depth) / 2) / sc
    return np.array([float(mpmath.mpf(float(v)) / n * r) for v in x])


@pytest.mark.parametrize("c", [1.0, 0.5, 2.0])
def test_move_outward_against_60_digits_near_the_boundary(c):
    rng = np.random.default_rng(0)
    for gap in (0.5, 1e-3, 1e-7):
        u = rng.standard_normal(5)
        x = u / np.linalg.norm(u) * (1 - gap) / np.sqrt(c)
        got = poincare.move_outward(torch.from_numpy(x), 2.5, c=c).numpy()
        want = _outward_mp(x, 2.5, c)
        # the gap to the boundary, not the coordinates, is what must be accurate
        g_got = 1 / np.sqrt(c) - np.linalg.norm(got)
        g_want = 1 / np.sqrt(c) - np.linalg.norm(want)
        assert g_got == pytest.approx(g_want, rel=1e-6)
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=0)


def test_move_outward_distances_origin_and_gradient():
    x = torch.tensor([[0.3, -0.4, 0.1], [0.0, 0.0, 0.0], [0.999999, 0.0, 0.0]], dtype=torch.float64)
    y = poincare.move_outward(x, 3.0, c=1.0)
    d0x, d0y = poincare.distance_to_origin(x, c=1.0), poincare.distance_to_origin(y, c=1.0)
    np.testing.assert_allclose((d0y - d0x)[[0, 2]].numpy(), 3.0, rtol=1e-9)
    np.testing.assert_allclose(poincare.dist(x, y, c=1.0)[[0, 2]].numpy(), 3.0, rtol=1e-9)
    assert torch.equal(y[1], x[1])  # the origin has no ray
    xg = x[[0, 2]].clone().requires_grad_(True)
    poincare.move_outward(xg, 3.0, c=1.0).sum().backward()
    assert torch.isfinite(xg.grad).all()


# ---------------------------------------------------------------- the placement


def _brute_children_hold(labels, name: str, x: np.ndarray) -> bool:
    tax = labels.taxonomy
    P = labels.embeddings.numpy()
    return any(
        float(cones.membership_margin_np(P[tax.index(k)], x, CAP, c=1.0)) >= 0
        for k in tax.children(name)
    )


@pytest.mark.parametrize("dim", [3, 6])
def test_placed_points_are_in_their_nodes_cone_and_no_childs(dim):
    tax = hand_tree()
    labels = cap_labels(tax, dim=dim)
    seen = ["puppy", "kitten", "bird", "hammer", "saw"]
    pl = ConePlacement(labels, seen)
    rng = np.random.default_rng(1)
    # head outputs on every side of every label point, near and far, some near the boundary
    P = labels.embeddings
    z = []
    for j in range(len(tax)):
        for scale in (0.05, 0.5, 2.0):
            v = torch.from_numpy(rng.standard_normal((6, dim)) * scale)
            z.append(poincare.mobius_add(P[j].expand_as(v), poincare.expmap0(v, c=1.0), c=1.0))
    z = torch.cat(z)
    x, names = pl.place(z)
    Pn = P.numpy()
    for xi, name in zip(x.numpy(), names, strict=True):
        assert float(cones.membership_margin_np(Pn[tax.index(name)], xi, CAP, c=1.0)) >= 0
        assert not _brute_children_hold(labels, name, xi)
        # inside every ancestor's cone too (a tree: nested caps)
        for a in tax.ancestors(name):
            assert float(cones.membership_margin_np(Pn[tax.index(a)], xi, CAP, c=1.0)) >= 0
    assert set(names) <= {n for n in tax.names if class_membership(tax, [n], seen).sum() > 0}


def test_backoff_choice_confident_and_hesitant():
    tax = hand_tree()
    seen = ["puppy", "kitten", "bird"]
    cand = ["thing", "animal", "dog", "cat", "puppy", "kitten", "bird"]
    member = class_membership(tax, cand, seen)
    depth = torch.tensor([tax.depth(n) for n in cand], dtype=torch.float64)
    d_cand = torch.zeros(2, len(cand))
    # confident puppy; then split between puppy and kitten (common ancestor: animal)
    d_seen = torch.tensor([[0.0, 9.0, 9.0], [1.0, 1.0, 9.0]], dtype=torch.float64)
    got = backoff_choice(d_seen, d_cand.double(), member, depth)
    assert [cand[i] for i in got.tolist()] == ["puppy", "animal"]


def test_classifier_posterior_picks_the_node_from_the_features():
    """With a classifier the posterior is the softmax of its logits on the features: a
    point at puppy's label point whose features say kitten goes to kitten; without
    features (or without a classifier) the distances decide. A classifier that does not
    fit the trained classes is refused."""
    tax = hand_tree()
    labels = cap_labels(tax, dim=4)
    seen = ["puppy", "kitten", "bird"]
    w, b = 8.0 * torch.eye(3, dtype=torch.float32), torch.zeros(3)
    pl = ConePlacement(labels, seen, classifier=(w, b))
    z = labels.embeddings[[tax.index("puppy")] * 3]
    feats = torch.eye(3)[[1, 0, 2]]  # kitten, puppy, bird
    assert [pl.names[r] for r in pl.choose(z, feats).tolist()] == ["kitten", "puppy", "bird"]
    assert [pl.names[r] for r in pl.choose(z).tolist()] == ["puppy"] * 3
    want = torch.softmax(feats.double() @ w.double().T, dim=1)
    torch.testing.assert_close(pl.posterior(torch.zeros(3, 3), feats), want)
    # hesitant features (kitten and puppy alike): the mass rule's common ancestor, animal
    hesitant = torch.tensor([[1.0, 1.0, 0.0]])
    assert pl.names[int(pl.choose(z[:1], hesitant)[0])] == "animal"
    x, names = pl.place(z, feats)
    Pn = labels.embeddings.numpy()
    for xi, name in zip(x.numpy(), names, strict=True):
        assert float(cones.membership_margin_np(Pn[tax.index(name)], xi, CAP, c=1.0)) >= 0
    with pytest.raises(ValueError, match="do not fit 3 trained classes"):
        ConePlacement(labels, seen, classifier=(torch.zeros(2, 3), torch.zeros(2)))


def test_placement_refuses_ganea_labels():
    labels = cap_labels(hand_tree())
    labels.cone = cones.cone_spec("ganea", K=0.1)
    with pytest.raises(ValueError, match="cap family"):
        ConePlacement(labels, ["puppy"])
    with pytest.raises(ValueError, match="depth > margin"):
        PlacementConfig(depth=0.5, margin=0.5).validate()


def test_placement_keeps_nearest_neighbours_within_a_class():
    """Points around one label point keep their order of distance to it (seen from
    each one's anchor: moved outward by its certainty), and surer points lie deeper,
    where the label's cone holds them more firmly."""
    from models.vision.placement import certainty

    tax = Taxonomy.from_edges([("a", "r"), ("b", "r")])
    labels = cap_labels(tax, dim=4)
    P = labels.embeddings
    a = P[tax.index("a")]
    v = torch.from_numpy(np.random.default_rng(2).standard_normal((40, 4)) * 0.3)
    z = poincare.mobius_add(a.expand_as(v), poincare.expmap0(v, c=1.0), c=1.0)
    before = poincare.dist(a.expand_as(z), z, c=1.0).numpy()
    flat = ConePlacement(labels, ["a", "b"], PlacementConfig(certainty_depth=0.0))
    x, names = flat.place(z)
    assert set(names) == {"a"}
    anchor = flat.anchors[flat.names.index("a")]
    after = poincare.dist(anchor.expand_as(x), x, c=1.0).numpy()
    assert (np.argsort(before) == np.argsort(after)).all()
    assert after.max() < 3.0 - 0.5

    pl = ConePlacement(labels, ["a", "b"])
    assert pl.cfg.certainty_depth > 0
    x, names = pl.place(z)
    assert set(names) == {"a"}
    rows, info = pl.decide(z)
    sure = certainty((info["post"] * pl.member[rows]).sum(1))
    assert float(sure.max() - sure.min()) > 0.05  # the points differ in certainty
    own = poincare.move_outward(anchor.expand_as(x), pl.cfg.certainty_depth * sure[:, None], c=1.0)
    after = poincare.dist(own, x, c=1.0).numpy()
    assert (np.argsort(before) == np.argsort(after)).all()
    firm = cones.membership_margin_np(a.numpy(), x.numpy(), pl.spec, c=1.0)
    assert (firm >= 0).all()
    order = np.argsort(sure.numpy())
    assert firm[order[-10:]].mean() > firm[order[:10]].mean()  # surest: firmest


# ---------------------------------------------------------------- a trained model


def test_placement_merit_prefers_meeting_both_aims_then_more_at_their_class():
    from models.training.validation import PLACEMENT_IN_CLASS, PLACEMENT_OTHER

    ok = {"val_in_class": PLACEMENT_IN_CLASS, "val_other": PLACEMENT_OTHER}
    more_but_leaky = {"val_in_class": 0.95, "val_other": PLACEMENT_OTHER + 0.01}
    assert placement_merit(ok) > placement_merit(more_but_leaky)
    assert placement_merit(ok | {"val_in_class": 0.93}) > placement_merit(ok)
    assert placement_merit(more_but_leaky) > placement_merit(more_but_leaky | {"val_in_class": 0.9})


def test_trained_model_with_placement_lands_inside_class_cones(fm_cap, tmp_path):
    from models.vision.image_model import load_model

    labels, data, test = fm_cap
    model = tiny_train(labels, data, placement="cones")
    assert model.places_in_cones
    # calibrated on the validation split at the end of training (models.vision.placement.calibrate)
    assert set(model.config["placement_radii"]) == set(model.seen_classes)
    assert 0 <= model.config["placement_confidence"] <= 1
    assert model.placement.cfg.novelty == 1.0 and torch.isfinite(model.placement.radius).all()
    assert set(model.metrics["placement"]) == {"confidence", "val_in_class", "val_other"}
    # the auxiliary classifier is kept for the posterior (the default) where it places at
    # least as many validation images at their class as the distances do; in these short
    # runs it lags behind the head, and the distances decide
    shares, other = model.metrics["placement_val_in_class"], model.metrics["placement_val_other"]
    merit = {k: placement_merit({"val_in_class": shares[k], "val_other": other[k]}) for k in other}
    kept = merit["classifier"] >= merit["distance"]
    assert model.config["placement_posterior"] == ("classifier" if kept else "distance")
    assert (model.classifier is not None) == kept == (model.placement.classifier is not None)
    assert (
        model.metrics["placement"]["val_in_class"] == shares["classifier" if kept else "distance"]
    )
    placed = in_class_share(model, labels, test)
    model.config["placement"] = "none"
    model._placement = None
    raw = in_class_share(model, labels, test)
    assert placed >= raw + 0.3, (raw, placed)
    model.config["placement"] = "cones"
    model._placement = None
    path = tmp_path / "m.safetensors"
    model.save(path)
    again = load_model(path)
    assert again.placement is not None
    assert torch.equal(again.embed(test.images[:50]), model.embed(test.images[:50]))


def test_flip_training_embeds_the_mean_of_an_image_and_its_mirror(fm_cap):
    """Training with flips (augment "flip", an option) embeds the mean of an image's and its
    mirror image's features: a mirrored image embeds the same. The default trains without
    augmentation and has no flip average."""
    from models.training.config import TrainConfig

    labels, data, test = fm_cap
    cfg = TrainConfig().resolved()
    assert (cfg.augment, cfg.tta) == ("none", False)
    assert TrainConfig(augment="flip").resolved().tta is True
    assert TrainConfig(augment="shift").resolved().tta is False
    model = tiny_train(labels, data, placement="cones", epochs=1, augment="flip")
    assert model.tta and model.config["augment"] == "flip"
    imgs = test.images[:40]
    f = model.features(imgs)
    model.config["tta"] = False
    plain, mirror = model.features(imgs), model.features(imgs[:, :, ::-1].copy())
    model.config["tta"] = True
    torch.testing.assert_close(f, (plain + mirror) / 2, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(model.features(imgs[:, :, ::-1].copy()), f, rtol=1e-5, atol=1e-5)
    # the placement's posterior and novelty see these features: embed uses them too
    z = model.embed(imgs)
    torch.testing.assert_close(model.embed(imgs[:, :, ::-1].copy()), z, rtol=1e-4, atol=1e-6)


def test_placement_posterior_distance_keeps_no_classifier(fm_cap):
    labels, data, test = fm_cap
    model = tiny_train(labels, data, placement="cones", placement_posterior="distance", epochs=1)
    assert model.classifier is None and model.placement.classifier is None
    assert model.config["placement_posterior"] == "distance"
    # without the auxiliary classifier there is nothing to keep: the distances decide
    model = tiny_train(labels, data, placement="cones", aux=0.0, epochs=1)
    assert model.classifier is None and model.config["placement_posterior"] == "distance"


def test_placement_needs_cap_labels_at_train_time(fm_cap):
    from models.training.config import TrainError

    labels, data, _ = fm_cap
    ganea = cap_labels(labels.taxonomy, dim=labels.dim)
    ganea.embeddings = labels.embeddings
    ganea.cone = cones.cone_spec("ganea", K=0.1)
    with pytest.raises(TrainError, match="cap family"):
        tiny_train(ganea, data, placement="cones", epochs=1)


def test_a_held_out_class_lands_under_its_parent_more_often_than_chance(fm_cap):
    """Sandal held out: its images are placed in shoe's cone (sandal's parent; gym shoe,
    the other shoe, is trained) far more often than the images of other classes are."""
    labels, data, test = fm_cap
    # the posterior's back-off alone (the feature novelty rule, on by default with a
    # holdout, sends a tenth of every class to sandal's cone: tests/models/test_novelty.py)
    model = tiny_train(labels, data, placement="cones", holdout=["sandal.n.01"], novelty_rate=0.0)
    tax = labels.taxonomy
    z = model.embed(test.images).numpy()
    shoe = labels.embeddings.numpy()[tax.index("shoe.n.01")]
    under = cones.membership_margin_np(shoe, z, CAP, c=1.0) >= 0
    nodes = np.array([test.classes[t][1] for t in test.targets])
    held = nodes == "sandal.n.01"
    # chance: the images of the classes that are neither shoes nor boots (the other footwear)
    others = ~np.isin(nodes, ["sandal.n.01", "gym_shoe.n.01", "boot.n.01"])
    assert held.sum() >= 20 and others.sum() >= 100
    # measured: 0.28 against 0.0 (the rest of the sandals go to footwear, the common ancestor
    # of the gym shoe and the boot they hesitate between: the grandparent)
    assert under[held].mean() > max(0.05, 3 * under[others].mean()), (
        under[held].mean(),
        under[others].mean(),
    )


# ---------------------------------------------------------------- back-offs (confidence, novelty)


def test_confidence_backoff_sends_a_hesitant_class_to_its_cone_parent():
    """puppy and kitten trained: a point between them (gap ~0) goes to the parent of its
    top class under confidence 0.5, and stays at its class under confidence 0; a point
    at its class keeps it either way. The placed point is in the parent's cone, in no
    class's."""
    tax = hand_tree()
    labels = cap_labels(tax, dim=4)
    seen = ["puppy", "kitten"]
    P = labels.embeddings
    a, b = P[tax.index("puppy")], P[tax.index("kitten")]
    between = poincare.expmap(a, 0.49 * poincare.logmap(a, b, c=1.0), c=1.0)[None]  # puppy's side
    at = P[tax.index("puppy")][None]
    z = torch.cat([between, at])
    plain = ConePlacement(labels, seen, PlacementConfig(threshold=0.9))
    strict = ConePlacement(labels, seen, PlacementConfig(threshold=0.5, confidence=0.5))
    loose = ConePlacement(labels, seen, PlacementConfig(threshold=0.5))
    rows, info = strict.decide(z)
    assert info["top"].tolist() == [0, 0]
    assert float(info["gap"][0]) < 0.5 and float(info["gap"][1]) > 0.9
    got = [strict.names[r] for r in rows.tolist()]
    assert got == ["dog", "puppy"] and info["backed"].tolist() == [True, False]
    assert [loose.names[r] for r in loose.choose(z).tolist()] == ["puppy", "puppy"]
    assert plain.names[int(plain.choose(z)[0])] == "animal"  # the mass rule: the common ancestor
    x, names = strict.place(z)
    Pn = P.numpy()
    assert float(cones.membership_margin_np(Pn[tax.index(names[0])], x[0].numpy(), CAP, c=1.0)) >= 0
    for k in seen:
        assert float(cones.membership_margin_np(Pn[tax.index(k)], x[0].numpy(), CAP, c=1.0)) < 0


def test_novelty_backoff_and_calibration_on_validation_points():
    """Per-class radii are the validation quantile of the distances to the class; a point
    of a class farther than novelty x radius backs off to the class's cone parent; the
    calibrated confidence meets the shares it reports."""
    from models.vision.placement import calibrate

    tax = hand_tree()
    labels = cap_labels(tax, dim=4)
    seen = ["puppy", "kitten", "bird", "hammer", "saw"]
    z = torch.cat([around(labels, n, 60, 0.6, seed=i) for i, n in enumerate(seen)])
    classes = [n for n in seen for _ in range(60)]
    pl = ConePlacement(labels, seen)
    got = calibrate(pl, z, classes, quantile=0.9)
    d = poincare.dist(labels.embeddings[tax.index("bird")].expand(60, -1), z[120:180], c=1.0)
    assert got["radii"]["bird"] == pytest.approx(float(torch.quantile(d, 0.9)))
    assert got["val_in_class"] >= 0.9 or got["confidence"] == 0.0
    g, ok, bad = next(t for t in got["grid"] if t[0] == got["confidence"])
    assert (ok, bad) == (got["val_in_class"], got["val_other"])
    # novelty: a bird image far from the bird (3 radii) goes to bird's parent, animal
    far = around(labels, "bird", 200, 4.0, seed=9)
    dist = poincare.dist(labels.embeddings[tax.index("bird")].expand(200, -1), far, c=1.0)
    cfg = PlacementConfig(novelty=1.0)
    nov = ConePlacement(labels, seen, cfg, radii=got["radii"])
    rows, info = nov.decide(far)
    base = pl.choose(far)
    is_bird = base == pl.names.index("bird")
    beyond = (dist > got["radii"]["bird"]) & is_bird
    assert beyond.sum() >= 20
    assert all(nov.names[r] == "animal" for r in rows[beyond].tolist())
    inside = (dist <= got["radii"]["bird"]) & is_bird & (info["gap"] >= 0)
    assert all(nov.names[r] == "bird" for r in rows[inside].tolist())
