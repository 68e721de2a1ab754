"""The nearest label prototype: how an unlabelled point gets a label.

One rule, used by queries (``query.label`` of a vector or image search,
:meth:`service.runtime.Runtime.nearest_used_labels`), upserts without a label,
index builds and jobs (:func:`service.ingest.build.build_index`,
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

The deepest holding cone: how a point gets a label from the geometry.

:func:`deepest_holder` (exact signature, kept stable for the service)::

    deepest_holder(points, label_names, label_points, children_of, spec, c,
                   *, fallback=None, tol=0.0) -> list[str]

* ``points`` (n, D) float64 (one point (D,) is taken as n = 1);
  ``label_names`` (m,) and ``label_points`` (m, D) float64, row j is
  ``label_names[j]``; ``children_of`` maps a label name to its children's
  names (a ``Mapping`` or a callable such as ``Taxonomy.children``; children
  that are not in ``label_names`` are skipped); ``spec`` a cone description
  (:func:`models.geometry.cones.cone_spec`; a label checkpoint's is
  :func:`label_cone_spec`); ``c`` the curvature.
* The rule: start at the roots (labels that are nobody's child among
  ``label_names``) whose cone holds the point (membership margin
  :func:`models.geometry.cones.membership_margin_np` ``>= -tol``), take the
  one of largest margin, then repeatedly step to the child of largest margin
  among the children whose cone holds the point; the answer is the last label
  reached. With the cap family sibling caps are disjoint, so in a tree at most
  one child holds a point and "largest margin" only decides between the
  parents of a DAG's shared child.
* Fall-back, for points that no root's cone holds: ``fallback(rows)`` (a
  callable on the (k, D) points, returning k names) when given, else the
  nearest label point by geodesic distance (:meth:`Prototypes.nearest`, the
  rule of the rest of this module, among ``label_names``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .geometry import cones, poincare_np

__all__ = [
    "Prototypes",
    "deepest_holder",
    "label_cone_spec",
    "nearest_rows",
    "prediction_labels",
]

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

    @classmethod
    def of_model(cls, model) -> Prototypes:
        """Every node's prototype for an image model's embeddings
        (:meth:`models.vision.image_model.ImageModel.prototypes`: the label points, or their
        scaled stand-ins for a model trained with ``prototype_radius`` and not placed)."""
        pts = model.prototypes().detach().cpu().double().numpy()
        return cls.of(model.labels.taxonomy.names, pts, model.labels.curvature)

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


# ---------------------------------------------------------------- the deepest holding cone


def label_cone_spec(labels) -> dict[str, Any]:
    """The cone family of a :class:`models.labels.LabelEmbedding`, validated
    (checkpoints written before the family was saved load as Ganea cones of
    their ``cone_K``: :meth:`models.labels.LabelEmbedding.from_tensors`)."""
    return cones.cone_spec(**labels.cone)


def _children_table(
    label_names: Sequence[str], children_of: Mapping[str, Iterable[str]] | Callable
) -> tuple[list[list[int]], list[int]]:
    row = {n: j for j, n in enumerate(label_names)}
    get = children_of.get if isinstance(children_of, Mapping) else children_of
    kids: list[list[int]] = []
    is_child = np.zeros(len(label_names), dtype=bool)
    for name in label_names:
        ks = [row[k] for k in (get(name) or ()) if k in row]
        kids.append(ks)
        is_child[ks] = True
    return kids, np.flatnonzero(~is_child).tolist()


def holder_table(
    label_names: Sequence[str], children_of: Mapping[str, Iterable[str]] | Callable
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(deg, ptr, flat)``: the children of each label (and, as row ``len(names)``,
    the roots) in compressed rows, as :func:`deepest_holder` descends them."""
    kids, roots = _children_table(list(label_names), children_of)
    lists = [*kids, roots]  # the last row: a virtual root above the roots
    deg = np.array([len(k) for k in lists], dtype=np.int64)
    ptr = np.zeros(len(lists) + 1, dtype=np.int64)
    np.cumsum(deg, out=ptr[1:])
    flat = np.fromiter((j for k in lists for j in k), dtype=np.int64, count=int(ptr[-1]))
    return deg, ptr, flat


def _apex(lp, parts, rows, spec, c) -> tuple:
    """The cone parts of the labels ``rows``: indexed from ``parts`` when the caller
    keeps them, else computed for those rows."""
    if parts is None:
        return cones.apex_parts_np(lp[rows], spec, c=c)
    return tuple(a[rows] for a in parts)


