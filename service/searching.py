"""Search requests -> index calls -> answers (no geometry and no index logic here).

* The query point: a label's prototype, an item's stored vector, a given
  vector, or an image's embedding.
* ``query.label``: the label given (a word resolves to the sense with the most
  items under it), the item's label, or -- for a vector or an image -- the
  nearest prototype among the labels that indexed items carry.
* ``nearest``: the index's k-NN; ``offset`` pages through one ranking.
* ``hierarchical``: the chain ``label, parent, ..., root`` of ``query.label``
  (:meth:`service.runtime.Runtime.chain`) handed to
  :meth:`indexing.HyperbolicIndex.search_hierarchical`, with levels
  ``"cone"`` (the default when the labels' cones hold their taxonomy,
  :attr:`service.runtime.Runtime.default_levels`) or ``"taxonomy"``:

  - ``cone``: level ``i`` holds the items whose own point the cone of the
    ``i``-th chain label holds and the ``(i-1)``-th's does not, labelled or not:
    the items whose holding label (stored by the index) is one the cone of
    ``chain[i]`` holds (:meth:`indexing.LabelCones.held_by`); the chain follows
    the parents whose cones hold each node. Items no chain cone holds are in no
    level.
  - ``taxonomy``: level ``i`` holds the items whose *label* is under
    ``chain[i]`` and not under ``chain[i-1]`` (level 0 the query label's
    subtree, level 1 what its parent adds, and so on); unlabelled items are in
    no level.

  ``via`` is the chain label of the level. ``under`` filters by the items'
  labels in both.
* A search by item id leaves that item out of its own answer.
* :func:`query_of` turns a validated request (:class:`service.schemas.SearchIn`,
  :class:`service.schemas.ImageSearchParams`) into its :class:`Query`, for the
  routes and the fast path alike.
* ``filter`` (a filter expression, :mod:`indexing.filters`; its ``under``
  conditions cover the labels in use at or below the node, as ``under`` does)
  narrows both modes inside the index search; ``max_distance`` leaves out the
  hits of the page farther than it; ``with_vector`` / ``with_payload`` add the
  items' stored vectors and payloads (one store read per answer).
* :func:`search_many` answers a batch of concurrent requests (:class:`Query`)
  exactly as :func:`query_point` and :func:`search` answer each one, with the
  per-request work batched: one nearest-prototype table for the vectors that
  need a label, one distance-to-origin call, and one index search for all
  plain ``nearest`` queries of the same window.
"""

from __future__ import annotations

import math
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from indexing import IndexInputError
from indexing.filters import Filter, parse_filter
from indexing.interface import run_calls
from indexing.sharded import ShardUnavailableError
from models.geometry import ranking
from models.taxonomy.graph import UnknownLabelError

from .errors import ApiError, bad_input, not_found, unknown_label
from .runtime import Runtime
from .schemas import ImageSearchParams, SearchIn

LEVELS = ("cone", "taxonomy")

#: one call of the index a search makes: ``(method, args, kwargs)``
IndexCall = tuple[str, tuple, dict]


@dataclass(slots=True)
class Hit:
    id: str
    distance: float
    label: str | None
    level: int | None
    via: str | None
    extra: dict | None = None  # with_vector / with_payload: "vector", "payload"
    score: float = 0.0  # in [0, 1], never increasing down a ranking (module docstring)
    firmness: float | None = None  # entailment / hierarchical: in the label's (via's) cone


@dataclass
class Group:
    """One child branch of a ``group_by: children`` answer."""

    label: str
    count: int
    hits: list[Hit]


@dataclass
class Answer:
    query_label: str | None
    query_vector: np.ndarray
    query_radius: float
    hits: list[Hit]
    chain: list[str] | None
    groups: list[Group] | None = None  # group_by: children
    mode: str = "nearest"  # the mode that ran ("auto" resolved)


