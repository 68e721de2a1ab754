"""Entailment cones of label points: the *holding label* of an item.

Given the label points (the label embedding), the taxonomy's parent function,
the curvature and a cone description (:func:`models.geometry.cones.cone_spec`:
any family, e.g. a label checkpoint's ``cone``), the holding label of an item
``x`` is the **deepest label whose cone holds** ``x``
(:func:`models.prototypes.deepest_holder`: from the roots down, through the
children whose cone holds the point, by
:func:`models.geometry.cones.membership_margin_np` ``>= 0``).  Labels without a
point are passed over (a label's cone parent is its nearest ancestor with a
point).  An item that no root's cone holds has no holding label (``None``).

The index stores the holding label beside each item; hierarchical search
(:meth:`indexing.HyperbolicIndex.search_hierarchical`) groups items by it.
For cones that nest or are disjoint (a laminar family, as the cap
construction's: every child's cap inside its parent's, siblings' caps
disjoint), the labels whose cones hold ``x`` are exactly the holding label and
the labels whose cones hold the holding label's point (:meth:`LabelCones.held_by`),
so levels by holding label are levels by cone membership of the item's own point.
"""

from __future__ import annotations

import hashlib
import json
import math
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from models.geometry import ranking

from .errors import IndexInputError

__all__ = ["HELD_KEPT", "HeldAmong", "LabelCones", "HierarchicalHit"]

#: answers a :class:`HeldAmong` keeps (one per label asked; the oldest goes first)
HELD_KEPT = 16384


class HierarchicalHit(NamedTuple):
    """One result of a hierarchical search."""

    id: str
    distance: float
    level: int  # position in the chain: 0 = the query label
    via: str  # the chain label of that level
    firmness: float | None = None  # in via's cone (indexing.entailment); None: by distance


ParentFn = Callable[[str], "str | None"]


def _check_spec(spec: Mapping[str, Any] | None, K: float | None) -> dict[str, Any]:
    from models.geometry import cones

    if spec is not None and K is not None:
        raise IndexInputError("cones: give a cone spec or K, not both")
    if spec is None:
        spec = {"family": "ganea", "K": 0.1 if K is None else K}
    if not isinstance(spec, Mapping):
        raise IndexInputError(f"spec: expected a cone description, got {type(spec).__name__}")
    try:
        return cones.cone_spec(**spec)
    except (TypeError, ValueError) as e:
        raise IndexInputError(f"spec: {e}") from None


