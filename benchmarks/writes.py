"""Write throughput of the REST service: batch upserts and single upserts, acknowledged.

Starts ``hypsearch serve --labels LABELS --index <new folder>`` on 127.0.0.1
(a free port; ``HYPSEARCH_API_KEY`` set, as in production), then:

* **batch**: ``POST /v1/items/batch`` of ``--batch`` items (vector, label and a
  payload of four fields each), one request after another, for ``--seconds``:
  items/s acknowledged (each answer comes once the batch is durable: one SQLite
  transaction, one fsync of the WAL);
* **single**: ``PUT /v1/items/{id}`` with 1 and with 8 concurrent clients, for
  ``--seconds``: acknowledged writes/s and p50 / p99 latency.

Every acknowledged id is then read back (``/v1/items/get``): the count of
those missing is reported (it must be 0)::

    python benchmarks/writes.py [--labels var/labels.safetensors] [--seconds 10]
        [--batch 1000] [--write-results [NAME]]

Only 127.0.0.1 is contacted. The machine may be shared and loaded: the table
says how many CPUs it has, and the figures are of that machine at that time.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
from _common import ROOT, add_results_flag, command_line, wait_ready, write_results

KEY = "benchmark-writes-key"
LABELS = ["gym_shoe.n.01", "sandal.n.01", "bag.n.04", "coat.n.01", "dress.n.01"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(
    labels: Path, index: Path, log: Path, checkout: Path = ROOT
) -> tuple[subprocess.Popen, str]:
    """``hypsearch serve`` of the code in ``checkout`` (this one, or another commit's)."""
    port = _free_port()
    env = {
        **os.environ,
        "PYTHONPATH": str(checkout),
        "HYPSEARCH_API_KEY": KEY,
        "HYPSEARCH_LOG_LEVEL": "WARNING",
        "HYPSEARCH_TORCH_THREADS": "1",
    }
    logf = open(log, "ab")  # noqa: SIM115 - lives as long as the server
    cmd = [sys.executable, "-m", "service.cli", "serve", "--labels", str(labels)]
    cmd += ["--index", str(index), "--host", "127.0.0.1", "--port", str(port)]
    proc = subprocess.Popen(cmd, cwd=checkout, env=env, stdout=logf, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    wait_ready(proc, url, log)
    return proc, url


#: items carry payloads (``--no-payloads``: for commits before payloads existed)
PAYLOADS = True


def _item(rng, dim: int, item_id: str, j: int) -> dict:
    d = rng.standard_normal(dim)
    v = d / np.linalg.norm(d) * rng.uniform(0.1, 0.8)
    if not PAYLOADS:
        return {"id": item_id, "vector": v.tolist(), "label": LABELS[j % len(LABELS)]}
    return {
        "id": item_id,
        "vector": v.tolist(),
        "label": LABELS[j % len(LABELS)],
        "payload": {"n": j, "color": ["red", "blue", "green"][j % 3], "price": j * 0.5,
                    "tags": [f"t{j % 7}"]},
    }  # fmt: skip


def run_batches(url: str, dim: int, size: int, seconds: float) -> tuple[dict, list[str]]:
    import httpx

    rng = np.random.default_rng(0)
    acked: list[str] = []
    lat: list[float] = []
    errors = 0
    with httpx.Client(base_url=url, timeout=120, headers={"Authorization": f"Bearer {KEY}"}) as c:
        t_end = time.monotonic() + seconds
        b = 0
        t0 = time.monotonic()
        while time.monotonic() < t_end:
            items = [_item(rng, dim, f"b{b}-{j}", j) for j in range(size)]
            s = time.monotonic()
            r = c.post("/v1/items/batch", json={"items": items})
            lat.append(time.monotonic() - s)
            if r.status_code == 200:
                acked += [it["id"] for it in items]
            else:
                errors += 1
            b += 1
        wall = time.monotonic() - t0
    return {
        "kind": f"batch of {size}",
        "clients": 1,
        "requests": len(lat),
        "rate": len(acked) / wall,
        "p50": float(np.percentile(lat, 50)) * 1e3,
        "p99": float(np.percentile(lat, 99)) * 1e3,
        "errors": errors,
    }, acked


def run_singles(
    url: str, dim: int, clients: int, seconds: float, rnd: int = 0
) -> tuple[dict, list[str]]:
    import httpx

    acked: list[str] = []
    lat: list[float] = []
    errors = [0]
    lock = threading.Lock()
    t_end = time.monotonic() + seconds

    def worker(w: int) -> None:
        rng = np.random.default_rng([rnd, w])  # new ids and points each round
        headers = {"Authorization": f"Bearer {KEY}"}
        with httpx.Client(base_url=url, timeout=120, headers=headers) as c:
            j = 0
            while time.monotonic() < t_end:
                it = _item(rng, dim, f"s{rnd}-{clients}-{w}-{j}", j)
                s = time.monotonic()
                r = c.put(f"/v1/items/{it['id']}", json={k: it[k] for k in it if k != "id"})
                d = time.monotonic() - s
                with lock:
                    lat.append(d)
                    if r.status_code in (200, 201):
                        acked.append(it["id"])
                    else:
                        errors[0] += 1
                j += 1

    t0 = time.monotonic()
    threads = [threading.Thread(target=worker, args=(w,)) for w in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    return {
        "kind": "single PUT",
        "clients": clients,
        "requests": len(lat),
        "rate": len(acked) / wall,
        "p50": float(np.percentile(lat, 50)) * 1e3,
        "p99": float(np.percentile(lat, 99)) * 1e3,
        "errors": errors[0],
    }, acked


def missing(url: str, ids: list[str]) -> int:
    import httpx

    found = 0
    with httpx.Client(base_url=url, timeout=120) as c:
        for a in range(0, len(ids), 5000):
            chunk = ids[a : a + 5000]
            r = c.post("/v1/items/get", json={"ids": chunk})
            if r.status_code == 200:
                found += len(r.json()["items"])
            else:  # a commit without /v1/items/get: one by one
                found += sum(c.get(f"/v1/items/{i}").status_code == 200 for i in chunk)
    return len(ids) - found


def run_checkout(args, checkout: Path) -> tuple[list[dict], list[str], int]:
    """The plan's rows against a server of ``checkout``'s code, its acknowledged ids,
    and how many of them are missing afterwards."""
    import httpx

    commit = subprocess.run(
        ["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="hs-writes-") as tmp:
        proc, url = start_server(
            args.labels, Path(tmp) / "index", Path(tmp) / "serve.log", checkout
        )
        try:
            dim = httpx.get(url + "/v1/stats").json()["dim"]
            rows, acked = [], []

            def items() -> int:
                return httpx.get(url + "/v1/stats").json()["items"]

            plan = [("single", 1), ("single", 8)]
            if not args.singles_only:
                plan += [("batch", 100), ("batch", args.batch)]
                plan += [("single", 1), ("single", 8)]  # again, over the larger index
            for kind, n in plan:
                before = items()
                if kind == "batch":
                    row, got = run_batches(url, dim, n, args.seconds)
                else:
                    row, got = run_singles(url, dim, n, args.seconds, rnd=len(rows))
                row["before"] = before
                row["commit"] = commit
                rows.append(row)
                acked += got
            lost = missing(url, acked)
        finally:
            proc.terminate()
            proc.wait(30)
    return rows, acked, lost


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    home = Path(os.environ.get("HYPSEARCH_HOME", ROOT / "var"))
    ap.add_argument("--labels", type=Path, default=home / "labels.safetensors")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument(
        "--checkout",
        type=Path,
        action="append",
        help="serve the code of this checkout (e.g. a worktree of an earlier commit) "
        "instead of this one; repeat to compare checkouts one after another",
    )
    ap.add_argument(
        "--singles-only", action="store_true", help="only the single upserts (1 and 8 clients)"
    )
    ap.add_argument(
        "--no-payloads",
        action="store_true",
        help="items without payloads (to compare with commits that had none)",
    )
    add_results_flag(ap, "writes")
    args = ap.parse_args(argv)
    global PAYLOADS
    PAYLOADS = not args.no_payloads
    if not args.labels.is_file():
        raise SystemExit(f"--labels {args.labels}: no such file (run hypsearch demo --no-serve)")

    load_before = os.getloadavg()[0]
    rows, acked, lost = [], [], 0
    for checkout in args.checkout or [ROOT]:
        got_rows, got_acked, got_lost = run_checkout(args, checkout.resolve())
        rows += got_rows
        acked += got_acked
        lost += got_lost
    lines = [
        "| commit | writes | clients | items before | requests | items/s acknowledged | p50 ms "
        "| p99 ms | errors |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {r['commit']} | {r['kind']} | {r['clients']} | {r['before']:,} | {r['requests']} | "
            f"{r['rate']:,.0f} | {r['p50']:.1f} | {r['p99']:.1f} | {r['errors']} |"
        )
    body = "\n".join(lines) + (
        f"\n\nEvery acknowledged id read back afterwards: {len(acked):,} written, "
        f"{lost} missing. Items {'with' if PAYLOADS else 'without'} payloads. Load "
        f"average (1 min) before the run {load_before:.1f}, after "
        f"{os.getloadavg()[0]:.1f}.\n\n"
        f"Each answer comes once the write is durable (SQLite WAL, synchronous=FULL: one "
        f"transaction and one fsync per batch; concurrent single upserts share one "
        f"(service.group_commit)). Up to 20,000 items the index scans exactly; above, the "
        f"graph backend inserts each write into its graph (the cost of a single upsert "
        f"on the larger index). Client and server share "
        f"this machine's {os.cpu_count()} CPUs, and the machine is shared with other work "
        f"at the time of the run (loaded): the figures are a lower bound of what an idle "
        f"machine gives.\n"
    )
    print(body)
    if args.write_results:
        path = write_results(
            args.write_results,
            body,
            command=command_line("writes.py", argv),
            title="Writes: batch and single upserts, acknowledged once durable",
        )
        print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
