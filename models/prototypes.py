"""The nearest label prototype: how an unlabelled point gets a label.

One rule, used by queries (``query.label`` of a vector or image search,
:meth:`service.runtime.Runtime.nearest_used_labels`), upserts without a label,
index builds and jobs (:func:`indexing.build.build_index`,
``label_source: "predicted"``) and the holding labels of entailment cones
(:class:`indexing.cones.LabelCones`, over the cones' own labels):

* the distance is the geodesic distance of the Poincaré ball
  (:func:`models.geometry.poincare_np.pairwise_dist`); ties go to the first
  candidate in the given order;
* the candidates, for a prediction, are :func:`prediction_labels`: **the labels
  that indexed items carry** (SPEC: "for a vector or image the nearest
  prototype among the labels that indexed items carry"), sorted by name. At
  build time these are the labels of the index's items when the build starts
  together with the labels the build's own sources are given (they are indexed
  by the same build); when there are none at all, every node of the taxonomy.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from .geometry import poincare_np

__all__ = ["Prototypes", "nearest_rows", "prediction_labels"]

_CHUNK = 4_000_000  # distances computed at a time (rows x prototypes)


def nearest_rows(
    x: np.ndarray, points: np.ndarray, *, curvature: float, gaps: np.ndarray | None = None
) -> np.ndarray:
    """Row of the nearest of ``points`` (m, D) to each row of ``x`` (n, D): int64 (n,)."""
    x = np.asarray(x, dtype=np.float64).reshape(-1, points.shape[1])
    out = np.empty(len(x), dtype=np.int64)
    step = max(1, _CHUNK // max(1, len(points)))
    for a in range(0, len(x), step):
        d = poincare_np.pairwise_dist(x[a : a + step], points, c=curvature, gy=gaps)
        out[a : a + step] = np.argmin(d, axis=1)
    return out


def prediction_labels(in_use: Iterable[str | None], taxonomy_names: Sequence[str]) -> list[str]:
    """The candidates of a prediction: the labels in use that are taxonomy nodes,
    sorted; every node (taxonomy order) when there are none."""
    known = set(taxonomy_names)
    used = sorted({lab for lab in in_use if lab is not None and lab in known})
    return used if used else list(taxonomy_names)


@dataclass(frozen=True)
class Prototypes:
    """Named label points of one curvature, with their gaps (kept for speed)."""

    names: tuple[str, ...]
    points: np.ndarray  # (m, D) float64
    curvature: float
    gaps: np.ndarray  # (m,) 1 - c|p|^2

    @classmethod
    def of(cls, names: Sequence[str], points, curvature: float) -> Prototypes:
        pts = np.ascontiguousarray(np.asarray(points, dtype=np.float64))
        pts.setflags(write=False)
        c = float(curvature)
        return cls(tuple(names), pts, c, poincare_np.gap(pts, c=c))

    @classmethod
    def of_labels(cls, labels) -> Prototypes:
        """Every node of a :class:`models.labels.LabelEmbedding`, in taxonomy order."""
        pts = labels.embeddings.detach().cpu().double().numpy()
        return cls.of(labels.taxonomy.names, pts, labels.curvature)

    def subset(self, names: Sequence[str]) -> Prototypes:
        """The prototypes of ``names`` (each one of :attr:`names`), in that order."""
        row = {n: j for j, n in enumerate(self.names)}
        idx = [row[n] for n in names]
        return Prototypes(tuple(names), self.points[idx], self.curvature, self.gaps[idx])

    def nearest(self, x: np.ndarray) -> list[str]:
        """The nearest prototype's name for each row of ``x``."""
        rows = nearest_rows(x, self.points, curvature=self.curvature, gaps=self.gaps)
        return [self.names[j] for j in rows.tolist()]

    def nearest_k(self, x: np.ndarray, k: int) -> list[tuple[str, float]]:
        """The ``k`` nearest prototypes of one point (ascending distance; equal
        distances in the order of :attr:`names`)."""
        q = np.asarray(x, dtype=np.float64).reshape(1, -1)
        d = poincare_np.pairwise_dist(q, self.points, c=self.curvature, gy=self.gaps)[0]
        idx = np.argsort(d, kind="stable")[: min(k, len(d))]
        return [(self.names[j], float(d[j])) for j in idx.tolist()]