@dataclass
class Query:
    """One search request for :func:`search_many`: exactly one of ``vector`` (a
    list of numbers, checked like a body's), ``label``, ``item_id``, or
    ``point`` (an already checked point, e.g. an image's embedding, with
    ``point_label`` its query label when known)."""

    k: int = 10
    offset: int = 0
    mode: str = "nearest"  # resolved: "auto" is turned into entailment or nearest (query_of)
    group_by: str | None = None
    under: str | None = None
    per_level: int | None = None
    levels: str | None = None
    vector: Any = None
    label: str | None = None
    item_id: str | None = None
    point: np.ndarray | None = None
    point_label: str | None = None
    filter: Any = None  # a filter expression (JSON), parsed by the worker
    with_vector: bool = False
    with_payload: bool = False
    max_distance: float | None = None

    @property
    def plain(self) -> bool:
        """Answered with the batch's one index search (nearest, no filters)."""
        return self.mode == "nearest" and self.under is None and self.filter is None


def check_vector(rt: Runtime, vector, field: str = "vector") -> np.ndarray:
    """A list of numbers -> a float64 point of the index's ball, or a 422 naming ``field``."""
    x = np.asarray(vector, dtype=np.float64)
    if x.ndim != 1 or len(x) != rt.dim:
        raise bad_input(f"{field}: expected {rt.dim} numbers (the index's dimension), got {x.size}")
    if not np.isfinite(x).all():
        raise bad_input(f"{field}: contains NaN or infinite values")
    if rt.product:
        try:
            return rt.check_points(x, field)[0]
        except IndexInputError as e:
            raise bad_input(str(e)) from None
    if not ranking.inside_ball(x, rt.curvature):
        bound = 1.0 / math.sqrt(rt.curvature)
        raise bad_input(
            f"{field}: norm {math.sqrt(ranking.sqnorm(x)):.6g} is outside the ball of curvature "
            f"{rt.curvature:g} (must be below {bound:.6g})"
        )
    return x


def resolve_label(rt: Runtime, text: str, field: str = "label", status: int = 422) -> str:
    """Synset or word -> node; unknown: ``status`` (422 in a body, 404 in a path),
    with suggestions; a product-space collection: the 422 of :meth:`Runtime.no_labels`."""
    if rt.product:
        raise rt.no_labels(field)
    try:
        return rt.resolve(text)
    except UnknownLabelError as e:
        raise unknown_label(field, e, status) from None


def query_of(req: SearchIn | ImageSearchParams, settings) -> Query:
    """The :class:`Query` of a validated request, its window checked against the
    settings (a 422 before any work). For a picture, the caller sets ``point`` and
    ``point_label`` once the picture is embedded."""
    check_window(req.k, req.offset, settings)
    by_label = isinstance(req, SearchIn) and req.label is not None
    mode = resolve_mode(req.mode, by_label)
    group_by = getattr(req, "group_by", None)
    if group_by is not None and not by_label:
        raise bad_input("group_by: groups by the children of a label: give a label query")
    if group_by is not None and mode == "nearest":
        raise bad_input("group_by: groups rank by entailment; use mode auto or entailment")
    q = Query(k=req.k, offset=req.offset, mode=mode, under=req.under, group_by=group_by)
    q.per_level, q.levels = req.per_level, req.levels
    q.with_vector, q.with_payload, q.max_distance = (
        req.with_vector,
        req.with_payload,
        req.max_distance,
    )
    if isinstance(req, SearchIn):
        q.vector, q.label, q.item_id = req.vector, req.label, req.id
        q.filter = req.filter
    return q


MODES = ("auto", "entailment", "nearest", "hierarchical")


def resolve_mode(mode: str, by_label: bool) -> str:
    """``auto``: ``entailment`` for a label query, ``nearest`` otherwise; the other
    modes as given (unknown: 422 naming the accepted ones)."""
    if mode not in MODES:
        raise bad_input(f"mode: must be one of {', '.join(MODES)}, got {mode!r}")
    if mode == "auto":
        return "entailment" if by_label else "nearest"
    return mode


def nearest_score(distance: float) -> float:
    """The score of a ``nearest`` result: ``1 / (1 + distance)`` (1 at the query
    point, 0.5 one unit of geodesic distance away, falling with distance)."""
    return 1.0 / (1.0 + max(0.0, float(distance)))


