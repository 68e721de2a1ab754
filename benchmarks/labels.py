"""Label-embedding benchmark: reconstruction and cone containment on WordNet closures.

Builds with the defaults of ``hypsearch labels train --taxonomy FILE --dim 10``
(the cap construction; nothing tuned per run) and, for comparison, the N&K
training from the hierarchical start (``--init hierarchical``, Ganea cones
K = 0.1); evaluates as Nickel and Kiela 2017 (mean rank, MAP over every node),
strict cone containment precision and recall over every ordered pair (every
closure pair a positive, every other pair a negative; for the noun closure
the positives exactly and a uniform sample of the negatives), and Ganea et
al.'s protocol (10 sampled negatives per positive, threshold chosen on a
validation half). On the mammal closure, gensim's PoincareModel is evaluated
the same way.

    python benchmarks/labels.py --only mammals default --threads 1
    python benchmarks/labels.py --only nouns
    python benchmarks/labels.py --only mammals default --write-results
    python benchmarks/labels.py --only nouns --inits cap --no-gensim --write-results labels-nouns

Prints a markdown table; ``--write-results [NAME]`` also writes it to
``benchmarks/results/NAME.md`` (``labels.md`` without a NAME).
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
from _common import ROOT, add_results_flag, command_line, cpu_model, report

sys.path.insert(0, str(ROOT))

TITLE = "Label embeddings: reconstruction and cone containment"

from models.labels import (  # noqa: E402
    LabelEmbedding,
    LabelTrainConfig,
    evaluate_cone_protocol,
    evaluate_cones,
    evaluate_reconstruction,
    train_labels,
)
from models.taxonomy.defaults import default_taxonomy  # noqa: E402
from models.taxonomy.graph import Taxonomy  # noqa: E402


def machine() -> str:
    return f"{os.cpu_count()} cores, {cpu_model()}, torch {torch.__version__}"


def evaluate(emb: LabelEmbedding, progress: bool = True) -> dict:
    rec = evaluate_reconstruction(emb, progress=progress)
    strict = evaluate_cones(emb, progress=progress)
    proto = evaluate_cone_protocol(emb)
    return {
        "mean_rank": rec["mean_rank"],
        "map": rec["map"],
        "cone": strict["cone"],
        "precision": strict["cone_precision"],
        "recall": strict["cone_recall"],
        "f1_strict": strict["cone_f1"],
        "negatives_sampled": strict["cone_negatives_sampled"],
        "f1_protocol": proto["protocol_f1"],
        "threshold": proto["protocol_threshold"],
        "threads": torch.get_num_threads(),
    }


def run_ours(name: str, tax: Taxonomy, init: str, out_dir: Path, reuse: bool) -> dict:
    path = out_dir / f"{name.replace(' ', '-')}-{init}.labels"
    if reuse and path.exists():  # evaluate the checkpoint of an earlier run
        emb = LabelEmbedding.load(path)
        assert emb.taxonomy == tax, f"{path} was trained on another taxonomy"
        minutes = emb.metrics["train_seconds"] / 60
    else:
        cfg = LabelTrainConfig(dim=10, init=init)
        t0 = time.perf_counter()
        emb = train_labels(tax, cfg, progress=True)
        minutes = (time.perf_counter() - t0) / 60
        emb.save(path)
    how = "cap construction" if init == "cap" else f"N&K from the {init} start, {emb.epoch} epochs"
    radius = emb.metrics.get("construction", {}).get("max_radius")
    return {
        "setting": f"hypsearch {how}, {name} ({len(tax):,} nodes), dim 10",
        "minutes": minutes,
        "max_radius": radius,
    } | evaluate(emb)


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
    emb = LabelEmbedding(tax, vecs, 1.0)  # Ganea cones, K = 0.1
    return {
        "setting": f"gensim PoincareModel, {name}, dim 10, {epochs} epochs, 10 negatives",
        "minutes": minutes,
        "max_radius": None,
    } | evaluate(emb, progress=False)


def table(rows: list[dict], when: str) -> str:
    threads = sorted({str(r.get("threads", "?")) for r in rows})
    lines = [
        f"Measured {when} on {machine()}, {'/'.join(threads)} torch thread(s) "
        "(`python benchmarks/labels.py`).",
        "",
        "| setting | minutes | mean rank | MAP | cones | strict P | strict R | strict F1 "
        "| Ganea protocol F1 (threshold) |",
        "| --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        note = (
            f" (negatives: {r['negatives_sampled']:,} sampled)"
            if r.get("negatives_sampled")
            else ""
        )
        lines.append(
            f"| {r['setting']} | {r['minutes']:.1f} | {r['mean_rank']:.2f} | {r['map']:.3f} "
            f"| {r['cone']} | {r['precision']:.3f} | {r['recall']:.3f} "
            f"| {r['f1_strict']:.3f}{note} "
            f"| {r['f1_protocol']:.3f} ({r['threshold']:.3g}) |"
        )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--only",
        nargs="+",
        choices=["mammals", "default", "nouns"],
        default=["mammals", "default", "nouns"],
        help="the taxonomies to run",
    )
    p.add_argument(
        "--inits",
        nargs="+",
        default=["cap", "hierarchical"],
        help="label inits to run (cap: the default construction; hierarchical: N&K training)",
    )
    p.add_argument("--gensim-epochs", type=int, default=50)
    p.add_argument("--no-gensim", action="store_true")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--out-dir", default=str(ROOT / "var" / "bench"))
    add_results_flag(p, "labels")
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
        report(
            table(rows, args.when or dt.date.today().isoformat()),
            args.write_results,
            command=command_line("labels.py"),
            title=TITLE,
        )
        return
    if args.threads:
        torch.set_num_threads(args.threads)
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    when = dt.date.today().isoformat()
    rows = []
    for which in args.only:
        if which == "mammals":
            name, tax = "mammal closure", Taxonomy.from_wordnet(root="mammal.n.01")
        elif which == "default":
            name, tax = "default taxonomy", default_taxonomy()
        else:
            name, tax = "noun closure", Taxonomy.from_wordnet()
        for init in args.inits:
            rows.append(run_ours(name, tax, init, out_dir, args.reuse))
            print(json.dumps(rows[-1]), flush=True)
        if which == "mammals" and not args.no_gensim:
            g = run_gensim(name, tax, args.gensim_epochs)
            if g:
                rows.append(g)
                print(json.dumps(g), flush=True)
    report(table(rows, when), args.write_results, command=command_line("labels.py"), title=TITLE)


if __name__ == "__main__":
    main()
