"""Label queries from the index's prepared holders (indexing.entailment.Holders, the
cone tests of indexing.cones.HeldAmong, kept while the index's items stay the same)
answer exactly what the slow path answers: every label's cone tested on every label
point (LabelCones.held_by), each holder's items ranked one by one, and each item
outside the cone given its tier from the cone chain by hand. On a taxonomy with
second parents (labels whose cones lie under another parent: the extra cones a
label query counts, BallRuntime.cone_extras), for every label, at two page sizes,
in the entailment and the hierarchical mode, before and after a write."""

from __future__ import annotations

import numpy as np
import pytest

from indexing import HyperbolicIndex, LabelCones
from indexing.cones import HeldAmong
from indexing.entailment import Candidates, entailment_order, path_below
from models.geometry import cones as mcones
from models.geometry import poincare_np
from models.labels import LabelEmbedding
from models.taxonomy.graph import Taxonomy
from service.runtime import runtime_for
from tests.support.cones import cap_labels

SPEC = mcones.cone_spec("cap", theta0=2.5, beta=0.5)
DIM = 5


def _taxonomy(n: int = 160, seconds: int = 24, seed: int = 3) -> Taxonomy:
    """A random tree of ``n`` nodes and ``seconds`` second parents (each an earlier
    node that is neither the node's parent nor one of its parent's ancestors)."""
    rng = np.random.default_rng(seed)
    parent = {f"n{j}": f"n{int(rng.integers(0, j))}" for j in range(1, n)}
    edges = list(parent.items())

    def ancestors(node: str) -> set[str]:
        out = set()
        while node in parent:
            node = parent[node]
            out.add(node)
        return out

    added = 0
    for j in rng.permutation(np.arange(20, n)).tolist():
        child = f"n{j}"
        other = f"n{int(rng.integers(1, j))}"
        if other != parent[child] and other not in ancestors(parent[child]):
            edges.append((child, other))
            added += 1
        if added == seconds:
            break
    return Taxonomy.from_edges(edges)


def _labels() -> LabelEmbedding:
    return cap_labels(_taxonomy(), DIM, seed=2)


def _items(emb: LabelEmbedding, n: int, seed: int) -> tuple[list[str], np.ndarray, list]:
    """Items beyond random labels' points (held by them or by a label below), a few
    labelled, and some in random directions near the origin (held by few cones)."""
    rng = np.random.default_rng(seed)
    pts = emb.embeddings.double().numpy()
    names = emb.taxonomy.names
    ids, rows, labels = [], [], []
    for j in range(n):
        if j % 5 == 4:
            u = rng.normal(size=DIM)
            y = u / np.linalg.norm(u) * rng.uniform(0.05, 0.6)
            lab = None
        else:
            lab = names[int(rng.integers(0, len(names)))]
            p = pts[names.index(lab)]
            r = np.linalg.norm(p)
            u = p / r + rng.normal(0, 0.02, DIM) if r > 0 else rng.normal(size=DIM)
            u /= np.linalg.norm(u)
            y = np.tanh((2 * np.arctanh(r) + rng.uniform(0.2, 2.0)) / 2) * u
        ids.append(f"{seed}-{j}")
        rows.append(y)
        labels.append(lab if j % 3 == 0 else None)
    return ids, np.array(rows), labels


def _copy(cones: LabelCones) -> LabelCones:
    """The same cones in another object: none of the answers the index's cones keep."""
    parents = {n: cones.parent(n) for n in cones.labels}
    return LabelCones(
        (cones.labels, cones.points), parents, curvature=cones.curvature, spec=cones.spec
    )