def parse_where(rt: Runtime, expr, name: str = "filter") -> Filter:
    """A filter expression checked (a 422 naming its part), its ``under`` conditions
    covering the labels in use at or below the node (unknown labels: 422 with
    suggestions)."""
    return parse_filter(
        expr,
        name,
        under_of=lambda lab, where: rt.used_under(resolve_label(rt, lab, where)),
        limits=rt.filter_limits,
    )


def decorate(rt: Runtime, hits: list[Hit], with_vector: bool, with_payload: bool) -> None:
    """Add the stored vectors and/or payloads to ``hits`` (one store read)."""
    if not (with_vector or with_payload) or not hits:
        return
    items = {it.id: it for it in rt.index.get_many([h.id for h in hits], vectors=with_vector)}
    for h in hits:
        it = items.get(h.id)
        extra: dict[str, Any] = {}
        if with_vector:
            extra["vector"] = None if it is None else it.vector.tolist()
        if with_payload:
            extra["payload"] = (
                it.payload if it is not None and isinstance(it.payload, dict) else None
            )
        h.extra = extra


def query_point(
    rt: Runtime, *, vector=None, label: str | None = None, item_id: str | None = None
) -> tuple[np.ndarray, str | None, str | None]:
    """``(point, query label, id to leave out)`` of exactly one of the three."""
    if label is not None:
        name = resolve_label(rt, label)
        return rt.prototype(name), name, None
    if item_id is not None:
        item = rt.index.get(item_id)
        if item is None:
            raise not_found(f"id: no item {item_id!r}")
        x = np.asarray(item.vector, dtype=np.float64)
        lab = item.label if item.label is not None and item.label in rt.taxonomy else None
        return x, lab or rt.nearest_used_labels(x[None])[0], item_id
    if vector is not None:
        x = check_vector(rt, vector)
        return x, rt.nearest_used_labels(x[None])[0], None
    raise bad_input("give exactly one of vector, label, id")


def search(rt: Runtime, x: np.ndarray, query_label: str | None, **kw: Any) -> Answer:
    """Run one search of the point ``x``; see the module docstring and :func:`_search`
    for the keywords."""
    return _drive(rt, _search(rt, x, query_label, **kw))


def _drive(rt: Runtime, steps: Generator[IndexCall, Any, Any]):
    """What the generator ``steps`` returns, each index call it yields made at once."""
    try:
        call = next(steps)
        while True:
            method, args, kwargs = call
            call = steps.send(getattr(rt.index, method)(*args, **kwargs))
    except StopIteration as stop:
        return stop.value


