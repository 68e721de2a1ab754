"""Feature novelty (models.vision.novelty) and the placement's zero-shot rule built on it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from models.geometry import cones, poincare
from models.training.evaluate import auroc
from models.vision.novelty import FeatureNovelty
from models.vision.placement import ConePlacement
from tests.support.cones import CAP, around, assert_placed_at, cap_labels, hand_tree, tiny_train


def _clusters(seed: int, n: int = 200, dim: int = 16, k: int = 3):
    """Gaussian classes around random directions, and their labels."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((k + 1, dim)) * 3
    x = np.concatenate([centres[j] + rng.standard_normal((n, dim)) for j in range(k + 1)])
    y = np.repeat(np.arange(k + 1), n)
    return torch.from_numpy(x), torch.from_numpy(y)


def _brute(features: np.ndarray, fit_x: np.ndarray, fit_y: np.ndarray) -> np.ndarray:
    """Independent float64: per class, (u - mu_k)^T inv(cov) (u - mu_k) with loops."""

    def unit(a):
        return a / np.linalg.norm(a, axis=1, keepdims=True)

    u, fu = unit(features), unit(fit_x)
    ks = sorted(set(fit_y.tolist()))
    mus = {k: fu[fit_y == k].mean(0) for k in ks}
    r = np.concatenate([fu[fit_y == k] - mus[k] for k in ks])
    cov = r.T @ r / len(r) + 1e-6 * np.eye(fu.shape[1])
    inv = np.linalg.inv(cov)
    out = []
    for row in u:
        out.append(min(float((row - mus[k]) @ inv @ (row - mus[k])) for k in ks))
    return np.array(out)


def test_scores_match_an_independent_computation():
    x, y = _clusters(0)
    keep = y < 3
    nov = FeatureNovelty.fit(x[keep], y[keep])
    got = nov.scores(x).numpy()
    want = _brute(x.numpy(), x[keep].numpy(), y[keep].numpy())
    np.testing.assert_allclose(got, want, rtol=1e-8, atol=1e-8)
    # unit-length features: the scale of a feature vector does not matter
    np.testing.assert_allclose(nov.scores(x * 7.5).numpy(), got, rtol=1e-9, atol=1e-9)
    assert nov.scores(torch.zeros(0, x.shape[1])).shape == (0,)


def test_a_class_never_fitted_scores_higher():
    x, y = _clusters(1)
    keep = y < 3
    nov = FeatureNovelty.fit(x[keep], y[keep])
    s = nov.scores(x).numpy()
    assert auroc(s[~keep.numpy()], s[keep.numpy()]) > 0.95


def test_calibration_calls_the_asked_share_novel_and_refuses_bad_input():
    x, y = _clusters(2)
    keep = y < 3
    nov = FeatureNovelty.fit(x[keep], y[keep])
    val = x[keep] + 0.3 * torch.randn(
        int(keep.sum()), x.shape[1], generator=torch.Generator().manual_seed(0), dtype=torch.float64
    )
    for rate in (0.05, 0.1, 0.3):
        nov.calibrate(val, rate)
        share = float(nov.novel(val).double().mean())
        assert abs(share - rate) <= 2 / len(val), (rate, share)
    nov.calibrate(val, 0.0)
    assert nov.threshold == float("inf") and not bool(nov.novel(x).any())
    with pytest.raises(ValueError, match="novelty rate"):
        nov.calibrate(val, 1.0)
    with pytest.raises(ValueError, match="every class"):
        FeatureNovelty.fit(x[:10], torch.tensor([0] * 5 + [2] * 5))
    with pytest.raises(ValueError, match="do not fit"):
        FeatureNovelty(torch.zeros(3, 4), torch.eye(5), 1.0)


class _Fixed:
    """A novelty rule whose verdicts are given (the placement's part is under test)."""

    def __init__(self, flags):
        self.flags = torch.as_tensor(flags)

    def novel(self, features):
        return self.flags[: len(features)]


