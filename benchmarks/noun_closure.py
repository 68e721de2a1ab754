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
  the pairs it does not hold by their source and by how deep the ancestor
  lies in its branch, and the 20 worst nodes with their worst-ranked ancestors;
* with ``--outward ROOM``: each default embedding also after ``labels train
  --outward ROOM``'s moves (``models.labels.construct.moved_outward``: the open
  children widened by ``--widen``, the closed subtrees moved outward towards
  their off-tree partners by ``--toward``), with the 10-d tables of it;
* experiments at 10 dimensions (``--no-experiments`` skips them): nodes of
  several parents placed one at a time (``benchmarks/_second_parents.py``),
  the best points along geodesics for the worst leaves, and tighter sibling
  caps (``cap_separation``, ``cap_margin``).

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
    lines += _off_tree_tables(tax, tree_parent, order, ranks, held, n_desc)
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


def _off_tree_tables(tax, tree, order, ranks, held, n_desc) -> list[str]:
    """The pairs the tree does not hold: by their source (the node of several parents
    they come in through, by its subtree size) and by how many levels the ancestor
    lies below the point where its branch leaves the node's tree path."""
    from models.labels.construct import _euler

    tin, tout = _euler(tree, order)
    tdepth = np.zeros(len(tree), dtype=np.int64)
    for i in order:
        if tree[i] >= 0:
            tdepth[i] = tdepth[tree[i]] + 1
    edges = tax.closure_edges()
    starts = np.searchsorted(edges[:, 0], np.arange(len(tree) + 1))
    ancs: dict[int, set] = {}

    def anc_set(p):
        if p not in ancs:
            ancs[p] = set(edges[starts[p] : starts[p + 1], 1].tolist())
        return ancs[p]

    by_src = defaultdict(list)
    by_excess = defaultdict(list)
    for u, (anc, rk, _) in ranks.items():
        h = held(u, anc)
        for a, r in zip(anc[~h].tolist(), rk[~h].tolist(), strict=True):
            v = u
            while v >= 0:
                if any(p != tree[v] and (p == a or a in anc_set(p)) for p in tax.parent_ids(v)):
                    break
                v = int(tree[v])
            k = int(n_desc[v]) if v >= 0 else -1
            by_src[4 if k < 0 else 0 if k == 0 else 1 if k < 10 else 2 if k < 100 else 3].append(r)
            lca = u
            while lca >= 0 and not (tin[lca] <= tin[a] < tout[lca]):
                lca = int(tree[lca])
            ex = int(tdepth[a] - (tdepth[lca] + 1 if lca >= 0 else 0))
            by_excess[min(ex, 5)].append(r)
    tot = sum(sum(x) for x in by_src.values()) or 1
    out = [
        "**Pairs not held, by their source: the node of several parents they come in "
        "through (its descendants)**",
        "",
        "| source | pairs | mean rank | median rank | share of the rank sum (pairs not held) |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    names = {0: "a leaf", 1: "1-9 descendants", 2: "10-99", 3: "100+", 4: "(none found)"}
    for g in sorted(by_src):
        r = np.array(by_src[g])
        out.append(
            f"| {names[g]} | {len(r):,} | {r.mean():.1f} | {np.median(r):.0f} | "
            f"{r.sum() / tot:.3f} |"
        )
    out += [
        "",
        "**Pairs not held, by how deep the ancestor lies in its branch: levels below the "
        "child of the branch point (the deepest tree ancestor of the node that also "
        "holds the ancestor)**",
        "",
        "| levels below | pairs | mean rank | median rank "
        "| share of the rank sum (pairs not held) |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for g in sorted(by_excess):
        r = np.array(by_excess[g])
        out.append(
            f"| {g}{'+' if g == 5 else ''} | {len(r):,} | {r.mean():.1f} | {np.median(r):.0f} | "
            f"{r.sum() / tot:.3f} |"
        )
    out.append("")
    return out


def _top_down(tree: np.ndarray) -> list[int]:
    from models.labels.construct import _top_down as top_down

    return top_down(tree)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sample", type=int, default=3000, help="nodes ranked (0: every node)")
    ap.add_argument("--sample-seed", type=int, default=0, help="seed of the nodes ranked")
    ap.add_argument("--dims", type=int, nargs="+", default=[5, 10, 20])
    ap.add_argument("--reuse", action="store_true", help="load embeddings built before")
    ap.add_argument("--no-baseline", action="store_true")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument(
        "--no-experiments", action="store_true", help="skip the second-parent experiments"
    )
    ap.add_argument("--wordnet-dir", default="/usr/share/wordnet")
    ap.add_argument(
        "--outward",
        type=float,
        nargs="*",
        default=[],
        help="also each embedding with its closed subtrees moved outward by these radii "
        "(cap_outward; models/labels/outward.py)",
    )
    ap.add_argument(
        "--toward",
        type=float,
        default=0.98,
        help="with --outward: each closed subtree shrinks towards this share of the way "
        "from its root's direction to the rim of its cap, on its off-tree partners' side",
    )
    ap.add_argument(
        "--widen",
        type=float,
        default=0.0,
        help="with --outward: the open children first widened in their parents' caps by "
        "this share (models/labels/outward.py widen_open)",
    )
    ap.add_argument(
        "--compare",
        action="store_true",
        help="with --outward, at 10 dimensions: also the move towards the roots' directions "
        "(the first --outward) and, with --widen, the move without widening",
    )
    ap.add_argument("--name", default="noun_closure", help="results file name")
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
    from models.taxonomy.graph import Taxonomy

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
        us = np.sort(np.random.default_rng(args.sample_seed).choice(us, args.sample, replace=False))
    summary, details, experiments_text, loads = [], [], [], []
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
        loads.append(f"{label}, dim {dim}: {_load()}")
        t = time.perf_counter()
        rec = evaluate_reconstruction(emb, sample=args.sample or None, seed=args.sample_seed)
        con = evaluate_cones(emb)
        info = emb.metrics.get("construction", {})
        summary.append(
            f"| {label} | {dim} | {seconds / 60:.1f} | {rec['mean_rank']:.2f} | "
            f"{rec['map']:.4f} | {con['cone_precision']:.4f} | {con['cone_recall']:.4f} | "
            f"{info.get('pairs_off_tree', '-'):,} | {info.get('pairs_folded', '-'):,} | "
            f"{info.get('max_radius', float('nan')):.1f} |"
        )
        print(summary[-1], f"(eval {time.perf_counter() - t:.0f} s)", file=sys.stderr)
        moves = [(room, args.toward, args.widen) for room in args.outward]
        if args.compare and dim == 10 and args.outward:
            room = args.outward[0]
            moves += [(room, 0.0, 0.0)] + ([(room, args.toward, 0.0)] if args.widen else [])
        for room, tw, wd in moves if kind == "new" else []:
            moved, sec = _outward(tax, emb, room, tw, wd)
            how = f"toward {tw:g}, widen {wd:g}"
            loads.append(f"{label} moved outward by {room:g} ({how}), dim {dim}: {_load()}")
            what = f"defaults, then closed subtrees moved outward by up to {room:g} " + (
                "towards their roots' directions (the first `--outward`)"
                if tw == 0 and wd == 0
                else f"towards their off-tree partners ({how})"
            )
            row = _summary_row(what, dim, seconds + sec, moved, args.sample, args.sample_seed)
            summary.append(row)
            print(summary[-1], file=sys.stderr)
            if dim == 10 and (room, tw, wd) == moves[0]:
                ranks = pair_ranks(moved, us)
                tree = np.asarray(_tree_of(tax, kind))
                details.append(
                    f"### defaults moved outward by {room:g} ({how}), dim 10\n\n"
                    + breakdown(moved, tree, ranks, 0.0)
                )
        if dim == 10:
            ranks = pair_ranks(emb, us)
            tree = np.asarray(_tree_of(tax, kind))
            details.append(f"### {label}, dim 10\n\n" + breakdown(emb, tree, ranks, 0.0))
            if kind == "new" and not args.no_experiments:
                summary_x, text = experiments(emb, tree, ranks, seconds, args.sample)
                summary += summary_x
                experiments_text.append(text)
    n_eval = len(us)
    body = [
        f"WordNet 3.0 noun closure: {len(tax):,} nodes, {len(edges):,} closure pairs. "
        f"Mean rank and MAP over {n_eval:,} uniformly drawn nodes (seed {args.sample_seed}) "
        "with every closure pair of each (`evaluate_reconstruction(sample=...)`); cones: strict "
        "membership of every closure pair, false positives from 4,000,000 sampled "
        "non-pairs. One torch thread.",
        "",
        "| embedding | dim | minutes | mean rank | MAP | cone P | cone R | pairs off the tree "
        "| pairs folded | max radius |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        *summary,
        "",
        "Minutes: the construction (and the outward move) in this process, one torch "
        "thread, on the shared machine; load averages (1, 5, 15 min) when each was built:",
        "",
        *[f"- {x}" for x in loads],
        "",
        *details,
        *experiments_text,
    ]
    cmd = "python benchmarks/noun_closure.py " + " ".join(sys.argv[1:])
    path = write_results(
        args.name,
        "\n".join(body),
        command=cmd.strip(),
        title="The WordNet noun closure: ranks, MAP and cones",
    )
    print(f"wrote {path}", file=sys.stderr)
    return 0


def experiments(emb, tree, ranks, seconds, sample):
    """Second parents placed one node at a time (benchmarks/_second_parents.py): summary
    rows and a section of the results file."""
    from _second_parents import geodesic_scan, replace_leaves

    from models.geometry import cones
    from models.labels import LabelEmbedding, evaluate_cones, evaluate_reconstruction

    tax = emb.taxonomy
    pts = emb.embeddings.numpy()
    rows = []
    lines = [
        "### Can a node of several parents be placed better, one at a time? (dim 10)",
        "",
        "Each node of several parents with at most `max_subtree` descendants is tried "
        "at the centre of the cap of each of its other parents (its subtree laid out "
        "below by the construction's recipe, so caps stay nested and disjoint) and "
        "moved where the rank sum of its and its subtree's ancestors is lowest, the "
        "other points fixed (`benchmarks/_second_parents.py`, `replace_leaves`).",
        "",
        "| max_subtree | tried | moved | seconds | rank sum gained (moved nodes) "
        "| tree pairs lost |",
        "| ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for ms in (0, 9):
        t = time.perf_counter()
        new_pts, _, info = replace_leaves(tax, pts, tree, max_subtree=ms)
        sec = time.perf_counter() - t
        lines.append(
            f"| {ms} | {info['tried']:,} | {info['moved']:,} | {sec:.0f} | "
            f"{info['rank_gain']:,.0f} | {info['pairs_lost']:,} |"
        )
        moved = LabelEmbedding(tax, torch.from_numpy(new_pts), 1.0, cone=cones.cone_spec("cap"))
        rec = evaluate_reconstruction(moved, sample=sample or None, seed=0)
        con = evaluate_cones(moved)
        rows.append(
            f"| defaults, then second parents placed one node at a time (max_subtree {ms}; "
            f"an experiment, not the default) | 10 | {(seconds + sec) / 60:.1f} | "
            f"{rec['mean_rank']:.2f} | {rec['map']:.4f} | {con['cone_precision']:.4f} | "
            f"{con['cone_recall']:.4f} | - | - | - |"
        )
        print(rows[-1], file=sys.stderr)
    # tighter packing of sibling caps (LabelTrainConfig's cap_separation, cap_margin)
    from models.labels import LabelTrainConfig, train_labels

    for sep, margin in ((1.0, 0.02), (1.0, 0.005), (1.1, 0.005)):
        t = time.perf_counter()
        e = train_labels(tax, LabelTrainConfig(dim=10, cap_separation=sep, cap_margin=margin))
        sec = time.perf_counter() - t
        what = f"defaults but cap_separation {sep}, cap_margin {margin} (an experiment, "
        rows.append(_summary_row(what + "not the default)", 10, sec, e, sample))
        print(rows[-1], file=sys.stderr)
    # the worst leaves of several parents: the best point between their branches
    order = _top_down(tree)
    from models.labels.construct import _euler

    tin, tout = _euler(tree, order)
    edges = tax.closure_edges()
    n_desc = np.bincount(edges[:, 1], minlength=len(tax))
    cands = [
        (u, anc, rk)
        for u, (anc, rk, _) in ranks.items()
        if len(tax.parent_ids(u)) > 1 and n_desc[u] == 0
    ]
    cands.sort(key=lambda x: -float(x[2].sum()))
    lines += [
        "",
        "The 10 leaves of several parents with the largest rank sums among the ranked "
        "nodes: the rank sum of their ancestors at the constructed point and at the "
        "best of 19 points along each geodesic towards an ancestor the tree does not "
        "hold (`geodesic_scan`), the other points fixed.",
        "",
        "| node | ancestors | rank sum (constructed) | best rank sum on the geodesics "
        "| towards | at |",
        "| --- | ---: | ---: | ---: | --- | ---: |",
    ]
    for u, anc, _ in cands[:10]:
        off = anc[~((tin[anc] <= tin[u]) & (tin[u] < tout[anc]))]
        base, best, to, at = geodesic_scan(tax, pts, u, off.tolist())
        lines.append(
            f"| {tax.names[u]} | {len(anc)} | {base:,.0f} | {best:,.0f} | "
            f"{tax.names[to] if to is not None else '-'} | {at:.2f} |"
        )
    lines.append("")
    return rows, "\n".join(lines)


def _summary_row(label: str, dim: int, seconds: float, emb, sample: int, seed: int = 0) -> str:
    """A row of the summary table: ``emb`` evaluated (ranks on ``sample`` nodes, cones)."""
    from models.labels import evaluate_cones, evaluate_reconstruction

    rec = evaluate_reconstruction(emb, sample=sample or None, seed=seed)
    con = evaluate_cones(emb)
    info = emb.metrics["construction"]
    return (
        f"| {label} | {dim} | {seconds / 60:.1f} | {rec['mean_rank']:.2f} | "
        f"{rec['map']:.4f} | {con['cone_precision']:.4f} | {con['cone_recall']:.4f} | "
        f"{info['pairs_off_tree']:,} | {info['pairs_folded']:,} | {info['max_radius']:.1f} |"
    )


def _load() -> str:
    import os

    return "load average " + " / ".join(f"{x:.1f}" for x in os.getloadavg())


def _outward(tax, emb, room: float, toward: float, widen: float):
    """``emb`` (a default construction) with its closed subtrees moved outward by up to
    ``room``, and the seconds the move took (the construction's radii are read back
    from the stored points where the checkpoint has no exact ones)."""
    from models.geometry import cones
    from models.labels import LabelEmbedding
    from models.labels.construct import CapPlacement, moved_outward

    t = time.perf_counter()
    x = emb.embeddings.to(torch.float64)
    rho = (2 * torch.atanh(x.norm(dim=1).clamp(max=1 - 1e-16))).numpy()
    tree = np.asarray(_tree_of(tax, "new"))
    placed = CapPlacement(x, rho, tree, dict(emb.metrics.get("construction", {})))
    moved = moved_outward(tax, placed, outward=room, toward=toward, widen=widen)
    sec = time.perf_counter() - t
    out = LabelEmbedding(tax, moved.points, 1.0, cone=cones.cone_spec("cap"))
    out.metrics = {"construction": moved.info, "train_seconds": sec}
    return out, sec


def _tree_of(tax, kind: str):
    from models.labels.construct import tree_plan

    return tree_plan(tax, general=kind == "new")[0]


if __name__ == "__main__":
    raise SystemExit(main())