def _search(
    rt: Runtime,
    x: np.ndarray,
    query_label: str | None,
    *,
    k: int,
    offset: int = 0,
    mode: str = "nearest",
    under: str | None = None,
    exclude: str | None = None,
    per_level: int | None = None,
    radius: float | None = None,
    levels: str | None = None,
    where=None,
    group_by: str | None = None,
) -> Generator[IndexCall, Any, Answer]:
    """One search of the point ``x`` as a generator that yields its index calls
    (:data:`IndexCall`) and is sent their answers (:func:`search` makes them one by
    one, :func:`search_many` a batch's together); see the module docstring. ``radius``:
    the distance of ``x`` to the origin when the caller has it; ``levels``:
    ``"cone"`` or ``"taxonomy"`` (default: :attr:`Runtime.default_levels`);
    ``where``: a filter expression (or a parsed :class:`Filter`)."""
    allowed: set[str] | None = None
    if rt.product and (mode in ("hierarchical", "entailment") or under is not None):
        raise rt.no_labels("under" if under is not None else "mode")
    if under is not None:
        allowed = rt.used_under(resolve_label(rt, under, "under"))
    if where is not None:
        where = parse_where(rt, where)
    want = offset + k + (1 if exclude is not None else 0)
    start = 0  # rank of the first hit fetched
    hits: list[Hit] = []
    chain = None
    if mode == "nearest":
        if allowed is None or allowed:
            ids, dists = yield ("search", (x,), {"k": want, "labels": allowed, "where": where})
            hits = _nearest_hits(rt, ids[0], dists[0])
    elif mode == "entailment":
        if query_label is None:  # pragma: no cover - every query has a label
            raise bad_input("mode: entailment search needs a query label")
        apex = query_label
        if group_by is not None:
            groups = yield from _groups(rt, x, apex, k, offset, allowed, where)
            if radius is None:
                radius = float(rt.distance_to_origin(x))
            return Answer(query_label, x, radius, [], None, groups, mode)
        if allowed is None or allowed:
            got = yield (
                "search_entailment",
                (apex, x, want, 0),
                {"labels": allowed, "where": where, "extra": rt.cone_extras(apex)},
            )
            hits = [
                Hit(h.id, h.distance, rt.label_of(h.id), None, None, firmness=h.firmness)
                for h in got
            ]
    elif mode == "hierarchical":
        if query_label is None:  # pragma: no cover - every query has a label
            raise bad_input("mode: hierarchical search needs a query label")
        lv = rt.default_levels if levels is None else levels
        if lv not in LEVELS:
            raise bad_input(f"levels: must be cone or taxonomy, got {lv!r}")
        chain = rt.chain(query_label, lv)
        if per_level is not None:
            hits = yield from _per_level(rt, x, chain, allowed, per_level, want, exclude, lv, where)
        else:
            start = offset if exclude is None else 0
            descendants = rt.cones.held_by if lv == "cone" else rt.used_under
            got = yield (
                "search_hierarchical",
                (x, chain, descendants),
                {
                    "k": want - start,
                    "offset": start,
                    "by": "holder" if lv == "cone" else "label",
                    "labels": allowed,
                    "where": where,
                    "firmness": True,
                },
            )
            for h in got:
                hits.append(
                    Hit(
                        h.id,
                        float(h.distance),
                        rt.label_of(h.id),
                        int(h.level),
                        h.via,
                        firmness=h.firmness,
                    )
                )
    else:
        raise bad_input(f"mode: must be one of {', '.join(MODES)}, got {mode!r}")
    hits = _window(hits, exclude, offset - start, k)
    _score(hits, mode)
    if radius is None:
        radius = float(rt.distance_to_origin(x))
    return Answer(query_label, x, radius, hits, chain, mode=mode)


def _nearest_hits(rt: Runtime, ids: np.ndarray, dists: np.ndarray) -> list[Hit]:
    label_of = rt.label_of
    scores = (1.0 / (1.0 + np.maximum(dists, 0.0))).tolist()  # nearest_score, vectorised
    return [
        Hit(i, d, label_of(i), None, None, score=s)
        for i, d, s in zip(ids.tolist(), dists.tolist(), scores, strict=True)
    ]


def _score(hits: list[Hit], mode: str) -> None:
    """Set each hit's score: ``nearest`` :func:`nearest_score`; otherwise the
    firmness (held items ``(0, 1]``, items outside the cone 0), capped by the
    score before it so that scores never increase down the ranking (the round
    robin over branches and a new level can follow a firmer item with a less
    firm one). The first hit of a page is capped by nothing before it."""
    if mode == "nearest":
        for h in hits:
            h.score = nearest_score(h.distance)
        return
    from indexing.entailment import running_min

    for h, sc in zip(hits, running_min([h.firmness or 0.0 for h in hits]), strict=True):
        h.score = sc


def _groups(
    rt: Runtime, x, apex: str, k: int, offset: int, allowed, where
) -> Generator[IndexCall, Any, list[Group]]:
    """``group_by: children``: one group per cone child of ``apex`` that holds items
    (count descending, then name), each its branch's ``[offset, offset + k)`` by
    firmness."""
    if allowed is not None and not allowed:
        return []
    cand = yield (
        "entailment_candidates",
        (apex, x, offset + k),
        {"labels": allowed, "where": where, "extra": rt.cone_extras(apex)},
    )
    from indexing.entailment import entailment_order

    out = []
    for b, n in sorted(cand.branch_counts().items(), key=lambda t: (-t[1], t[0])):
        if b == apex:
            continue  # held by the label's cone and by no child's
        got = entailment_order(cand, offset + k, branch=b)[offset:]
        hits = [
            Hit(h.id, h.distance, rt.label_of(h.id), None, None, firmness=h.firmness) for h in got
        ]
        _score(hits, "entailment")
        out.append(Group(b, n, hits))
    return out


