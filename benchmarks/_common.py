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
