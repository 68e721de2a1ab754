"""Entailment cones of label prototypes: the *holding label* of an item.

Given label prototypes (the label embeddings, points of the ball), the
taxonomy's parent function, the curvature and the cone constant ``K``, the
holding label of an item ``x`` is found by starting at the prototype nearest to
``x`` (geodesic distance, :func:`models.prototypes.nearest_rows`) and
walking up the ancestor chain until a label whose entailment cone holds ``x``
(``models.geometry.cones.in_cone(label_point, x)``).  Labels of the chain
without a prototype are passed over; if no cone of the chain holds ``x`` the
topmost label of the chain (a root) is used.

The index stores the holding label beside each item; hierarchical search
(:meth:`indexing.HyperbolicIndex.search_hierarchical`) groups items by it.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Mapping
from typing import NamedTuple

import numpy as np

from models.geometry import poincare_np, ranking

from .errors import IndexInputError

__all__ = ["LabelCones", "HierarchicalHit"]


class HierarchicalHit(NamedTuple):
    """One result of a hierarchical search."""

    id: str
    distance: float
    level: int  # position in the chain: 0 = the query label
    via: str  # the chain label of that level


ParentFn = Callable[[str], "str | None"]


class LabelCones:
    """Label prototypes + parent function + cone constant.

    ``prototypes``: a mapping ``label -> point`` or a pair ``(labels, points)``
    with ``points`` of shape ``(n_labels, dim)``.  ``parent``: a callable
    ``label -> parent label or None`` (for a DAG, the caller picks one parent)
    or a mapping.  Only the Poincaré ball is supported (the cones live there).
    """

    def __init__(
        self,
        prototypes,
        parent: ParentFn | Mapping[str, str | None],
        *,
        curvature: float = 1.0,
        K: float = 0.1,
    ) -> None:
        if isinstance(prototypes, Mapping):
            names = list(prototypes)
            pts = np.asarray([np.asarray(prototypes[n], dtype=np.float64) for n in names])
        else:
            names, pts = prototypes
            names = list(names)
            pts = np.asarray(pts, dtype=np.float64)
        if pts.ndim != 2 or len(pts) != len(names) or len(names) == 0:
            raise IndexInputError(
                "prototypes: expected a non-empty mapping label -> point "
                "or (labels, (n, dim) array)"
            )
        for j, n in enumerate(names):
            if not isinstance(n, str):
                raise IndexInputError(f"prototypes: label #{j} is {type(n).__name__}, expected str")
        if len(set(names)) != len(names):
            raise IndexInputError("prototypes: duplicate labels")
        if not np.isfinite(pts).all():
            raise IndexInputError("prototypes: contain NaN or infinite values")
        c = float(curvature)
        if not (math.isfinite(c) and c > 0):
            raise IndexInputError(f"curvature: must be a positive number, got {curvature!r}")
        outside = ~ranking.inside_ball(pts, c)
        if outside.any():
            j = int(np.nonzero(outside)[0][0])
            raise IndexInputError(f"prototypes[{names[j]!r}]: outside the ball of curvature {c}")
        self.labels = names
        self.points = np.ascontiguousarray(pts)
        self._gaps = poincare_np.gap(self.points, c=c)
        self.row = {n: j for j, n in enumerate(names)}
        self.curvature = c
        self.K = float(K)
        self.dim = pts.shape[1]
        if isinstance(parent, Mapping):
            pmap = dict(parent)
            self._parent: ParentFn = pmap.get
        elif callable(parent):
            self._parent = parent
        else:
            raise IndexInputError("parent: expected a callable label -> parent or a mapping")
        self._chains: dict[str, tuple[str, ...]] = {}

    def parent(self, label: str) -> str | None:
        return self._parent(label)

    def chain(self, label: str) -> tuple[str, ...]:
        """``(label, parent(label), ..., root)``."""
        got = self._chains.get(label)
        if got is not None:
            return got
        out = [label]
        seen = {label}
        while True:
            p = self._parent(out[-1])
            if p is None:
                break
            if p in seen:
                raise IndexInputError(f"parent: cycle through label {p!r}")
            out.append(p)
            seen.add(p)
        got = tuple(out)
        self._chains[label] = got
        return got

    # -- holding labels ----------------------------------------------------------------
    def nearest_labels(self, x: np.ndarray) -> np.ndarray:
        """Row of the nearest prototype of each item, among the cones' labels
        (:func:`models.prototypes.nearest_rows`, the one nearest-prototype rule)."""
        from models.prototypes import nearest_rows

        return nearest_rows(x, self.points, curvature=self.curvature, gaps=self._gaps)

    def holding_labels(self, x: np.ndarray) -> list[str]:
        """The holding label of each row of ``x`` (float64 ``(n, dim)`` points)."""
        import torch

        from models.geometry import cones

        from .geometry import torch_threads

        x = np.ascontiguousarray(x, dtype=np.float64)
        n = len(x)
        if n == 0:
            return []
        chains = [self.chain(self.labels[j]) for j in self.nearest_labels(x)]
        pos = np.zeros(n, dtype=np.int64)  # position in the chain
        result: list[str | None] = [None] * n
        active = np.arange(n)
        while len(active):
            cur = [chains[i][pos[i]] for i in active]
            has = np.array([c in self.row for c in cur], dtype=bool)
            held = np.zeros(len(active), dtype=bool)
            if has.any():
                rows = np.array([self.row[c] for c, h in zip(cur, has, strict=True) if h])
                apex = torch.from_numpy(self.points[rows])
                pts = torch.from_numpy(x[active[has]])
                with torch_threads():
                    inside = cones.in_cone(apex, pts, c=self.curvature, K=self.K)
                held[has] = np.asarray(inside, dtype=bool).reshape(-1)
            nxt = []
            for j, i in enumerate(active.tolist()):
                if held[j] or pos[i] + 1 >= len(chains[i]):
                    result[i] = cur[j]  # held, or the root of the chain
                else:
                    pos[i] += 1
                    nxt.append(i)
            active = np.asarray(nxt, dtype=np.int64)
        return result  # type: ignore[return-value]

    # -- persistence -------------------------------------------------------------------
    def records(self) -> list[tuple[str, str | None, bytes | None]]:
        """``(label, parent, prototype bytes or None)`` for every label on a chain."""
        rows: dict[str, tuple[str, str | None, bytes | None]] = {}
        for name in self.labels:
            for lab in self.chain(name):
                if lab in rows:
                    break
                vec = None
                if lab in self.row:
                    vec = np.ascontiguousarray(self.points[self.row[lab]], dtype="<f8").tobytes()
                rows[lab] = (lab, self._parent(lab), vec)
        return sorted(rows.values())

    def fingerprint(self) -> str:
        h = hashlib.sha256()
        h.update(f"{self.curvature!r} {self.K!r}".encode())
        for lab, par, vec in self.records():
            h.update(repr((lab, par)).encode())
            h.update(vec or b"-")
        return h.hexdigest()

    @classmethod
    def from_records(cls, records, *, curvature: float, K: float) -> LabelCones:
        parents = {lab: par for lab, par, _ in records}
        names = [lab for lab, _, vec in records if vec is not None]
        pts = np.array(
            [np.frombuffer(vec, dtype="<f8") for _, _, vec in records if vec is not None]
        )
        return cls((names, pts), parents, curvature=curvature, K=K)
