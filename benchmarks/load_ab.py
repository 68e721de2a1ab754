"""Before/after load benchmark: ``benchmarks/load.py`` of two commits, interleaved.

The machine is shared, so one run of each commit says little: this script
exports both commits (``git archive``) into a temporary folder and runs each
one's own ``benchmarks/load.py`` in turn, round after round (before, after,
before, after, ...), each against a server of that commit's code, with the same
arguments, the 1-minute load average recorded before every cell::

    python benchmarks/load_ab.py --before c22f1be --after HEAD [--rounds 2] \\
        [--write-results NAME] -- --labels var/bench/nouns.labels \\
        --kinds label,label-hier --generator python

Everything after ``--`` goes to ``load.py`` (paths inside this checkout are
handed over absolute; ``--model`` and ``--index`` default to this checkout's
``var/``, where ``hypsearch demo --no-serve`` leaves them). Only 127.0.0.1 is
contacted (``load.py``'s own servers).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import ROOT, command_line, report, run_meta

ROW = re.compile(
    r"^(?P<kind>\S+)\s+connections=\s*(?P<clients>\d+) requests=\s*(?P<requests>\d+) "
    r"errors=(?P<errors>\d+) p50=(?P<p50>[\d.]+)ms p99=(?P<p99>[\d.]+)ms "
    r"rps=(?P<rps>\d+) load=(?P<load>[\d.]+)$"
)


def export(rev: str, into: Path) -> str:
    """The commit ``rev`` written into ``into``; returns its short hash."""
    sha = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", rev],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    into.mkdir(parents=True)
    archive = subprocess.Popen(["git", "-C", str(ROOT), "archive", sha], stdout=subprocess.PIPE)
    subprocess.run(["tar", "-x", "-C", str(into)], stdin=archive.stdout, check=True)
    if archive.wait() != 0:
        raise SystemExit(f"git archive {rev} failed")
    return sha


def absolute(args: list[str]) -> list[str]:
    """Paths of this checkout (that exist) made absolute, for another working folder."""
    out = []
    for a in args:
        p = ROOT / a
        out.append(str(p) if not a.startswith("-") and p.exists() else a)
    return out


def run_load(tree: Path, args: list[str], timeout: float) -> list[dict]:
    """``tree``'s ``benchmarks/load.py`` with ``args``: its rows (parsed from its log)."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    cmd = [sys.executable, str(tree / "benchmarks" / "load.py"), *args]
    out = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=timeout)
    rows = [m.groupdict() for ln in out.stderr.splitlines() if (m := ROW.match(ln.strip()))]
    if out.returncode != 0 or not rows:
        tail = "\n".join(out.stderr.splitlines()[-15:])
        raise SystemExit(f"load.py failed ({out.returncode}) in {tree}:\n{tail}")
    return rows


def table(rows: list[dict], meta: dict) -> str:
    out = [
        f"Measured {meta['date']} on {meta['cpu']} ({meta['cores']} cores): `benchmarks/load.py` "
        f"of each commit in turn, {meta['rounds']} rounds (`python benchmarks/load.py "
        f"{meta['args']}`, each run starting its own server of that commit's code); the machine "
        "is shared with other work: the load average (1 min) before each cell is in the table.",
        "",
        "| request | commit | round | requests | errors | p50 ms | p99 ms | requests/s | load |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in sorted(rows, key=lambda r: (meta["kinds"].index(r["kind"]), r["round"])):
        out.append(
            f"| {r['kind']} | {r['commit']} ({r['side']}) | {r['round']} | {int(r['requests']):,} "
            f"| {r['errors']} | {float(r['p50']):.1f} | {float(r['p99']):.1f} "
            f"| {int(r['rps']):,} | {float(r['load']):.1f} |"
        )
    return "\n".join(out)


def main() -> int:
    argv = sys.argv[1:]
    rest: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, rest = argv[:i], argv[i + 1 :]
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--before", required=True, help="the commit before (any git revision)")
    p.add_argument("--after", default="HEAD", help="the commit after (default HEAD)")
    p.add_argument("--rounds", type=int, default=2, help="before/after pairs (1 to 5)")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per load.py run")
    p.add_argument("--write-results", nargs="?", const="load-ab", default=None, metavar="NAME")
    args = p.parse_args(argv)
    if not 1 <= args.rounds <= 5:
        p.error("--rounds: 1 to 5")
    if "--write-results" in rest or "--url" in rest:
        p.error("load.py's --write-results and --url are not for this script")
    given = set(rest)
    load_args = list(rest)
    for flag, name in (("--model", "model.safetensors"), ("--index", "index")):
        if flag not in given:
            load_args += [flag, str(ROOT / "var" / name)]
    load_args = absolute(load_args)
    kinds = "vector,label,label-hier,image,batch"
    if "--kinds" in rest:
        kinds = rest[rest.index("--kinds") + 1]
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="hs-ab-") as tmp:
        trees = {}
        for side, rev in (("before", args.before), ("after", args.after)):
            trees[side] = (export(rev, Path(tmp) / side), Path(tmp) / side)
        for rnd in range(1, args.rounds + 1):
            for side in ("before", "after"):
                sha, tree = trees[side]
                for r in run_load(tree, load_args, args.timeout):
                    rows.append({**r, "commit": sha, "side": side, "round": rnd})
                    print(f"round {rnd} {side} {sha}: {r}", file=sys.stderr, flush=True)
    meta = run_meta(
        rounds=args.rounds,
        args=command_line("load_ab.py", rest).removeprefix("python benchmarks/load_ab.py "),
        kinds=kinds.split(","),
    )
    report(table(rows, meta), args.write_results, command=command_line("load_ab.py"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
