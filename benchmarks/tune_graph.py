"""Tuning of the graph backend's constants on data the ANN benchmark does not measure.

    .venv/bin/python benchmarks/tune_graph.py --write-results     # benchmarks/results/tune_graph.md

The graph backend (:mod:`indexing.backends.graph`) has two constants chosen on
data: :func:`indexing.backends.graph_params.default_ef` (the beam width of a
graph that has not calibrated one) and
:data:`indexing.backends.graph_params.CALIBRATION_MARGIN` (how much more recall
the calibration asks of its own queries than ``target_recall``).  This script
sets them on the datasets of ``benchmarks/ann.py`` drawn with another seed
(``--seed``, 1; ``ann.py`` measures seed 0): other points, other queries.
The noun embeddings are one fixed set, so there only the queries (and a
30,000-node subsample) differ.

For each dataset it builds the graph index once per candidate margin
(``--margins``, smallest first, until its default search reaches the target: a
larger margin only widens the calibrated beam) and reports:

* the beam width the calibration chose with that margin and the recall@10 of
  the dataset's fresh queries at that width (the default search);
* from the first build, the narrowest width of
  :data:`~indexing.backends.graph_params.EF_LADDER` whose recall@10 reaches the
  target (0.99): what ``default_ef`` should return for that size and dimension.

The margin it recommends is the smallest candidate with which every dataset's
default search reaches the target; the table beside it says whether the
constants in the code are the tuned ones.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
from _common import add_results_flag, command_line, cpu_model, report_each
from ann import FULL, MIXED, NOUNS, TARGET, exact_truth, make_data, recall

from indexing import HyperbolicIndex
from indexing.backends import graph_calibrate, graph_params

DATASETS = FULL + ",nouns:30000"


def say(*a) -> None:
    print(*a, file=sys.stderr, flush=True)


def code_default_ef(spec: str, n: int, ix: HyperbolicIndex) -> int:
    """What :func:`default_ef` of the code gives the built index's data."""
    b = ix._backend
    return graph_params.default_ef(b.space.dim, n, deep=b._deep_tuned(), product=spec == MIXED)


def tune_dataset(args, name: str, margins: list[float]) -> dict:
    x, q, spec, desc = make_data(name, args.queries, args.seed, args.nouns_labels)
    t = time.perf_counter()
    truth = exact_truth(x, q, spec, args.k)
    say(f"{desc}: truth in {time.perf_counter() - t:.1f} s")
    out = {"desc": desc, "runs": [], "needed": None, "code_ef": None}
    for j, m in enumerate(margins):
        graph_calibrate.CALIBRATION_MARGIN = m
        t = time.perf_counter()
        ix = HyperbolicIndex(space=spec, backend="graph")
        ix.add(x, [str(i) for i in range(len(x))])
        build = time.perf_counter() - t
        ids, _ = ix.search(q, k=args.k)
        rec = recall(ids.astype(np.int64), truth)
        ef = ix._backend.ef
        out["runs"].append((m, ef, rec, build))
        say(f"  margin {m:g}: calibrated ef {ef}, recall {rec:.4f} (build {build:.0f} s)")
        if j == 0:
            out["code_ef"] = code_default_ef(spec, len(x), ix)
            for w in graph_params.EF_LADDER:
                ids, _ = ix.search(q, k=args.k, ef=w)
                r = recall(ids.astype(np.int64), truth)
                if r >= TARGET:
                    out["needed"] = (w, r)
                    break
            say(f"  narrowest width at {TARGET}: {out['needed']} (code: {out['code_ef']})")
        del ix
        if rec >= TARGET:  # a larger margin only widens the beam
            break
    return out


def tables(results, args, margins, load0, started) -> str:
    code_margin = graph_params.CALIBRATION_MARGIN
    passing = [next((m for m, _e, rec, _b in r["runs"] if rec >= TARGET), None) for r in results]
    pick = None if None in passing else max(passing, default=None)
    lines = [
        f"Tuning data: the datasets of `benchmarks/ann.py` drawn with seed {args.seed} "
        f"(ann.py measures seed 0; the noun embeddings are one set: other queries), "
        f"{args.queries:,} fresh queries each, truth = brute-force exact float64 top-{args.k}. "
        f"{cpu_model()}, {os.cpu_count()} CPUs; load average {load0:.1f} at the start, "
        f"{os.getloadavg()[0]:.1f} at the end ({(time.time() - started) / 60:.0f} min).",
        "",
        f"Calibrated beam width and recall@{args.k} of the default search, by "
        "`CALIBRATION_MARGIN` (build: seconds, 2 shared cores):",
        "",
        "| dataset | " + " | ".join(f"margin {m:g}" for m in margins) + " |",
        "| --- | " + " | ".join("---" for _ in margins) + " |",
    ]
    for r in results:
        cells = [
            f"ef {ef}: {'**' if rec < TARGET else ''}{rec:.4f}{'**' if rec < TARGET else ''} "
            f"({b:.0f} s)"
            for _m, ef, rec, b in r["runs"]
        ]
        cells += ["(not built)"] * (len(margins) - len(cells))
        lines.append(f"| {r['desc']} | " + " | ".join(cells) + " |")
    lines += [
        "",
        f"Smallest margin with every dataset at recall@{args.k} ≥ {TARGET}: "
        + (f"**{pick:g}**" if pick is not None else "none of the candidates")
        + f" (the code: {code_margin:g}, "
        + ("the tuned value" if pick == code_margin else "not the tuned value")
        + ").",
        "",
        f"Narrowest width of `EF_LADDER` at recall@{args.k} ≥ {TARGET} (the graph of the "
        "first build), against `default_ef` of the code:",
        "",
        "| dataset | narrowest width (recall) | `default_ef` |",
        "| --- | ---: | ---: |",
    ]
    for r in results:
        need = r["needed"]
        cell = f"{need[0]} ({need[1]:.4f})" if need else f"— (> {graph_params.EF_LADDER[-1]})"
        lines.append(f"| {r['desc']} | {cell} | {r['code_ef']} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--datasets", default=DATASETS)
    ap.add_argument("--seed", type=int, default=1, help="tuning seed (ann.py measures 0)")
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--margins", default="0,0.003,0.006")
    ap.add_argument("--nouns-labels", default=NOUNS)
    add_results_flag(ap, "tune_graph")
    args = ap.parse_args(argv)
    command = command_line("tune_graph.py", sys.argv[1:] if argv is None else argv)
    margins = sorted(float(m) for m in args.margins.split(","))
    import torch

    torch.set_num_threads(1)
    load0, started = os.getloadavg()[0], time.time()
    report_each(
        [n for n in args.datasets.split(",") if n],
        lambda name: tune_dataset(args, name, margins),
        lambda results: tables(results, args, margins, load0, started),
        args.write_results,
        command=command,
        title="Graph backend constants: tuning",
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
