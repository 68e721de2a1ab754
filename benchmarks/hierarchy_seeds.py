"""The hyperbolic model against its Euclidean twin, over seeds: label precision and level purity.

Each hyperbolic checkpoint (``--hyperbolic``) answers as the service does: a
fresh index of the Fashion-MNIST test split, queried through
:mod:`service.searching` (label queries in the default mode; ``mode:
hierarchical`` paged through levels 0 to 3), exactly as
``benchmarks/hierarchy.py`` measures the demo's model. Each Euclidean twin
(``--twin``: ``hypsearch train ... --geometry euclidean``, the same budget)
answers the same label queries the best way it can, by its nearest class
prototype: an item's class is the nearest of the ten class prototypes; a
label's answer is the items of the classes under it, round robin over those
classes, each class's items nearest its prototype first; its levels are the
hyperbolic answer's chain (the label, then the chain of parents the service
uses), an item's level the first chain label above its class, each level's
items nearest their prototype first. The same judges for both (precision@k,
every class among the k, level purity as in ``hierarchy.py``).

    python benchmarks/hierarchy_seeds.py --hyperbolic var/bench/seeds/hyp-s{0,1,2}.safetensors \\
        --twin var/bench/seeds/twin-s{0,1,2}.safetensors [--write-results]

'ahead' in the table: every hyperbolic seed better than every twin seed (the
difference larger than the spread of the seeds).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import ROOT, write_results  # noqa: E402
from hierarchy import open_runtime, paged_levels, pure, search, truth_of  # noqa: E402


def _labels(tax):
    from models.images.datasets import FASHION_MNIST_CLASSES

    classes = [c for _, c in FASHION_MNIST_CLASSES]
    under = {n: {c for c in classes if c == n or n in tax.ancestors(c)} for n in tax.names}
    general = sorted(n for n in tax.names if 2 <= len(under[n]) <= 6)
    return classes, general, under


def hyperbolic(path: Path, k: int, max_results: int, no_backoff: bool = False) -> tuple[dict, dict]:
    """Scores of one hyperbolic checkpoint, and the level chain of each class label;
    ``no_backoff``: the same weights with the placement's two back-offs to the cone
    parent off (``placement_confidence`` 0, ``placement_novelty`` unbounded)."""
    with tempfile.TemporaryDirectory() as tmp:
        if no_backoff:
            from models.vision.image_model import load_model

            model = load_model(path)
            model.config = dict(model.config, placement_confidence=0.0, placement_novelty=1e9)
            path = Path(tmp) / path.name
            model.save(path)
        rt = open_runtime(path.parent, Path(tmp) / "index", model_path=path)
        truth = truth_of(rt)
        tax = rt.taxonomy
        classes, general, under = _labels(tax)
        prec, every = {}, {}
        for lab in classes + general:
            got = [truth[h.id] for h in search(rt, lab, "auto", k).hits]
            prec[lab] = float(np.mean([g in under[lab] for g in got]))
            every[lab] = under[lab] <= set(got)
        n_pure = n_all = 0
        chains = {}
        for lab in classes:
            hits = paged_levels(rt, lab, max_results)
            chains[lab] = list(hits[-1][1])
            n_all += len(hits)
            n_pure += sum(pure(tax, chain, h, truth) for h, chain in hits)
        rt.close()
    return _scores(prec, every, classes, general, n_pure / n_all), chains


def twin(path: Path, chains: dict, k: int, max_results: int) -> dict:
    """Scores of one Euclidean twin answering by its nearest class prototype."""
    import torch

    from models.images.datasets import FASHION_MNIST_CLASSES, load_fashion_mnist
    from models.vision.image_model import load_model

    torch.set_num_threads(1)
    model = load_model(path)
    tax = model.labels.taxonomy
    classes, general, under = _labels(tax)
    test = load_fashion_mnist("test")
    truth = np.array([FASHION_MNIST_CLASSES[t][1] for t in test.targets.tolist()])
    with torch.no_grad():
        z = model.embed(test.images)
        d = model.space.pairwise(z, model.prototypes(classes)).detach().numpy()  # (n, 10)
    pred = d.argmin(1)
    near = d[np.arange(len(d)), pred]  # distance to the item's own prototype
    by_class = [
        np.flatnonzero(pred == j)[np.argsort(near[pred == j], kind="stable")]
        for j in range(len(classes))
    ]

    def answer(lab: str, want: int) -> list[int]:
        lists = [by_class[j] for j, c in enumerate(classes) if c in under[lab]]
        out: list[int] = []
        depth = 0
        while len(out) < want and any(depth < len(v) for v in lists):
            rnd = [v[depth] for v in lists if depth < len(v)]
            out += sorted(rnd, key=lambda i: near[i])
            depth += 1
        return out[:want]

    prec, every = {}, {}
    for lab in classes + general:
        got = truth[answer(lab, k)]
        prec[lab] = float(np.mean([g in under[lab] for g in got])) if len(got) else 0.0
        every[lab] = under[lab] <= set(got.tolist())
    n_pure = n_all = 0
    for lab in classes:
        chain = chains[lab][:4]
        level = np.full(len(pred), 99)
        for i in reversed(range(len(chain))):
            inside = np.array([classes[p] in under.get(chain[i], set()) for p in pred])
            level[inside] = i
        order = np.lexsort((near, level))
        order = order[level[order] <= 3][:max_results]
        for i in order.tolist():
            hit = _Hit(f"{i}", int(level[i]))
            n_all += 1
            n_pure += pure(tax, chain, hit, {hit.id: truth[i]})
    return _scores(prec, every, classes, general, n_pure / n_all)


class _Hit:
    def __init__(self, id_: str, level: int):
        self.id, self.level = id_, level


def _scores(prec, every, classes, general, purity) -> dict:
    return {
        "P@k, classes (mean)": float(np.mean([prec[c] for c in classes])),
        "P@k, classes (min)": float(min(prec[c] for c in classes)),
        "P@k, labels above 2-6 classes (min)": float(min(prec[g] for g in general)),
        "labels above 2-6 classes with every class among the k": float(
            np.mean([every[g] for g in general])
        ),
        "level purity, levels 0-3": float(purity),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hyperbolic", type=Path, nargs="+", required=True)
    ap.add_argument("--twin", type=Path, nargs="+", required=True)
    ap.add_argument("--k", type=int, default=50)
    ap.add_argument("--max-results", type=int, default=3000)
    ap.add_argument(
        "--no-backoff",
        action="store_true",
        help="the hyperbolic checkpoints with the placement's back-offs off "
        "(results: hierarchy-seeds-no-backoff.md)",
    )
    ap.add_argument("--write-results", action="store_true")
    args = ap.parse_args()
    for p in [*args.hyperbolic, *args.twin]:
        if not p.is_file():
            ap.error(f"{p}: no such checkpoint")
    hyp, chains = [], None
    for p in args.hyperbolic:
        s, c = hyperbolic(p, args.k, args.max_results, args.no_backoff)
        hyp.append(s)
        chains = chains or c
        print(p.name, s, file=sys.stderr)
    tw = []
    for p in args.twin:
        tw.append(twin(p, chains, args.k, args.max_results))
        print(p.name, tw[-1], file=sys.stderr)
    off = "; the placement back-offs off" if args.no_backoff else ""
    lines = [
        f"Hyperbolic: {', '.join(p.name for p in args.hyperbolic)} (answers of the "
        f"service's search{off}); twin: {', '.join(p.name for p in args.twin)} (nearest "
        f"class prototype). k {args.k}; purity over at most {args.max_results:,} results a "
        "class label. The checkpoints: `hypsearch train --dataset fashion-mnist --labels "
        "LABELS --out OUT --seed S --threads 1` (the defaults: 570 s budget, two runs at a "
        "time; every run fitted its 12 epochs), the twin with `--geometry euclidean`.",
        "",
        "| metric | hyperbolic: mean (min-max) | twin: mean (min-max) | hyperbolic vs twin |",
        "| --- | --- | --- | --- |",
    ]
    for m in hyp[0]:
        h = [s[m] for s in hyp]
        t = [s[m] for s in tw]
        verdict = "**ahead**" if min(h) > max(t) else "behind" if max(h) < min(t) else "overlap"
        lines.append(
            f"| {m} | {np.mean(h):.3f} ({min(h):.3f}-{max(h):.3f}) | "
            f"{np.mean(t):.3f} ({min(t):.3f}-{max(t):.3f}) | {verdict} |"
        )
    body = "\n".join(lines)
    print(body)
    if args.write_results:

        def rel(paths):
            return " ".join(os.path.relpath(os.path.abspath(p), ROOT) for p in paths)

        cmd = (
            f"python benchmarks/hierarchy_seeds.py --hyperbolic {rel(args.hyperbolic)} "
            f"--twin {rel(args.twin)}"
            + (" --no-backoff" if args.no_backoff else "")
            + " --write-results"
        )
        path = write_results(
            "hierarchy-seeds" + ("-no-backoff" if args.no_backoff else ""),
            body,
            command=cmd,
            title="Label precision and level purity: the hyperbolic model against its twin",
        )
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
