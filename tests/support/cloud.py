"""Helpers shared by the index and store tests (no tests here)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from indexing import HyperbolicIndex
from indexing.geometry import torch_threads
from indexing.synthetic import hierarchical_cloud
from models.geometry import poincare

__all__ = [
    "cloud",
    "make_ids",
    "brute_force",
    "recall_at",
    "exact_dist",
    "against_exact",
    "chain_up",
]


def cloud(n: int, n_queries: int = 0, *, dim: int = 16, seed: int = 0, curvature: float = 1.0):
    """A seeded hierarchical cloud: norms mostly in [0.9, 0.999]/sqrt(c), ~5% beyond."""
    return hierarchical_cloud(n, dim, curvature=curvature, seed=seed, n_queries=n_queries)


def make_ids(n: int, prefix: str = "i") -> list[str]:
    return [f"{prefix}{j}" for j in range(n)]


def exact_dist(q: np.ndarray, x: np.ndarray, c: float = 1.0) -> np.ndarray:
    """models.geometry float64 distances from one query to rows of x."""
    with torch_threads():
        return poincare.dist(
            torch.from_numpy(np.asarray(q, dtype=np.float64))[None, :],
            torch.from_numpy(np.asarray(x, dtype=np.float64)),
            c=c,
        ).numpy()


def assert_geodesic(actual, ref) -> None:
    """Index distances against the torch reference: the index returns the
    compiled float64 twin of the formula (models.geometry.kernels), equal to
    it within a few ulps (tests/models/test_geometry_kernels.py)."""
    np.testing.assert_allclose(actual, ref, rtol=1e-12, atol=0)


def brute_force(x: np.ndarray, q: np.ndarray, k: int, c: float = 1.0):
    """(indices, distances) of the exact float64 k nearest neighbours, by models.geometry."""
    d = np.stack([exact_dist(qq, x, c) for qq in q])
    order = np.argsort(d, axis=1, kind="stable")[:, :k]
    return order, np.take_along_axis(d, order, axis=1)


def recall_at(found, truth) -> float:
    pairs = zip(found, truth, strict=True)
    hits = [len(set(map(str, a)) & set(map(str, b))) / len(b) for a, b in pairs]
    return float(np.mean(hits))


def exact_fixture(backend: str, n: int, n_queries: int, *, seed: int):
    """A module-scoped fixture of :func:`against_exact`'s answer (built once a module)."""

    @pytest.fixture(scope="module")
    def fixture():
        return against_exact(backend, n, n_queries, seed=seed)

    return fixture


def against_exact(backend: str, n: int, n_queries: int, *, seed: int, k: int = 10):
    """``(x, q, truth, tdist, index)``: a seeded cloud of ``n`` points (dim 16)
    and ``n_queries`` queries, the exact backend's top ``k`` (ids, distances) and
    an index of ``backend`` with its default parameters holding the same items."""
    x, q = cloud(n, n_queries, seed=seed)
    ids = make_ids(len(x))
    exact = HyperbolicIndex(16, backend="exact")
    exact.add(x, ids)
    truth, tdist = exact.search(q, k=k)
    index = HyperbolicIndex(16, backend=backend)  # default parameters
    index.add(x, ids)
    return x, q, truth, tdist, index


def chain_up(parent: dict, label: str) -> list[str]:
    """``[label, its parent, ..., the root]`` in a tree given as child -> parent
    (the root's parent ``None``): the chain a hierarchical search walks."""
    out = [label]
    while parent[out[-1]] is not None:
        out.append(parent[out[-1]])
    return out
