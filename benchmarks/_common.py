"""What the benchmark scripts share: the repository root, the CPU's name, the README block.

Each script is run as ``python benchmarks/<name>.py``, so this module is found
beside it (``from _common import ...``).
"""

from __future__ import annotations

import platform
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


def write_readme(text: str, start: str, end: str, readme: str | Path | None = None) -> Path:
    """Put ``text`` between the markers ``start`` and ``end`` of the README.

    The block replaces what the markers held; without the markers (or with
    them in the wrong order) it is appended, markers included, at the end.
    Returns the file written.
    """
    path = Path(readme) if readme is not None else ROOT / "README.md"
    body = path.read_text(encoding="utf-8") if path.exists() else ""
    block = f"{start}\n{text.rstrip(chr(10))}\n{end}"
    if start in body and end in body and body.index(start) < body.index(end):
        body = body[: body.index(start)] + block + body[body.index(end) + len(end) :]
    else:
        body = body.rstrip("\n") + "\n\n" + block + "\n"
    path.write_text(body, encoding="utf-8")
    return path


def report(
    text: str, start: str, end: str, write: bool, readme: str | Path | None = None
) -> Path | None:
    """Print a benchmark's tables and, with ``write``, put them into the README (its path)."""
    print(text)
    return write_readme(text, start, end, readme) if write else None


RESULTS = ROOT / "benchmarks" / "results"


def git_commit() -> str:
    """The checkout's commit (short), with ``+dirty`` when the tree has changes."""
    import subprocess

    try:
        sha = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
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
    tmp.write_text("\n".join(head) + body.rstrip("\n") + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path
