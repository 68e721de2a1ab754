"""One round trip to the shards, three ways: Ray actor calls (a task per shard), a
Ray Compiled Graph over the same actors, and the shards' direct channel
(:mod:`indexing.channel`, what ``serve --ray`` uses for its reads).

::

    python benchmarks/shard_channel.py [--items 10000] [--calls 2000] [--write-results]

A local Ray cluster (2 shard actors of a :class:`indexing.sharded.ShardedIndex` of
``--items`` random 10-d points, the default backend) on this machine; each way makes the
same calls, one after another from one thread: one that does nothing (the
shard's ``info``: the round trip alone), a nearest search of 1 query and of
32 queries (k 10) on both shards, merged as the service merges them, and (for the
three ways alike) the shards' ``many`` of 16 such searches (a label micro-batch's
shape). Per call: the mean wall time and the CPU seconds of every process of the
run (this one, the GCS, the raylet, the actors). The compiled graph runs last
(its teardown leaves the actors as they were). Ray binds the machine's network
interface, so, as ``ray_serve.py``, the script runs in a loopback-only network
namespace (as root it makes one).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from _common import ROOT, add_results_flag, command_line, report, run_meta
from ray_serve import in_namespace, loopback_only, session_cpu

sys.path.insert(0, str(ROOT))  # this checkout's packages, not an installed copy


def measure(fn, calls: int) -> tuple[float, float]:
    """Mean wall and CPU (all of the run's processes) microseconds per call of ``fn``."""
    for _ in range(max(20, calls // 20)):  # warm
        fn()
    sid = os.getsid(0)
    cpu, t0 = session_cpu(sid), time.perf_counter()
    for _ in range(calls):
        fn()
    wall = time.perf_counter() - t0
    return 1e6 * wall / calls, 1e6 * (session_cpu(sid) - cpu) / calls


def run(args, tmp: Path) -> list[tuple[str, str, float, float]]:
    from indexing.sharded import ShardedIndex
    from service.ray_serve import start_local_ray

    try:
        os.setsid()  # this run's processes apart, for their CPU (session_cpu)
    except OSError:  # a session leader already
        pass
    ray = start_local_ray(cpus=2, object_store_bytes=200 * 2**20, temp_dir=str(tmp / "ray"))
    rng = np.random.default_rng(0)
    dim = 10
    pts = rng.uniform(-1, 1, (args.items, dim)) * 0.8 / np.sqrt(dim)
    ids = [f"p{i}" for i in range(args.items)]
    owner = ShardedIndex(tmp / "ix", shards=2, dim=dim, ray=True)
    owner.add(pts, ids)
    by_actor = ShardedIndex(tmp / "ix", ray=True, fail_fast=True, channel=False)
    by_channel = ShardedIndex(tmp / "ix", ray=True, fail_fast=True, channel=True)
    q1, q32 = pts[:1] * 0.9, pts[:32] * 0.9
    plan = ("call", ("search", q1, 10), {})
    batch = [plan] * 16
    rows = []
    for way, ix in (("Ray actor calls", by_actor), ("direct channel", by_channel)):
        for what, fn in (
            ("nothing (the shard's `info`)", lambda ix=ix: ix._read_all("info")),
            ("search, 1 query", lambda ix=ix: ix.search(q1, k=10)),
            ("search, 32 queries", lambda ix=ix: ix.search(q32, k=10)),
            ("many: 16 searches", lambda ix=ix: ix._read_all("many", batch)),
        ):
            rows.append((way, what, *measure(fn, args.calls)))
            print(rows[-1], file=sys.stderr, flush=True)
    want = by_channel.search(q32, k=10)
    got = by_actor.search(q32, k=10)
    assert all(np.array_equal(a, b) for a, b in zip(want, got, strict=True))
    from ray.dag import InputNode, MultiOutputNode

    actors = by_actor._shards.actors
    with InputNode() as inp:
        dag = MultiOutputNode([a.many.bind(inp) for a in actors])
    graph = dag.experimental_compile()
    try:
        merge = by_actor._plan_search(q1, 10)[1]
        merge32 = by_actor._plan_search(q32, 10)[1]
        c32 = [("call", ("search", q32, 10), {})]
        for what, fn in (
            ("nothing (the shard's `info`)", lambda: ray.get(graph.execute([("info", (), {})]))),
            ("search, 1 query", lambda: merge([p[0][1] for p in ray.get(graph.execute([plan]))])),
            ("search, 32 queries", lambda: merge32([p[0][1] for p in ray.get(graph.execute(c32))])),
            ("many: 16 searches", lambda: ray.get(graph.execute(batch))),
        ):
            rows.append(("Ray Compiled Graph", what, *measure(fn, args.calls)))
            print(rows[-1], file=sys.stderr, flush=True)
    finally:
        graph.teardown()
    by_actor.close(), by_channel.close(), owner.close()
    ray.shutdown()
    return rows


def table(rows, meta: dict) -> str:
    out = [
        f"Measured {meta['date']} on {meta['cpu']} ({meta['cores']} cores): a local Ray "
        f"cluster, 2 shard actors of {meta['items']:,} random 10-d points (default backend), "
        f"{meta['calls']:,} calls a cell from one thread (`{meta['command']}`); load "
        f"average (1 min) {meta['load'][0]:.1f} before, {meta['load'][1]:.1f} after. CPU: "
        "every process of the run (this one, the GCS, the raylet, the shard actors) over "
        "the calls.",
        "",
        "| way | call (both shards, answers merged) | wall µs / call | CPU µs / call |",
        "| --- | --- | ---: | ---: |",
    ]
    for way, what, wall, cpu in rows:
        out.append(f"| {way} | {what} | {wall:,.0f} | {cpu:,.0f} |")
    return "\n".join(out)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--items", type=int, default=10_000)
    p.add_argument("--calls", type=int, default=2000, help="per cell")
    add_results_flag(p, "shard-channel")
    args = p.parse_args()
    if not 100 <= args.items <= 1_000_000:
        p.error("--items: 100 to 1,000,000")
    if not 10 <= args.calls <= 100_000:
        p.error("--calls: 10 to 100,000")
    if not loopback_only():
        return in_namespace(sys.argv[1:], __file__)
    command = command_line("shard_channel.py")
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="hssc-") as d:
        rows = run(args, Path(d))
    meta = run_meta(
        items=args.items,
        calls=args.calls,
        command=command,
        load=(load_before, os.getloadavg()[0]),
    )
    report(table(rows, meta), args.write_results, command=command)
    return 0


if __name__ == "__main__":
    sys.exit(main())
