"""Filtered search and batch upserts: targets and measurements.

1. In process: an index of ``--n`` random points of the 8-d Poincaré ball
   (backend ``auto``: the graph above 20,000 items) whose payloads carry
   ``shard = i % 100``; queries one at a time, unfiltered and with the filter
   ``payload.shard == 42`` (1% of the items). Recall@10 of the filtered
   answers against the exact filtered k-NN (an exact index over the same
   points), queries/s of both, and the time of the first filter on the field
   (building its payload column from the store).
2. Through a real server (``hypsearch serve --labels LABELS`` on 127.0.0.1, a
   fresh index in a temporary folder): ``--single`` items written one
   ``PUT /v1/items/{id}`` at a time, then ``--batch`` items in one
   ``POST /v1/items/batch``; items/s of each (every write durable when answered).

::

    python benchmarks/filters.py [--n 100000] [--batch 10000] [--single 300]
        [--labels var/load/labels.safetensors] [--batch-only] [--write-results]

Prints a markdown table; ``--write-results [NAME]`` also writes it to
``benchmarks/results/NAME.md`` (``filters.md`` without a NAME).
``--batch-only`` runs part 2 alone and replaces only the REST rows of the
table in that results file (with a line saying when they were measured).
Targets: filtered recall@10 >= 0.99 and filtered q/s >= 1/3 of unfiltered;
batch items/s >= 10x single PUTs.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from _common import RESULTS, ROOT, add_results_flag, command_line, cpu_model, read_results, report

sys.path.insert(0, str(ROOT))

DIM = 8


def _points(rng, n: int, dim: int = DIM, rmax: float = 0.9) -> np.ndarray:
    d = rng.standard_normal((n, dim))
    return d / np.linalg.norm(d, axis=1, keepdims=True) * rng.uniform(0.05, rmax, (n, 1))


def filtered_search(n: int, queries: int) -> dict:
    from indexing import HyperbolicIndex

    rng = np.random.default_rng(0)
    x = _points(rng, n)
    ids = [f"p{j:07d}" for j in range(n)]
    payloads = [{"shard": j % 100} for j in range(n)]
    t = time.perf_counter()
    ix = HyperbolicIndex(DIM)
    ix.add(x, ids, payloads=payloads)
    build = time.perf_counter() - t
    q = _points(rng, queries)
    f = {"must": [{"key": "payload.shard", "match": 42}]}
    t = time.perf_counter()
    ix.count(f)  # the column of payload.shard, from the store
    column = time.perf_counter() - t
    ix.search(q[:5], k=10)  # warm the kernels
    ix.search(q[:5], k=10, where=f)

    def qps(**kw) -> tuple[float, list]:
        out = []
        t = time.perf_counter()
        for i in range(queries):
            out.append(ix.search(q[i], k=10, **kw)[0][0])
        return queries / (time.perf_counter() - t), out

    unf, _ = qps()
    fil, got = qps(where=f)
    exact = HyperbolicIndex(DIM, backend="exact")
    exact.add(x, ids)
    allowed = [i for i, p in zip(ids, payloads, strict=True) if p["shard"] == 42]
    truth, _ = exact.search(q, k=10, filter_ids=allowed)
    recall = float(np.mean([len(set(a) & set(b)) / 10 for a, b in zip(got, truth, strict=True)]))
    return {
        "n": n,
        "backend": ix.backend,
        "build_s": build,
        "column_s": column,
        "unfiltered_qps": unf,
        "filtered_qps": fil,
        "recall": recall,
        "allowed": len(allowed),
    }


def batch_upserts(labels: Path, single: int, batch: int) -> dict:
    import httpx

    from tests.support.server import free_port

    folder = Path(tempfile.mkdtemp(prefix="filters-bench-"))
    port = free_port()
    env = {**os.environ, "HYPSEARCH_TORCH_THREADS": "1", "PYTHONPATH": str(ROOT)}
    log = open(folder / "serve.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [sys.executable, "-m", "service.cli", "serve", "--labels", str(labels)]
        + ["--index", str(folder / "index"), "--port", str(port), "--log-level", "WARNING"],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(base_url=url, timeout=600) as c:
            deadline = time.monotonic() + 300
            while True:
                try:
                    if c.get("/readyz").status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"server did not start: {(folder / 'serve.log').read_text()}")
                time.sleep(0.2)
            dim = c.get("/v1/stats").json()["dim"]
            rng = np.random.default_rng(1)
            x = _points(rng, single + batch, dim, 0.6)
            t = time.perf_counter()
            for j in range(single):
                r = c.put(f"/v1/items/s{j}", json={"vector": x[j].tolist(), "payload": {"j": j}})
                r.raise_for_status()
            single_s = time.perf_counter() - t
            items = [
                {"id": f"b{j}", "vector": x[single + j].tolist(), "payload": {"j": j}}
                for j in range(batch)
            ]
            t = time.perf_counter()
            r = c.post("/v1/items/batch", json={"items": items})
            batch_s = time.perf_counter() - t
            r.raise_for_status()
            assert r.json() == {"upserted": batch}
            count = c.post("/v1/count", json={}).json()["count"]
            assert count == single + batch, count
    finally:
        proc.terminate()
        proc.wait(60)
        log.close()
    return {
        "single": single,
        "single_ips": single / single_s,
        "batch": batch,
        "batch_ips": batch / batch_s,
        "batch_s": batch_s,
    }


def table(s: dict, b: dict, load0: float, argv: str) -> str:
    when = dt.date.today().isoformat()
    ratio = s["filtered_qps"] / s["unfiltered_qps"]
    return "\n".join(
        [
            f"Measured {when} on {platform.node() or 'this machine'} ({cpu_model()}, "
            f"{os.cpu_count()} cores), load average {load0:.1f} at the start and "
            f"{os.getloadavg()[0]:.1f} at the end (measured while other jobs shared the "
            f"cores); `python benchmarks/filters.py {argv}`.",
            "",
            "| what | value | target |",
            "|---|---|---|",
            f"| index | {s['n']:,} points, 8-d ball, backend {s['backend']} "
            f"(built in {s['build_s']:.0f} s) | |",
            f"| filter `payload.shard == 42` | {s['allowed']:,} items (1%); its column "
            f"built from the store in {s['column_s']:.2f} s (first filter on the field) | |",
            f"| unfiltered search, one query at a time | {s['unfiltered_qps']:.0f} q/s | |",
            f"| filtered search, one query at a time | {s['filtered_qps']:.0f} q/s "
            f"({ratio:.2f}x unfiltered) | >= 0.33x |",
            f"| filtered recall@10 (vs exact filtered k-NN) | {s['recall']:.3f} | >= 0.99 |",
            *batch_rows(b),
        ]
    )


def batch_rows(b: dict) -> list[str]:
    speed = b["batch_ips"] / b["single_ips"]
    return [
        f"| REST: single `PUT /v1/items/{{id}}` ({b['single']} items) | "
        f"{b['single_ips']:.0f} items/s | |",
        f"| REST: one `POST /v1/items/batch` of {b['batch']:,} items | "
        f"{b['batch_ips']:.0f} items/s ({b['batch_s']:.1f} s; {speed:.0f}x single PUTs) "
        f"| >= 10x |",
    ]


BATCH_NOTE = "REST rows measured again"


def with_new_batch_rows(block: str, b: dict, load0: float, argv: str) -> str:
    """The results file's table with its REST rows (only) measured again (``--batch-only``)."""
    keep = [
        line
        for line in block.strip("\n").split("\n")
        if not line.startswith("| REST:") and not line.startswith(BATCH_NOTE)
    ]
    while keep and not keep[-1].strip():
        keep.pop()
    note = (
        f"{BATCH_NOTE} {dt.date.today().isoformat()} on {platform.node() or 'this machine'} "
        f"({cpu_model()}, {os.cpu_count()} cores), load average {load0:.1f} at the start and "
        f"{os.getloadavg()[0]:.1f} at the end (measured while other jobs shared the cores); "
        f"`python benchmarks/filters.py {argv}`."
    )
    return "\n".join([*keep, *batch_rows(b), "", note])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--batch", type=int, default=10_000)
    ap.add_argument("--single", type=int, default=300)
    ap.add_argument("--labels", type=Path, default=ROOT / "var" / "load" / "labels.safetensors")
    ap.add_argument(
        "--batch-only",
        action="store_true",
        help="measure only the REST upserts and update only those rows of the results table",
    )
    add_results_flag(ap, "filters")
    args = ap.parse_args()
    if not args.labels.is_file():
        raise SystemExit(f"--labels: no such file {args.labels}")
    import torch

    torch.set_num_threads(1)
    load0 = os.getloadavg()[0]
    command = command_line("filters.py")
    argv = command.removeprefix("python benchmarks/filters.py").strip()
    if args.batch_only:  # the REST rows only; the search rows of the results file stay
        name = args.write_results or "filters"
        if not (RESULTS / f"{name}.md").is_file():
            raise SystemExit(f"--batch-only: no benchmarks/results/{name}.md to update")
        b = batch_upserts(args.labels, args.single, args.batch)
        print(b, file=sys.stderr)
        block = read_results(name)
        report(with_new_batch_rows(block, b, load0, argv), args.write_results, command=command)
        return
    s = filtered_search(args.n, args.queries)
    print(s, file=sys.stderr)
    b = batch_upserts(args.labels, args.single, args.batch)
    print(b, file=sys.stderr)
    report(table(s, b, load0, argv), args.write_results, command=command)


if __name__ == "__main__":
    main()
