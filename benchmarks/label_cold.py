"""Cold label queries: the first query of each label, in one process.

A label query is kept by the index once answered (until the index changes),
so ``benchmarks/load.py``, which asks 200 labels over and over, measures
mostly kept answers. Over the 82,115 WordNet nouns most queries a user makes
are a label's first. This script opens a collection as the service does (a
:class:`service.runtime.BallRuntime` over a label checkpoint, with ``--items``
items near random labels' points, as ``load.py --labels`` makes them) and
times, in the search worker's own call (``searching.search_many`` and the
answer's JSON), the first query of ``--queries`` labels drawn uniformly, in
the default mode (entailment) and the hierarchical one, and the first query
of the most general labels (the most descendants)::

    python benchmarks/label_cold.py --labels var/bench/nouns.labels \\
        [--before REV] [--write-results]

``--before REV`` measures the same with the code of commit ``REV`` too
(exported with ``git archive``; this script run again over it), before this
checkout's, so one results file holds both.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from _common import ROOT, command_line, report, run_meta


def measure(labels: Path, items: int, queries: int, general: int) -> dict:
    from indexing.batches import open_index
    from models.labels import LabelEmbedding
    from service import searching
    from service.pipeline import answer_json
    from service.runtime import BallRuntime

    emb = LabelEmbedding.load(labels)
    tax = emb.taxonomy
    names = tax.names
    tmp = tempfile.TemporaryDirectory(prefix="hs-cold-")
    index = open_index(Path(tmp.name) / "index", dim=emb.dim, curvature=float(emb.curvature))
    t = time.perf_counter()
    rt = BallRuntime(index, emb, None)
    opened = time.perf_counter() - t
    # items near random labels' points, as load.py's label collection makes them
    rng = np.random.default_rng(0)
    x = emb.embeddings.numpy().astype(np.float64)
    sc = float(emb.curvature) ** 0.5
    rows = rng.integers(0, len(names), items).tolist()
    vecs = []
    for row in rows:
        v = x[row]
        nv = float(np.linalg.norm(v))
        rho = 2 * np.arctanh(min(nv * sc, 1 - 1e-16))
        vecs.append(v / max(nv, 1e-300) * np.tanh(min(rho, 12.0) / 2) / sc)
    rt.upsert([f"lab-{j}" for j in range(items)], np.array(vecs), [names[r] for r in rows])

    def first(label: str, mode: str) -> float:
        t = time.perf_counter()
        ans = searching.search_many(rt, [searching.Query(k=10, mode=mode, label=label)])[0]
        if isinstance(ans, Exception):
            raise ans
        answer_json(rt, ans)
        return (time.perf_counter() - t) * 1000

    n_desc = np.bincount(tax.closure_edges()[:, 1], minlength=len(names))
    top = [names[j] for j in np.lexsort((np.arange(len(names)), -n_desc))[:general].tolist()]
    out = {"opened_s": opened, "labels": len(names), "items": items, "general": {}}
    for mode in ("entailment", "hierarchical"):
        first(names[0], mode)  # the index's state, prepared once
        pick = random.Random(f"cold-{mode}")
        ms = [first(pick.choice(names), mode) for _ in range(queries)]
        out[mode] = {
            "queries": queries,
            "mean": float(np.mean(ms)),
            "p50": float(np.percentile(ms, 50)),
            "p99": float(np.percentile(ms, 99)),
            "max": float(max(ms)),
        }
        out["general"][mode] = {n: first(n, mode) for n in top}
    out["descendants"] = {n: int(n_desc[tax.index(n)]) for n in top}
    rt.close()
    tmp.cleanup()
    return out


def run_at(rev: str, args) -> tuple[str, dict]:
    """This script's measurement with the code of commit ``rev`` (short hash, result)."""
    sha = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", rev],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="hs-cold-rev-") as tree:
        archive = subprocess.Popen(["git", "-C", str(ROOT), "archive", sha], stdout=subprocess.PIPE)
        subprocess.run(["tar", "-x", "-C", tree], stdin=archive.stdout, check=True)
        archive.wait()
        cmd = [sys.executable, str(Path(__file__).resolve()), "--json", "--labels"]
        cmd += [str(args.labels.resolve()), "--items", str(args.items)]
        cmd += ["--queries", str(args.queries), "--general", str(args.general)]
        env = {**os.environ, "PYTHONPATH": tree}
        out = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, check=True)
    return sha, json.loads(out.stdout)


def table(runs: list[tuple[str, dict, float]], meta: dict) -> str:
    first = runs[0][1]
    out = [
        f"Measured {meta['date']} on {meta['cpu']} ({meta['cores']} cores), one process, "
        f"`python benchmarks/label_cold.py {meta['args']}`: a collection over "
        f"{first['labels']:,} labels with {first['items']:,} items; the first query of each "
        "label (k 10), timed in the search worker's call (`searching.search_many` and the "
        "answer's JSON). The machine is shared with other work: the load average (1 min) "
        "before each run is in the table.",
        "",
        "| code | mode | first queries of random labels | mean ms | p50 ms | p99 ms | max ms "
        "| collection opened in | load |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for sha, r, load in runs:
        for mode in ("entailment", "hierarchical"):
            m = r[mode]
            out.append(
                f"| {sha} | {mode} | {m['queries']} | {m['mean']:.2f} | {m['p50']:.2f} "
                f"| {m['p99']:.2f} | {m['max']:.1f} | {r['opened_s']:.1f} s | {load:.1f} |"
            )
    general = list(first["general"]["entailment"])
    out += [
        "",
        "The first query of the most general labels (ms; descendants in brackets):",
        "",
        "| code | mode | "
        + " | ".join(f"{n} ({first['descendants'][n]:,})" for n in general)
        + " |",
        "| --- | --- | " + " | ".join("---:" for _ in general) + " |",
    ]
    for sha, r, _ in runs:
        for mode in ("entailment", "hierarchical"):
            g = r["general"][mode]
            out.append(f"| {sha} | {mode} | " + " | ".join(f"{g[n]:.1f}" for n in general) + " |")
    return "\n".join(out)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--labels", type=Path, required=True, help="a label checkpoint")
    p.add_argument("--items", type=int, default=2000)
    p.add_argument("--queries", type=int, default=300, help="random labels per mode")
    p.add_argument("--general", type=int, default=6, help="most general labels asked")
    p.add_argument("--before", help="also measure the code of this commit, first")
    p.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--write-results", nargs="?", const="label-cold", default=None)
    args = p.parse_args()
    if not args.labels.is_file():
        p.error(f"--labels {args.labels}: no such file")
    if not (1 <= args.items <= 100000 and 1 <= args.queries <= 10000 and 1 <= args.general <= 20):
        p.error("--items 1 to 100000, --queries 1 to 10000, --general 1 to 20")
    if args.json:
        print(json.dumps(measure(args.labels, args.items, args.queries, args.general)))
        return 0
    runs = []
    if args.before:
        load = os.getloadavg()[0]
        sha, got = run_at(args.before, args)
        runs.append((f"{sha} (before)", got, load))
    load = os.getloadavg()[0]
    here = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    runs.append((here, measure(args.labels, args.items, args.queries, args.general), load))
    meta = run_meta(
        args=command_line("label_cold.py").removeprefix("python benchmarks/label_cold.py "),
    )
    report(table(runs, meta), args.write_results, command=command_line("label_cold.py"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
