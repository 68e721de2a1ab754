"""Second parents placed one node at a time (benchmarks/_second_parents.py, issue 33):
the experiment behind docs/labels.md's account of the noun closure's rank tail."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest

from models.geometry import cones
from models.labels import LabelEmbedding, evaluate_cones, evaluate_reconstruction
from models.labels.construct import _held_pairs, cap_construction
from models.taxonomy.graph import Taxonomy

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from _second_parents import geodesic_scan, replace_leaves  # noqa: E402

WORDNET = "/usr/share/wordnet"
CAP = cones.cone_spec("cap")


def _two_branches() -> Taxonomy:
    """A sparse branch ``a`` and a dense one ``b``; ``x`` (a leaf) has a parent in each."""
    edges = [("a", "root"), ("b", "root")]
    for i in range(3):
        edges += [(f"a{i}", "a")] + [(f"a{i}{j}", f"a{i}") for j in range(2)]
    for i in range(5):
        edges.append((f"b{i}", "b"))
        for j in range(5):
            edges.append((f"b{i}{j}", f"b{i}"))
            edges += [(f"b{i}{j}{k}", f"b{i}{j}") for k in range(5)]
    return Taxonomy.from_edges([*edges, ("x", "a00"), ("x", "b00")])


def _top_down(tree):
    kids = [[] for _ in tree]
    out = []
    for i, p in enumerate(tree):
        (kids[p] if p >= 0 else out).append(i)
    h = 0
    while h < len(out):
        out.extend(kids[out[h]])
        h += 1
    return out


def test_replace_leaves_lowers_ranks_keeps_caps_nested_and_is_deterministic():
    tax = _two_branches()
    # the random sibling layout leaves x where a move to its other parent pays
    placed = cap_construction(tax, 5, seed=3, layout="random")
    pts = placed.points.numpy()
    new, tree, info = replace_leaves(tax, pts, placed.tree_parent, max_subtree=9, seed=3)
    again, tree2, info2 = replace_leaves(tax, pts, placed.tree_parent, max_subtree=9, seed=3)
    assert np.array_equal(new, again) and np.array_equal(tree, tree2) and info == info2
    assert info["tried"] == 1 and info["moved"] == 1 and info["rank_gain"] > 0
    before = evaluate_reconstruction(LabelEmbedding(tax, placed.points, 1.0, cone=CAP))
    import torch

    emb = LabelEmbedding(tax, torch.from_numpy(new), 1.0, cone=CAP)
    after = evaluate_reconstruction(emb)
    assert after["mean_rank"] < before["mean_rank"]
    # the caps hold exactly the pairs of the new spanning tree: nested, disjoint
    con = evaluate_cones(emb)
    held, _ = _held_pairs(tree, _top_down(tree), tax.closure_edges())
    assert con["cone_true_positives"] == int(held.sum())
    assert con["cone_false_positives"] == 0


def test_geodesic_scan_never_reports_worse_than_the_constructed_point():
    tax = _two_branches()
    placed = cap_construction(tax, 5, seed=3, layout="random")
    x = tax.index("x")
    tree = placed.tree_parent
    other = "a00" if tree[x] == tax.index("b00") else "b00"
    targets = [tax.index(other), tax.index(other[:2])]
    base, best, to, at = geodesic_scan(tax, placed.points.numpy(), x, targets)
    assert best <= base
    assert (to is None) == (best == base)
    assert 0.0 <= at < 1.0


@pytest.mark.skipif(not os.path.exists(f"{WORDNET}/data.noun"), reason="WordNet not installed")
def test_default_taxonomy_moves_keep_the_cones():
    from models.taxonomy.defaults import default_taxonomy

    tax = default_taxonomy(WORDNET)
    placed = cap_construction(tax, 10)
    new, tree, info = replace_leaves(tax, placed.points.numpy(), placed.tree_parent)
    import torch

    emb = LabelEmbedding(tax, torch.from_numpy(new), 1.0, cone=CAP)
    con = evaluate_cones(emb)
    held, _ = _held_pairs(tree, _top_down(tree), tax.closure_edges())
    assert con["cone_true_positives"] == int(held.sum())
    assert con["cone_recall"] >= 0.95 and con["cone_precision"] >= 0.95