def _window(hits: list[Hit], exclude: str | None, skip: int, k: int) -> list[Hit]:
    if exclude is not None:
        hits = [h for h in hits if h.id != exclude]
    return hits[skip : skip + k]


def search_many(rt: Runtime, queries: Sequence[Query]) -> list[Answer | Exception]:
    """Answer each query as ``search(rt, *query_point(rt, ...), ...)`` would, in one
    batch: the answer, or the exception that query raises (an :class:`ApiError`,
    or anything else the index raises), so that no query's failure reaches
    another. See the module docstring for what is batched."""
    n = len(queries)
    out: list[Answer | Exception | None] = [None] * n
    xs: list[np.ndarray | None] = [None] * n
    labels: list[str | None] = [None] * n
    excludes: list[str | None] = [None] * n
    need_label: list[int] = []
    for i, q in enumerate(queries):
        try:
            if q.point is not None:
                xs[i], labels[i] = np.asarray(q.point, dtype=np.float64), q.point_label
                if q.point_label is None:
                    need_label.append(i)
            elif q.vector is not None and q.label is None and q.item_id is None:
                xs[i] = check_vector(rt, q.vector)
                need_label.append(i)
            else:
                xs[i], labels[i], excludes[i] = query_point(
                    rt, vector=q.vector, label=q.label, item_id=q.item_id
                )
        except Exception as e:  # noqa: BLE001 - that query's answer
            out[i] = e
    for i, lab in _each(out, need_label, lambda rows: rt.nearest_used_labels(_stack(xs, rows))):
        labels[i] = lab
    live = [i for i in range(n) if out[i] is None]
    radii = dict(_each(out, live, lambda rows: rt.distance_to_origin(_stack(xs, rows)).tolist()))
    groups: dict[int, list[int]] = {}  # window size -> plain nearest queries
    steps: dict[int, Generator[IndexCall, Any, Answer]] = {}  # the other queries
    for i in live:
        if out[i] is not None:
            continue
        q = queries[i]
        if q.plain:
            want = q.offset + q.k + (1 if excludes[i] is not None else 0)
            groups.setdefault(want, []).append(i)
            continue
        steps[i] = _search(
            rt,
            xs[i],
            labels[i],
            k=q.k,
            offset=q.offset,
            mode=q.mode,
            under=q.under,
            exclude=excludes[i],
            per_level=q.per_level,
            radius=radii[i],
            levels=q.levels,
            where=q.filter,
            group_by=q.group_by,
        )
    _drive_many(rt, steps, out)
    for want, rows in groups.items():
        for i, (ids, dists) in _each(out, rows, lambda r, w=want: _nearest_rows(rt, xs, r, w)):
            q = queries[i]
            hits = _window(_nearest_hits(rt, ids, dists), excludes[i], q.offset, q.k)
            out[i] = Answer(labels[i], xs[i], radii[i], hits, None)
    for i, q in enumerate(queries):
        ans = out[i]
        if isinstance(ans, Answer):
            try:
                _finish(rt, q, ans)
            except Exception as e:  # noqa: BLE001 - that query's answer
                out[i] = e
    return out  # type: ignore[return-value]


def _drive_many(rt: Runtime, steps: dict[int, Generator], out: list) -> None:
    """Run the searches ``steps`` (row -> :func:`_search` generator) side by side: the
    index calls all pending ones yield are made together
    (:func:`indexing.interface.run_calls`: one call per shard of a sharded index for
    the whole batch), each answer or exception sent back to its own search; each
    search's answer (or the exception it raised) goes to ``out[row]``."""
    pending: dict[int, IndexCall] = {}

    def advance(i: int, value: Any = None) -> None:
        try:
            pending[i] = steps[i].send(value)
        except StopIteration as stop:
            out[i] = stop.value
        except Exception as e:  # noqa: BLE001 - that query's answer
            out[i] = e

    for i in steps:
        advance(i)
    while pending:
        rows, calls = list(pending), list(pending.values())
        pending.clear()
        for i, got in zip(rows, run_calls(rt.index, calls), strict=True):
            if isinstance(got, Exception):
                steps[i].close()
                out[i] = got
            else:
                advance(i, got)


