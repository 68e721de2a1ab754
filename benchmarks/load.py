"""Load benchmark of the REST service: latency percentiles and throughput.

Starts ``hypsearch serve`` on 127.0.0.1 (a free port) over a model and an
index -- by default the demo's artifacts under ``$HYPSEARCH_HOME`` (run
``hypsearch demo --no-serve`` first) -- or measures a server already running
on loopback (``--url``). For each kind of search (vector, label, image) and
each number of concurrent clients (1, 8, 32), closed-loop clients send
requests for a fixed time and the script reports p50 / p95 / p99 latency,
throughput and errors, then a markdown table::

    python benchmarks/load.py [--seconds 8] [--clients 1,8,32] [--write-results]

``--write-results [NAME]`` also writes the table to
``benchmarks/results/NAME.md`` (``load.md`` without a NAME). Only 127.0.0.1 is
ever contacted; every cell is bounded in time and in requests.

Targets (32 clients, 2 cores): vector search p99 <= 15 ms, image search
p99 <= 50 ms, no errors.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlparse

import numpy as np
from _common import ROOT, add_results_flag, command_line, cpu_model, report

TARGETS = {("vector", 32): 15.0, ("image", 32): 50.0}  # p99 ms
LABELS = [
    "sneaker",
    "sandal",
    "boot",
    "shoe",
    "footwear",
    "coat",
    "dress",
    "shirt",
    "jersey",
    "pullover",
    "trouser",
    "bag",
    "clothing",
    "garment",
    "overgarment",
    "handbag",
    "gym_shoe.n.01",
    "bag.n.04",
]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(
    model: Path, index: Path, log: Path, extra_env: dict
) -> tuple[subprocess.Popen, str]:
    import httpx

    port = _free_port()
    env = {
        **os.environ,
        "HYPSEARCH_TORCH_THREADS": "1",
        "HYPSEARCH_LOG_LEVEL": "WARNING",
        **extra_env,
    }
    logf = open(log, "ab")  # noqa: SIM115 - lives as long as the server
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "service.cli",
            "serve",
            "--model",
            str(model),
            "--index",
            str(index),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        cwd=ROOT,
        env=env,
        stdout=logf,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited with {proc.returncode}; see {log}")
        try:
            if httpx.get(url + "/readyz", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    proc.terminate()
    raise SystemExit(f"server not ready after 120 s; see {log}")


def workloads(url: str, n: int = 200, seed: int = 0) -> dict:
    """Request bodies of each kind, from the served index."""
    import httpx

    from service.imaging import encode_png

    rng = random.Random(seed)
    with httpx.Client(base_url=url, timeout=30) as c:
        stats = c.get("/v1/stats").json()
        ids = [f"fashion-mnist-test-{rng.randrange(10000)}" for _ in range(n)]
        vectors = []
        for i in ids:
            r = c.get(f"/v1/items/{i}")
            if r.status_code == 200:
                vectors.append(r.json()["vector"])
    if not vectors:  # not the Fashion-MNIST index: random points of the ball
        x = np.random.default_rng(seed).normal(size=(n, stats["dim"]))
        x *= 0.9 / np.linalg.norm(x, axis=1, keepdims=True) / np.sqrt(stats["curvature"])
        vectors = x.tolist()
    from models.data import load_fashion_mnist

    data = load_fashion_mnist("test")
    rows = [rng.randrange(len(data.images)) for _ in range(n)]
    images = [encode_png(data.images[r]) for r in rows]
    return {
        "vector": [{"json": {"vector": v, "k": 10}} for v in vectors],
        "label": [
            {
                "json": {
                    "label": rng.choice(LABELS),
                    "k": 10,
                    "mode": rng.choice(["nearest", "hierarchical"]),
                }
            }
            for _ in range(n)
        ],
        "image": [
            {"files": {"file": ("q.png", im, "image/png")}, "params": {"k": 10}} for im in images
        ],
    }


class _Conn:
    """A minimal HTTP/1.1 keep-alive client (asyncio streams): the load generator
    shares the 2 cores with the server, so it must cost little per request."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def request(self, raw: bytes) -> int:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        self.writer.write(raw)
        await self.writer.drain()
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        if length:
            await self.reader.readexactly(length)
        if b"connection: close" in head.lower():
            await self.close()
        return status

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            try:
                await self.writer.wait_closed()
            except OSError:
                pass
        self.reader = self.writer = None


def _raw_requests(url: str, kind: str, bodies: list) -> list[bytes]:
    """Each request body as the bytes of a complete HTTP/1.1 request."""
    import json
    import uuid
    from urllib.parse import urlencode

    host = urlparse(url).netloc
    out = []
    for body in bodies:
        if kind == "image":
            boundary = uuid.uuid4().hex
            name, data, ctype = body["files"]["file"]
            payload = (
                (
                    f"--{boundary}\r\n"
                    f'Content-Disposition: form-data; name="file"; filename="{name}"\r\n'
                    f"Content-Type: {ctype}\r\n\r\n"
                ).encode()
                + data
                + f"\r\n--{boundary}--\r\n".encode()
            )
            target = "/v1/search/image?" + urlencode(body.get("params", {}))
            ctype_header = f"multipart/form-data; boundary={boundary}"
        else:
            payload = json.dumps(body["json"]).encode()
            target = "/v1/search"
            ctype_header = "application/json"
        head = (
            f"POST {target} HTTP/1.1\r\nHost: {host}\r\nContent-Type: {ctype_header}\r\n"
            f"Content-Length: {len(payload)}\r\n\r\n"
        ).encode()
        out.append(head + payload)
    return out


