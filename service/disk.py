"""A 2-D Poincaré-disk picture of one answer: query, results, label prototypes.

The points live in a D-dimensional ball; the page draws a disk. The layout
keeps what makes the hierarchy readable and gives up the rest:

* **radius**: each point's hyperbolic distance to the origin ``d(0, x)`` is
  kept, up to one common scale: display radius ``tanh(s * d(0, x) / 2)``, with
  ``s`` chosen so that the farthest point lands at 0.92 of the disk. General
  labels (near the origin) stay inside, specific labels and items outside them.
* **angle**: the direction ``x / |x|``, minus the mean direction of the points
  drawn, projected onto its two principal axes (SVD). Points of one hierarchy
  tend to share a direction (that is how hierarchies embed), so the uncentred
  directions would all fall on one ray; centring spreads the differences
  between branches over the whole circle. Items sit at their label's angle
  when the model put them near it.

Labels drawn: the query's chain (its label up to the root), the labels of the
results, and the labels in use under the query label's parent (its siblings),
at most :data:`MAX_LABELS`; each with an edge to its parent. ``origin`` marks
the centre of the ball.
"""

from __future__ import annotations

import math

import numpy as np

from .schemas import DiskOut, DiskPoint

MAX_LABELS = 48
EDGE = 0.92


def layout(rt, ans) -> DiskOut:
    if rt.product:  # the disk shows the labels around the query, in the ball
        raise rt.no_labels("disk")
    chain = ans.chain or (rt.chain(ans.query_label) if ans.query_label else [])
    labels: list[str] = []
    hits = list(ans.hits) + [h for g in ans.groups or [] for h in g.hits]

    def add(name: str | None) -> None:
        if name and name in rt.taxonomy and name not in labels and len(labels) < MAX_LABELS:
            labels.append(name)

    for c in chain:
        add(c)
    for g in ans.groups or []:
        add(g.label)
    for h in hits:
        add(h.label)
    if len(chain) > 1:
        for child in sorted(rt.used_under(chain[1])):
            if chain[1] in rt.taxonomy.parents(child):
                add(child)

    q = np.asarray(ans.query_vector, dtype=np.float64)
    vecs = [q, np.zeros_like(q)]
    kinds: list[tuple[str, str, str | None, int | None]] = [
        ("query", "query", ans.query_label, None),
        ("origin", "origin", None, None),
    ]
    for h in hits:
        item = rt.index.get(h.id)
        if item is None:
            continue
        vecs.append(np.asarray(item.vector, dtype=np.float64))
        kinds.append(("result", h.id, h.label, h.level))
    for name in labels:
        vecs.append(rt.label_point(name))
        kinds.append(("label", name, name, None))
    m = np.stack(vecs)
    radius = rt.distance_to_origin(m)
    norms = np.linalg.norm(m, axis=1, keepdims=True)
    dirs = np.divide(m, norms, out=np.zeros_like(m), where=norms > 0)
    # principal axes of the directions, centred on their mean (points near the
    # origin, whose direction means little, left out of the fit)
    fit = [i for i, k in enumerate(kinds) if k[0] != "origin" and radius[i] > 0.5] or [0]
    mean = dirs[fit].mean(axis=0)
    basis = _plane(dirs[fit] - mean)
    xy = (dirs - mean) @ basis  # (n, 2)
    lens = np.linalg.norm(xy, axis=1, keepdims=True)
    xy = np.divide(xy, lens, out=np.zeros_like(xy), where=lens > 1e-12)

    rmax = float(radius.max()) if len(radius) else 0.0
    scale = 2 * math.atanh(EDGE) / rmax if rmax > 0 else 1.0
    pts = xy * np.tanh(scale * radius / 2)[:, None]

    parent_of: dict[str, str | None] = {}
    for i, name in enumerate(chain):
        parent_of[name] = chain[i + 1] if i + 1 < len(chain) else None
    for name in labels:
        if name not in parent_of:
            ps = [p for p in rt.taxonomy.parents(name) if p in labels]
            parent_of[name] = ps[0] if ps else None

    points = []
    for (kind, name, lab, level), (px, py) in zip(kinds, pts.tolist(), strict=True):
        points.append(
            DiskPoint(
                kind=kind,
                name=name,
                x=round(px, 5),
                y=round(py, 5),
                label=lab,
                level=level,
                parent=parent_of.get(name) if kind == "label" else None,
            )
        )
    return DiskOut(scale=scale, points=points)


def _plane(dirs: np.ndarray) -> np.ndarray:
    """(D, 2): the two leading right singular vectors of ``dirs`` (uncentred)."""
    d = dirs.shape[1]
    if d == 1:
        return np.array([[1.0, 0.0]])
    try:
        _, _, vt = np.linalg.svd(dirs, full_matrices=False)
    except np.linalg.LinAlgError:
        vt = np.eye(d)
    basis = vt[:2].T
    if basis.shape[1] < 2:  # a single direction: complete with any orthogonal axis
        e = np.zeros(d)
        e[int(np.argmin(np.abs(basis[:, 0])))] = 1.0
        e -= basis[:, 0] * (basis[:, 0] @ e)
        basis = np.column_stack([basis[:, 0], e / np.linalg.norm(e)])
    return basis
