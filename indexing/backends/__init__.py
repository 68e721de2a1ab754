"""Search backends of :class:`indexing.HyperbolicIndex` (see :mod:`.base`)."""

from __future__ import annotations

from .base import Backend
from .exact import ExactBackend
from .graph import GraphBackend
from .hnsw import HnswBackend

__all__ = ["Backend", "ExactBackend", "GraphBackend", "HnswBackend", "BACKENDS", "make_backend"]

BACKENDS: dict[str, type[Backend]] = {
    "exact": ExactBackend,
    "graph": GraphBackend,
    "hnsw": HnswBackend,
}


def make_backend(name: str, space, **params) -> Backend:
    try:
        cls = BACKENDS[name]
    except KeyError:
        raise ValueError(f"unknown backend {name!r} (known: {sorted(BACKENDS)})") from None
    return cls(space, **params)
