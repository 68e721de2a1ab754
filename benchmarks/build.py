"""Index build time: hypsearch's graph against hnswlib on the same data, same threads.

    .venv/bin/python benchmarks/build.py                           # cloud:300000:32, 3 rounds
    .venv/bin/python benchmarks/build.py --datasets other:300000:32 --rounds 2
    .venv/bin/python benchmarks/build.py --write-results           # benchmarks/results/build.md

Datasets as in ``benchmarks/ann.py`` (``cloud:N:D``, ``other:N:D``, ...). For each
round, back to back on the same machine, the builds run in turn:

* ``hypsearch``: ``HyperbolicIndex(space)`` with its defaults (the graph
  backend), ``build_threads`` = ``--threads``: one ``add`` of every point (the
  calibration of the default beam included), then its recall@10 at that
  default beam against the exact top 10 of ``--queries`` queries and its
  queries/s on one thread;
* ``hnswlib``: ``l2`` on the coordinates, ``M=16`` and ``ef_construction=200``
  (the values hnswlib's README recommends), ``set_num_threads(--threads)``, one
  ``add_items``;
* ``hnswlib-same``: the same with ``ef_construction`` equal to hypsearch's
  (its layer 0 then keeps up to ``2M = 32`` neighbours: hypsearch's ``R``).

The load average (1 min) is recorded before each build: the machine may be
shared. The best round of each build is reported, and every round listed.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
from _common import ROOT, add_results_flag, command_line, cpu_model, report

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from ann import exact_truth, make_data, recall  # noqa: E402

from indexing import HyperbolicIndex  # noqa: E402
from indexing.backends import graph as graph_backend  # noqa: E402


def load() -> float:
    return os.getloadavg()[0]


def build_hypsearch(x, spec, threads: int, q, truth, ef_construction=None) -> dict:
    ids = [str(j) for j in range(len(x))]
    params = {} if ef_construction is None else {"ef_construction": ef_construction}
    t = time.perf_counter()
    ix = HyperbolicIndex(space=spec, backend="graph", build_threads=threads, **params)
    ix.add(x, ids)
    seconds = time.perf_counter() - t
    p = ix.stats()["backend_params"]
    graph_backend.set_search_threads(1)
    ix.search(q[:64], k=10)  # warm-up
    t = time.perf_counter()
    found, _ = ix.search(q, k=10)
    qps = len(q) / (time.perf_counter() - t)
    graph_backend.set_search_threads(0)
    rec = recall(found.astype(np.int64), truth)
    info = {
        "seconds": seconds,
        "recall": rec,
        "qps": qps,
        "ef": ix._backend.ef,
        "R": p["R"],
        "ef_construction": p["ef_construction"],
    }
    ix.close()
    return info


def build_hnswlib(x, threads: int, ef_construction: int) -> dict:
    import hnswlib

    t = time.perf_counter()
    ix = hnswlib.Index(space="l2", dim=x.shape[1])
    ix.init_index(max_elements=len(x), M=16, ef_construction=ef_construction, random_seed=100)
    ix.set_num_threads(threads)
    ix.add_items(x.astype(np.float32), np.arange(len(x)))
    return {"seconds": time.perf_counter() - t}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--datasets", default="cloud:300000:32")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--ef-construction",
        default="",
        help="also build hypsearch with these ef_construction values (comma separated)",
    )
    add_results_flag(ap, "build")
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load0 = load()
    rows, summary = [], []
    for name in args.datasets.split(","):
        x, q, spec, desc = make_data(name, args.queries, args.seed, "")
        truth = exact_truth(x, q, spec, 10)
        build_hypsearch(x[:5000], spec, args.threads, q[:100], truth[:100])  # compiles the kernels
        best: dict[str, dict] = {}
        extra = [int(v) for v in args.ef_construction.split(",") if v.strip()]
        apps = ["hypsearch", "hnswlib", "hnswlib-same"] + [f"hypsearch-efc{v}" for v in extra]
        for r in range(args.rounds):
            efc = None
            for app in apps:
                before = load()
                if app == "hypsearch":
                    got = build_hypsearch(x, spec, args.threads, q, truth)
                    efc = got["ef_construction"]
                elif app.startswith("hypsearch-efc"):
                    v = int(app.removeprefix("hypsearch-efc"))
                    got = build_hypsearch(x, spec, args.threads, q, truth, ef_construction=v)
                elif app == "hnswlib":
                    got = build_hnswlib(x, args.threads, 200)
                else:
                    got = build_hnswlib(x, args.threads, efc)
                got["load"] = before
                print(f"{desc} round {r + 1} {app}: {got}", file=sys.stderr, flush=True)
                rows.append((desc, r + 1, app, got))
                if app not in best or got["seconds"] < best[app]["seconds"]:
                    best[app] = got
        h, peer = best["hypsearch"], best["hnswlib"]
        summary.append(
            f"| {desc} | {h['seconds']:.1f} | {peer['seconds']:.1f} | "
            f"{best['hnswlib-same']['seconds']:.1f} (ef_construction {h['ef_construction']}) | "
            f"{h['seconds'] / peer['seconds']:.2f}x | {h['recall']:.4f} (ef {h['ef']}) | "
            f"{h['qps']:,.0f} |"
        )
        for app in apps[3:]:
            b = best[app]
            summary.append(
                f"| {desc}, hypsearch ef_construction {b['ef_construction']} | "
                f"{b['seconds']:.1f} | | | {b['seconds'] / peer['seconds']:.2f}x | "
                f"{b['recall']:.4f} (ef {b['ef']}) | {b['qps']:,.0f} |"
            )
    lines = [
        f"Measured {started} on {cpu_model()} ({os.cpu_count()} CPUs), builds with "
        f"{args.threads} threads, {args.rounds} rounds, the builds of a round back to back; "
        f"load average (1 min) {load0:.1f} before the run, {load():.1f} after (the machine "
        "is shared: each build's load is in the second table).",
        "",
        "| dataset | hypsearch build s | hnswlib build s (M 16, ef_construction 200) | "
        "hnswlib build s (M 16, hypsearch's ef_construction) | hypsearch / hnswlib | "
        "hypsearch recall@10 (default beam) | hypsearch q/s, 1 thread |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
        *summary,
        "",
        "Every build (seconds; load average before it):",
        "",
        "| dataset | round | build | seconds | load | recall@10 | q/s, 1 thread |",
        "| --- | ---: | --- | ---: | ---: | ---: | ---: |",
    ]
    for desc, r, app, got in rows:
        rec = f"{got['recall']:.4f}" if "recall" in got else ""
        qps = f"{got['qps']:,.0f}" if "qps" in got else ""
        lines.append(
            f"| {desc} | {r} | {app} | {got['seconds']:.1f} | {got['load']:.1f} | {rec} | {qps} |"
        )
    report(
        "\n".join(lines) + "\n",
        args.write_results,
        command=command_line("build.py", argv),
        title="Index build: hypsearch's graph against hnswlib, same data and threads",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
