"""Loading the graph backend's compiled kernels ahead of their first real use
(:func:`warm_kernels`, called in the background by :mod:`indexing.live`)."""

from __future__ import annotations

import time

import numpy as np

from ..geometry import PoincareIndexSpace
from ..table import ItemTable
from .graph import GraphBackend

__all__ = ["warm_kernels"]


def warm_kernels(dim: int = 8) -> float:
    """Load (or compile) the compiled kernels of this backend now, on a few hundred
    random points of the ball, both coordinate precisions; returns the seconds
    it took.

    numba loads its on-disk cache at a kernel's first call: about 1.3 s on a
    2-core machine, which otherwise lands on the write that makes ``auto``
    switch an exact-scan index to this backend (benchmarks/results/writes.md).
    The service calls this in the background once it is serving."""
    t0 = time.perf_counter()
    rng = np.random.default_rng(0)
    space = PoincareIndexSpace(dim, 1.0)
    x = rng.standard_normal((600, dim))
    x *= rng.uniform(0.05, 0.8, (600, 1)) / np.linalg.norm(x, axis=1, keepdims=True)
    for precision in ("float32", "float64"):
        table = ItemTable(dim, capacity=1024)
        table.upsert([f"w{i}" for i in range(400)], x[:400], [None] * 400, [None] * 400)
        g = GraphBackend(space, precision=precision, n_entries=16, build_threads=1)
        g.build(table)
        more = [f"w{i}" for i in range(400, 600)]
        new, _ = table.upsert(more, x[400:], [None] * 200, [None] * 200)
        g.add(table, new)
        g.search(table, x[:4], 5)
        g.search(table, x[:4], 5, allowed=np.arange(0, 600, 2, dtype=np.int64))
        g.remove(table, new[:10])
    return time.perf_counter() - t0
