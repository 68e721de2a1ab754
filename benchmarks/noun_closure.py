"""The whole WordNet noun closure: where the reconstruction rank tail comes from.

Builds (or, with ``--reuse``, loads) the noun labels with the defaults of
``hypsearch labels train`` at 5, 10 and 20 dimensions, and the previous
construction (random sibling layout, pass-through folds only) at 10 for
comparison, then writes ``benchmarks/results/noun_closure.md``:

* per embedding: build time, mean rank and MAP (Nickel and Kiela 2017, as
  ``hypsearch labels eval`` computes them, on ``--sample`` uniformly drawn
  nodes, or every node with ``--sample 0``), strict cone precision and
  recall (``models.labels.evaluate_cones``: every closure pair, 4,000,000
  sampled non-pairs);
* for each 10-d embedding: mean rank and MAP by depth, by number of parents
  (1 against 2+), by whether a node lies below a node of several parents,
  by subtree size, by whether the spanning tree (so the caps) holds the pair,
  and the 20 worst nodes with their worst-ranked ancestors.

    python benchmarks/noun_closure.py [--sample 3000] [--dims 5 10 20] [--reuse]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict

import numpy as np
import torch
from _common import ROOT, write_results

sys.path.insert(0, str(ROOT))


def pair_ranks(emb, us: np.ndarray, chunk: int = 128):
    """For each node of ``us``: its ancestors, their ranks and the node's AP.

    Rank and AP exactly as :func:`models.labels.evaluate_reconstruction`:
    1 + the non-ancestors strictly nearer than the ancestor; precision at
    each ancestor is (ancestors up to it) / (nodes up to it).
    """
    from models.geometry import poincare

    tax = emb.taxonomy
    n = len(tax)
    edges = tax.closure_edges()
    starts = np.searchsorted(edges[:, 0], np.arange(n + 1))
    theta = emb.embeddings
    out = {}
    for s in range(0, len(us), chunk):
        ub = us[s : s + chunk]
        z = poincare.pairwise_dist_arg(theta[torch.from_numpy(ub)], theta, c=emb.curvature)
        for r, u in enumerate(ub.tolist()):
            anc = edges[starts[u] : starts[u + 1], 1]
            row = z[r].clone()
            row[u] = float("inf")
            za = row[torch.from_numpy(anc)]
            srt = torch.sort(row).values
            closer = torch.searchsorted(srt, za.contiguous(), side="left").numpy()
            order = np.argsort(closer, kind="stable")
            j = np.empty(len(anc))
            j[order] = np.arange(1, len(anc) + 1)
            ranks = closer - (j - 1) + 1
            ap = float(np.mean(j / (closer + 1)))
            out[u] = (anc, ranks, ap)
    return out


def _row(label, pairs_ranks, aps, nodes):
    r = np.concatenate(pairs_ranks) if pairs_ranks else np.zeros(0)
    share = ""
    return (
        f"| {label} | {nodes:,} | {len(r):,} | {r.mean():.2f} | {np.median(r):.0f} | "
        f"{np.mean(aps):.3f} |{share}"
        if len(r)
        else f"| {label} | {nodes:,} | 0 | - | - | - |"
    )


def breakdown(emb, tree_parent: np.ndarray, ranks: dict, total_rank: float) -> str:
    """The tables of one embedding (markdown)."""
    tax = emb.taxonomy
    n = len(tax)
    depth = tax.depths if not callable(tax.depths) else tax.depths()
    nparents = np.array([len(tax.parent_ids(i)) for i in range(n)])
    edges = tax.closure_edges()
    n_desc = np.bincount(edges[:, 1], minlength=n)
    multi = nparents > 1
    below_multi = multi.copy()
    below_multi[edges[multi[edges[:, 1]], 0]] = True
    # tree-ancestor test along the construction's spanning tree
    order = _top_down(tree_parent)
    from models.labels.construct import _euler

    tin, tout = _euler(tree_parent, order)

    def held(u, anc):
        return (tin[anc] <= tin[u]) & (tin[u] < tout[anc])

    head = (
        "| group | nodes | pairs | mean rank | median rank | MAP |\n"
        "| --- | ---: | ---: | ---: | ---: | ---: |"
    )
    lines = []

    def table(title, keyf, labels):
        groups = defaultdict(lambda: ([], []))
        for u, (_, rk, ap) in ranks.items():
            g = keyf(u)
            groups[g][0].append(rk)
            groups[g][1].append(ap)
        lines.extend([f"**{title}**", "", head])
        for g in labels:
            if g in groups:
                lines.append(_row(labels[g], groups[g][0], groups[g][1], len(groups[g][1])))
        lines.append("")

    dmax = int(max(depth[u] for u in ranks))
    table(
        "By depth (longest path from the root)",
        lambda u: int(depth[u]),
        {d: f"depth {d}" for d in range(dmax + 1)},
    )
    table(
        "By number of parents",
        lambda u: "2+" if multi[u] else "1",
        {"1": "1 parent", "2+": "2+ parents"},
    )
    table(
        "By whether a node of 2+ parents is the node or above it",
        lambda u: "y" if below_multi[u] else "n",
        {"n": "no node of 2+ parents at or above", "y": "a node of 2+ parents at or above"},
    )

    def size(u):
        k = int(n_desc[u])
        return 0 if k == 0 else 1 if k < 10 else 2 if k < 100 else 3

    table("By subtree size (descendants)", size, {0: "leaf", 1: "1-9", 2: "10-99", 3: "100+"})
    # per pair: held by the spanning tree (so by the caps) or reached through another parent
    hr, orr = [], []
    for u, (anc, rk, _) in ranks.items():
        h = held(u, anc)
        hr.append(rk[h])
        orr.append(rk[~h])
    hr, orr = np.concatenate(hr), np.concatenate(orr)
    tot = hr.sum() + orr.sum()
    lines += [
        "**By pair: does the spanning tree (so do the caps) hold it?**",
        "",
        "| pairs | count | mean rank | median rank | share of the rank sum |",
        "| --- | ---: | ---: | ---: | ---: |",
        f"| held (ancestor on the tree path) | {len(hr):,} | {hr.mean():.2f} | "
        f"{np.median(hr):.0f} | {hr.sum() / tot:.3f} |",
        f"| not held (reached through another parent) | {len(orr):,} | "
        f"{orr.mean() if len(orr) else 0:.2f} | {np.median(orr) if len(orr) else 0:.0f} | "
        f"{orr.sum() / tot:.3f} |",
        "",
    ]
    worst = sorted(ranks.items(), key=lambda kv: -float(kv[1][1].mean()))[:20]
    lines += [
        "**The 20 worst nodes (by mean rank of their ancestors)**",
        "",
        "| node | parents | mean rank | worst-ranked ancestors (rank; * = not on the tree path) |",
        "| --- | --- | ---: | --- |",
    ]
    for u, (anc, rk, _) in worst:
        h = held(u, anc)
        o = np.argsort(-rk, kind="stable")[:3]
        bad = ", ".join(f"{tax.names[anc[i]]} ({int(rk[i])}{'' if h[i] else '*'})" for i in o)
        lines.append(f"| {tax.names[u]} | {', '.join(tax.parents(u))} | {rk.mean():.1f} | {bad} |")
    lines.append("")
    del total_rank
    return "\n".join(lines)


def _top_down(tree: np.ndarray) -> list[int]:
    n = len(tree)
    kids: list[list[int]] = [[] for _ in range(n)]
    out = []
    for i in range(n):
        (kids[tree[i]] if tree[i] >= 0 else out).append(i)
    head = 0
    while head < len(out):
        out.extend(kids[out[head]])
        head += 1
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sample", type=int, default=3000, help="nodes ranked (0: every node)")
    ap.add_argument("--dims", type=int, nargs="+", default=[5, 10, 20])
    ap.add_argument("--reuse", action="store_true", help="load embeddings built before")
    ap.add_argument("--no-baseline", action="store_true")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--wordnet-dir", default="/usr/share/wordnet")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from models.geometry import cones
    from models.labels import (
        LabelEmbedding,
        LabelTrainConfig,
        evaluate_cones,
        evaluate_reconstruction,
        train_labels,
    )
    from models.labels.construct import cap_construction
    from models.taxonomy import Taxonomy

    cache = ROOT / "var" / "bench"
    cache.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    tax = Taxonomy.from_wordnet(args.wordnet_dir)
    print(
        f"noun closure: {len(tax):,} nodes, {len(tax.closure_edges()):,} pairs "
        f"({time.perf_counter() - t0:.0f} s)",
        file=sys.stderr,
    )
    runs = []
    if not args.no_baseline:
        old = "previous construction (random sibling layout, pass-through folds)"
        runs.append((old, 10, "old"))
    runs += [("`hypsearch labels train` defaults", d, "new") for d in args.dims]
    edges = tax.closure_edges()
    us = np.unique(edges[:, 0])
    if args.sample and args.sample < len(us):
        us = np.sort(np.random.default_rng(0).choice(us, args.sample, replace=False))
    summary, details = [], []
    for label, dim, kind in runs:
        path = cache / f"noun-closure-{kind}-{dim}.labels"
        if args.reuse and path.exists():
            emb = LabelEmbedding.load(path)
            seconds = emb.metrics.get("train_seconds", float("nan"))
        elif kind == "new":
            emb = train_labels(tax, LabelTrainConfig(dim=dim))
            seconds = emb.metrics["train_seconds"]
            emb.save(path)
        else:
            t = time.perf_counter()
            placed = cap_construction(tax, dim, layout="random", folds="pass-through")
            seconds = time.perf_counter() - t
            emb = LabelEmbedding(tax, placed.points, 1.0, cone=cones.cone_spec("cap"))
            emb.metrics = {"construction": placed.info, "train_seconds": seconds}
            emb.save(path)
        print(f"{label}, dim {dim}: built in {seconds:.0f} s", file=sys.stderr)
        t = time.perf_counter()
        rec = evaluate_reconstruction(emb, sample=args.sample or None, seed=0)
        con = evaluate_cones(emb)
        info = emb.metrics.get("construction", {})
        summary.append(
            f"| {label} | {dim} | {seconds / 60:.1f} | {rec['mean_rank']:.2f} | "
            f"{rec['map']:.4f} | {con['cone_precision']:.4f} | {con['cone_recall']:.4f} | "
            f"{info.get('pairs_off_tree', '-'):,} | {info.get('pairs_folded', '-'):,} | "
            f"{info.get('max_radius', float('nan')):.1f} |"
        )
        print(summary[-1], f"(eval {time.perf_counter() - t:.0f} s)", file=sys.stderr)
        if dim == 10:
            ranks = pair_ranks(emb, us)
            tree = np.asarray(_tree_of(tax, kind))
            details.append(f"### {label}, dim 10\n\n" + breakdown(emb, tree, ranks, 0.0))
    n_eval = len(us)
    body = [
        f"WordNet 3.0 noun closure: {len(tax):,} nodes, {len(edges):,} closure pairs. "
        f"Mean rank and MAP over {n_eval:,} uniformly drawn nodes (seed 0) with every "
        "closure pair of each (`evaluate_reconstruction(sample=...)`); cones: strict "
        "membership of every closure pair, false positives from 4,000,000 sampled "
        "non-pairs. One torch thread.",
        "",
        "| embedding | dim | minutes | mean rank | MAP | cone P | cone R | pairs off the tree "
        "| pairs folded | max radius |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        *summary,
        "",
        *details,
    ]
    cmd = "python benchmarks/noun_closure.py " + " ".join(sys.argv[1:])
    path = write_results(
        "noun_closure",
        "\n".join(body),
        command=cmd.strip(),
        title="The WordNet noun closure: ranks, MAP and cones",
    )
    print(f"wrote {path}", file=sys.stderr)
    return 0


def _tree_of(tax, kind: str):
    from models.labels.construct import tree_plan

    return tree_plan(tax, general=kind == "new")[0]


if __name__ == "__main__":
    raise SystemExit(main())
