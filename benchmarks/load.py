"""Load benchmark of the REST service: latency percentiles and throughput.

Starts ``hypsearch serve`` on 127.0.0.1 (a free port) over a model and an
index -- by default the demo's artifacts under ``$HYPSEARCH_HOME`` (run
``hypsearch demo --no-serve`` first; the index is copied to a temporary
folder, so the batch upserts leave the demo's index as it was) -- or measures
a server already running on loopback (``--url``). For each kind of request
and each number of concurrent connections (default 32):

* ``vector``: ``POST /v1/search`` with a stored item's vector, k 10;
* ``label``: ``POST /v1/search`` with a label, k 10, the default mode (auto:
  entailment for a label);
* ``label-hier``: the same labels in ``mode: hierarchical``;
* ``image``: ``POST /v1/search/image``, a Fashion-MNIST PNG upload, k 10;
* ``batch``: ``POST /v1/items/batch`` of ``--batch-size`` items (vector,
  label, payload), each answered once durable;

closed-loop connections send requests for a fixed time and the script reports
p50 / p99 latency, requests/s and errors (any answer but 200, and socket
errors), then a markdown table::

    python benchmarks/load.py [--generator wrk|python] [--seconds 20]
        [--clients 32] [--kinds vector,label,label-hier,image,batch] [--write-results]

``--generator wrk`` (the default when ``wrk`` is on the PATH; Debian package
``wrk``) drives the requests from C with one thread, ``python`` with the
asyncio client below; either shares the machine's cores with the server.
``--profile DIR`` also records the server with py-spy during each cell
(``DIR/<kind>.svg``, a flame graph). ``--write-results [NAME]`` writes the
table to ``benchmarks/results/NAME.md`` (``load.md`` without a NAME). Only
127.0.0.1 is ever contacted; every cell is bounded in time and in requests.

``--labels CHECKPOINT`` measures the label searches over another taxonomy
(e.g. the 82,115 WordNet nouns of ``hypsearch labels train``): the server
also gets a collection ``labels-load`` with that checkpoint's labels
(``POST /v1/collections``, the checkpoint copied under a data root) and
``--label-items`` items, each near a random label's point, and the ``label``
and ``label-hier`` requests ask that collection for labels drawn uniformly
from the taxonomy.

Targets (32 connections, 2 cores, the generator on the same cores): vector
search p99 <= 5 ms, label searches (default and hierarchical) p99 <= 15 ms,
no errors.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlparse

import numpy as np
from _common import ROOT, add_results_flag, command_line, report, run_meta, wait_ready

TARGETS = {("vector", 32): 5.0, ("label", 32): 15.0, ("label-hier", 32): 15.0}  # p99 ms
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


def label_collection(url: str, ckpt: Path, folder: Path, items: int, n: int = 200, seed=0):
    """Create the collection ``labels-load`` over the label checkpoint ``ckpt`` (copied
    into ``folder``, a data root of the server), upsert ``items`` items near random
    labels' points, and return the label requests of that collection."""
    import json
    import shutil

    import httpx

    from models.labels import LabelEmbedding

    emb = LabelEmbedding.load(ckpt)
    ckpt_name = "labels.safetensors"
    shutil.copy(ckpt, folder / ckpt_name)
    names = emb.taxonomy.names
    space = f"poincare:{emb.dim}@{float(emb.curvature):g}"
    with httpx.Client(base_url=url, timeout=600) as c:
        r = c.post(
            "/v1/collections",
            json={
                "name": "labels-load",
                "space": space,
                "taxonomy": str(folder / "labels.safetensors"),
            },
        )
        if r.status_code >= 300:
            raise SystemExit(f"creating the collection: {r.status_code} {r.text}")
        rng = np.random.default_rng(seed)
        x = emb.embeddings.numpy()
        sc = float(emb.curvature) ** 0.5
        for s in range(0, items, 500):
            rows = rng.integers(0, len(names), min(500, items - s))
            body = []
            for j, row in enumerate(rows.tolist()):
                v = x[row]
                nv = float(np.linalg.norm(v))
                rho = 2 * np.arctanh(min(nv * sc, 1 - 1e-16))
                v = v / max(nv, 1e-300) * np.tanh(min(rho, 12.0) / 2) / sc  # inside its label
                body.append({"id": f"lab-{s + j}", "vector": v.tolist(), "label": names[row]})
            r = c.post("/v1/collections/labels-load/items/batch", json={"items": body})
            if r.status_code >= 300:
                raise SystemExit(f"upserting items: {r.status_code} {r.text[:300]}")
    pick = random.Random(seed)

    def js(body: dict) -> tuple:
        return ("POST", "/v1/collections/labels-load/search", "application/json",
                json.dumps(body).encode())  # fmt: skip

    return {
        "label": [js({"label": pick.choice(names), "k": 10}) for _ in range(n)],
        "label-hier": [
            js({"label": pick.choice(names), "k": 10, "mode": "hierarchical"}) for _ in range(n)
        ],
    }