def _descend_one(m, table, lp, parts, targets, spec, c, tol) -> int:
    """:func:`deepest_holder`'s descent for one point (``targets``: its parts): the
    row of its deepest holding label, ``m`` when no root holds it. The same margins
    (elementwise, broadcast against the children) and the same choice (the largest
    margin, then the first child)."""
    deg, ptr, flat = table
    cur = m
    for _ in range(m + 1):
        d = int(deg[cur])
        if d == 0:
            break
        kids = flat[ptr[cur] : ptr[cur] + d]
        mar = cones.margin_of_parts_np(_apex(lp, parts, kids, spec, c), targets, spec, c=c)
        held = mar >= -tol
        if not held.any():
            break
        cur = int(kids[int(np.argmax(np.where(held, mar, -np.inf)))])
    return cur


def deepest_holder(
    points,
    label_names: Sequence[str],
    label_points,
    children_of: Mapping[str, Iterable[str]] | Callable[[str], Iterable[str]],
    spec: dict[str, Any],
    c: float,
    *,
    fallback: Callable[[np.ndarray], list[str]] | None = None,
    tol: float = 0.0,
    table: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
    parts: tuple | None = None,
) -> list[str]:
    """The deepest label whose cone holds each point (see the module docstring), (n,) names.

    ``table``: :func:`holder_table` of ``label_names`` and ``children_of``, when the
    caller keeps it (built here otherwise: O(labels), the most of a one-point call);
    ``parts``: :func:`models.geometry.cones.apex_parts_np` of ``label_points``, when
    the caller keeps it (else each level computes those of the children it tests).
    The points' own parts are computed once, not once a level.

    A descent: each level computes the margins of the points still moving
    against the children of their current label only (ties to the first
    child listed), so a point costs its depth times its labels' fan-out, not
    the number of labels (the 82,115-node noun closure answers in
    milliseconds per point).
    """
    names = list(label_names)
    lp = np.asarray(label_points, dtype=np.float64).reshape(len(names), -1)
    x = np.asarray(points, dtype=np.float64).reshape(-1, lp.shape[1])
    if len(names) == 0:
        raise ValueError("deepest_holder needs at least one label")
    if table is None:
        table = holder_table(names, children_of)
    m = len(names)
    deg, ptr, flat = table
    if len(deg) != m + 1:
        raise ValueError(f"deepest_holder: a table of {len(deg) - 1} labels for {m} labels")
    cur = np.full(len(x), m, dtype=np.int64)
    active = np.flatnonzero(deg[cur] > 0)
    targets = cones.margin_targets_np(x, spec, c=c)  # the points' parts, once
    if len(x) == 1:  # one point (a single upsert): the same descent, without the batching
        cur[0] = _descend_one(m, table, lp, parts, targets, spec, c, tol)
        active = active[:0]
    budget = max(1, _CHUNK // max(1, lp.shape[1]))  # (point, child) pairs at a time
    for _ in range(m + 1):  # a DAG: every step goes one level deeper
        if len(active) == 0:
            break
        moved = []
        cnt_all = deg[cur[active]]
        ends = np.cumsum(cnt_all)
        a = 0
        while a < len(active):
            b = max(a + 1, int(np.searchsorted(ends, ends[a] - cnt_all[a] + budget, "right")))
            act, cnt = active[a:b], cnt_all[a:b]
            pt = np.repeat(act, cnt)
            off = np.arange(int(cnt.sum())) - np.repeat(np.cumsum(cnt) - cnt, cnt)
            cand = flat[np.repeat(ptr[cur[act]], cnt) + off]
            apex = _apex(lp, parts, cand, spec, c)
            mar = cones.margin_of_parts_np(apex, tuple(t[pt] for t in targets), spec, c=c)
            held = mar >= -tol
            pt, cand, mar, off = pt[held], cand[held], mar[held], off[held]
            if len(pt):
                o = np.lexsort((off, -mar, pt))  # per point: largest margin, then first
                first = o[np.r_[True, pt[o][1:] != pt[o][:-1]]]
                cur[pt[first]] = cand[first]
                moved.append(pt[first])
            a = b
        active = np.concatenate(moved) if moved else np.zeros(0, dtype=np.int64)
        active = active[deg[cur[active]] > 0]
    out: list[str | None] = [names[j] if j < m else None for j in cur.tolist()]
    lost = np.flatnonzero(cur == m).tolist()
    if lost:
        if fallback is None:
            fb = Prototypes.of(names, lp, c).nearest(x[lost])
        else:
            fb = list(fallback(x[lost]))
        for i, v in zip(lost, fb, strict=True):
            out[i] = v
    return out  # type: ignore[return-value]