def test_novel_points_go_to_the_unseen_class_nearest_their_posterior():
    """puppy, kitten, hammer trained; bird and saw declared unseen. A novel point at the
    kitten (a cat: nearest unseen class by the label points, bird, an animal) goes to
    bird's cone, one at the hammer to saw's; a point not called novel keeps its class.
    The placed points lie inside the unseen class's cone and no child's."""
    tax = hand_tree()
    labels = cap_labels(tax, dim=4)
    seen, unseen = ["puppy", "kitten", "hammer"], ["bird", "saw"]
    z = torch.cat([around(labels, "kitten", 3, 0.05), around(labels, "hammer", 3, 0.05)])
    flags = [True, True, False, True, True, False]
    pl = ConePlacement(labels, seen, unseen=unseen, feature_novelty=_Fixed(flags))
    feats = torch.zeros(len(z), 2)
    rows, info = pl.decide(z, feats)
    got = [pl.names[r] for r in rows.tolist()]
    assert got == ["bird", "bird", "kitten", "saw", "saw", "hammer"]
    assert info["unseen"].tolist() == flags
    # without features (or without the rule) nothing is novel
    assert [pl.names[r] for r in pl.choose(z).tolist()] == ["kitten"] * 3 + ["hammer"] * 3
    x, names = pl.place(z, feats)
    assert names == got
    assert_placed_at(labels, x.numpy(), names)
    # the nearest unseen class by expected label-point distance, computed independently
    d = poincare.pairwise_dist(
        labels.embeddings[[tax.index(u) for u in unseen]],
        labels.embeddings[[tax.index(s) for s in seen]],
        c=1.0,
    )
    assert d[0, 1] < d[1, 1] and d[1, 2] < d[0, 2]  # bird nearer kitten, saw nearer hammer


def test_without_declared_unseen_classes_a_novel_point_backs_off_to_the_parent():
    tax = hand_tree()
    labels = cap_labels(tax, dim=4)
    seen = ["puppy", "kitten", "bird", "hammer", "saw"]
    z = around(labels, "kitten", 4, 0.05)
    pl = ConePlacement(labels, seen, feature_novelty=_Fixed([True, False, True, False]))
    got = [pl.names[r] for r in pl.choose(z, torch.zeros(4, 2)).tolist()]
    # every node has training images: the class's cone parent
    assert got == ["cat", "kitten", "cat", "kitten"]
    with pytest.raises(ValueError, match="not in the labels' taxonomy"):
        ConePlacement(labels, seen, unseen=["whale"])


def _novel_parent_brute(tax, seen, post):
    """Independent: candidates are the nodes with no trained class at or below; a
    class's novel parent the nearest ancestor (taxonomy parents, a tree here) with a
    candidate child, strictly above the class; the destination the parent of the most
    posterior x candidates."""
    with_images = set(seen)
    for s in seen:
        with_images |= tax.ancestors(s)
    count = {n: sum(k not in with_images for k in tax.children(n)) for n in tax.names}
    out = []
    for p in post.tolist():
        score = {}
        for s, ps in zip(seen, p, strict=True):
            n = tax.parents(s)[0] if tax.parents(s) else s
            while tax.parents(n) and count[n] == 0:
                n = tax.parents(n)[0]
            score[n] = score.get(n, 0.0) + ps * count[n]
        out.append(max(score, key=score.get))
    return out


def test_novel_points_land_under_the_parent_of_the_nodes_without_images():
    """puppy, kitten and hammer trained (bird and saw have no images, nobody says they
    are unseen): a novel point near the kitten lands at animal (cat has no child without
    images; bird is one of animal's), one near the hammer at tool (saw); points not
    called novel keep their class, and each lies in its node's cone and no child's."""
    tax = hand_tree()
    labels = cap_labels(tax, dim=4)
    seen = ["puppy", "kitten", "hammer"]
    z = torch.cat([around(labels, "kitten", 3, 0.05), around(labels, "hammer", 3, 0.05)])
    flags = [True, True, False, True, True, False]
    pl = ConePlacement(labels, seen, feature_novelty=_Fixed(flags))
    assert pl.unseen == []
    feats = torch.zeros(len(z), 2)
    rows, info = pl.decide(z, feats)
    got = [pl.names[r] for r in rows.tolist()]
    assert got == ["animal", "animal", "kitten", "tool", "tool", "hammer"]
    assert info["novel"].tolist() == flags and not info["unseen"].any()
    novel = torch.tensor(flags)
    want = _novel_parent_brute(tax, seen, info["post"][novel])
    assert [g for g, f in zip(got, flags, strict=True) if f] == want
    x, names = pl.place(z, feats)
    assert names == got
    assert_placed_at(labels, x.numpy(), names)
    # a posterior split between the branches: the parent with more candidate children
    # wins for equal mass (uniform prior over the nodes without images)
    post = torch.tensor([[0.5, 0.0, 0.5], [0.9, 0.1, 0.0]], dtype=torch.float64)
    chosen = [pl.names[r] for r in pl.novel_choice(post).tolist()]
    assert chosen == _novel_parent_brute(tax, seen, post)


