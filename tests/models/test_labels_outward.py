"""Closed subtrees moved outward (``cap_outward``, issue 33): second parents' ancestors
rank nearer, the caps hold what they held, nothing else changes where no pair is off the tree."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from models.labels import LabelTrainConfig, evaluate_cones, evaluate_reconstruction, train_labels
from models.labels.construct import _euler, _held_pairs, cap_construction, tree_plan
from models.labels.outward import closed_nodes
from models.taxonomy.graph import Taxonomy

WORDNET = "/usr/share/wordnet"


def _wordnet(root: str) -> Taxonomy:
    if not os.path.exists(f"{WORDNET}/data.noun"):
        pytest.skip("WordNet files not installed (Debian package wordnet-base)")
    return Taxonomy.from_wordnet(WORDNET, root=root)


@pytest.fixture(scope="module")
def drugs() -> Taxonomy:
    # 915 nouns under drug.n.01, 164 closure pairs reached only through a second parent
    return _wordnet("drug.n.01")


def test_outward_ranks_second_parents_nearer_and_keeps_the_cones(drugs):
    before = train_labels(drugs, LabelTrainConfig(dim=10))
    after = train_labels(drugs, LabelTrainConfig(dim=10, cap_outward=10.0))
    rb, ra = evaluate_reconstruction(before), evaluate_reconstruction(after)
    assert ra["mean_rank"] < rb["mean_rank"] - 0.2, (ra, rb)
    assert ra["map"] >= 0.97
    cb, ca = evaluate_cones(before), evaluate_cones(after)
    # the same pairs held, no more held falsely: the dilations map caps to caps
    assert ca["cone_true_positives"] == cb["cone_true_positives"]
    assert ca["cone_false_positives"] <= cb["cone_false_positives"]
    info = after.metrics["construction"]
    assert info["outward_moved"] > 0 and info["outward_mean_push"] > 1.0
    assert info["max_radius"] <= 32.0 + 1e-9
    rho = 2 * torch.atanh(after.embeddings.norm(dim=1))
    # (radii read back from float64 norms near 32 are good to about 0.01)
    assert float(rho.max()) <= 32.05 and torch.isfinite(after.embeddings).all()


def _forked(chain: bool = False) -> Taxonomy:
    """Three 4-ary trees of depth 4 under one root; 32 leaves of the first get a second
    parent three levels deep in one of the others (1,024 nodes, 4,907 closure pairs);
    with ``chain``, 16 leaves of the first get the same second parent ``B.0.0.0``."""
    edges = []

    def grow(name: str, depth: int) -> None:
        for i in range(4 if depth else 0):
            edges.append((f"{name}.{i}", name))
            grow(f"{name}.{i}", depth - 1)

    for b in "ABC":
        edges.append((b, "r"))
        grow(b, 4)
    for i in range(4):
        for j in range(4):
            if chain:
                edges.append((f"A.{i}.{j}.1.3", "B.0.0.0"))
                continue
            edges.append((f"A.{i}.{j}.0.0", f"B.{j}.{i}.1"))
            edges.append((f"A.{j}.{i}.2.1", f"C.{i}.{j}.3"))
    return Taxonomy.from_edges(edges)


def test_subtrees_shrunk_towards_their_partners_rank_better_and_keep_the_cones():
    from models.geometry import cones
    from models.labels import LabelEmbedding

    tax = _forked()
    spec = cones.cone_spec("cap")
    got = {}
    for toward in (0.0, 0.98):
        placed = cap_construction(tax, 5, outward=10.0, toward=toward, widen=0.0)
        emb = LabelEmbedding(tax, placed.points, 1.0, cone=spec)
        got[toward] = (evaluate_reconstruction(emb), evaluate_cones(emb), placed.info)
    (r0, c0, _), (r1, c1, info) = got[0.0], got[0.98]
    # towards the root's direction: 1.61; towards the second parents' side: 1.54
    assert r1["mean_rank"] < r0["mean_rank"] - 0.03, (r1, r0)
    assert r1["map"] >= r0["map"]
    assert c1["cone_true_positives"] == c0["cone_true_positives"]
    assert c1["cone_false_positives"] <= c0["cone_false_positives"]
    assert info["outward_toward"] == 0.98 and info["max_radius"] <= 32.0 + 1e-9


def test_widening_open_children_keeps_the_caps_nested_and_grows_them():
    from models.geometry import cones
    from models.labels import LabelEmbedding
    from models.labels.outward import crossing_pairs, widen_open

    tax = _forked(chain=True)
    placed = cap_construction(tax, 5)
    tree = placed.tree_parent
    _, order, _ = tree_plan(tax, general=True)
    e = tax.closure_edges()
    held, _ = _held_pairs(tree, order, e)
    tin, tout = _euler(tree, order)
    crossing = crossing_pairs(tree, tin, tout, e[~held])
    assert np.array_equal(crossing == 0, closed_nodes(tree, tin, tout, e[~held]))
    x = placed.points.numpy()
    nrm = np.linalg.norm(x, axis=1)
    dirs = x / np.maximum(nrm, 1e-300)[:, None]
    new_dirs, rho, info = widen_open(
        dirs, placed.radius, tree, order, crossing, tin, tout,
        theta0=2.5, beta=0.5, share=1.0, max_radius=32.0,
    )  # fmt: skip
    assert info["widened"] > 0
    spec = cones.cone_spec("cap")
    pts = torch.from_numpy(new_dirs * np.tanh(rho / 2)[:, None])
    before = evaluate_cones(LabelEmbedding(tax, placed.points, 1.0, cone=spec))
    after = evaluate_cones(LabelEmbedding(tax, pts, 1.0, cone=spec))
    assert after["cone_true_positives"] == before["cone_true_positives"]
    assert after["cone_false_positives"] <= before["cone_false_positives"]
    # an open node's only open child comes inward; the closed children go out
    par = np.maximum(tree, 0)
    under = (tree >= 0) & (crossing[par] > 0) & (placed.radius[par] > 0)
    n_open = np.bincount(par[under & (crossing > 0)], minlength=len(tree))
    only = under & (crossing > 0) & (n_open[par] == 1)
    grow = placed.radius - rho
    assert only.sum() >= 3 and grow[only].min() > 0.5, grow[only]
    assert grow[under & (crossing == 0)].mean() < -0.5


def test_widening_ranks_second_parents_nearer(drugs):
    from models.geometry import cones
    from models.labels import LabelEmbedding

    spec = cones.cone_spec("cap")
    got = {}
    for widen in (0.0, 0.6):
        placed = cap_construction(drugs, 10, outward=20.0, widen=widen)
        emb = LabelEmbedding(drugs, placed.points, 1.0, cone=spec)
        got[widen] = (evaluate_reconstruction(emb), evaluate_cones(emb), placed.info)
    (r0, c0, _), (r1, c1, info) = got[0.0], got[0.6]
    assert r1["mean_rank"] < r0["mean_rank"] - 0.03, (r1, r0)  # 1.22 -> 1.14
    assert r1["map"] >= 0.97 and info["outward_widened"] > 0
    assert c1["cone_true_positives"] == c0["cone_true_positives"]
    assert c1["cone_false_positives"] <= c0["cone_false_positives"]


def test_closed_nodes_are_those_holding_no_outside_nodes_second_ancestor():
    # z has two parents, b (tree) and c: c's branch holds an ancestor of z off the tree
    edges = [("a", "r"), ("c", "r"), ("b", "a"), ("z", "b"), ("z", "c"), ("y", "c")]
    edges += [("x", "a"), ("w", "x")]
    tax = Taxonomy.from_edges(edges)
    tree, order, _ = tree_plan(tax, general=True)
    e = tax.closure_edges()
    held, _ = _held_pairs(tree, order, e)
    tin, tout = _euler(tree, order)
    closed = closed_nodes(tree, tin, tout, e[~held])
    name = dict(zip(tax.names, closed.tolist(), strict=True))
    off = {(tax.names[u], tax.names[a]) for u, a in e[~held].tolist()}
    (u, a) = next(iter(off))
    assert name[a] is False  # the second parent's side holds an outside node's ancestor
    assert name["w"] and name["x"] and name["y"]  # nothing points into these
    assert name["z"]  # a leaf is closed


def test_no_pair_off_the_tree_leaves_the_ranks_and_cones_as_they_were():
    # a tree: every subtree is closed and moves, the ranks and cones stay exact
    edges = [(f"n{i}", f"n{(i - 1) // 3}") for i in range(1, 121)]
    tax = Taxonomy.from_edges(edges)
    plain = cap_construction(tax, 5)
    moved = cap_construction(tax, 5, outward=10.0)
    from models.geometry import cones
    from models.labels import LabelEmbedding

    spec = cones.cone_spec("cap")
    for placed in (plain, moved):
        emb = LabelEmbedding(tax, placed.points, 1.0, cone=spec)
        r, c = evaluate_reconstruction(emb), evaluate_cones(emb)
        assert r["mean_rank"] == 1.0 and r["map"] == 1.0
        assert c["cone_precision"] == 1.0 and c["cone_recall"] == 1.0
    assert moved.info["max_radius"] > plain.info["max_radius"] + 5


def test_outward_is_deterministic_and_checks_its_options(drugs):
    a = cap_construction(drugs, 5, outward=10.0, seed=2)
    b = cap_construction(drugs, 5, outward=10.0, seed=2)
    assert torch.equal(a.points, b.points)
    assert np.array_equal(a.radius, b.radius)
    with pytest.raises(ValueError, match="outward"):
        cap_construction(drugs, 5, outward=-1.0)
    with pytest.raises(ValueError, match="max_radius"):
        cap_construction(drugs, 5, outward=1.0, max_radius=40.0)
    with pytest.raises(ValueError, match="toward"):
        cap_construction(drugs, 5, outward=1.0, toward=1.0)
    with pytest.raises(ValueError, match="widen"):
        cap_construction(drugs, 5, outward=1.0, widen=-0.1)
    with pytest.raises(ValueError, match="cap_outward"):
        LabelTrainConfig(cap_outward=float("nan")).validate()
    with pytest.raises(ValueError, match="cap_max_radius"):
        LabelTrainConfig(cap_max_radius=0.0).validate()


def test_cli_outward_option(tmp_path):
    tsv = tmp_path / "t.tsv"
    tsv.write_text("b\ta\nc\ta\nd\tb\nd\tc\ne\tb\n")
    out = tmp_path / "t.labels"
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    cmd = [sys.executable, "-m", "service.cli", "labels", "train", "--taxonomy", str(tsv)]
    bad = subprocess.run([*cmd, "--out", str(out), "--outward", "-1"], env=env,
                         capture_output=True, text=True)  # fmt: skip
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and not out.exists()
    ok = subprocess.run([*cmd, "--out", str(out), "--outward", "5", "--quiet"], env=env,
                        capture_output=True, text=True)  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    from models.labels import LabelEmbedding

    emb = LabelEmbedding.load(out)
    assert emb.metrics["construction"]["outward"] == 5.0
