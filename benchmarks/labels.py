"""Label-embedding benchmark: reconstruction and cone containment on WordNet closures.

Trains with the defaults of ``hypsearch labels train --taxonomy FILE --dim 10``
(nothing tuned per run), evaluates as Nickel and Kiela 2017 (mean rank, MAP
over every node) and cone containment F1 (strict cones, K = 0.1; and at the
energy threshold with the best F1, as Ganea et al. tune it), and, on the
mammal closure, trains gensim's PoincareModel and evaluates its vectors the
same way.

    python benchmarks/labels.py                      # mammals + nouns
    python benchmarks/labels.py --only mammals --write-readme

Prints a markdown table; ``--write-readme`` puts it into README.md between
``<!-- labels-bench:start -->`` and ``<!-- labels-bench:end -->``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import time
from pathlib import Path

import torch
from _common import ROOT, cpu_model, report

sys.path.insert(0, str(ROOT))
START, END = "<!-- labels-bench:start -->", "<!-- labels-bench:end -->"

from models.labels import (  # noqa: E402
    LabelEmbedding,
    LabelTrainConfig,
    best_cone_threshold,
    evaluate_cones,
    evaluate_reconstruction,
    train_labels,
)
from models.taxonomy import Taxonomy  # noqa: E402


def machine() -> str:
    return f"{os.cpu_count()} cores, {cpu_model()}, torch {torch.__version__}"


def run_ours(name: str, tax: Taxonomy, cone_sample: int | None, out_dir: Path, reuse: bool) -> dict:
    path = out_dir / f"{name}.labels"
    if reuse and path.exists():  # evaluate the checkpoint of an earlier run
        emb = LabelEmbedding.load(path)
        assert emb.taxonomy == tax, f"{path} was trained on another taxonomy"
        minutes = emb.metrics["train_seconds"] / 60
    else:
        cfg = LabelTrainConfig(dim=10)
        t0 = time.perf_counter()
        emb = train_labels(tax, cfg, progress=True)
        minutes = (time.perf_counter() - t0) / 60
        emb.save(path)
    rec = evaluate_reconstruction(emb, progress=True)
    strict = evaluate_cones(emb, sample=cone_sample, progress=True)
    best = best_cone_threshold(emb, sample=min(cone_sample or 2000, 2000))
    tuned = evaluate_cones(emb, tol=best["threshold"], sample=cone_sample, seed=1, progress=True)
    return {
        "setting": f"hypsearch, {name} ({len(tax):,} nodes), dim 10, {emb.epoch} epochs",
        "minutes": minutes,
        "mean_rank": rec["mean_rank"],
        "map": rec["map"],
        "f1_strict": strict["cone_f1"],
        "f1_tuned": tuned["cone_f1"],
        "threshold": best["threshold"],
        "cone_sample": cone_sample,
        "threads": torch.get_num_threads(),
    }


def run_gensim(name: str, tax: Taxonomy, epochs: int) -> dict | None:
    try:
        from gensim.models.poincare import PoincareModel
    except ImportError:
        print("gensim not installed (pip install gensim): skipping its row", file=sys.stderr)
        return None
    names = tax.names
    relations = [(names[u], names[v]) for u, v in tax.closure_edges().tolist()]
    t0 = time.perf_counter()
    # negative=50 never leaves gensim 4.4's negative sampling on this closure
    # (mammal.n.01 is related to every other node); 10 is gensim's default.
    model = PoincareModel(relations, size=10, negative=10, burn_in=10, seed=0)
    model.train(epochs=epochs, batch_size=10, print_every=10**9)
    minutes = (time.perf_counter() - t0) / 60
    vecs = torch.tensor([model.kv[n] for n in names], dtype=torch.float64)
    emb = LabelEmbedding(tax, vecs, 1.0)
    rec = evaluate_reconstruction(emb)
    best = best_cone_threshold(emb, sample=None)
    return {
        "setting": f"gensim PoincareModel, {name}, dim 10, {epochs} epochs, 10 negatives",
        "minutes": minutes,
        "mean_rank": rec["mean_rank"],
        "map": rec["map"],
        "f1_strict": evaluate_cones(emb)["cone_f1"],
        "f1_tuned": evaluate_cones(emb, tol=best["threshold"])["cone_f1"],
        "threshold": best["threshold"],
        "cone_sample": None,
        "threads": torch.get_num_threads(),
    }


def table(rows: list[dict], when: str) -> str:
    threads = sorted({str(r.get("threads", "?")) for r in rows})
    lines = [
        f"Measured {when} on {machine()}, {'/'.join(threads)} torch thread(s) "
        "(`python benchmarks/labels.py`).",
        "",
        "| setting | train minutes | mean rank | MAP | cone F1 (strict, K=0.1) "
        "| cone F1 (tuned threshold) |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        note = f" (sampled {r['cone_sample']} apexes)" if r.get("cone_sample") else ""
        lines.append(
            f"| {r['setting']} | {r['minutes']:.1f} | {r['mean_rank']:.2f} | {r['map']:.3f} "
            f"| {r['f1_strict']:.3f}{note} | {r['f1_tuned']:.3f} (E ≤ {r['threshold']:.3g}) |"
        )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--only", choices=["mammals", "nouns"], help="one closure only")
    p.add_argument("--gensim-epochs", type=int, default=50)
    p.add_argument("--no-gensim", action="store_true")
    p.add_argument(
        "--cone-sample", type=int, default=5000, help="apexes sampled for the noun cone F1"
    )
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--out-dir", default=str(ROOT / "var" / "bench"))
    p.add_argument("--write-readme", action="store_true")
    p.add_argument(
        "--reuse",
        action="store_true",
        help="evaluate the checkpoints an earlier run left in --out-dir (its training time) "
        "instead of training",
    )
    p.add_argument(
        "--table-from",
        nargs="+",
        metavar="LOG",
        help="no training: build the table from the JSON rows printed by earlier runs "
        "(e.g. mammals and nouns run as two processes)",
    )
    p.add_argument("--when", default=None, help="date of the runs read with --table-from")
    args = p.parse_args()
    if args.table_from:
        rows = []
        for log in args.table_from:
            for line in Path(log).read_text(errors="replace").replace("\r", "\n").splitlines():
                if line.startswith("{") and '"setting"' in line:
                    row = json.loads(line)
                    row.setdefault("threads", args.threads or "?")
                    rows.append(row)
        report(table(rows, args.when or dt.date.today().isoformat()), START, END, args.write_readme)
        return
    if args.threads:
        torch.set_num_threads(args.threads)
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    when = dt.date.today().isoformat()
    rows = []
    if args.only in (None, "mammals"):
        mammals = Taxonomy.from_wordnet(root="mammal.n.01")
        rows.append(run_ours("mammal closure", mammals, None, out_dir, args.reuse))
        print(json.dumps(rows[-1]), flush=True)
        if not args.no_gensim:
            g = run_gensim("mammal closure", mammals, args.gensim_epochs)
            if g:
                rows.append(g)
                print(json.dumps(g), flush=True)
    if args.only in (None, "nouns"):
        nouns = Taxonomy.from_wordnet()
        rows.append(run_ours("noun closure", nouns, args.cone_sample, out_dir, args.reuse))
        print(json.dumps(rows[-1]), flush=True)
    report(table(rows, when), START, END, args.write_readme)


if __name__ == "__main__":
    main()