def start_server(
    model: Path, index: Path, log: Path, extra_env: dict
) -> tuple[subprocess.Popen, str]:
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
    wait_ready(proc, url, log, limit=300.0)  # a shared, loaded machine starts slowly
    return proc, url


def workloads(url: str, n: int = 200, seed: int = 0, batch_size: int = 100) -> dict:
    """Requests of each kind (method, path, content type, body bytes), from the
    served index."""
    import json
    import uuid

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
    from models.images.datasets import load_fashion_mnist

    data = load_fashion_mnist("test")
    rows = [rng.randrange(len(data.images)) for _ in range(n)]
    images = [encode_png(data.images[r]) for r in rows]

    def js(path: str, body: dict) -> tuple:
        return ("POST", path, "application/json", json.dumps(body).encode())

    def upload(png: bytes) -> tuple:
        boundary = uuid.uuid4().hex
        body = (
            (
                f"--{boundary}\r\n"
                'Content-Disposition: form-data; name="file"; filename="q.png"\r\n'
                "Content-Type: image/png\r\n\r\n"
            ).encode()
            + png
            + f"\r\n--{boundary}--\r\n".encode()
        )
        return ("POST", "/v1/search/image?k=10", f"multipart/form-data; boundary={boundary}", body)

    nrng = np.random.default_rng(seed)
    batches = []
    for b in range(max(1, n // 4)):  # distinct ids: new items until the bodies repeat
        items = []
        for j in range(batch_size):
            v = vectors[(b * batch_size + j) % len(vectors)]
            v = (np.asarray(v) * nrng.uniform(0.97, 1.0)).tolist()
            items.append(
                {
                    "id": f"load-{b}-{j}",
                    "vector": v,
                    "label": LABELS[j % len(LABELS)],
                    "payload": {"n": j, "color": ["red", "blue"][j % 2]},
                }
            )
        batches.append(js("/v1/items/batch", {"items": items}))
    return {
        "vector": [js("/v1/search", {"vector": v, "k": 10}) for v in vectors],
        "label": [js("/v1/search", {"label": rng.choice(LABELS), "k": 10}) for _ in range(n)],
        "label-hier": [
            js("/v1/search", {"label": rng.choice(LABELS), "k": 10, "mode": "hierarchical"})
            for _ in range(n)
        ],
        "image": [upload(im) for im in images],
        "batch": batches,
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


def _raw_requests(url: str, specs: list[tuple]) -> list[bytes]:
    """Each request as the bytes of a complete HTTP/1.1 request."""
    host = urlparse(url).netloc
    out = []
    for method, path, ctype, body in specs:
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: {ctype}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        out.append(head + body)
    return out


async def run_cell(
    url: str, kind: str, bodies: list, clients: int, seconds: float, max_requests: int
) -> dict:
    u = urlparse(url)
    raws = _raw_requests(url, bodies)
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
        "p99": float(np.percentile(ms, 99)) if len(ms) else float("nan"),
        "rps": len(lat) / wall if wall > 0 else 0.0,
    }


_WRK_SCRIPT = """
local dir = "%s"
local n = %d
local reqs = {}
local i = 0
local function read(path)
  local f = assert(io.open(path, "rb"))
  local data = f:read("*a")
  f:close()
  return data
end
function init(args)
  for j = 1, n do
    local head = read(dir .. "/" .. j .. ".head")
    local method, path, ctype = head:match("^(%%S+) (%%S+) (.+)$")
    reqs[j] = wrk.format(method, path, {["Content-Type"] = ctype}, read(dir .. "/" .. j .. ".body"))
  end
end
function request()
  i = i + 1
  return reqs[(i %% n) + 1]
end
done = function(summary, latency, requests)
  io.write(string.format("RESULT %%d %%d %%d %%d %%d %%d %%d %%f %%f\\n",
    summary.requests, summary.errors.status, summary.errors.connect, summary.errors.read,
    summary.errors.write, summary.errors.timeout, summary.duration,
    latency:percentile(50), latency:percentile(99)))
end
"""


def run_wrk(url: str, kind: str, specs: list[tuple], clients: int, seconds: float) -> dict:
    """One cell driven by wrk (one thread, ``clients`` connections): a warm-up
    second, then ``seconds`` measured; latencies from wrk's histogram (µs)."""
    with tempfile.TemporaryDirectory(prefix="hs-wrk-") as d:
        for j, (method, path, ctype, body) in enumerate(specs, 1):
            Path(d, f"{j}.head").write_text(f"{method} {path} {ctype}")
            Path(d, f"{j}.body").write_bytes(body)
        script = Path(d, "load.lua")
        script.write_text(_WRK_SCRIPT % (d, len(specs)))

        def wrk(secs: float) -> str:
            cmd = ["wrk", "-t1", f"-c{clients}", f"-d{max(1, round(secs))}s", "--timeout", "10s"]
            cmd += ["-s", str(script), url]
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=secs + 60)
            if out.returncode != 0:
                raise SystemExit(f"wrk failed ({out.returncode}): {out.stderr.strip()}")
            return out.stdout

        wrk(1)  # warm-up: every connection opened and used
        text = wrk(seconds)
    line = next(ln for ln in text.splitlines() if ln.startswith("RESULT "))
    req, status, conn, read, write, tmo, dur_us, p50, p99 = line.split()[1:]
    errors = int(status) + int(conn) + int(read) + int(write) + int(tmo)
    wall = int(dur_us) / 1e6
    return {
        "kind": kind,
        "clients": clients,
        "requests": int(req),
        "errors": errors,
        "p50": float(p50) / 1000,
        "p99": float(p99) / 1000,
        "rps": (int(req) - errors) / wall if wall > 0 else 0.0,
    }


def table(rows: list[dict], meta: dict) -> str:
    out = [
        f"Measured {meta['date']} on {meta['cpu']} ({meta['cores']} cores), {meta['items']} items "
        f"(dim {meta['dim']}), one `hypsearch serve` process (torch threads 1), "
        f"{meta['generator']} on the same machine, closed-loop connections for "
        f"{meta['seconds']:g} s per cell after a warm-up second "
        f"(`python benchmarks/load.py{meta['args']}`); batch upserts of {meta['batch_size']} "
        f"items each (a row: one request); the machine is shared with other work: "
        f"load average (1 min) before each cell in the table, "
        f"{meta['load'][0]:.1f} before the run, {meta['load'][1]:.1f} after:",
        "",
        *(
            [
                f"Label searches of the collection `labels-load` ({meta['labels']:,} labels, "
                f"`--labels`), {meta['items']} items in it.",
                "",
            ]
            if meta.get("labels")
            else []
        ),
        "| request | connections | requests | errors | p50 ms | p99 ms | requests/s "
        "| load before | target |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in rows:
        target = TARGETS.get((r["kind"], r["clients"]))
        verdict = ""
        if target is not None:
            ok = r["requests"] > 0 and r["p99"] <= target and r["errors"] == 0
            verdict = f"p99 <= {target:g} ms: {'met' if ok else 'not met'}"
        out.append(
            f"| {r['kind']} | {r['clients']} | {r['requests']} | {r['errors']} | {r['p50']:.1f} | "
            f"{r['p99']:.1f} | {r['rps']:.0f} | {r['load']:.1f} | {verdict} |"
        )
    for r in rows:
        if r["kind"] == "batch":
            out.append(
                f"\nbatch: {r['rps'] * meta['batch_size']:,.0f} items/s acknowledged "
                f"({r['rps']:.0f} requests/s x {meta['batch_size']} items, each answered "
                "once durable)."
            )
    return "\n".join(out)


def _scrub(svg: Path) -> None:
    """Machine-local paths out of a flame graph: the checkout's, the virtual
    environment's and Python's own prefixes, and py-spy's path."""
    import re

    text = svg.read_text(encoding="utf-8")
    text = text.replace(str(ROOT) + "/", "")
    text = re.sub(r"/[^\s\"'<>()]*/site-packages/", "site-packages/", text)
    text = re.sub(r"/[^\s\"'<>()]*/lib/python3\.\d+/", "python/", text)
    text = re.sub(r"/[^\s\"'<>()]*/py-spy\b", "py-spy", text)
    svg.write_text(text, encoding="utf-8")


def _profiler(pid: int, out: Path, seconds: float) -> subprocess.Popen | None:
    """py-spy recording the server for ``seconds`` into a flame graph (svg)."""
    import shutil

    spy = shutil.which("py-spy") or os.environ.get("PY_SPY")
    if not spy:
        raise SystemExit("--profile: py-spy not found (pip install py-spy, or set PY_SPY)")
    cmd = [spy, "record", "-p", str(pid), "-o", str(out), "-f", "flamegraph"]
    cmd += ["-r", "100", "-d", str(max(1, round(seconds))), "--nonblocking"]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def main() -> int:
    import shutil

    home = Path(os.environ.get("HYPSEARCH_HOME", ROOT / "var"))
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", help="a server already running on 127.0.0.1 (default: start one)")
    p.add_argument("--model", default=str(home / "model.safetensors"))
    p.add_argument("--index", default=str(home / "index"))
    p.add_argument("--clients", default="32")
    p.add_argument("--kinds", default="vector,label,label-hier,image,batch")
    p.add_argument("--seconds", type=float, default=20.0, help="per cell (bounded)")
    p.add_argument("--max-requests", type=int, default=200000, help="per cell (python)")
    p.add_argument("--batch-size", type=int, default=100, help="items of a batch upsert")
    p.add_argument(
        "--generator",
        choices=["wrk", "python"],
        default="wrk" if shutil.which("wrk") else "python",
    )
    p.add_argument("--profile", type=Path, help="py-spy flame graphs of each cell into DIR")
    p.add_argument(
        "--labels", type=Path, help="label checkpoint: label searches over its taxonomy (above)"
    )
    p.add_argument("--label-items", type=int, default=2000, help="items of --labels' collection")
    add_results_flag(p, "load")
    args = p.parse_args()
    if not 0 < args.seconds <= 60:
        p.error("--seconds must be in (0, 60]")
    clients = [int(c) for c in args.clients.split(",")]
    if any(c < 1 or c > 128 for c in clients):
        p.error("--clients: 1 to 128 each")
    if not 1 <= args.batch_size <= 1000:
        p.error("--batch-size: 1 to 1000")
    kinds = [k for k in args.kinds.split(",") if k]
    known = {"vector", "label", "label-hier", "image", "batch"}
    if set(kinds) - known:
        p.error(f"--kinds: unknown {sorted(set(kinds) - known)} (known: {sorted(known)})")
    if args.labels is not None:
        if args.url:
            p.error("--labels starts its own server: leave --url out")
        if not args.labels.is_file():
            p.error(f"--labels {args.labels}: no such file")
        if set(kinds) - {"label", "label-hier"}:
            p.error("--labels measures the kinds label and label-hier only")
        if not 0 < args.label_items <= 100000:
            p.error("--label-items: 1 to 100000")
    proc = None
    tmp = tempfile.TemporaryDirectory(prefix="hs-load-")
    roots = Path(tmp.name) / "roots"
    roots.mkdir()
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
        index = Path(args.index)
        if "batch" in kinds:  # the writes go to a copy
            index = Path(tmp.name) / "index"
            shutil.copytree(args.index, index)
        proc, url = start_server(
            Path(args.model),
            index,
            Path(tempfile.gettempdir()) / "hypsearch-load-server.log",
            # --labels: the collection lives in a home of its own, gone with the run
            {"HYPSEARCH_DATA_ROOTS": str(roots), "HYPSEARCH_HOME": str(roots.parent / "home")}
            if args.labels is not None
            else {},
        )
    try:
        import httpx

        load_before = os.getloadavg()[0]
        stats = httpx.get(url + "/v1/stats", timeout=10).json()
        loads = workloads(url, batch_size=args.batch_size)
        if args.labels is not None:
            t = time.perf_counter()
            loads |= label_collection(url, args.labels, roots, args.label_items)
            stats = httpx.get(url + "/v1/collections/labels-load", timeout=10).json()
            print(f"collection labels-load: {stats} ({time.perf_counter() - t:.0f} s)",
                  file=sys.stderr)  # fmt: skip
        rows = []
        if args.profile:
            args.profile.mkdir(parents=True, exist_ok=True)
        for kind in kinds:
            for n in clients:
                load = os.getloadavg()[0]
                spy = None
                if args.profile and proc is not None:
                    time.sleep(0.5)
                    spy = _profiler(proc.pid, args.profile / f"{kind}-{n}.svg", args.seconds)
                if args.generator == "wrk":
                    r = run_wrk(url, kind, loads[kind], n, args.seconds)
                else:
                    r = asyncio.run(
                        run_cell(url, kind, loads[kind], n, args.seconds, args.max_requests)
                    )
                if spy is not None:
                    spy.wait(60)
                    if (args.profile / f"{kind}-{n}.svg").exists():
                        _scrub(args.profile / f"{kind}-{n}.svg")
                r["load"] = load
                rows.append(r)
                print(
                    f"{kind:10s} connections={n:3d} requests={r['requests']:6d} "
                    f"errors={r['errors']} p50={r['p50']:.1f}ms p99={r['p99']:.1f}ms "
                    f"rps={r['rps']:.0f} load={load:.1f}",
                    file=sys.stderr,
                    flush=True,
                )
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:  # busy with requests still queued
                proc.kill()
                proc.wait(30)
        tmp.cleanup()
    command = command_line("load.py")
    shown = command.removeprefix("python benchmarks/load.py").strip()
    meta = run_meta(
        items=stats["items"],
        dim=stats["dim"],
        seconds=args.seconds,
        args=f" {shown}" if shown else "",
        load=(load_before, os.getloadavg()[0]),
        generator="wrk (1 thread)" if args.generator == "wrk" else "the asyncio generator",
        batch_size=args.batch_size,
        labels=stats.get("labels") if args.labels is not None else None,
    )
    report(table(rows, meta), args.write_results, command=command)
    return 0


if __name__ == "__main__":
    sys.exit(main())
