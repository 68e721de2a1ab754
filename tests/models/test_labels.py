"""Label embeddings: training, evaluation, checkpoints, resuming."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from models.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from models.geometry import cones
from models.labels import (
    LabelEmbedding,
    LabelTrainConfig,
    evaluate_cones,
    evaluate_reconstruction,
    hierarchical_start,
    train_labels,
)
from models.taxonomy.graph import Taxonomy

WORDNET = "/usr/share/wordnet"


def small_tree() -> Taxonomy:
    """A 3-level tree with one node of two parents."""
    edges = [("a", "root"), ("b", "root"), ("c", "root")]
    for p in "abc":
        for i in range(4):
            edges.append((f"{p}{i}", p))
            for j in range(3):
                edges.append((f"{p}{i}_{j}", f"{p}{i}"))
    edges.append(("a0_0", "b"))  # multiple inheritance
    return Taxonomy.from_edges(edges)


@pytest.fixture(scope="module")
def mammals() -> Taxonomy:
    import os

    if not os.path.exists(f"{WORDNET}/data.noun"):
        pytest.skip("WordNet files not installed (Debian package wordnet-base)")
    return Taxonomy.from_wordnet(WORDNET, root="mammal.n.01")


@pytest.fixture(scope="module")
def mammal_embedding(mammals) -> LabelEmbedding:
    return train_labels(mammals, LabelTrainConfig(epochs=12, burnin=2, seed=3, init="hierarchical"))


# ------------------------------------------------------------------ evaluation


def _dist64(x: np.ndarray, y: np.ndarray, c: float) -> float:
    """Independent float64 distance: arcosh form of the contract."""
    sq = float(((x - y) ** 2).sum())
    a = 1 - c * float((x * x).sum())
    b = 1 - c * float((y * y).sum())
    return math.acosh(1 + 2 * c * sq / (a * b)) / math.sqrt(c)


def _brute_reconstruction(emb: LabelEmbedding, tax: Taxonomy):
    x = emb.embeddings.numpy()
    n = len(tax)
    ranks, aps = [], []
    for u in range(n):
        anc = set(tax.ancestor_ids(u).tolist())
        if not anc:
            continue
        d = np.array([_dist64(x[u], x[v], emb.curvature) for v in range(n)])
        negatives = [v for v in range(n) if v != u and v not in anc]
        for v in anc:
            ranks.append(1 + sum(d[w] < d[v] for w in negatives))
        # average precision of the ancestors in the ranking of all other nodes
        order = sorted((v for v in range(n) if v != u), key=lambda v: d[v])
        hits, precisions = 0, []
        for k, v in enumerate(order, 1):
            if v in anc:
                hits += 1
                precisions.append(hits / k)
        aps.append(np.mean(precisions))
    return float(np.mean(ranks)), float(np.mean(aps))


def test_reconstruction_metrics_match_brute_force():
    tax = small_tree()
    gen = torch.Generator().manual_seed(0)
    pts = (torch.rand(len(tax), 3, generator=gen, dtype=torch.float64) - 0.5) * 1.2
    emb = LabelEmbedding(tax, pts, curvature=1.0)
    got = evaluate_reconstruction(emb, chunk=7)
    mean_rank, mean_ap = _brute_reconstruction(emb, tax)
    assert got["nodes"] == len(tax)
    assert got["edges"] == len(tax.closure_edges())
    assert got["mean_rank"] == pytest.approx(mean_rank, rel=1e-12)
    assert got["map"] == pytest.approx(mean_ap, rel=1e-12)
    assert got["map"] < 0.9  # random points do not reconstruct the tree


def test_cone_metrics_match_brute_force():
    tax = small_tree()
    emb = LabelEmbedding(tax, hierarchical_start(tax, 3, seed=1, step=0.7), curvature=1.0)
    got = evaluate_cones(emb, chunk=5, tol=0.2)
    x = emb.embeddings
    truth = {(int(v), int(u)) for u, v in tax.closure_edges()}
    tp = fp = 0
    for v in range(len(tax)):
        for u in range(len(tax)):
            if u == v:
                continue
            inside = float(cones.cone_energy(x[v], x[u], c=1.0, K=0.1)) <= 0.2
            tp += inside and (v, u) in truth
            fp += inside and (v, u) not in truth
    p = tp / max(tp + fp, 1)
    r = tp / len(truth)
    assert got["cone_precision"] == pytest.approx(p)
    assert got["cone_recall"] == pytest.approx(r)
    assert 0 < got["cone_recall"]


def test_curvature_scales_but_keeps_ranks():
    tax = small_tree()
    pts = hierarchical_start(tax, 4, seed=2)
    a = evaluate_reconstruction(LabelEmbedding(tax, pts, 1.0))
    b = evaluate_reconstruction(LabelEmbedding(tax, pts / math.sqrt(2.5), 2.5))
    assert a["map"] == pytest.approx(b["map"], rel=1e-9)
    assert a["mean_rank"] == pytest.approx(b["mean_rank"], rel=1e-9)


# ------------------------------------------------------------------ training


def test_hierarchical_start_follows_depth_and_parents():
    tax = small_tree()
    x = hierarchical_start(tax, 5, seed=0)
    norms = x.norm(dim=-1)
    assert float(norms[tax.index("root")]) == 0.0
    for name in tax.names:
        for p in tax.parents(name):
            if tax.depth(p) < tax.depth(name):
                assert norms[tax.index(name)] > norms[tax.index(p)]
    # a grandchild points closer to its grandparent's direction than to another branch
    d = x / norms.clamp_min(1e-12)[:, None]
    cos_own = float(d[tax.index("c1_2")] @ d[tax.index("c")])
    cos_other = float(d[tax.index("c1_2")] @ d[tax.index("b")])
    assert cos_own > cos_other
    assert bool((norms < 1).all())


def test_training_lowers_loss_and_reconstructs(mammals, mammal_embedding):
    emb = mammal_embedding
    assert emb.epoch == 12
    assert emb.embeddings.dtype == torch.float64
    assert bool(torch.isfinite(emb.embeddings).all())
    assert float(emb.embeddings.norm(dim=-1).max()) < 1.0
    m = evaluate_reconstruction(emb)
    # a loose bound for a short run (the benchmark reports the real numbers)
    assert m["map"] > 0.85, m
    assert m["mean_rank"] < 5, m
    start = LabelEmbedding(mammals, hierarchical_start(mammals, 10, seed=3), 1.0)
    assert m["map"] > evaluate_reconstruction(start)["map"]


def test_training_is_reproducible():
    tax = small_tree()
    cfg = LabelTrainConfig(dim=4, epochs=4, burnin=1, batch_size=16, negatives=5, seed=7)
    a = train_labels(tax, cfg).embeddings
    b = train_labels(tax, cfg).embeddings
    c = train_labels(
        tax, LabelTrainConfig(dim=4, epochs=4, burnin=1, batch_size=16, negatives=5, seed=8)
    ).embeddings
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_resume_after_interruption_matches_uninterrupted_run(tmp_path):
    tax = small_tree()
    cfg = LabelTrainConfig(dim=4, epochs=6, burnin=2, batch_size=16, negatives=5, seed=1)
    full = train_labels(tax, cfg)
    ck = tmp_path / "labels.partial"

    def stop_after_3(epoch, loss, theta):
        if epoch == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train_labels(tax, cfg, checkpoint_path=ck, on_epoch=stop_after_3)
    partial = LabelEmbedding.load(ck)
    assert partial.epoch == 3
    assert not partial.metrics.get("finished")
    resumed = train_labels(tax, cfg, resume=partial)
    assert resumed.epoch == 6
    assert torch.equal(resumed.embeddings, full.embeddings)


def test_resume_refuses_other_options(tmp_path):
    tax = small_tree()
    cfg = LabelTrainConfig(dim=4, epochs=2, batch_size=16, negatives=5)
    emb = train_labels(tax, cfg, checkpoint_path=tmp_path / "x")
    with pytest.raises(ValueError, match="other options"):
        train_labels(tax, LabelTrainConfig(dim=4, epochs=3, batch_size=16, negatives=5), resume=emb)


def test_leaf_spread_pushes_leaves_apart():
    tax = small_tree()
    base = dict(dim=3, epochs=8, burnin=1, batch_size=8, negatives=5, seed=0, init="hierarchical")
    plain = train_labels(tax, LabelTrainConfig(**base)).embeddings
    spread = train_labels(
        tax, LabelTrainConfig(**base, leaf_spread=1.0, leaf_margin=6.0)
    ).embeddings
    from models.geometry import poincare

    leaves = torch.tensor([tax.index(x) for x in tax.leaves()])

    def mean_leaf_dist(x):
        d = poincare.pairwise_dist(x[leaves], x[leaves], c=1.0)
        return float(d.sum() / (len(leaves) * (len(leaves) - 1)))

    assert mean_leaf_dist(spread) > mean_leaf_dist(plain)


def test_cone_stage_lowers_edge_energies():
    tax = small_tree()
    base = dict(dim=3, epochs=6, burnin=1, batch_size=16, negatives=10, seed=0, init="hierarchical")
    before = train_labels(tax, LabelTrainConfig(**base))
    after = train_labels(tax, LabelTrainConfig(**base, cone_epochs=20, cone_lr=0.05))
    e = torch.from_numpy(tax.closure_edges())

    def mean_energy(emb):
        x = emb.embeddings
        return float(cones.cone_energy(x[e[:, 1]], x[e[:, 0]], c=1.0, K=0.1).mean())

    assert mean_energy(after) < mean_energy(before)
    k_min = float(cones.inner_radius(c=1.0, K=0.1))
    assert float(after.embeddings.norm(dim=-1).min()) >= k_min * (1 - 1e-9)


def test_config_validation_names_the_option():
    with pytest.raises(ValueError, match="dim"):
        LabelTrainConfig(dim=1).validate()
    with pytest.raises(ValueError, match="curvature"):
        LabelTrainConfig(curvature=-1).validate()
    with pytest.raises(ValueError, match="init"):
        LabelTrainConfig(init="zeros").validate()


# ------------------------------------------------------------------ checkpoints


def test_checkpoint_round_trip(tmp_path, mammal_embedding):
    path = tmp_path / "labels.safetensors"
    version = mammal_embedding.save(path)
    loaded = LabelEmbedding.load(path)
    assert loaded.version == version and len(version) == 64
    assert loaded.taxonomy == mammal_embedding.taxonomy
    assert loaded.names == mammal_embedding.names
    assert torch.equal(loaded.embeddings, mammal_embedding.embeddings)
    assert loaded.curvature == mammal_embedding.curvature
    assert loaded.config == mammal_embedding.config
    assert loaded.epoch == mammal_embedding.epoch


def test_truncated_foreign_and_wrong_kind_checkpoints(tmp_path):
    tax = small_tree()
    emb = LabelEmbedding(tax, hierarchical_start(tax, 3), 1.0)
    good = tmp_path / "good.safetensors"
    emb.save(good)
    data = good.read_bytes()
    for cut in (4, 100, len(data) // 2, len(data) - 1):
        bad = tmp_path / f"cut{cut}"
        bad.write_bytes(data[:cut])
        with pytest.raises(CheckpointError, match="truncated|not a checkpoint"):
            LabelEmbedding.load(bad)
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"\x00\x01not a checkpoint at all" * 10)
    with pytest.raises(CheckpointError, match="junk.bin"):
        LabelEmbedding.load(junk)
    # a valid safetensors file of another tool
    from safetensors.torch import save_file

    other = tmp_path / "other.safetensors"
    save_file({"w": torch.zeros(3)}, other)
    with pytest.raises(CheckpointError, match="not a hypsearch checkpoint"):
        LabelEmbedding.load(other)
    # the right format, the wrong kind
    model = tmp_path / "model.safetensors"
    save_checkpoint(model, "model", {"w": torch.zeros(2)}, {})
    with pytest.raises(CheckpointError, match="expected a 'labels' checkpoint"):
        LabelEmbedding.load(model)
    # a flipped byte in the body is caught by the checksum
    flipped = bytearray(data)
    flipped[-3] ^= 0xFF
    (tmp_path / "flipped").write_bytes(bytes(flipped))
    with pytest.raises(CheckpointError, match="checksum|corrupt"):
        LabelEmbedding.load(tmp_path / "flipped")
    with pytest.raises(CheckpointError, match="no such"):
        LabelEmbedding.load(tmp_path / "missing")


def test_checkpoint_never_unpickles(tmp_path):
    """A torch pickle with a payload is refused, and the payload never runs."""
    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    path = tmp_path / "evil.pt"
    torch.save({"x": Evil()}, path)
    with pytest.raises(CheckpointError):
        load_checkpoint(path)
    assert not marker.exists()


def test_export_tsv(tmp_path):
    tax = small_tree()
    emb = LabelEmbedding(tax, hierarchical_start(tax, 3), 2.0)
    out = tmp_path / "labels.tsv"
    emb.export_tsv(out)
    lines = out.read_text().splitlines()
    assert lines[0] == "# curvature=2.0 dim=3 cone=ganea K=0.1"
    assert len(lines) == len(tax) + 1
    rows = {ln.split("\t")[0]: np.array([float(v) for v in ln.split("\t")[1:]]) for ln in lines[1:]}
    for name in tax.names:
        np.testing.assert_array_equal(rows[name], emb[name].numpy())


# ------------------------------------------------------------------ cap cones


def hand_tree() -> Taxonomy:
    """A hand-made tree (no second parents): 4 levels, uneven branching."""
    edges = [("animal", "thing"), ("plant", "thing"), ("rock", "thing")]
    edges += [(f"mammal{i}", "animal") for i in range(5)] + [("bird", "animal")]
    edges += [(f"dog{i}", "mammal0") for i in range(7)] + [("cat", "mammal1")]
    edges += [("puppy", "dog0"), ("tree", "plant"), ("oak", "tree"), ("pine", "tree")]
    return Taxonomy.from_edges(edges)


def _read_export(path):
    """The exported file parsed here, by hand: header fields, names, coordinates."""
    lines = path.read_text().splitlines()
    header = dict(f.split("=", 1) for f in lines[0].lstrip("# ").split())
    names, rows = [], []
    for ln in lines[1:]:
        name, *xs = ln.split("\t")
        names.append(name)
        rows.append([float(v) for v in xs])
    return header, names, rows


def _brute_contains(header, x, y) -> tuple[bool, float]:
    """y in the cone of x by the README's cap formula, in mpmath (50 digits); and the margin."""
    import mpmath

    mpmath.mp.dps = 50
    c = mpmath.mpf(header["curvature"])
    theta0, beta = mpmath.mpf(header["theta0"]), mpmath.mpf(header["beta"])

    def theta(p):
        t = mpmath.sqrt(c) * mpmath.sqrt(sum(mpmath.mpf(v) ** 2 for v in p))
        return min(mpmath.pi, theta0 * mpmath.exp(-beta * 2 * mpmath.atanh(t)))

    nx = mpmath.sqrt(sum(mpmath.mpf(v) ** 2 for v in x))
    ny = mpmath.sqrt(sum(mpmath.mpf(v) ** 2 for v in y))
    if nx == 0 or ny == 0:
        angle = mpmath.mpf(0)
    else:
        cos = sum(mpmath.mpf(a) * mpmath.mpf(b) for a, b in zip(x, y, strict=True)) / (nx * ny)
        angle = mpmath.acos(max(-1, min(1, cos)))
    m = theta(x) - angle - theta(y)
    return m >= 0, float(m)