def _slow_candidates(ix, cones, apex: str, q: np.ndarray, want: int, extra) -> Candidates:
    """The candidates by the slow path: every item's holder read from the table, every
    source's cone tested on every label point (held_by of ``cones``, a copy of the
    index's), each holder's items ranked by firmness one by one, every outside item's
    tier found up the apex's cone chain."""
    t = ix._live.table
    alive = [s for s in range(t.n_slots) if t.alive[s]]
    by_holder: dict[str, list[int]] = {}
    for s in alive:
        if t.holders[s] is not None:
            by_holder.setdefault(t.holders[s], []).append(s)
    sources = [(apex, ()), *((a, tuple(p)) for a, p in extra)]
    held: set[str] = set()
    for a, _ in sources:
        held |= cones.held_by(a)
    held &= set(by_holder)

    def entries(slots: list[int], a: str, clip: bool) -> list[tuple[float, str, float]]:
        f = cones.firmness(a, t.vectors[slots]).tolist()
        d = poincare_np.dist(q[None, :], t.vectors[slots], c=cones.curvature).tolist()
        f = [min(1.0, max(0.0, v)) for v in f] if clip else f
        return list(zip(f, [t.ids[s] for s in slots], d, strict=True))

    out = Candidates(apex=apex)
    for h in sorted(held):
        chain = set(cones.chain(h))
        a, prefix = next(((a, p) for a, p in sources if a in chain), (apex, ()))
        ranked = sorted(entries(by_holder[h], a, True), key=lambda e: (-e[0], e[1]))
        out.counts[h] = len(by_holder[h])
        out.paths[h] = prefix + path_below(cones, a, h)
        out.held[h] = ranked[:want]
    chain = cones.chain(apex)

    def tier(h: str | None) -> int:
        for i, a in enumerate(chain):
            if h is not None and h in cones.held_by(a):
                return 2 * i + (0 if h == a else 1)
        return 2 * len(chain)

    rest = [s for s in alive if t.holders[s] not in held]
    out.n_outside = len(rest)
    tiers = [tier(t.holders[s]) for s in rest]
    outside = [(*e, i) for e, i in zip(entries(rest, apex, False), tiers, strict=True)]
    out.outside = sorted(outside, key=lambda e: (e[3], -e[0], e[1]))
    return out


def _slow_order(cand: Candidates, want: int, branch: str | None = None) -> list:
    """entailment_order as it was written first (each node's item count summed over
    every holder): the round robin over branches, each node's own items at their share."""
    from indexing.entailment import EntailmentHit, _round_robin, _stride

    tree: dict[tuple[str, ...], set[str]] = {}
    for path in cand.paths.values():
        for j in range(len(path)):
            tree.setdefault(path[:j], set()).add(path[j])

    def order(path: tuple[str, ...]) -> list:
        node = path[-1] if path else cand.apex
        lists = [order(path + (ch,)) for ch in sorted(tree.get(path, ()))]
        if path:
            own_h = [node] if cand.paths.get(node) == path else []
        else:
            own_h = [h for h, p in cand.paths.items() if not p]
        own = sorted(
            [(t, h) for h in own_h for t in cand.held.get(h, [])], key=lambda e: (-e[0][0], e[0][1])
        )[:want]
        n_own = sum(cand.counts[h] for h in own_h)
        n_all = sum(n for h, n in cand.counts.items() if cand.paths[h][: len(path)] == path)
        return _stride(
            own, _round_robin([v for v in lists if v], want), n_own / max(1, n_all), want
        )

    if branch is not None:
        entries = order((branch,)) if (branch,) in tree or branch in cand.held else []
    else:
        entries = order(())
    hits = [EntailmentHit(i, d, f, cand.branch(h)) for (f, i, d), h in entries]
    if len(hits) < want and branch is None:
        hits += [EntailmentHit(i, d, f, None) for f, i, d, _ in cand.outside[: want - len(hits)]]
    return hits


@pytest.fixture(scope="module")
def rt(tmp_path_factory):
    emb = _labels()
    index = HyperbolicIndex(dim=DIM, curvature=1.0, path=tmp_path_factory.mktemp("h") / "ix")
    runtime = runtime_for(index, emb, taxonomy=emb.taxonomy)
    ids, x, labels = _items(emb, 500, seed=1)
    runtime.upsert(ids, x, labels)
    yield runtime
    runtime.close()


