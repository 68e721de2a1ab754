"""Taxonomy files: reading and writing ``child<TAB>parent`` edge lists.

One ``child<TAB>parent`` per line; blank lines and lines starting with ``#``
are ignored. Reading reports every problem as one line that names the file
and the line; writing is atomic. The graph is built by the caller
(:meth:`models.taxonomy.graph.Taxonomy.from_tsv` and
:meth:`~models.taxonomy.graph.Taxonomy.to_tsv`).
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

from models.fileio import atomic_write_bytes, read_named_file
from models.taxonomy.base import EdgeError, TaxonomyError, gc_paused

__all__ = ["read_tsv", "write_tsv"]

T = TypeVar("T")


def read_tsv(path: str | os.PathLike, build: Callable[[list[tuple[str, str]]], T]) -> T:
    """``build(edges)`` of the edge list at *path*.

    Errors name the file and line: a line without exactly two non-empty
    tab-separated fields, a self-loop, an edge that closes a cycle (an
    :class:`~models.taxonomy.base.EdgeError` raised by ``build``).
    """
    path = os.fspath(path)
    data = read_named_file(
        path,
        TaxonomyError,
        missing="taxonomy file not found: {path}",
        directory="taxonomy path is a directory: {path}",
    )
    edges: list[tuple[str, str]] = []
    try:
        for lineno, line in enumerate(_lines(data), 1):
            s = line.rstrip("\r\n")
            t = s.strip()
            if not t or t[0] == "#":
                continue
            parts = s.split("\t")
            if len(parts) != 2 or not parts[0].strip() or not parts[1].strip():
                shown = s if len(s) <= 80 else s[:77] + "..."
                raise TaxonomyError(
                    f"{path}:{lineno}: malformed line, expected 'child<TAB>parent' "
                    f"(got {len(parts)} field(s)): {shown!r}"
                )
            c = parts[0].strip()
            p = parts[1].strip()
            if c == p:
                raise TaxonomyError(f"{path}:{lineno}: self-loop edge {c!r} -> {p!r}")
            edges.append((c, p))
    except UnicodeDecodeError as e:
        raise TaxonomyError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    if not edges:
        raise TaxonomyError(f"{path}: no edges")
    try:
        return build(edges)
    except EdgeError as e:
        lineno = _find_line(data, e.edge)
        raise TaxonomyError(f"{path}:{lineno}: {e}") from None


def _lines(data: bytes) -> io.TextIOWrapper:
    """The lines of *data* as a UTF-8 text file reads them (universal newlines)."""
    return io.TextIOWrapper(io.BytesIO(data), encoding="utf-8")


def _find_line(data: bytes, edge: tuple[str, str]) -> int | str:
    for lineno, line in enumerate(_lines(data), 1):
        parts = line.rstrip("\r\n").split("\t")
        if len(parts) == 2 and (parts[0].strip(), parts[1].strip()) == edge:
            return lineno
    return "?"


def write_tsv(
    path: str | os.PathLike,
    names: Sequence[str],
    rows: Iterable[Sequence[int]],
    *,
    closure: bool,
) -> None:
    """Write ``names[child]<TAB>names[parent]`` lines, one for each id in
    ``rows[child]``, after a header line, atomically (temp file + ``os.replace``).

    ``closure`` only names the kind of edges in the header.
    """
    parts = []
    n_edges = 0
    with gc_paused():
        for child, row in zip(names, rows, strict=True):
            if row:
                n_edges += len(row)
                prefix = child + "\t"
                parts.extend([prefix + names[a] + "\n" for a in row])
    kind = "transitive closure" if closure else "direct edges"
    header = (
        f"# hypsearch taxonomy: {len(names)} nodes, {n_edges} edges ({kind}); child<TAB>parent\n"
    )
    body = "".join(parts)
    del parts
    atomic_write_bytes(os.fspath(path), (header.encode("utf-8"), body.encode("utf-8")), mode=0o644)