def test_cap_cones_of_a_hand_made_tree_nest_exactly():
    from models.labels import evaluate_cone_protocol

    tax = hand_tree()
    emb = train_labels(tax, LabelTrainConfig(dim=5))
    assert emb.cone == {"family": "cap", "theta0": 2.5, "beta": 0.5}
    assert emb.epoch == 0 and emb.metrics["finished"]
    m = evaluate_cones(emb)
    assert m["cone_precision"] == 1.0 and m["cone_recall"] == 1.0
    assert m["cone_positives"] == len(tax.closure_edges()) and m["cone_false_positives"] == 0
    assert evaluate_cone_protocol(emb)["protocol_f1"] == 1.0
    rec = evaluate_reconstruction(emb)
    assert rec["map"] == 1.0 and rec["mean_rank"] == 1.0


def test_exported_cap_cones_match_a_brute_force_of_the_formula(tmp_path):
    tax = small_tree()  # a0_0 has a second parent
    emb = train_labels(tax, LabelTrainConfig(dim=4, curvature=2.0))
    out = tmp_path / "labels.tsv"
    emb.export_tsv(out)
    header, names, rows = _read_export(out)
    assert header["cone"] == "cap" and float(header["curvature"]) == 2.0
    closure = {(tax.names[v], tax.names[u]) for u, v in tax.closure_edges().tolist()}
    tp = fp = 0
    x = torch.tensor(rows, dtype=torch.float64)
    ours = cones.pairwise_membership_margin(x, x, emb.cone, c=2.0)
    for i, a in enumerate(names):
        for j, b in enumerate(names):
            if i == j:
                continue
            inside, margin = _brute_contains(header, rows[i], rows[j])
            assert abs(float(ours[i, j]) - margin) < 1e-9
            tp += inside and (a, b) in closure
            fp += inside and (a, b) not in closure
    m = evaluate_cones(emb)
    assert (m["cone_true_positives"], m["cone_false_positives"]) == (tp, fp)
    # every closure pair but those through the second parent only: b's cap, b's ancestors
    lost = emb.metrics["construction"]["pairs_off_tree"]
    assert lost >= 1 and tp == len(closure) - lost and fp == 0
    # the sampled estimate: positives exact, no false positives to find
    s = evaluate_cones(emb, max_pairs=0, negative_sample=5000)
    assert s["cone_recall"] == m["cone_recall"] and s["cone_false_positives"] == 0
    assert s["cone_negatives_sampled"] == 5000


