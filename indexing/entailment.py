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
   :meth:`indexing.cones.LabelCones.held_by`), spread over the tree of cones
   below the apex, recursively: a node's order is a **round robin** over its
   child branches (round ``r`` holds the ``r``-th item of every child's own
   order, firmest first), so every branch holding items shows within the
   first ``B`` results (``B`` branches), and every grandchild soon after;
   the node's **own** items (held by its cone and by no child's: for a leaf
   label all of them, for a general label the items the model could not place
   below it) are merged into that order at their share of the node's items
   (a node whose own items are a tenth of its items gets every tenth place),
   firmest first. So the uncertain few that a model leaves at a general label
   stay behind the classes below it, and a class that has a child class
   (``shirt.n.01`` over ``jersey.n.03``) shows both, one for one.
2. Then every other item, least far outside first: by the hierarchy, then by
   firmness. An item's *tier* is set by the nearest label up the apex's cone
   chain (``apex, parent, ..., root``) whose cone holds it: items of the
   parent's cone before those of the grandparent's, and within one ancestor
   first the items placed at that ancestor itself (a general item that may
   well be of the apex's kind: a flower a model left at ``organism`` for the
   label ``plant``) and then those of its other branches (items the model
   placed as something else: a nematode for ``plant``); items no chain cone
   holds come last. Within a tier, firmness descending (:func:`outside_tiers`).

