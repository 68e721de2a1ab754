"""Beyond one machine: equality of the sharded index, the Ray build against the
local build, and search through the sharded service against the single-process
one. Run inside a network namespace that has only ``lo`` (Ray binds the
machine's interface otherwise)::

    ip netns add hs; ip netns exec hs ip link set lo up
    ip netns exec hs env PYTHONPATH=$PWD RAY_USAGE_STATS_ENABLED=0 \\
        .venv/bin/python benchmarks/scale.py --model var/load/model.safetensors --write-results
    ip netns del hs

``--limit N`` builds only the first N pictures of each split (default: all of
Fashion-MNIST train + test, 70,000); ``--seconds`` is the length of each load run;
``--write-results [NAME]`` also writes the tables to ``benchmarks/results/NAME.md``
(``scale.md`` without a NAME).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
from _common import ROOT, add_results_flag, command_line, cpu_model, report, wait_ready

sys.path.insert(0, str(ROOT))


def equality(ray, shards: int, n: int = 5000, queries: int = 50) -> dict:
    """Ids and distances of nearest / under-filtered / hierarchical pages: sharded == single."""
    from indexing import HyperbolicIndex
    from indexing.sharded import ShardedIndex

    rng = np.random.default_rng(shards)
    dim = 10
    x = rng.normal(size=(n, dim))
    x *= (rng.uniform(0.05, 0.95, size=n) / np.linalg.norm(x, axis=1))[:, None]
    ids = [f"p{i}" for i in range(n)]
    leaves = ["a1", "a2", "b1", "b2"]
    parent = {"a1": "a", "a2": "a", "b1": "b", "b2": "b", "a": "root", "b": "root", "root": None}
    below = {"a": {"a1", "a2"}, "b": {"b1", "b2"}, "root": set(parent) - {"root"}}
    labels = [leaves[i % 4] for i in range(n)]
    tmp = Path(tempfile.mkdtemp(prefix="hs-scale-"))
    single = HyperbolicIndex(dim=dim, backend="exact")
    sharded = ShardedIndex(tmp, shards=shards, dim=dim, backend="exact", ray=True)
    for lo in range(0, n, 1000):
        single.add(x[lo : lo + 1000], ids[lo : lo + 1000], labels=labels[lo : lo + 1000])
        sharded.add(x[lo : lo + 1000], ids[lo : lo + 1000], labels=labels[lo : lo + 1000])
    q = rng.normal(size=(queries, dim)) * 0.05
    single.search(q[:2], k=10)  # warm-up: the first call loads the distance code
    sharded.search(q[:2], k=10)
    same = total = 0
    t_single = t_sharded = 0.0
    for filt in ({}, {"under": {"a1", "b2"}}):
        t = time.perf_counter()
        a = single.search(q, k=10, **filt)
        t_single += time.perf_counter() - t
        t = time.perf_counter()
        b = sharded.search(q, k=10, **filt)
        t_sharded += time.perf_counter() - t
        same += int(((a[0] == b[0]).all(axis=1) & (a[1] == b[1]).all(axis=1)).sum())
        total += queries
    for j in range(queries // 5):
        chain = [leaves[j % 4], parent[leaves[j % 4]], "root"]
        for offset in (0, 10, 1500):
            a = single.search_hierarchical(q[j], chain, lambda lab: below.get(lab, ()), 10, offset)
            b = sharded.search_hierarchical(q[j], chain, lambda lab: below.get(lab, ()), 10, offset)
            same += a == b
            total += 1
    sharded.close()
    shutil.rmtree(tmp, ignore_errors=True)
    del ray
    return {
        "shards": shards,
        "items": n,
        "same": same,
        "total": total,
        "ms_single": 1000 * t_single / (2 * queries),
        "ms_sharded": 1000 * t_sharded / (2 * queries),
    }


def builds(model_path: str, limit: int | None, workers: int) -> tuple[dict, Path, Path]:
    """Local build vs Ray build of Fashion-MNIST train + test (the Ray one into 2 shards)."""
    import torch

    from indexing.batches import open_index
    from indexing.sharded import ShardedIndex
    from models.images.datasets import DEFAULT_FASHION_MNIST_DIR
    from models.vision.image_model import load_model
    from service.ingest.build import build_index
    from service.ingest.plans import plan_dataset
    from service.ingest.ray_build import ray_build_index

    torch.set_num_threads(1)
    model = load_model(model_path)
    tmp = Path(tempfile.mkdtemp(prefix="hs-scale-build-"))
    local = open_index(tmp / "local", dim=model.dim, curvature=model.curvature)
    sharded = ShardedIndex(
        tmp / "sharded", shards=2, dim=model.dim, curvature=model.curvature, ray=True
    )
    t_local = t_ray = 0.0
    n = 0
    for split in ("train", "test"):
        plan = plan_dataset("fashion-mnist", split, DEFAULT_FASHION_MNIST_DIR)
        plan.sources = plan.sources[:limit]
        n += len(plan.sources)
        t = time.perf_counter()
        build_index(model, local, plan, batch_size=256, workers=0)
        t_local += time.perf_counter() - t
        t = time.perf_counter()
        ray_build_index(model_path, model, sharded, plan, batch_size=256, workers=workers)
        t_ray += time.perf_counter() - t
    ids = sorted(local.ids())
    same_ids = ids == sorted(sharded.ids())
    worst = 0.0
    for i in ids[:: max(1, len(ids) // 2000)]:
        worst = max(worst, float(np.abs(local.get(i).vector - sharded.get(i).vector).max()))
    local.save()
    local.close()
    sharded.close()
    return (
        {
            "items": n,
            "same_ids": same_ids,
            "max_diff": worst,
            "s_local": t_local,
            "s_ray": t_ray,
            "workers": workers,
        },
        tmp / "local",
        tmp / "sharded",
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def load(url: str, ids: list[str], clients: int, seconds: float) -> dict:
    """``clients`` threads posting ``/v1/search`` by id (k = 10) for ``seconds``."""
    import httpx

    lat: list[float] = []
    errors = [0]
    stop = time.perf_counter() + seconds
    lock = threading.Lock()

    def client(seed: int) -> None:
        rng = np.random.default_rng(seed)
        mine = []
        with httpx.Client(base_url=url, timeout=30) as c:
            while time.perf_counter() < stop:
                body = {"id": ids[int(rng.integers(len(ids)))], "k": 10}
                t = time.perf_counter()
                r = c.post("/v1/search", json=body)
                mine.append(time.perf_counter() - t)
                if r.status_code != 200:
                    errors[0] += 1
        with lock:
            lat.extend(mine)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    a = np.asarray(lat)
    return {
        "qps": len(a) / wall,
        "p50": 1000 * float(np.percentile(a, 50)),
        "p99": 1000 * float(np.percentile(a, 99)),
        "errors": errors[0],
    }


def services(model_path, local_index, sharded_index, clients, seconds, replicas) -> list[dict]:
    """The same load against ``hypsearch serve`` and ``serve --ray auto --shards 2``."""
    from indexing import HyperbolicIndex

    ix = HyperbolicIndex.load(local_index)
    ids = ix.ids()[:5000]
    ix.close()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_USAGE_STATS_ENABLED": "0"}
    base = [sys.executable, "-m", "service.cli", "serve", "--model", model_path, "--threads", "1"]
    rows = []
    for name, extra in (
        ("single process", ["--index", str(local_index)]),
        (
            f"Ray Serve, {replicas} replicas, 2 shards",
            ["--index", str(sharded_index), "--ray", "auto", "--shards", "2"]
            + ["--replicas", str(replicas)],
        ),
    ):
        port = _free_port()
        url = f"http://127.0.0.1:{port}"
        proc = subprocess.Popen(
            [*base, *extra, "--port", str(port)], env=env, stdout=subprocess.DEVNULL
        )
        try:
            wait_ready(proc, url, None, limit=300)
            load(url, ids, 4, 2.0)  # warm-up
            rows.append({"service": name, **load(url, ids, clients, seconds)})
        finally:
            proc.send_signal(2)
            try:
                proc.wait(120)
            except subprocess.TimeoutExpired:
                proc.kill()
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=str(ROOT / "var/load/model.safetensors"))
    ap.add_argument("--limit", type=int, default=None, help="first N pictures of each split")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--replicas", type=int, default=2)
    add_results_flag(ap, "scale")
    args = ap.parse_args()
    from service.ray_serve import start_local_ray

    ray = start_local_ray(cpus=2, object_store_bytes=300 * 2**20)
    eq = [equality(ray, s) for s in (2, 4)]
    b, local_index, sharded_index = builds(args.model, args.limit, args.workers)
    sv = services(args.model, local_index, sharded_index, args.clients, args.seconds, args.replicas)
    ray.shutdown()
    lines = [
        f"Measured {datetime.date.today()} on {cpu_model()} ({os.cpu_count()} cores), "
        f"load average {os.getloadavg()[1]:.1f} over the last 5 minutes at the end "
        f"(other jobs included); `{command_line('scale.py')}` in a loopback-only "
        "network namespace, one local Ray cluster (2 CPUs).",
        "",
        "| shards | items | answers equal to one index | ms/query single | ms/query sharded |",
        "| ---: | ---: | :---: | ---: | ---: |",
    ]
    for e in eq:
        lines.append(
            f"| {e['shards']} | {e['items']:,} | {e['same']} of {e['total']} | "
            f"{e['ms_single']:.2f} | {e['ms_sharded']:.2f} |"
        )
    per_item = 1000 * (b["s_ray"] - b["s_local"]) / max(b["items"], 1)
    lines += [
        "",
        "| build (Fashion-MNIST train + test) | items | seconds | items/s |",
        "| --- | ---: | ---: | ---: |",
        f"| local (`build_index`, 1 thread) | {b['items']:,} | {b['s_local']:.1f} | "
        f"{b['items'] / b['s_local']:.0f} |",
        f"| Ray Data, {b['workers']} actors × 1 thread, into 2 shards | {b['items']:,} | "
        f"{b['s_ray']:.1f} | {b['items'] / b['s_ray']:.0f} |",
        "",
        f"Same ids: {'yes' if b['same_ids'] else 'NO'}; largest coordinate difference of the "
        f"vectors: {b['max_diff']:.1e}; Ray's overhead: {per_item:+.2f} ms per item "
        "(actor start-up, the object store and the shards' round trips included).",
        "",
        f"| service ({args.clients} clients, `/v1/search` by id, k = 10) | queries/s | "
        "p50 ms | p99 ms | errors |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for r in sv:
        lines.append(
            f"| {r['service']} | {r['qps']:.0f} | {r['p50']:.0f} | {r['p99']:.0f} | {r['errors']} |"
        )
    report("\n".join(lines), args.write_results, command=command_line("scale.py"))
    print(json.dumps({"equality": eq, "build": b, "services": sv}, default=str), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