async def run_cell(
    url: str, kind: str, bodies: list, clients: int, seconds: float, max_requests: int
) -> dict:
    u = urlparse(url)
    raws = _raw_requests(url, kind, bodies)
    lat: list[float] = []
    errors = 0
    stop_at = 0.0
    sent = 0
    conns = [_Conn(u.hostname, u.port) for _ in range(clients)]

    async def client(j: int) -> None:
        nonlocal sent, errors
        i = j
        conn = conns[j]
        while time.perf_counter() < stop_at and sent < max_requests:
            sent += 1
            t = time.perf_counter()
            try:
                ok = await conn.request(raws[i % len(raws)]) == 200
            except (OSError, asyncio.IncompleteReadError, ValueError):
                ok = False
                await conn.close()
            if ok:
                lat.append(time.perf_counter() - t)
            else:
                errors += 1
            i += clients

    # warm-up: every connection opened and used for a second
    stop_at = time.perf_counter() + 1.0
    await asyncio.gather(*(client(j) for j in range(clients)))
    lat.clear()
    errors = 0
    sent = 0
    t0 = time.perf_counter()
    stop_at = t0 + seconds
    await asyncio.gather(*(client(j) for j in range(clients)))
    wall = time.perf_counter() - t0
    for c in conns:
        await c.close()
    ms = np.array(lat) * 1000
    return {
        "kind": kind,
        "clients": clients,
        "requests": len(lat) + errors,
        "errors": errors,
        "p50": float(np.percentile(ms, 50)) if len(ms) else float("nan"),
        "p95": float(np.percentile(ms, 95)) if len(ms) else float("nan"),
        "p99": float(np.percentile(ms, 99)) if len(ms) else float("nan"),
        "rps": len(lat) / wall if wall > 0 else 0.0,
    }


def table(rows: list[dict], meta: dict) -> str:
    out = [
        f"Measured {meta['date']} on {meta['cpu']} ({meta['cores']} cores), {meta['items']} items "
        f"(dim {meta['dim']}), one `hypsearch serve` process (torch threads 1), closed-loop "
        f"clients on the same machine for {meta['seconds']:g} s per cell "
        f"(`python benchmarks/load.py{meta['args']}`); load average before the run "
        f"{meta['load'][0]:.1f}, after {meta['load'][1]:.1f} (other processes share the cores):",
        "",
        "| search | clients | requests | errors | p50 ms | p95 ms | p99 ms | requests/s | target |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in rows:
        target = TARGETS.get((r["kind"], r["clients"]))
        verdict = ""
        if target is not None:
            ok = r["p99"] <= target and r["errors"] == 0
            verdict = f"p99 <= {target:g} ms: {'met' if ok else 'not met'}"
        out.append(
            f"| {r['kind']} | {r['clients']} | {r['requests']} | {r['errors']} | {r['p50']:.1f} | "
            f"{r['p95']:.1f} | {r['p99']:.1f} | {r['rps']:.0f} | {verdict} |"
        )
    return "\n".join(out)


def main() -> int:
    home = Path(os.environ.get("HYPSEARCH_HOME", ROOT / "var"))
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", help="a server already running on 127.0.0.1 (default: start one)")
    p.add_argument("--model", default=str(home / "model.safetensors"))
    p.add_argument("--index", default=str(home / "index"))
    p.add_argument("--clients", default="1,8,32")
    p.add_argument("--kinds", default="vector,label,image")
    p.add_argument("--seconds", type=float, default=8.0, help="per cell (bounded)")
    p.add_argument("--max-requests", type=int, default=20000, help="per cell (bounded)")
    add_results_flag(p, "load")
    args = p.parse_args()
    if not 0 < args.seconds <= 60:
        p.error("--seconds must be in (0, 60]")
    clients = [int(c) for c in args.clients.split(",")]
    if any(c < 1 or c > 128 for c in clients):
        p.error("--clients: 1 to 128 each")
    kinds = [k for k in args.kinds.split(",") if k]
    proc = None
    if args.url:
        host = urlparse(args.url).hostname
        if host not in ("127.0.0.1", "localhost", "::1"):
            p.error("--url must be a loopback address")
        url = args.url.rstrip("/")
    else:
        for f in (args.model, args.index):
            if not Path(f).exists():
                p.error(
                    f"{f}: missing (run `hypsearch demo --no-serve` first, or give --model/--index)"
                )
        proc, url = start_server(
            Path(args.model),
            Path(args.index),
            Path(tempfile.gettempdir()) / "hypsearch-load-server.log",
            {},
        )
    try:
        import httpx

        load_before = os.getloadavg()[0]
        stats = httpx.get(url + "/v1/stats", timeout=10).json()
        loads = workloads(url)
        rows = []
        for kind in kinds:
            for n in clients:
                r = asyncio.run(
                    run_cell(url, kind, loads[kind], n, args.seconds, args.max_requests)
                )
                rows.append(r)
                print(
                    f"{kind:6s} clients={n:3d} requests={r['requests']:6d} errors={r['errors']} "
                    f"p50={r['p50']:.1f}ms p95={r['p95']:.1f}ms p99={r['p99']:.1f}ms "
                    f"rps={r['rps']:.0f}",
                    file=sys.stderr,
                    flush=True,
                )
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(30)
    command = command_line("load.py")
    shown = command.removeprefix("python benchmarks/load.py").strip()
    meta = {
        "date": dt.date.today().isoformat(),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "items": stats["items"],
        "dim": stats["dim"],
        "seconds": args.seconds,
        "args": f" {shown}" if shown else "",
        "load": (load_before, os.getloadavg()[0]),
    }
    report(table(rows, meta), args.write_results, command=command)
    return 0


if __name__ == "__main__":
    sys.exit(main())