def test_cone_family_survives_the_checkpoint_and_old_ones_are_ganea(tmp_path):
    tax = hand_tree()
    emb = train_labels(tax, LabelTrainConfig(dim=3, cone_theta0=2.0))
    emb.save(tmp_path / "a")
    assert LabelEmbedding.load(tmp_path / "a").cone == {"family": "cap", "theta0": 2.0, "beta": 0.5}
    tensors, meta = emb.tensors_and_meta()
    del meta["cone"]
    meta["config"]["cone_K"] = 0.3
    save_checkpoint(tmp_path / "b", "labels", tensors, meta)
    assert LabelEmbedding.load(tmp_path / "b").cone == {"family": "ganea", "K": 0.3}
    meta["cone"] = {"family": "cap", "theta0": 9.0}
    save_checkpoint(tmp_path / "c", "labels", tensors, meta)
    with pytest.raises(CheckpointError, match="cone"):
        LabelEmbedding.load(tmp_path / "c")
    with pytest.raises(ValueError, match="cone stage"):
        LabelTrainConfig(cone_epochs=3).validate()


def test_tree_parent_keeps_the_most_ancestors():
    from models.labels.construct import tree_parents

    tax = Taxonomy.from_edges(
        [("a", "r"), ("b", "a"), ("c", "b"), ("x", "r"), ("leaf", "x"), ("leaf", "c")]
    )
    parent, _ = tree_parents(tax)
    assert tax.names[parent[tax.index("leaf")]] == "c"  # 4 ancestors that way, 2 the other