def _finish(rt: Runtime, q: Query, ans: Answer) -> None:
    """``max_distance``, then ``with_vector`` / ``with_payload``, on an answer."""
    if q.max_distance is not None:
        ans.hits = [h for h in ans.hits if h.distance <= q.max_distance]
    decorate(rt, ans.hits, q.with_vector, q.with_payload)


def _stack(xs: list, rows: list[int]) -> np.ndarray:
    return np.stack([xs[i] for i in rows])


def _nearest_rows(rt: Runtime, xs: list, rows: list[int], k: int) -> list:
    ids, dists = rt.index.search(_stack(xs, rows), k=k)
    return list(zip(ids, dists, strict=True))


def _each(out: list, rows: list[int], batched) -> list:
    """``[(row, value)]`` of ``batched(rows)`` (one value per row), computed for all
    rows at once; should that raise, row by row, each failure becoming that row's
    answer in ``out`` (and the row left out) -- except a shard that is down, which
    is every row's answer at once (asking row by row would only wait for it again)."""
    if not rows:
        return []
    try:
        return list(zip(rows, batched(rows), strict=True))
    except ShardUnavailableError as e:  # a shard is down: no row's fault, every row's answer
        for i in rows:
            out[i] = e
        return []
    except Exception:  # noqa: BLE001 - find the row(s) that fail
        pass
    got = []
    for i in rows:
        try:
            got.append((i, batched([i])[0]))
        except Exception as e:  # noqa: BLE001 - that query's answer
            out[i] = e
    return got


def _per_level(
    rt, x, chain, allowed, per_level: int, want: int, exclude: str | None, levels: str, where=None
) -> Generator[IndexCall, Any, list[Hit]]:
    """Hierarchical order with at most ``per_level`` items of each level: level ``i``
    holds the items of ``chain[i]``'s level (by cone or by taxonomy, as
    :func:`search`) and not of ``chain[i-1]``'s, the firmest in ``chain[i]``'s cone."""
    hits: list[Hit] = []
    seen: set[str] = set()
    for lvl, lab in enumerate(chain):
        if len(hits) >= want:
            break
        below = set(rt.cones.held_by(lab)) if levels == "cone" else rt.used_under(lab)
        level_labels = below - seen
        seen |= below
        if levels == "taxonomy" and allowed is not None:
            level_labels &= allowed
        if not level_labels:
            continue
        take = min(per_level, want - len(hits)) + (1 if exclude is not None else 0)
        found = yield (
            "search_hierarchical",
            (x, [lab], lambda _, labs=frozenset(level_labels): labs),
            {
                "k": take,
                "by": "holder" if levels == "cone" else "label",
                "labels": allowed if levels == "cone" else None,
                "where": where,
                "firmness": True,
            },
        )
        got = [
            Hit(h.id, float(h.distance), rt.label_of(h.id), lvl, lab, firmness=h.firmness)
            for h in found
            if h.id != exclude
        ]
        hits += got[: min(per_level, want - len(hits))]
    return hits


def count_held(rt: Runtime, label: str, where=None) -> tuple[int, list[tuple[str, int]]]:
    """``(items the label's cone holds, [(child, items its cone holds), ...])`` for
    a label (synset or word; unknown: 422 with suggestions), filtered by ``where``
    (a parsed filter), children by count descending, then name."""
    apex = resolve_label(rt, label)
    cand = rt.index.entailment_candidates(
        apex, rt.label_point(apex), 1, where=where, extra=rt.cone_extras(apex)
    )
    facets = sorted(
        ((b, n) for b, n in cand.branch_counts().items() if b != apex),
        key=lambda t: (-t[1], t[0]),
    )
    return cand.n_held, facets


def check_window(k: int, offset: int, settings) -> None:
    if not 1 <= k <= settings.max_k:
        raise ApiError(422, f"k: must be from 1 to {settings.max_k}, got {k}")
    if offset < 0:
        raise ApiError(422, f"offset: must be at least 0, got {offset}")
    if offset + k > settings.max_window:
        raise ApiError(422, f"offset + k must be at most {settings.max_window}, got {offset + k}")
