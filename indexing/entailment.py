r"""Ranking by entailment: the items a label's cone holds, firmest first.

A label query asks "what is a <label>?"; the nearest items to the label's
point answer "what lies near it", which for a general label near the origin
is whatever is uncertain. This module ranks by *membership* instead.

Firmness
--------
The **firmness** of a point :math:`y` in the cone of the label point :math:`x`
is its membership margin (:func:`models.geometry.cones.membership_margin_np`)
divided by the cone's aperture (:func:`models.geometry.cones.aperture_np`):

* ``cap`` cones: :math:`f = (\theta(x) - \angle(x, y) - \theta(y)) / \theta(x)`,
  the share of the label's cap left between the item's own cap and the label
  cap's rim: 1 for a certain item (a point cap) on the label's axis, 0 on the
  rim;
* ``ganea`` cones: :math:`f = (\psi(x) - \Xi(x, y)) / \psi(x)`, the share of the
  half-aperture left beside the geodesic's angle: 1 on the axis, 0 on the
  cone's surface.

Held items have :math:`0 \le f \le 1`; items outside have :math:`f < 0` (how
far outside, in units of the aperture).

The entailment ranking (:func:`entailment_order`)
-------------------------------------------------
1. The held items (holding label: the apex or a label its cone holds,
   :meth:`indexing.cones.LabelCones.held_by`), spread over the apex's
   **branches**: a branch is a cone child of the apex (the child on the item's
   holding label's cone chain), or the apex itself for items no child's cone
   holds. Round robin by firmness: round ``r`` holds the ``r``-th firmest item
   of every branch that has one, ordered by firmness; so every branch holding
   items shows within the first ``B`` results (``B`` branches).
2. Then every other item, least far outside first (firmness descending).

Ties are broken by id. Each index computes, over its own items, the firmest
``want`` items of each branch and of the outside (:func:`candidates`); the
order of a sharded index is the same order over the union of its shards'
candidates, so one rule serves both (:func:`merge_candidates`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from models.geometry import poincare_np

from .cones import LabelCones
from .errors import IndexInputError
from .table import ItemTable

__all__ = [
    "Candidates",
    "EntailmentHit",
    "branch_of_holders",
    "candidates",
    "entailment_order",
    "merge_candidates",
    "running_min",
    "top_firm",
]


class EntailmentHit(NamedTuple):
    """One result of an entailment ranking."""

    id: str
    distance: float  # geodesic distance to the query point
    firmness: float  # in the apex's cone (< 0: outside it)
    branch: str | None  # the apex's branch that holds it; None outside the cone


@dataclass
class Candidates:
    """The firmest ``want`` items of each branch (held) and of the outside, from
    one index: lists of ``(firmness, id, distance)`` sorted by (firmness desc, id),
    and the number of items each branch holds (before the cut)."""

    branches: dict[str, list[tuple[float, str, float]]] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    outside: list[tuple[float, str, float]] = field(default_factory=list)
    n_outside: int = 0

    @property
    def n_held(self) -> int:
        return sum(self.counts.values())


def branch_of_holders(cones: LabelCones, apex: str, holders: Iterable[str]) -> dict[str, str]:
    """``holder -> branch`` for the holding labels ``holders`` held by ``apex``'s cone:
    the cone child of ``apex`` on the holder's cone chain, or ``apex`` itself (the
    apex, or a label held without the apex on its chain)."""
    out: dict[str, str] = {}
    for h in holders:
        ch = cones.chain(h) if h in cones.row else (h,)
        branch = apex
        for j, lab in enumerate(ch):
            if lab == apex:
                branch = ch[j - 1] if j > 0 else apex
                break
        out[h] = branch
    return out


def top_firm(f: np.ndarray, ids: np.ndarray, want: int) -> np.ndarray:
    """Positions of the ``want`` largest ``f`` (ties by id), in that order."""
    n = len(f)
    if n == 0 or want <= 0:
        return np.empty(0, dtype=np.int64)
    if want < n:
        # keep every item tied with the cut, then order exactly
        cut = np.partition(-f, want - 1)[want - 1]
        pos = np.nonzero(-f <= cut)[0]
    else:
        pos = np.arange(n)
    order = np.lexsort((ids[pos], -f[pos]))
    return pos[order][:want]


def candidates(
    table: ItemTable,
    cones: LabelCones,
    apex: str,
    query: np.ndarray,
    want: int,
    *,
    only: np.ndarray | None = None,
    outside: bool = True,
) -> Candidates:
    """The :class:`Candidates` of one index's ``table`` for the cone of ``apex``
    (a label with a point), distances measured from ``query`` (a ``(dim,)``
    point); ``only``: a boolean mask over the slots (filters); ``outside``: also
    rank the items outside the cone (when the page may reach past the held ones)."""
    if apex not in cones.row:
        raise IndexInputError(f"label: {apex!r} has no point (no cone to rank by)")
    c = cones.curvature
    held_labels = [h for h in cones.held_by(apex) if h in table.by_holder]
    branch = branch_of_holders(cones, apex, held_labels)
    per: dict[str, list[int]] = {}
    for h in held_labels:
        per.setdefault(branch[h], []).extend(table.by_holder[h])
    out = Candidates()
    q = np.asarray(query, dtype=np.float64).reshape(-1)
    id_arr = table.id_array()

    def rank(slots: np.ndarray, k: int, clip: bool) -> list[tuple[float, str, float]]:
        if only is not None and len(slots):
            slots = slots[only[slots]]
        if len(slots) == 0:
            return []
        f = cones.firmness(apex, table.vectors[slots])
        if clip:  # held by its holder: inside (a rounding hair below 0 is 0)
            f = np.clip(f, 0.0, 1.0)
        ids = id_arr[slots]
        pos = top_firm(f, ids, k)
        d = poincare_np.dist(q[None, :], table.vectors[slots[pos]], c=c)
        return list(zip(f[pos].tolist(), ids[pos].tolist(), d.tolist(), strict=True))

    held_slots: list[np.ndarray] = []
    for b, slots_l in per.items():
        slots = np.fromiter(slots_l, dtype=np.int64, count=len(slots_l))
        slots.sort()
        held_slots.append(slots)
        n = len(slots) if only is None else int(only[slots].sum())
        if n:
            out.counts[b] = n
            out.branches[b] = rank(slots, want, True)
    if outside:
        alive = table.alive[: table.n_slots].copy()
        for s in held_slots:
            alive[s] = False
        if only is not None:
            alive &= only[: table.n_slots]
        rest = np.nonzero(alive)[0]
        out.n_outside = len(rest)
        out.outside = rank(rest, want, False)
    return out


def merge_candidates(parts: Sequence[Candidates], want: int) -> Candidates:
    """The candidates of the union of the indexes ``parts`` came from."""
    out = Candidates()
    key = lambda t: (-t[0], t[1])  # noqa: E731
    for p in parts:
        for b, n in p.counts.items():
            out.counts[b] = out.counts.get(b, 0) + n
            out.branches.setdefault(b, []).extend(p.branches.get(b, []))
        out.outside.extend(p.outside)
        out.n_outside += p.n_outside
    for b in out.branches:
        out.branches[b] = sorted(out.branches[b], key=key)[:want]
    out.outside = sorted(out.outside, key=key)[:want]
    return out


def entailment_order(cand: Candidates, want: int, *, spread: bool = True) -> list[EntailmentHit]:
    """The first ``want`` results of the entailment ranking (module docstring);
    ``spread=False``: the held items by firmness alone (no round robin)."""
    held: list[EntailmentHit] = []
    lists = {b: v for b, v in cand.branches.items() if v}
    if spread:
        depth = 0
        while len(held) < want and lists:
            rnd = [(v[depth], b) for b, v in lists.items() if depth < len(v)]
            if not rnd:
                break
            rnd.sort(key=lambda t: (-t[0][0], t[0][1]))
            held += [EntailmentHit(i, d, f, b) for (f, i, d), b in rnd]
            depth += 1
    else:
        every = [(t, b) for b, v in lists.items() for t in v]
        every.sort(key=lambda t: (-t[0][0], t[0][1]))
        held = [EntailmentHit(i, d, f, b) for (f, i, d), b in every[:want]]
    held = held[:want]
    if len(held) < want:
        held += [EntailmentHit(i, d, f, None) for f, i, d in cand.outside[: want - len(held)]]
    return held


def running_min(values: Sequence[float]) -> list[float]:
    """Scores from firmness: each value clipped to [0, 1] and to the score before it,
    so scores never increase down a ranking."""
    out: list[float] = []
    cur = 1.0
    for v in values:
        cur = min(cur, max(0.0, min(1.0, float(v))))
        out.append(cur)
    return out