def test_tree_parent_folds_a_pass_through_parent_and_caps_hold_both_chains():
    """clothing.n.01's case: a node of two parents, one of them (``goods``, under
    ``trade`` under ``thing``) holding nothing but that node. The tree keeps the
    broad parent and hangs the pass-through chain inside its cap, so every
    ancestor of ``cloth`` (along both parents) holds it and its descendants."""
    from models.labels.construct import tree_plan

    edges = [("cover", "thing"), ("trade", "thing"), ("goods", "trade"), ("cloth", "cover")]
    edges += [("cloth", "goods"), ("shoe", "cover"), ("boot", "shoe"), ("sandal", "shoe")]
    edges += [(f"shirt{i}", "cloth") for i in range(4)] + [("tee", "shirt0")]
    tax = Taxonomy.from_edges(edges)
    parent, order, false_pairs = tree_plan(tax)
    up = {tax.names[i]: tax.names[p] if p >= 0 else None for i, p in enumerate(parent.tolist())}
    assert up["cloth"] == "goods" and up["goods"] == "trade" and up["trade"] == "cover"
    assert false_pairs == 2  # (cover, trade), (cover, goods)
    pos = {v: k for k, v in enumerate(order)}
    assert sorted(order) == list(range(len(tax)))
    assert all(p < 0 or pos[p] < pos[i] for i, p in enumerate(parent.tolist()))
    emb = train_labels(tax, LabelTrainConfig(dim=4))
    assert emb.metrics["construction"]["pairs_off_tree"] == 0
    assert emb.metrics["construction"]["pairs_folded"] == 2
    m = evaluate_cones(emb)
    assert m["cone_recall"] == 1.0 and m["cone_false_positives"] == 2
    x = emb.embeddings.double()
    margin = cones.pairwise_membership_margin(x, x, emb.cone, c=1.0)
    for a in ("cover", "goods", "trade", "cloth"):
        for d in ("cloth", "shirt0", "tee"):
            if a != d:
                assert float(margin[tax.index(a), tax.index(d)]) >= 0, (a, d)
    # a fold that costs more than it gains is not made: a long chain beside a leaf
    tax2 = Taxonomy.from_edges(
        [("a", "r"), ("b", "a"), ("c", "b"), ("x", "r"), ("leaf", "x"), ("leaf", "c")]
    )
    p2, _, f2 = tree_plan(tax2)
    assert tax2.names[p2[tax2.index("leaf")]] == "c" and f2 == 0
    # ties go to the parent with the most descendants (the service's chains)
    tax3 = Taxonomy.from_edges(
        [("p", "r"), ("q", "r"), ("v", "p"), ("v", "q"), ("w", "q"), ("w2", "q")]
    )
    p3, _, _ = tree_plan(tax3)
    assert tax3.names[p3[tax3.index("v")]] == "q"
