"""The sharded service on Ray against one process: ``hypsearch serve --ray local
--shards 2`` and one ``hypsearch serve`` over the same items, back to back in one
run, each driven by :mod:`load`'s wrk cells (32 connections: ``vector``,
``label`` in the default mode, ``label-hier``); a table with both and the ratio.

::

    python benchmarks/ray_serve.py [--model MODEL] [--index INDEX] [--seconds 10]
        [--rounds 2] [--profile DIR] [--write-results]

The items are the demo's index (``$HYPSEARCH_HOME/index``, 10,000 Fashion-MNIST
test pictures; ``hypsearch demo --no-serve`` makes it): copied once as it is, for
the single process, and once into 2 shards, for the Ray server (whose own local
cluster, ``--ray local``, lives and dies with it: the shards' 2 actors, the
GCS and the raylet, all on the same 2 cores as the ingress and the load
generator). Each round serves the single process, then the Ray server; each
server gets 2 s of every kind first (not measured), and every cell records the
load average (1 min) before it.

"At equal p99": the Ray server is measured at 32 connections and, when its p99
is above the single process's p99 at 32, again at 16, 8 and 4 connections
until it is not; the ratio at equal p99 is its requests/s there (0 when no
count gets there) over the single process's at 32. The target (issue 30): at
least 0.5 for every kind.

Ray binds the machine's network interface, so the run needs a network
namespace with only ``lo``: inside one the script runs as it is; as root outside
one it makes one (``ip netns add``), runs itself there and removes it.
``--profile DIR``: py-spy flame graphs of each Ray cell at 32 connections, the
serving process and every process under it (the raylet, the shards' actors).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from _common import ROOT, add_results_flag, command_line, report, run_meta, wait_ready
from load import _free_port, _scrub, run_wrk, workloads

sys.path.insert(0, str(ROOT))  # this checkout's packages, not an installed copy

KINDS = ("vector", "label", "label-hier")
TARGET = 0.5  # the Ray server's requests/s over the single process's, at equal p99
NETNS = f"hsraybench{os.getpid()}"


def loopback_only() -> bool:
    return [name for _, name in socket.if_nameindex()] == ["lo"]


def in_namespace(argv: list[str], script: str = __file__) -> int:
    """Run ``script`` (this one) again inside a new loopback-only network namespace
    (root)."""
    if os.geteuid() != 0:
        raise SystemExit(
            f"{Path(script).name}: Ray needs a network namespace with only lo; run as root (the "
            "script makes one) or inside one (ip netns exec NAME ...)"
        )
    subprocess.run(["ip", "netns", "add", NETNS], check=True)
    try:
        subprocess.run(["ip", "netns", "exec", NETNS, "ip", "link", "set", "lo", "up"], check=True)
        cmd = ["ip", "netns", "exec", NETNS, sys.executable, str(Path(script)), *argv]
        return subprocess.run(cmd, check=False).returncode
    finally:
        subprocess.run(["ip", "netns", "del", NETNS], check=False)


def copies(index: Path, into: Path) -> tuple[Path, Path, int, int]:
    """The index copied as it is (``into/single``) and into 2 shards (``into/sharded``,
    written here in this process: no Ray needed to fill them)."""
    from indexing import HyperbolicIndex
    from indexing.sharded import ShardedIndex

    single = into / "single"
    shutil.copytree(index, single)
    ix = HyperbolicIndex.load(single)
    items = ix.get_many(ix.ids())
    sharded = ShardedIndex(into / "sharded", shards=2, dim=ix.dim, curvature=ix.curvature)

    for lo in range(0, len(items), 2000):
        part = items[lo : lo + 2000]
        sharded.add(
            np.stack([it.vector for it in part]),
            [it.id for it in part],
            labels=[it.label for it in part],
            payloads=[it.payload for it in part],
        )
    n, dim = len(sharded), ix.dim
    sharded.close()
    ix.close()
    if n != len(items):
        raise SystemExit(f"the sharded copy holds {n} items, the index {len(items)}")
    return single, into / "sharded", n, dim


def start(model: Path, index: Path, extra: list[str], log: Path, tmp: Path):
    port = _free_port()
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "HYPSEARCH_TORCH_THREADS": "1",
        "HYPSEARCH_LOG_LEVEL": "WARNING",
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_TMPDIR": str(tmp),  # this run's cluster files apart from any other's
    }
    cmd = [sys.executable, "-m", "service.cli", "serve", "--model", str(model)]
    cmd += ["--index", str(index), "--host", "127.0.0.1", "--port", str(port), *extra]
    with open(log, "ab") as logf:
        proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=logf, stderr=subprocess.STDOUT, start_new_session=True
        )
    url = f"http://127.0.0.1:{port}"
    wait_ready(proc, url, log, limit=300.0)
    return proc, url


def stop(proc) -> None:
    """SIGTERM (the server stops its shards and its local cluster), then its whole
    process group (the cluster's processes started under it) if it hangs."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # its session: nothing of it outlives the run
    except ProcessLookupError:
        pass
    proc.wait(30)


def session_cpu(sid: int) -> float:
    """CPU seconds (user + system) of the live processes of session ``sid``: a server
    and everything it started (the Ray server: its GCS, raylet and shard actors)."""
    ticks = 0
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            rest = (d / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(rest[3]) == sid:
            ticks += int(rest[11]) + int(rest[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def cell(url: str, kind: str, specs, clients: int, seconds: float, sid: int) -> dict:
    load = os.getloadavg()[0]
    cpu = session_cpu(sid)
    r = run_wrk(url, kind, specs, clients, seconds)  # a warm-up second, then the cell
    cpu = session_cpu(sid) - cpu
    r["load"] = load
    # per answered request, the warm-up second's counted at the cell's rate
    answered = (r["requests"] - r["errors"]) * (1 + 1 / max(1, round(seconds)))
    r["cpu_ms"] = 1000 * cpu / answered if answered else float("nan")
    print(
        f"{kind:10s} c={clients:3d} requests={r['requests']:6d} errors={r['errors']} "
        f"p50={r['p50']:.1f}ms p99={r['p99']:.1f}ms rps={r['rps']:.0f} load={load:.1f} "
        f"cpu={r['cpu_ms']:.2f}ms/request",
        file=sys.stderr,
        flush=True,
    )
    return r


def profile(pid: int, out: Path, seconds: float):
    spy = shutil.which("py-spy") or os.environ.get("PY_SPY")
    if not spy:
        raise SystemExit("--profile: py-spy not found (pip install py-spy, or set PY_SPY)")
    cmd = [spy, "record", "-p", str(pid), "--subprocesses", "-o", str(out), "-f", "flamegraph"]
    cmd += ["-r", "50", "-d", str(max(1, round(seconds))), "--nonblocking"]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _scrub_processes(svg: Path) -> None:
    """The processes' command lines of a flame graph cut to their program and plain
    words (no paths, no options with values: the machine's folders stay out)."""
    import re

    def short(m: re.Match) -> str:
        words = m[2].split()
        keep = [Path(words[0]).name] if words else []
        keep += [w for w in words[1:] if "/" not in w and "=" not in w][:3]
        return m[1] + " ".join(keep) + m[3]

    text = svg.read_text(encoding="utf-8")
    title = r"(<title>process \d+:&quot;)([^<]*)(&quot; \([\d,]+ samples[^<]*</title>)"
    text = re.sub(title, short, text)
    shown = r"(>process \d+:&quot;)([^<]*)()(?=</text>)"  # the label drawn on the bar
    svg.write_text(re.sub(shown, short, text), encoding="utf-8")


def run(args, model: Path, tmp: Path) -> tuple[list[dict], int, int]:
    single, sharded, n, dim = copies(args.index, tmp)
    servers = {
        "one process": (single, []),
        "Ray, 2 shards": (sharded, ["--ray", "local", "--shards", "2"]),
    }
    rows: list[dict] = []
    for rnd in range(1, args.rounds + 1):
        base: dict[str, dict] = {}
        for name, (index, extra) in servers.items():
            log = tmp / f"{name.split(',')[0].replace(' ', '-')}-{rnd}.log"
            proc, url = start(model, index, extra, log, tmp / "ray")
            try:
                loads = workloads(url)
                for kind in KINDS:  # warm-up, not measured: kernels, caches, connections
                    run_wrk(url, kind, loads[kind], 32, 2)
                for kind in KINDS:
                    spy = None
                    if args.profile and extra:
                        time.sleep(0.5)
                        svg = args.profile / f"ray-{kind}-{rnd}.svg"
                        spy = profile(proc.pid, svg, args.seconds + 1)
                    r = cell(url, kind, loads[kind], 32, args.seconds, proc.pid)
                    if spy is not None:
                        spy.wait(120)
                        if svg.exists():
                            _scrub(svg)
                            _scrub_processes(svg)
                    rows.append({"round": rnd, "server": name, **r})
                    if not extra:
                        base[kind] = r
                        continue
                    for c in (16, 8, 4):  # at equal p99: fewer connections
                        if r["p99"] <= base[kind]["p99"] or r["requests"] == 0:
                            break
                        r = cell(url, kind, loads[kind], c, args.seconds, proc.pid)
                        rows.append({"round": rnd, "server": name, **r})
            finally:
                stop(proc)
    return rows, n, dim


def table(rows: list[dict], meta: dict) -> str:
    out = [
        f"Measured {meta['date']} on {meta['cpu']} ({meta['cores']} cores), {meta['items']:,} "
        f"items (dim {meta['dim']}): one `hypsearch serve` process, then `hypsearch serve --ray "
        "local --shards 2` (its own one-machine cluster: 2 shard actors), over the same items, "
        f"in {meta['rounds']} round(s), back to back; wrk (1 thread) on the same cores, "
        f"closed-loop connections for {meta['seconds']:g} s per cell after a warm-up second "
        f"(`{meta['command']}`). The machine is shared with other work: the load average "
        f"(1 min) before each cell is in the table; {meta['load'][0]:.1f} before the run, "
        f"{meta['load'][1]:.1f} after.",
        "",
        "| round | server | request | connections | requests | errors | p50 ms | p99 ms "
        "| requests/s | server CPU ms/request | load before |",
        "| ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        out.append(
            f"| {r['round']} | {r['server']} | {r['kind']} | {r['clients']} | {r['requests']} | "
            f"{r['errors']} | {r['p50']:.1f} | {r['p99']:.1f} | {r['rps']:.0f} | "
            f"{r['cpu_ms']:.2f} | {r['load']:.1f} |"
        )
    out += [
        "",
        "The ratio: the Ray server's requests/s over the one process's at 32 connections "
        "(same round); at equal p99: the Ray server's requests/s at the most connections "
        "(32, 16, 8, 4) whose p99 is at most the one process's p99 at 32 (0 when none is). "
        f"Target: at least {TARGET:g} at equal p99, with no errors. Server CPU: the CPU "
        "seconds of the server's processes (the Ray server's GCS, raylet and shard actors "
        "included) over the requests it answered in the cell (at 32 connections), which "
        "the other work on the machine changes less than the requests/s.",
        "",
        "| round | request | one process req/s (p99 ms) | Ray req/s at 32 (p99 ms) | ratio "
        "| Ray at equal p99: connections, req/s | ratio at equal p99 | target "
        "| server CPU ms/request: one process, Ray |",
        "| ---: | --- | ---: | ---: | ---: | --- | ---: | --- | --- |",
    ]
    for rnd in sorted({r["round"] for r in rows}):
        for kind in KINDS:
            mine = [r for r in rows if r["round"] == rnd and r["kind"] == kind]
            one = next((r for r in mine if r["server"] == "one process"), None)
            ray = [r for r in mine if r["server"] != "one process"]
            if one is None or not ray:
                continue
            at32 = ray[0]
            eq = next((r for r in ray if r["p99"] <= one["p99"] and r["requests"] > 0), None)
            ratio = at32["rps"] / one["rps"] if one["rps"] else 0.0
            ratio_eq = eq["rps"] / one["rps"] if eq is not None and one["rps"] else 0.0
            errors = sum(r["errors"] for r in mine)
            met = ratio_eq >= TARGET and errors == 0
            where = f"{eq['clients']}, {eq['rps']:.0f}" if eq is not None else "none"
            out.append(
                f"| {rnd} | {kind} | {one['rps']:.0f} ({one['p99']:.1f}) | {at32['rps']:.0f} "
                f"({at32['p99']:.1f}) | {ratio:.2f} | {where} | {ratio_eq:.2f} | "
                f"{'met' if met else 'not met'} | {one['cpu_ms']:.2f}, {at32['cpu_ms']:.2f} |"
            )
    return "\n".join(out)


def main() -> int:
    home = Path(os.environ.get("HYPSEARCH_HOME", ROOT / "var"))
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", type=Path, default=home / "model.safetensors")
    p.add_argument("--index", type=Path, default=home / "index")
    p.add_argument("--seconds", type=float, default=10.0, help="per cell")
    p.add_argument("--rounds", type=int, default=2, help="one process, then Ray, this often")
    p.add_argument("--profile", type=Path, help="py-spy flame graphs of the Ray cells into DIR")
    add_results_flag(p, "ray-serve")
    args = p.parse_args()
    if not 0 < args.seconds <= 60:
        p.error("--seconds must be in (0, 60]")
    if not 1 <= args.rounds <= 5:
        p.error("--rounds: 1 to 5")
    for f in (args.model, args.index):
        if not f.exists():
            p.error(f"{f}: missing (run `hypsearch demo --no-serve` first, or give it)")
    if not shutil.which("wrk"):
        p.error("wrk is not on the PATH (Debian package wrk)")
    if not loopback_only():
        return in_namespace(sys.argv[1:])
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
    command = command_line("ray_serve.py")
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="hsrb-") as d:
        rows, n, dim = run(args, args.model, Path(d))
    meta = run_meta(
        items=n,
        dim=dim,
        rounds=args.rounds,
        seconds=args.seconds,
        command=command,
        load=(load_before, os.getloadavg()[0]),
    )
    report(table(rows, meta), args.write_results, command=command)
    return 0


if __name__ == "__main__":
    sys.exit(main())
