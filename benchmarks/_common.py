"""What the benchmark scripts share: the repository root, the CPU's name, the results file.

Each script is run as ``python benchmarks/<name>.py``, so this module is found
beside it (``from _common import ...``). A script prints its tables; with
``--write-results`` it also writes them to ``benchmarks/results/<name>.md``
(:func:`write_results`), which the README and docs/ link to. No script
writes the README.
"""

from __future__ import annotations

import platform
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def cpu_model() -> str:
    """The CPU's model name (from /proc/cpuinfo where there is one)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def run_meta(**fields) -> dict:
    """A results table's metadata: the date, the CPU and its cores, then ``fields``."""
    import datetime as dt
    import os

    return {
        "date": dt.date.today().isoformat(),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        **fields,
    }


def add_results_flag(parser, default: str) -> None:
    """``--write-results [NAME]``: also write the tables to
    ``benchmarks/results/NAME.md`` (``default`` when no NAME is given)."""
    parser.add_argument(
        "--write-results",
        nargs="?",
        const=default,
        default=None,
        metavar="NAME",
        help=f"also write the tables to benchmarks/results/NAME.md (NAME: {default} if omitted)",
    )


def command_line(script: str, argv: list[str] | None = None) -> str:
    """The command that reproduces a run: ``python benchmarks/<script> <argv>``,
    without ``--write-results`` (and its NAME), paths inside the checkout relative."""
    import shlex

    args = list(sys.argv[1:] if argv is None else argv)
    out: list[str] = []
    skip = False
    for a in args:
        if skip:
            skip = False
            if not a.startswith("-"):
                continue
        if a == "--write-results":
            skip = True
            continue
        if a.startswith("--write-results="):
            continue
        out.append(_inside_root(a))
    return " ".join(["python", f"benchmarks/{script}", *map(shlex.quote, out)])


def _inside_root(arg: str) -> str:
    """An absolute path inside the checkout, relative to it (results name no
    machine-local folder); anything else as it is."""
    if not arg.startswith("/"):
        return arg
    try:
        return Path(arg).resolve().relative_to(ROOT).as_posix()
    except ValueError:
        return arg


def report(text: str, name: str | None, *, command: str, title: str | None = None) -> Path | None:
    """Print a benchmark's tables and, given a ``name``, write them to
    ``benchmarks/results/<name>.md`` (:func:`write_results`); returns the path written."""
    print(text)
    if name is None:
        return None
    path = write_results(name, text, command=command, title=title)
    print(f"written to {path}", file=sys.stderr)
    return path


def report_each(names, run, tables, name: str | None, *, command: str, title=None) -> list:
    """``run(n)`` for each of ``names`` in turn; after each, ``tables(results so far)``
    is written to ``benchmarks/results/<name>.md`` (:func:`report`; marked partial until
    the last), so a long run that is stopped keeps what it measured. Returns the results."""
    results = []
    for n in names:
        results.append(run(n))
        text = tables(results)
        if len(results) < len(names):
            text += f"\n\n(Partial: {len(results)} of {len(names)} datasets so far.)"
        if name or len(results) == len(names):
            report(text, name, command=command, title=title)
    return results


def read_results(name: str) -> str:
    """The body of ``benchmarks/results/<name>.md``: what follows its header
    (title, date, commit, machine, command)."""
    lines = (RESULTS / f"{name}.md").read_text(encoding="utf-8").splitlines()
    for i, line in enumerate(lines):
        if line.startswith("- command:"):
            rest = lines[i + 1 :]
            while rest and not rest[0].strip():
                rest = rest[1:]
            return "\n".join(rest) + "\n"
    return "\n".join(lines) + "\n"


RESULTS = ROOT / "benchmarks" / "results"


def git_commit() -> str:
    """The checkout's commit (short), with ``+dirty`` when the tree has changes."""
    import subprocess

    def git(*args: str) -> str:
        cmd = ["git", "-C", str(ROOT), *args]
        return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip()

    try:
        sha = git("rev-parse", "--short", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return sha + ("+dirty" if dirty else "")


def machine() -> str:
    """``<CPU model>, <n> CPUs, Python <version>``."""
    import os

    return f"{cpu_model()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"


def write_results(name: str, body: str, *, command: str, title: str | None = None) -> Path:
    """Write ``benchmarks/results/<name>.md``: a title, the date (UTC), the commit,
    the machine and the command that reproduces it, then ``body`` (markdown
    tables and what they say). Returns the path written (replaced atomically)."""
    import datetime
    import os

    RESULTS.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    head = [
        f"# {title or name}",
        "",
        f"- date: {now}",
        f"- commit: {git_commit()}",
        f"- machine: {machine()}",
        f"- command: `{command}`",
        "",
    ]
    path = RESULTS / f"{name}.md"
    tmp = path.with_suffix(".md.tmp")
    tmp.write_text("\n".join(head) + "\n" + body.rstrip("\n") + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path


def wait_ready(proc, url: str, log: Path | None, limit: float = 120.0) -> None:
    """Wait until the server process ``proc`` answers ``GET url/readyz`` with 200; if it
    exits, or is not ready after ``limit`` seconds (then it is terminated), stop the
    benchmark with a line that points at its ``log`` (when it has one)."""
    import time

    import httpx

    see = f"; see {log}" if log is not None else ""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited with {proc.returncode}{see}")
        try:
            if httpx.get(url + "/readyz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    proc.terminate()
    raise SystemExit(f"server not ready after {limit:g} s{see}")
