"""Hierarchical (cone) search: k-NN level by level along a label chain.

``chain = [l0, parent(l0), ..., root]``.  Level ``i`` holds the items whose
holding label (``by="holder"``; or their own label, ``by="label"``) is one of
``levels[i]`` (the level's labels: a descendant-or-self of ``l_i`` and of no
earlier chain label; for cones, the labels the cone of ``l_i`` holds), and
whose label is in ``labels`` when that filter is given,
so each item is in at most one level and a nearer level always ranks first.
Results are ordered by (level, distance), or with the label cones by (level,
firmness in the level's cone); a page ``[offset, offset + k)`` of
that order skips whole levels by their counts and searches only the levels it
reaches, each with a filtered k-NN of just the items it still needs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import numpy as np

from models.geometry import poincare_np

from .cones import HierarchicalHit, LabelCones
from .entailment import top_firm
from .errors import IndexInputError
from .live import LiveIndex
from .validation import check_str_set

__all__ = ["chain_levels", "search_levels"]


def chain_levels(
    chain: Sequence[str], descendants_of: Callable[[str], Iterable[str]]
) -> tuple[list[str], list[set[str]]]:
    """``(chain, levels)``: the checked chain and, per chain label, the holding
    labels of its level (:class:`IndexInputError` on bad input)."""
    if isinstance(chain, str):
        raise IndexInputError("chain: expected a sequence of labels, got a single str")
    chain = list(chain)
    if not chain:
        raise IndexInputError("chain: empty")
    for j, lab in enumerate(chain):
        if not isinstance(lab, str):
            raise IndexInputError(f"chain[{j}]: expected str, got {type(lab).__name__}")
    if not callable(descendants_of):
        raise IndexInputError("descendants_of: expected a callable label -> labels")
    levels: list[set[str]] = []
    seen: set[str] = set()
    for lab in chain:
        d = check_str_set(descendants_of(lab), f"descendants_of({lab!r})")
        d.add(lab)
        levels.append(d - seen)
        seen |= d
    return chain, levels


def search_levels(
    live: LiveIndex,
    q: np.ndarray,
    chain: list[str],
    levels: list[set[str]],
    k: int,
    offset: int,
    ef: int | None,
    *,
    by: str = "holder",
    labels: set[str] | None = None,
    mask: np.ndarray | None = None,
    cones: LabelCones | None = None,
) -> list[HierarchicalHit]:
    """The hits ``[offset, offset + k)`` for the one query ``q`` (shape ``(1, dim)``);
    ``mask`` (boolean, over the slots): only the items it marks; ``cones``: each
    level ordered by firmness in its chain label's cone
    (:mod:`indexing.entailment`; ties by id), not by distance."""
    t = live.table
    if by not in ("holder", "label"):
        raise IndexInputError(f"by: must be 'holder' or 'label', got {by!r}")
    only = None if labels is None else t.slots_for_labels(labels)
    out: list[HierarchicalHit] = []
    pos = 0  # rank of the first item of the current level
    for lvl, labs in enumerate(levels):
        need = offset + k - pos
        if need <= 0:
            break
        allowed = None
        if only is None and by == "holder" and mask is None:
            count = t.count_for_holders(labs)  # no set built for a level skipped whole
            slots = None
        else:
            slots = t.slots_for_holders(labs) if by == "holder" else t.slots_for_labels(labs)
            if only is not None:
                slots &= only
            count = len(slots)
            if mask is not None and count:
                allowed = np.fromiter(sorted(slots), dtype=np.int64, count=count)
                allowed = allowed[mask[allowed]]
                count = len(allowed)
        if count == 0:
            continue
        if pos + count <= offset:
            pos += count
            continue
        if slots is None:
            slots = t.slots_for_holders(labs)
        if allowed is None:
            allowed = np.fromiter(sorted(slots), dtype=np.int64, count=count)
        take = min(count, need)
        if cones is not None and chain[lvl] in cones.row:
            got = _firmest(live, cones, chain[lvl], q, allowed, take)
        else:
            slots, dists = live.search(q, take, allowed, ef)
            got = [(t.ids[int(s)], float(d), None) for s, d in zip(slots[0], dists[0], strict=True)]
        for j, (item_id, dist, firm) in enumerate(got):
            if pos + j >= offset:
                out.append(HierarchicalHit(item_id, dist, lvl, chain[lvl], firm))
        pos += count
    return out[:k]


def _firmest(
    live: LiveIndex, cones: LabelCones, apex: str, q: np.ndarray, allowed: np.ndarray, take: int
) -> list[tuple[str, float, float]]:
    """``(id, distance, firmness)`` of the ``take`` items of the sorted slots
    ``allowed`` that the cone of ``apex`` holds most firmly (ties by id)."""
    t = live.table
    f = cones.firmness(apex, t.vectors[allowed])
    ids = t.id_array()[allowed]
    pos = top_firm(f, ids, take)
    d = poincare_np.dist(q[:1], t.vectors[allowed[pos]], c=cones.curvature)
    return list(zip(ids[pos].tolist(), d.tolist(), f[pos].tolist(), strict=True))
