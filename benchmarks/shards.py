"""The sharded index on Ray as it grows: 1, 2 and 4 shards at 100k, 300k and 1M
synthetic vectors (build time, queries/s, p99, memory per shard). Run inside a
network namespace that has only ``lo`` (Ray binds the machine's interface
otherwise)::

    ip netns add hs; ip netns exec hs ip link set lo up
    ip netns exec hs env PYTHONPATH=$PWD RAY_USAGE_STATS_ENABLED=0 \\
        .venv/bin/python benchmarks/shards.py --write-results
    ip netns del hs

``--sizes`` and ``--shards`` (comma separated) pick the grid; ``--dim`` the
dimension of the hierarchical cloud (:func:`indexing.synthetic.hierarchical_cloud`).
For each cell, on one local Ray cluster (``--cpus`` CPUs):

* **build**: a new :class:`indexing.sharded.ShardedIndex` (``ray=True``: one
  actor per shard, each a durable index folder), every vector added in chunks
  of ``--chunk`` (each chunk: one call per shard, the shards in parallel), the
  wall time from the first call to the last answer (actor start-up apart);
* **memory per shard**: the shard's own account (``stats()["memory_bytes"]``:
  vectors, graph, maps) and its actor process's resident memory (VmRSS);
* **latency**: ``--single`` queries one at a time (one fan-out each): p50 and p99;
* **throughput**: ``--clients`` threads each sending one query at a time for
  ``--seconds`` (the 32 connections of the load benchmark, without HTTP):
  queries/s and p99; and one call with every query (the fan-out batched per
  shard): queries/s.

The load average (1 min) is recorded before each cell: the machine may be shared.
The results file is written again after every cell, so a run cut short keeps the
cells it finished.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
from _common import ROOT, add_results_flag, command_line, cpu_model, report

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def rss(pid: int) -> int:
    """Resident bytes of process ``pid`` (same machine)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def cell(ray, n: int, shards: int, x, q, args, tmp: Path) -> dict:
    from indexing.sharded import ShardedIndex

    folder = tmp / f"n{n}-s{shards}"
    ids = [f"p{j}" for j in range(n)]
    load = os.getloadavg()[0]
    t = time.perf_counter()
    ix = ShardedIndex(folder, shards=shards, dim=x.shape[1], ray=True, timeout=600)
    start_s = time.perf_counter() - t
    t = time.perf_counter()
    for lo in range(0, n, args.chunk):
        ix.add(x[lo : lo + args.chunk], ids[lo : lo + args.chunk])
    build_s = time.perf_counter() - t
    stats = ix.stats()["shards"]
    info = ix.shard_info()
    mem = [s["memory_bytes"] for s in stats]
    res = [rss(i["pid"]) for i in info]
    ix.search(q[:8], k=10)  # warm
    lat = []
    for i in range(args.single):
        t0 = time.perf_counter()
        ix.search(q[i % len(q)], k=10)
        lat.append(time.perf_counter() - t0)
    stop = threading.Event()
    tl: list[float] = []

    def client(j):
        i = j
        while not stop.is_set():
            t0 = time.perf_counter()
            ix.search(q[i % len(q)], k=10)
            tl.append(time.perf_counter() - t0)
            i += args.clients

    threads = [threading.Thread(target=client, args=(j,)) for j in range(args.clients)]
    t = time.perf_counter()
    for th in threads:
        th.start()
    time.sleep(args.seconds)
    stop.set()
    for th in threads:
        th.join()
    conc_s = time.perf_counter() - t
    t = time.perf_counter()
    ix.search(q, k=10)
    batch_qps = len(q) / (time.perf_counter() - t)
    ix.close()
    shutil.rmtree(folder, ignore_errors=True)
    return {
        "n": n,
        "shards": shards,
        "load": load,
        "start_s": start_s,
        "build_s": build_s,
        "mem": mem,
        "rss": res,
        "p50": float(np.percentile(lat, 50)),
        "p99": float(np.percentile(lat, 99)),
        "conc_qps": len(tl) / conc_s,
        "conc_p99": float(np.percentile(tl, 99)),
        "batch_qps": batch_qps,
    }


def tables(rows: list[dict], args, started: str, load0: float, argv) -> None:
    mib = 2**20
    lines = [
        f"Measured {started} on {cpu_model()} ({os.cpu_count()} CPUs), one local Ray "
        f"cluster ({args.cpus} CPUs) on this machine: every shard's actor, the driver and "
        f"its {args.clients} client threads share the same cores. Hierarchical cloud, "
        f"{args.dim}-d, added in chunks of {args.chunk:,}; {args.queries:,} queries, k = 10. "
        f"Load average (1 min) {load0:.1f} before the run, {os.getloadavg()[0]:.1f} after; "
        "each cell's in the table (the machine is shared).",
        "",
        "| items | shards | actors' start s | build s | items/s | memory per shard (index, MiB) | "
        "shard process RSS (MiB) | one query p50 ms | p99 ms | "
        f"{args.clients} clients q/s | {args.clients} clients p99 ms | one batched call q/s | "
        "load |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
        "| ---: |",
    ]
    for r in rows:
        lines.append(
            f"| {r['n']:,} | {r['shards']} | {r['start_s']:.0f} | {r['build_s']:.1f} | "
            f"{r['n'] / r['build_s']:,.0f} | "
            f"{max(r['mem']) / mib:.0f} | {max(r['rss']) / mib:.0f} | {r['p50'] * 1e3:.2f} | "
            f"{r['p99'] * 1e3:.2f} | {r['conc_qps']:,.0f} | {r['conc_p99'] * 1e3:.1f} | "
            f"{r['batch_qps']:,.0f} | {r['load']:.1f} |"
        )
    lines += [
        "",
        "Memory per item (index account of the largest shard x shards / items): "
        + ", ".join(
            f"{r['n']:,} in {r['shards']}: {max(r['mem']) * r['shards'] / r['n']:.0f} B"
            for r in rows
        )
        + ".",
    ]
    report(
        "\n".join(lines) + "\n",
        args.write_results,
        command=command_line("shards.py", argv),
        title="Sharded index on Ray: build, queries and memory by items and shards",
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="100000,300000,1000000")
    ap.add_argument("--shards", default="1,2,4")
    ap.add_argument("--dim", type=int, default=16)
    ap.add_argument("--chunk", type=int, default=100_000)
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--single", type=int, default=300)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--cpus", type=int, default=os.cpu_count())
    add_results_flag(ap, "shards")
    args = ap.parse_args(argv)
    from indexing.synthetic import hierarchical_cloud
    from service.ray_serve import start_local_ray

    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load0 = os.getloadavg()[0]
    ray = start_local_ray(
        cpus=args.cpus,
        object_store_bytes=600 * 2**20,
        temp_dir=os.path.join(tempfile.gettempdir(), f"hsbench-{os.getpid()}"),
    )
    tmp = Path(tempfile.mkdtemp(prefix="hs-shards-"))
    rows: list[dict] = []
    try:
        for n in [int(v) for v in args.sizes.split(",")]:
            x, q = hierarchical_cloud(n, args.dim, seed=0, n_queries=args.queries)
            for s in [int(v) for v in args.shards.split(",")]:
                r = cell(ray, n, s, x, q, args, tmp)
                print(r, file=sys.stderr, flush=True)
                rows.append(r)
                tables(rows, args, started, load0, argv)  # each cell as it comes
    finally:
        ray.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