def test_a_novel_point_never_lands_at_its_own_class_even_when_the_class_has_kinds_without_images():
    """WordNet gives almost every class children without images (boot: cowboy boot,
    hip boot, ...). A novel image near the kitten is not a kitten: it lands above the
    kitten (at animal, the nearest node over kitten with a child without images: bird),
    not at kitten for the sake of its imageless child tabby."""
    from models.taxonomy.graph import Taxonomy

    base = hand_tree()
    edges = [(n, p) for n in base.names for p in base.parents(n)]
    tax = Taxonomy.from_edges(edges + [("tabby", "kitten"), ("claw", "hammer")])
    labels = cap_labels(tax, dim=4)
    seen = ["puppy", "kitten", "hammer"]
    z = torch.cat([around(labels, "kitten", 2, 0.05), around(labels, "hammer", 2, 0.05)])
    flags = [True, False, True, False]
    pl = ConePlacement(labels, seen, feature_novelty=_Fixed(flags))
    got = [pl.names[r] for r in pl.choose(z, torch.zeros(len(z), 2)).tolist()]
    assert got == ["animal", "kitten", "tool", "hammer"]
    rows, info = pl.decide(z, torch.zeros(len(z), 2))
    post = info["post"]
    want = _novel_parent_brute(tax, seen, post[torch.tensor(flags)])
    assert [pl.names[r] for r in rows[torch.tensor(flags)].tolist()] == want


def test_a_held_out_class_trained_with_the_novelty_rule_lands_under_its_parent(fm_cap, tmp_path):
    """A small run with sandal held out (nobody tells the placement) fits the rule (rate
    0.2 of validation), keeps it in the checkpoint, and the held-out images land at
    shoe.n.01 itself (sandal's parent: in its cone, in none of its children's) far more
    often than the trained classes' images do."""
    from models.vision.image_model import load_model

    labels, data, test = fm_cap
    # widths of 16 and 32: the narrowest encoder (8) has no features that tell sandals apart
    # (measured AUROC 0.47 against 0.87; 0.63 to 0.88 over seeds 0 to 3)
    kw = dict(placement="cones", holdout=["sandal.n.01"], widths=[16, 32, 32, 32])
    model = tiny_train(labels, data, novelty_rate=0.2, **kw)
    assert model.novelty is not None and model.config["novelty_rate"] == 0.2
    assert np.isfinite(model.config["novelty_threshold"])
    assert model.placement.unseen == []  # nobody tells the placement what is unseen
    tax = labels.taxonomy
    P = labels.embeddings.numpy()

    def at_shoe(z):
        inside = cones.membership_margin_np(P[tax.index("shoe.n.01")], z, CAP, c=1.0) >= 0
        for kid in tax.children("shoe.n.01"):
            inside &= cones.membership_margin_np(P[tax.index(kid)], z, CAP, c=1.0) < 0
        return inside

    z = model.embed(test.images).numpy()
    shoe = at_shoe(z)
    nodes = np.array([test.classes[t][1] for t in test.targets])
    held = nodes == "sandal.n.01"
    assert held.sum() >= 20
    assert shoe[held].mean() > max(0.2, 2 * shoe[~held].mean()), (
        shoe[held].mean(),
        shoe[~held].mean(),
    )
    path = tmp_path / "m.safetensors"
    model.save(path)
    again = load_model(path)
    assert again.novelty is not None and again.novelty.threshold == model.novelty.threshold
    assert torch.equal(again.embed(test.images[:64]), model.embed(test.images[:64]))
    # off (the default, --holdout or not): no rule in the model
    off = tiny_train(labels, data, **kw)
    assert off.novelty is None and "novelty_threshold" not in off.config
    z0 = off.embed(test.images).numpy()
    assert at_shoe(z0)[held].mean() < shoe[held].mean()


def test_the_default_rate_is_off_whatever_is_held_out_and_bad_rates_are_refused():
    from models.training.config import TrainConfig, TrainError

    # --holdout removes images and nothing else: it never sets the rule's rate
    assert TrainConfig(holdout=["a", "b"]).resolved_novelty_rate(10) == 0.0
    assert TrainConfig().resolved_novelty_rate(10) == 0.0
    assert TrainConfig(holdout=["a"], novelty_rate=0.05).resolved_novelty_rate(10) == 0.05
    assert TrainConfig(novelty_rate=0.1).resolved_novelty_rate(10) == 0.1
    for bad in (-0.1, 1.0):
        with pytest.raises(TrainError, match="novelty rate"):
            TrainConfig(novelty_rate=bad).validate()


def test_cli_refuses_a_bad_novelty_rate_in_one_line(tmp_path, capsys):
    from service.cli import main

    code = main(
        [
            "train",
            "--dataset",
            "fashion-mnist",
            "--labels",
            str(tmp_path / "missing.labels"),
            "--out",
            str(tmp_path / "m.safetensors"),
            "--novelty-rate",
            "1.5",
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "novelty rate" in err[0], err
