"""Which backend an index uses, and with which parameters.

A configuration is ``exact``, ``graph``, ``hnsw`` or ``auto``.  ``auto`` scans
exactly while the index is small and switches to the graph above
``auto_threshold`` live items (the graph is the faster of the two approximate
backends at recall@10 >= 0.99 in ``benchmarks/ann.py``, see benchmarks/results/ann.md); it
goes back to exact only below half the threshold, so that an index near the
threshold does not rebuild at every write.  The graph backend indexes the
Poincaré ball and product spaces (with the product distance compiled); the
hnsw backend the ball only.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import numpy as np

from .backends import BACKENDS, Backend, make_backend
from .errors import IndexInputError
from .geometry import IndexSpace, PoincareIndexSpace
from .validation import check_pos_int

__all__ = ["AUTO_BACKEND", "AUTO_THRESHOLD", "BALL_ONLY", "BackendChoice"]

AUTO_THRESHOLD = 20_000
#: The backend ``auto`` uses above ``AUTO_THRESHOLD`` live items in the Poincaré ball.
AUTO_BACKEND = "graph"
#: Backends that index the Poincaré ball only (product spaces use ``exact`` or ``graph``).
BALL_ONLY = ("hnsw",)


class BackendChoice:
    """A checked backend configuration: ``config`` (a backend name or ``auto``),
    ``params`` (JSON-serialisable keyword arguments of the backend) and
    ``auto_threshold``.  Bad input raises :class:`IndexInputError` here rather
    than at the first switch to the graph."""

    def __init__(self, space: IndexSpace, config: str, params: Mapping[str, Any]) -> None:
        if config != "auto" and config not in BACKENDS:
            raise IndexInputError(
                f"backend: unknown backend {config!r} (known: auto, {', '.join(sorted(BACKENDS))})"
            )
        params = {k: v.item() if isinstance(v, np.generic) else v for k, v in params.items()}
        try:
            json.dumps(params)
        except (TypeError, ValueError):
            raise IndexInputError(f"backend_params: not JSON-serialisable: {params!r}") from None
        self.auto_threshold = check_pos_int(
            params.pop("auto_threshold", AUTO_THRESHOLD), "auto_threshold", 0
        )
        self.space = space
        self.config = config
        self.params = params
        self._ball = isinstance(space, PoincareIndexSpace)
        if config in BALL_ONLY and not self._ball:
            raise IndexInputError(
                f"backend: {config} supports the Poincaré ball only, not {space.spec!r}; "
                "product spaces use the exact or graph backend (backend='exact', 'graph' or 'auto')"
            )
        names = (config,)
        if config == "auto":
            names = (AUTO_BACKEND,)
        for name in names:
            try:
                make_backend(name, space, **params)
            except (TypeError, ValueError) as exc:
                raise IndexInputError(f"backend_params: {exc}") from None

    @staticmethod
    def recorded(
        manifest: Mapping[str, Any] | None, overrides: Mapping[str, Any]
    ) -> tuple[str, dict[str, Any]]:
        """The ``(config, params)`` a manifest recorded (``auto`` if none or
        unknown), updated with ``overrides``."""
        man = manifest or {}
        config = man.get("backend_config", "auto")
        if config != "auto" and config not in BACKENDS:
            config = "auto"
        params = dict(man.get("config_params", {}))
        if "auto_threshold" in man:
            params["auto_threshold"] = man["auto_threshold"]
        params.update(overrides)
        return config, params

    def manifest_fields(self) -> dict[str, Any]:
        """What :meth:`recorded` reads back."""
        return {
            "backend_config": self.config,
            "config_params": self.params,
            "auto_threshold": self.auto_threshold,
        }

    def desired(self, n_alive: int, current: str | None = None) -> str:
        """The backend for ``n_alive`` live items, ``current`` being the one in use."""
        if self.config != "auto":
            return self.config
        if n_alive > self.auto_threshold:
            return AUTO_BACKEND
        if current == AUTO_BACKEND and n_alive >= self.auto_threshold // 2:
            return AUTO_BACKEND  # hysteresis: do not flip back and forth around the threshold
        return "exact"

    def make(self, name: str) -> Backend:
        """A new, empty backend ``name`` (``auto``'s exact scan takes no parameters)."""
        params = self.params if name != "exact" or self.config != "auto" else {}
        return make_backend(name, self.space, **params)