class LabelCones:
    """Label points + parent function + cone description.

    ``prototypes``: a mapping ``label -> point`` or a pair ``(labels, points)``
    with ``points`` of shape ``(n_labels, dim)``.  ``parent``: a callable
    ``label -> parent label or None`` (for a DAG, the caller picks one parent:
    the one whose cone holds the label) or a mapping.  ``spec``: the cone
    family and its parameters (:func:`models.geometry.cones.cone_spec`);
    ``K`` alone: Ganea cones of that constant (the default, ``K=0.1``).  Only
    the Poincaré ball is supported (the cones live there).
    """

    def __init__(
        self,
        prototypes,
        parent: ParentFn | Mapping[str, str | None],
        *,
        curvature: float = 1.0,
        spec: Mapping[str, Any] | None = None,
        K: float | None = None,
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
        self.spec = _check_spec(spec, K)
        self.labels = names
        self.points = np.ascontiguousarray(pts)
        self.row = {n: j for j, n in enumerate(names)}
        self.curvature = c
        self.dim = pts.shape[1]
        if isinstance(parent, Mapping):
            pmap = dict(parent)
            self._parent: ParentFn = pmap.get
        elif callable(parent):
            self._parent = parent
        else:
            raise IndexInputError("parent: expected a callable label -> parent or a mapping")
        self._chains: dict[str, tuple[str, ...]] = {}
        self._children: dict[str, list[str]] = {}  # cone children: labels with a point
        for name in names:
            up = next((a for a in self.chain(name)[1:] if a in self.row), None)
            if up is not None:
                self._children.setdefault(up, []).append(name)
        self._held: dict[str, frozenset[str]] = {}
        self._apertures: dict[str, float] = {}
        self._holder_table = None  # models.prototypes.holder_table, built at first use
        self._holder_parts: tuple | None = None  # cones.apex_parts_np of the points, with it

    @property
    def family(self) -> str:
        return self.spec["family"]

    @property
    def K(self) -> float | None:
        """Ganea's constant (``None`` for another family)."""
        return self.spec.get("K")

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
    def margins(self, apex: str, x: np.ndarray) -> np.ndarray:
        """Membership margins of the rows of ``x`` in the cone of label ``apex``
        (``>= 0``: held)."""
        from models.geometry import cones

        x = np.asarray(x, dtype=np.float64).reshape(-1, self.dim)
        return cones.membership_margin_np(
            self.points[self.row[apex]], x, self.spec, c=self.curvature
        )

    def firmness(self, apex: str, x: np.ndarray) -> np.ndarray:
        """How firmly the cone of ``apex`` holds each row of ``x``: the membership
        margin over the cone's aperture (:mod:`indexing.entailment`); ``>= 0``
        held, at most 1."""
        from models.geometry import cones

        ap = self._apertures.get(apex)
        if ap is None:
            ap = float(cones.aperture_np(self.points[self.row[apex]], self.spec, c=self.curvature))
            self._apertures[apex] = ap
        return self.margins(apex, x) / max(ap, np.finfo(np.float64).tiny)

    def holding_labels(self, x: np.ndarray) -> list[str | None]:
        """The deepest label whose cone holds each row of ``x`` (float64 ``(n,
        dim)`` points; ``None`` where no root's cone holds it)."""
        from models.geometry import cones
        from models.prototypes import deepest_holder, holder_table

        x = np.ascontiguousarray(x, dtype=np.float64).reshape(-1, self.dim)
        if len(x) == 0:
            return []
        if self._holder_table is None:  # once: the cones never change
            self._holder_table = holder_table(self.labels, self._children)
            self._holder_parts = cones.apex_parts_np(self.points, self.spec, c=self.curvature)
        return deepest_holder(
            x,
            self.labels,
            self.points,
            self._children,
            self.spec,
            self.curvature,
            table=self._holder_table,
            parts=self._holder_parts,
            fallback=lambda rows: [None] * len(rows),
        )

    def held_by(self, label: str) -> frozenset[str]:
        """``label`` and the labels whose points its cone holds (cached): the
        holding labels of the items that cone holds, for a laminar family."""
        got = self._held.get(label)
        if got is None:
            if label not in self.row:
                got = frozenset({label})
            else:
                inside = self.margins(label, self.points) >= 0
                got = frozenset(n for n, h in zip(self.labels, inside.tolist(), strict=True) if h)
                got |= {label}
            self._held[label] = got
        return got

    def held_among(self, label: str, names: Sequence[str]) -> frozenset[str]:
        """``held_by(label) & set(names)``, measured on the points of ``names`` alone
        (:class:`HeldAmong`, which keeps the answers for many labels)."""
        return HeldAmong(self, names)(label)

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

    def spec_json(self) -> str:
        return json.dumps(self.spec, sort_keys=True)

    def fingerprint(self) -> str:
        h = hashlib.sha256()
        h.update(f"{self.curvature!r} {self.spec_json()}".encode())
        for lab, par, vec in self.records():
            h.update(repr((lab, par)).encode())
            h.update(vec or b"-")
        return h.hexdigest()

    @classmethod
    def from_records(
        cls, records, *, curvature: float, spec: Mapping[str, Any] | None = None, K=None
    ) -> LabelCones:
        parents = {lab: par for lab, par, _ in records}
        names = [lab for lab, _, vec in records if vec is not None]
        pts = np.array(
            [np.frombuffer(vec, dtype="<f8") for _, _, vec in records if vec is not None]
        )
        return cls((names, pts), parents, curvature=curvature, spec=spec, K=K)


class HeldAmong:
    """Which of the labels ``names`` (an index's holding labels: a few thousand among
    a taxonomy's 82,115 nouns) the cone of a label holds: ``held_by(label) &
    set(names)`` for any label, measured on the points of ``names`` alone, with the
    parts of the membership margin that depend on those points computed once
    (:func:`models.geometry.cones.margin_targets_np`: the same margins, so the same
    answers) and each label's answer kept (at most ``kept`` of them). Built once per
    state of an index's holders (:class:`indexing.kept.KeptAnswers`); thread-safe."""

    def __init__(self, cones: LabelCones, names: Sequence[str], kept: int = HELD_KEPT) -> None:
        from models.geometry.cones import margin_targets_np

        self.cones = cones
        self.names = tuple(names)
        self.asked = frozenset(self.names)
        named = [n for n in self.names if n in cones.row]
        self._named = np.array(named, dtype=object)
        rows = np.fromiter((cones.row[n] for n in named), dtype=np.int64, count=len(named))
        self._targets = margin_targets_np(cones.points[rows], cones.spec, c=cones.curvature)
        self._size = kept
        self._kept: dict[str, frozenset[str]] = {}
        self._lock = threading.Lock()

    def __call__(self, label: str) -> frozenset[str]:
        got = self._kept.get(label)
        if got is None:
            got = self._measure(label)
            with self._lock:
                if len(self._kept) >= self._size:
                    self._kept.pop(next(iter(self._kept)))
                self._kept[label] = got
        return got

    def _measure(self, label: str) -> frozenset[str]:
        from models.geometry.cones import margin_to_targets_np

        c = self.cones
        whole = c._held.get(label)  # noqa: SLF001 - the same answer, kept already
        if whole is not None:
            return whole & self.asked
        if label not in c.row:  # no point, no cone: itself (as held_by answers)
            return frozenset({label}) & self.asked
        out: set[str] = set()
        if len(self._named):
            x = c.points[c.row[label]]
            inside = margin_to_targets_np(x, self._targets, c.spec, c=c.curvature) >= 0
            out.update(self._named[inside].tolist())
        if label in self.asked:
            out.add(label)
        return frozenset(out)