def _check_every_label(rt) -> dict[str, int]:
    """Fast against slow for every label; what the queries went through."""
    ix, slow_cones = rt.index, _copy(rt.cones)
    seen = {"extras": 0, "outside tiers": 0, "levels": 0}
    for label in rt.taxonomy.names:
        q = rt.prototype(label)
        extra = rt.cone_extras(label)
        seen["extras"] += bool(extra)
        for want in (10, 120):
            slow = _slow_candidates(ix, slow_cones, label, q, want, extra)
            for _ in range(2):  # computed, then the kept answer
                fast = ix.entailment_candidates(label, q, want, extra=extra)
                assert (fast.held, fast.counts, fast.paths) == (
                    slow.held,
                    slow.counts,
                    slow.paths,
                ), label
                if fast.n_held < want:
                    assert fast.n_outside == slow.n_outside, label
                    assert fast.outside == slow.outside[:want], label
                assert entailment_order(fast, want) == _slow_order(slow, want), label
                for child in {fast.branch(h) for h in fast.counts}:  # group_by children
                    got = entailment_order(fast, want, branch=child)
                    assert got == _slow_order(slow, want, branch=child), (label, child)
            seen["outside tiers"] += len({e[3] for e in slow.outside[:want]}) > 1
            chain = rt.chain(label, "cone")
            kept = ix.search_hierarchical(q, chain, rt.cones.held_by, want, firmness=True)
            fresh = ix.search_hierarchical(q, chain, slow_cones.held_by, want, firmness=True)
            assert kept == fresh, label
            seen["levels"] += len({h.level for h in kept}) > 1
    return seen


def test_label_queries_from_the_prepared_holders_answer_as_the_slow_path(rt):
    assert rt.default_levels == "cone"
    seen = _check_every_label(rt)
    # second parents' cones were counted, outside tiers and levels were reached
    assert min(seen.values()) >= 5, seen
    # a write: the prepared holders follow (items moved, added and deleted)
    ids, x, labels = _items(rt.labels, 60, seed=2)
    rt.upsert(ids, x, labels)
    moved = [f"1-{j}" for j in range(0, 40, 2)]
    rt.upsert(moved, x[: len(moved)] * 0.5, [None] * len(moved))
    rt.delete([f"1-{j}" for j in range(1, 40, 4)])
    _check_every_label(rt)


def _extras_by_every_descendant(rt, label: str) -> tuple:
    """BallRuntime.cone_extras by its definition, looking at every descendant: breadth
    first (children by name), the descendants whose cone chain passes neither the
    label nor an extra found before, each with its taxonomy path below the label."""
    tops, out, seen = {label}, [], {label}
    frontier = [(label, ())]
    while frontier:
        nxt = []
        for node, path in frontier:
            for ch in sorted(rt.taxonomy.children(node)):
                if ch not in seen:
                    seen.add(ch)
                    if not tops.intersection(rt.cones.chain(ch)):
                        tops.add(ch)
                        out.append((ch, path + (ch,)))
                    nxt.append((ch, path + (ch,)))
        frontier = nxt
    return tuple(out)


def test_cone_extras_skip_closed_subtrees_and_find_every_extra(rt):
    """cone_extras looks below the nodes whose subtrees are not closed only; it finds
    what a look at every descendant finds, for every label (some of them have extras,
    some several)."""
    sizes = []
    for label in rt.taxonomy.names:
        want = _extras_by_every_descendant(rt, label)
        assert rt.cone_extras(label) == want, label
        sizes.append(len(want))
    assert max(sizes) >= 2 and sum(n > 0 for n in sizes) >= 5
    assert 0 < len(rt._open()) < len(rt.taxonomy) // 2  # some subtrees closed, some not


def test_held_among_answers_held_by_on_its_names(rt):
    """HeldAmong over the index's holders, and over a few names with one that is no
    label: held_by(label) & names for every label, asked twice (the kept answer)."""
    cones, slow = _copy(rt.cones), _copy(rt.cones)
    holders = [h for h, got in rt.index._live.table.by_holder.items() if got]
    for names in (holders, holders[::5] + ["no-such-label"]):
        among = HeldAmong(cones, names)
        for label in [*cones.labels, "no-such-label"]:
            want = slow.held_by(label) & set(names)
            assert among(label) == want and among(label) == want, label