Ties are broken by id. Each index computes, over its own items, the firmest
``want`` items of each branch and of the outside (:func:`candidates`); the
order of a sharded index is the same order over the union of its shards'
candidates, so one rule serves both (:func:`merge_candidates`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from models.geometry import poincare_np

from .cones import HeldAmong, LabelCones
from .errors import IndexInputError
from .table import ItemTable

__all__ = [
    "Candidates",
    "EntailmentHit",
    "Holders",
    "path_below",
    "candidates",
    "entailment_order",
    "merge_candidates",
    "outside_tiers",
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
    """The firmest ``want`` items of each holding label the apex's cone holds, and
    of the outside, from one index: lists of ``(firmness, id, distance)`` sorted
    by (firmness desc, id), the outside's ``(firmness, id, distance, tier)`` by
    (tier, firmness desc, id) (:func:`outside_tiers`); the number of items each
    holding label has (before the cut); and each holding label's path below the
    apex (its cone chain from the apex's child down to it; ``()`` for the apex
    itself)."""

    held: dict[str, list[tuple[float, str, float]]] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    paths: dict[str, tuple[str, ...]] = field(default_factory=dict)
    outside: list[tuple[float, str, float, int]] = field(default_factory=list)
    n_outside: int = 0
    apex: str = ""

    @property
    def n_held(self) -> int:
        return sum(self.counts.values())

    def branch(self, holder: str) -> str:
        """The apex's branch of a holding label: its cone child on the path, or the apex."""
        path = self.paths.get(holder, ())
        return path[0] if path else self.apex

    def branch_counts(self) -> dict[str, int]:
        """Items held under each branch (the apex's own included, keyed by the apex)."""
        out: dict[str, int] = {}
        for h, n in self.counts.items():
            b = self.branch(h)
            out[b] = out.get(b, 0) + n
        return out


def path_below(cones: LabelCones, apex: str, holder: str) -> tuple[str, ...]:
    """The cone chain of ``holder`` from the apex's child down to it (``()`` for the
    apex itself, or for a label held without the apex on its chain)."""
    ch = cones.chain(holder) if holder in cones.row else (holder,)
    if apex not in ch:
        return ()
    return tuple(reversed(ch[: ch.index(apex)]))


def outside_tiers(
    cones: LabelCones, apex: str, holders: Sequence[str], held: HeldAmong | None = None
) -> dict[str, int]:
    """The tier of the items outside the apex's cone held by each of ``holders``
    (module docstring): ``2 i`` when they are placed at ``chain[i]`` itself (the
    ``i``-th label up the apex's cone chain), ``2 i + 1`` when ``chain[i]``'s cone
    is the nearest on the chain that holds them and they lie in another branch,
    ``2 len(chain)`` when none holds them (and for items with no holder).
    ``held``: the cone tests, prepared for labels that include ``holders``."""
    chain = cones.chain(apex) if apex in cones.row else (apex,)
    if held is None:
        held = HeldAmong(cones, holders)
    tiers: dict[str, int] = {}
    left = set(holders)
    for i, a in enumerate(chain):
        if not left:
            break
        inside = held(a) & left
        for h in inside:
            tiers[h] = 2 * i + (0 if h == a else 1)
        left -= inside
    return tiers | {h: 2 * len(chain) for h in left}


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


class Holders:
    """The labels that hold items of one table, in one state of it, prepared for label
    queries: their cone tests (:attr:`held`, a :class:`indexing.cones.HeldAmong`),
    each one's slots, sorted (:attr:`slots`, by the label's number in
    :attr:`number`), and each slot's holder by number (:attr:`code`, -1 for none). An
    index keeps it while its items and cones stay the same
    (:meth:`indexing.kept.KeptAnswers.one`): read it, never change it."""

    def __init__(self, table: ItemTable, cones: LabelCones) -> None:
        names = [h for h, got in table.by_holder.items() if got]
        self.held = HeldAmong(cones, names)
        self.number = {h: j for j, h in enumerate(names)}
        self.slots: list[np.ndarray] = []
        self.code = np.full(table.n_slots, -1, dtype=np.int64)
        for j, h in enumerate(names):
            got = table.by_holder[h]
            slots = np.fromiter(got, dtype=np.int64, count=len(got))
            slots.sort()
            self.slots.append(slots)
            self.code[slots] = j

    @property
    def names(self) -> tuple[str, ...]:
        return self.held.names


def candidates(
    table: ItemTable,
    cones: LabelCones,
    apex: str,
    query: np.ndarray,
    want: int,
    *,
    only: np.ndarray | None = None,
    outside: bool = True,
    extra: Sequence[tuple[str, Sequence[str]]] = (),
    holders: Holders | None = None,
) -> Candidates:
    """The :class:`Candidates` of one index's ``table`` for the cone of ``apex``
    (a label with a point), distances measured from ``query`` (a ``(dim,)``
    point); ``only``: a boolean mask over the slots (filters); ``outside``: also
    rank the items outside the cone (when the page may reach past the held ones);
    ``extra``: ``(label, path)`` pairs, more cones whose items count as held
    (a taxonomy's descendants of the apex that the apex's cone cannot hold: a
    node whose cone lies under its other parent), each item's firmness then
    measured in that label's cone and its path below the apex ``path`` + its
    path below that label. ``holders``: the table's :class:`Holders` (made here
    when not given)."""
    for a in [apex, *(a for a, _ in extra)]:
        if a not in cones.row:
            raise IndexInputError(f"label: {a!r} has no point (no cone to rank by)")
    c = cones.curvature
    out = Candidates(apex=apex)
    q = np.asarray(query, dtype=np.float64).reshape(-1)
    id_arr = table.id_array()

    def rank(slots: np.ndarray, k: int, clip: bool, a: str = apex) -> list:
        f = cones.firmness(a, table.vectors[slots])
        if clip:  # held by its holder: inside (a rounding hair below 0 is 0)
            f = np.clip(f, 0.0, 1.0)
        ids = id_arr[slots]
        pos = top_firm(f, ids, k)
        d = poincare_np.dist(q[None, :], table.vectors[slots[pos]], c=c)
        return list(zip(f[pos].tolist(), ids[pos].tolist(), d.tolist(), strict=True))

    def rank_each(members: list[tuple[str, np.ndarray]], a: str) -> dict[str, list]:
        """``rank(slots, want, True, a)`` of each ``(holder, slots)``, all at once."""
        slots = np.concatenate([s for _, s in members])
        grp = np.repeat(np.arange(len(members)), [len(s) for _, s in members])
        f = np.clip(cones.firmness(a, table.vectors[slots]), 0.0, 1.0)
        ids = id_arr[slots]
        order = np.lexsort((ids, -f, grp))  # by holder, then as top_firm orders
        first = np.searchsorted(grp[order], np.arange(len(members)))
        keep = order[np.arange(len(order)) - first[grp[order]] < want]
        d = poincare_np.dist(q[None, :], table.vectors[slots[keep]], c=c)
        got: dict[str, list] = {h: [] for h, _ in members}
        f, ids, d = f[keep].tolist(), ids[keep].tolist(), d.tolist()
        for j, g in enumerate(grp[keep].tolist()):
            got[members[g][0]].append((f[j], ids[j], d[j]))
        return got

    hs = Holders(table, cones) if holders is None else holders
    sources = [(apex, ()), *((a, tuple(p)) for a, p in extra)]
    # only the labels that hold items matter: tested on their points alone
    held: set[str] = set()
    for a, _ in sources:
        held |= hs.held(a)
    ranked_by: dict[str, list[tuple[str, np.ndarray]]] = {}  # source -> what it ranks
    for h in sorted(held):
        # the first source on the holder's cone chain ranks it (else the apex's own)
        chain = set(cones.chain(h)) if h in cones.row else {h}
        a, prefix = next(((a, p) for a, p in sources if a in chain), (apex, ()))
        slots = hs.slots[hs.number[h]]
        if only is not None:
            slots = slots[only[slots]]
        if len(slots):
            out.counts[h] = len(slots)
            out.paths[h] = prefix + path_below(cones, a, h)
            ranked_by.setdefault(a, []).append((h, slots))
    ranked = {}
    for a, members in ranked_by.items():  # one firmness call per source
        ranked |= rank_each(members, a)
    out.held = {h: ranked[h] for h in out.counts}
    if outside:
        n = table.n_slots
        inside = np.zeros(len(hs.names) + 1, dtype=bool)  # by number; the last: no holder
        inside[[hs.number[h] for h in held]] = True
        alive = table.alive[:n] & ~inside[hs.code[:n]]
        if only is not None:
            alive &= only[:n]
        rest = np.nonzero(alive)[0]
        out.n_outside = len(rest)
        if len(rest):
            # each outside item's tier by its holder's (no holder: the last tier)
            others = [h for h in hs.names if h not in held]
            tier_of = outside_tiers(cones, apex, others, hs.held)
            no_holder = 2 * len(cones.chain(apex) if apex in cones.row else (apex,))
            by_number = np.full(len(hs.names) + 1, no_holder, dtype=np.int64)
            for h in others:
                by_number[hs.number[h]] = tier_of[h]
            tiers = by_number[hs.code[rest]]
            for t in np.unique(tiers).tolist():  # tier by tier until ``want`` are ranked
                got = rank(rest[tiers == t], want - len(out.outside), False)
                out.outside += [(f, i, d, t) for f, i, d in got]
                if len(out.outside) >= want:
                    break
    return out


def _by_firmness(t: tuple) -> tuple[float, str]:
    return -t[0], t[1]


def _by_tier(t: tuple[float, str, float, int]) -> tuple[int, float, str]:
    return t[3], -t[0], t[1]


def merge_candidates(parts: Sequence[Candidates], want: int) -> Candidates:
    """The candidates of the union of the indexes ``parts`` came from."""
    out = Candidates(apex=parts[0].apex if parts else "")
    for p in parts:
        for h, n in p.counts.items():
            out.counts[h] = out.counts.get(h, 0) + n
            out.paths[h] = p.paths[h]
            out.held.setdefault(h, []).extend(p.held.get(h, []))
        out.outside.extend(p.outside)
        out.n_outside += p.n_outside
    for h in out.held:
        out.held[h] = sorted(out.held[h], key=_by_firmness)[:want]
    out.outside = sorted(out.outside, key=_by_tier)[:want]
    return out


def _round_robin(lists: list[list], want: int) -> list:
    """Round ``r``: the ``r``-th entry of each list that has one, by firmness."""
    out: list = []
    depth = 0
    while len(out) < want:
        rnd = [v[depth] for v in lists if depth < len(v)]
        if not rnd:
            break
        rnd.sort(key=lambda e: _by_firmness(e[0]))
        out += rnd
        depth += 1
    return out[:want]


def _stride(own: list, rest: list, share: float, want: int) -> list:
    """``own`` merged into ``rest`` at its ``share`` of the positions (in order:
    the next entry is ``own``'s while it has had less than its share)."""
    out: list = []
    i = j = 0
    while len(out) < want and (i < len(own) or j < len(rest)):
        if i < len(own) and (j >= len(rest) or i + 0.5 <= share * (len(out) + 1)):
            out.append(own[i])
            i += 1
        else:
            out.append(rest[j])
            j += 1
    return out


def _order(cand: Candidates, tree: dict, below: dict, path: tuple[str, ...], want: int) -> list:
    """Entries ``((firmness, id, distance), holder)`` under the node ``path``
    (:func:`entailment_order`; ``below``: the items held under each node path)."""
    node = path[-1] if path else cand.apex
    lists = [_order(cand, tree, below, path + (ch,), want) for ch in sorted(tree.get(path, ()))]
    if path:
        own_h = [node] if cand.paths.get(node) == path else []
    else:  # the apex's own: its items, and any held without it on their chain
        own_h = [h for h, p in cand.paths.items() if not p]
    own = sorted(
        [(t, h) for h in own_h for t in cand.held.get(h, [])],
        key=lambda e: _by_firmness(e[0]),
    )[:want]
    n_own = sum(cand.counts[h] for h in own_h)
    rest = _round_robin([v for v in lists if v], want)
    return _stride(own, rest, n_own / max(1, below.get(path, 0)), want)


def entailment_order(
    cand: Candidates, want: int, *, spread: bool = True, branch: str | None = None
) -> list[EntailmentHit]:
    """The first ``want`` results of the entailment ranking (module docstring);
    ``spread=False``: the held items by firmness alone (no round robin);
    ``branch``: only the items under that child of the apex (no outside items)."""
    tree: dict[tuple[str, ...], set[str]] = {}  # node path -> child names
    below: dict[tuple[str, ...], int] = {}  # node path -> the items held under it
    for h, path in cand.paths.items():
        for j in range(len(path)):
            tree.setdefault(path[:j], set()).add(path[j])
        for j in range(len(path) + 1):
            below[path[:j]] = below.get(path[:j], 0) + cand.counts[h]
    if branch is not None:
        known = (branch,) in tree or branch in cand.held
        entries = _order(cand, tree, below, (branch,), want) if known else []
    elif spread:
        entries = _order(cand, tree, below, (), want)
    else:
        entries = [(t, h) for h, v in cand.held.items() for t in v]
        entries.sort(key=lambda e: _by_firmness(e[0]))
        entries = entries[:want]
    hits = [EntailmentHit(i, d, f, cand.branch(h)) for (f, i, d), h in entries]
    if len(hits) < want and branch is None:
        hits += [EntailmentHit(i, d, f, None) for f, i, d, _ in cand.outside[: want - len(hits)]]
    return hits


def running_min(values: Sequence[float]) -> list[float]:
    """Scores from firmness: each value clipped to [0, 1] and to the score before it,
    so scores never increase down a ranking."""
    out: list[float] = []
    cur = 1.0
    for v in values:
        cur = min(cur, max(0.0, min(1.0, float(v))))
        out.append(cur)
    return out
