"""Filter expressions over items: parse and check them, evaluate them to slots.

A filter ``F`` is a JSON object ``{"must": [C...], "should": [C...],
"must_not": [C...]}`` (each list optional; an item passes when every ``must``
condition holds, at least one ``should`` condition holds when that list is
non-empty, and no ``must_not`` condition holds).  A condition ``C`` is one of::

    {"key": K, "match": V}                         V a string, number or boolean
    {"key": K, "in": [V...]}                       any of the values
    {"key": K, "range": {"gt"|"gte"|"lt"|"lte": number, ...}}
    {"under": "<label>"}                           the item's label is the label or below it
    F                                              a nested filter

``K`` is ``label``, ``id`` or ``payload.<field>[.<field>...]``.  A payload value
that is a JSON array matches when one of its elements does (``match``, ``in``
and ``range`` alike); ``true`` does not match ``1`` (booleans and numbers are
different values); a missing field matches no condition (so ``must_not``
keeps the items without it).  Which labels ``under`` covers is the caller's
(:func:`parse_filter` ``under_of``; the service passes the taxonomy's
descendants in use); without ``under_of`` it covers the label itself.

:func:`parse_filter` raises :class:`IndexInputError` naming the offending part
(``filter.must[1].range.gt: expected a number, got 'a'``).  A parsed
:class:`Filter` is evaluated by :class:`PayloadColumns` to a boolean mask over
the slots of an :class:`~indexing.table.ItemTable`: ``label`` and ``id`` come
from the table's own maps, ``payload.*`` fields from a column per field path,
built once from the store (SQLite ``json_extract``) when a filter first names
it and then kept up to date by every write (value -> slots for ``match``/``in``,
a float64 array for ``range``), so a filter costs set unions and vectorised
comparisons, never a scan of the payloads.

Bounds: a filter has at most :data:`MAX_CONDITIONS` conditions and names at most
:data:`MAX_PAYLOAD_KEYS` payload fields unless the caller passes its own
:class:`FilterLimits`; the columns are a cache bounded in count and bytes
(:data:`CACHE_COLUMNS`, :data:`CACHE_BYTES`, least recently used out), and a
field no item has costs an empty column (no array).
"""

from __future__ import annotations

import json
import math
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import IndexInputError
from .table import ItemTable

__all__ = [
    "CACHE_BYTES",
    "CACHE_COLUMNS",
    "MAX_CONDITIONS",
    "MAX_DEPTH",
    "MAX_PAYLOAD_KEYS",
    "MAX_VALUES",
    "Condition",
    "Filter",
    "FilterLimits",
    "PayloadColumns",
    "Under",
    "field_value",
    "parse_filter",
]

#: bounds on one filter: nesting depth, conditions in all, values of one ``in``
MAX_DEPTH = 16
MAX_CONDITIONS = 256
MAX_VALUES = 10_000
MAX_KEY_CHARS = 500
#: distinct payload fields one filter names (each new one costs a scan of the store)
MAX_PAYLOAD_KEYS = 16
#: the payload-column cache of one index: columns and bytes kept at most
CACHE_COLUMNS = 64
CACHE_BYTES = 256 * 1024 * 1024


@dataclass(frozen=True)
class FilterLimits:
    """Bounds of one filter; ``*_note`` is appended to the error (the service names
    its setting there)."""

    conditions: int = MAX_CONDITIONS
    payload_keys: int = MAX_PAYLOAD_KEYS
    conditions_note: str = ""
    keys_note: str = ""


_CLAUSES = ("must", "should", "must_not")
_BOUNDS = ("gt", "gte", "lt", "lte")
_MISSING = object()


def _canon(v: Any) -> tuple | None:
    """The hashable form of a scalar JSON value (``None``: not matchable)."""
    if isinstance(v, bool):
        return ("b", v)
    if isinstance(v, (int, float)):
        f = float(v)
        return ("n", f) if math.isfinite(f) else None
    if isinstance(v, str):
        return ("s", v)
    return None


def _number(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    f = float(v)
    return f if math.isfinite(f) else None


@dataclass(frozen=True)
class Condition:
    """``key`` (``("label",)``, ``("id",)`` or ``("payload", field, ...)``) and one
    test: ``values`` (canonical, for ``match``/``in``) or ``bounds``
    ``(gt, gte, lt, lte)`` (``None`` where not given) for ``range``."""

    key: tuple[str, ...]
    op: str  # "match" | "in" | "range"
    values: frozenset = frozenset()
    bounds: tuple[float | None, float | None, float | None, float | None] = (None,) * 4

    def holds(self, value: Any) -> bool:
        """Whether a plain Python value (the item's field; ``_MISSING`` when absent)
        passes: the reference semantics the columns implement."""
        vals = value if isinstance(value, list) else [value]
        if self.op == "range":
            return any(_in_bounds(_number(v), self.bounds) for v in vals)
        return any(_canon(v) in self.values for v in vals if _canon(v) is not None)


def _in_bounds(x: float | None, b) -> bool:
    if x is None:
        return False
    gt, gte, lt, lte = b
    return (
        (gt is None or x > gt)
        and (gte is None or x >= gte)
        and (lt is None or x < lt)
        and (lte is None or x <= lte)
    )


@dataclass(frozen=True)
class Under:
    """``{"under": label}``: items whose label is one of ``labels``."""

    label: str
    labels: frozenset[str]


@dataclass(frozen=True)
class Filter:
    must: tuple = ()
    should: tuple = ()
    must_not: tuple = ()

    def payload_keys(self) -> set[tuple[str, ...]]:
        """The payload field paths the filter reads."""
        out: set[tuple[str, ...]] = set()
        for c in (*self.must, *self.should, *self.must_not):
            if isinstance(c, Filter):
                out |= c.payload_keys()
            elif isinstance(c, Condition) and c.key[0] == "payload":
                out.add(c.key[1:])
        return out

    def holds(self, item_id: str, label: str | None, payload: Any) -> bool:
        """Whether one item passes (plain Python: the reference for the tests)."""

        def one(c) -> bool:
            if isinstance(c, Filter):
                return c.holds(item_id, label, payload)
            if isinstance(c, Under):
                return label in c.labels
            if c.key == ("id",):
                return c.holds(item_id)
            if c.key == ("label",):
                return c.holds(_MISSING if label is None else label)
            return c.holds(field_value(payload, c.key[1:]))

        return (
            all(one(c) for c in self.must)
            and (not self.should or any(one(c) for c in self.should))
            and not any(one(c) for c in self.must_not)
        )


def field_value(payload: Any, path: tuple[str, ...]) -> Any:
    """The value at ``path`` in a payload (``_MISSING`` when absent)."""
    v = payload
    for seg in path:
        if not isinstance(v, dict) or seg not in v:
            return _MISSING
        v = v[seg]
    return v


# ---------------------------------------------------------------- parsing


class _Parser:
    def __init__(
        self,
        under_of: Callable[[str, str], Iterable[str]] | None,
        limits: FilterLimits | None = None,
    ) -> None:
        self.under_of = under_of
        self.limits = limits or FilterLimits()
        self.n = 0

    def filter(self, obj: Any, where: str, depth: int) -> Filter:
        if not isinstance(obj, Mapping):
            raise IndexInputError(
                f"{where}: expected an object with must / should / must_not, "
                f"got {type(obj).__name__}"
            )
        if depth > MAX_DEPTH:
            raise IndexInputError(f"{where}: filters nest at most {MAX_DEPTH} deep")
        extra = sorted(set(obj) - set(_CLAUSES))
        if extra:
            raise IndexInputError(
                f"{where}: unknown field {extra[0]!r} (a filter has must, should, must_not)"
            )
        parts = {}
        for clause in _CLAUSES:
            items = obj.get(clause)
            if items is None:
                parts[clause] = ()
                continue
            if not isinstance(items, list):
                raise IndexInputError(
                    f"{where}.{clause}: expected a list of conditions, got {type(items).__name__}"
                )
            parts[clause] = tuple(
                self.condition(c, f"{where}.{clause}[{j}]", depth) for j, c in enumerate(items)
            )
        return Filter(**parts)

    def condition(self, c: Any, where: str, depth: int):
        self.n += 1
        lim = self.limits
        if self.n > lim.conditions:
            raise IndexInputError(
                f"{where}: a filter has at most {lim.conditions:,} conditions{lim.conditions_note}"
            )
        if not isinstance(c, Mapping):
            raise IndexInputError(f"{where}: expected a condition object, got {type(c).__name__}")
        if not c or any(k in c for k in _CLAUSES):  # {} is the empty filter: every item
            return self.filter(c, where, depth + 1)
        if "under" in c:
            if len(c) != 1:
                other = sorted(k for k in c if k != "under")[0]
                raise IndexInputError(f"{where}: unexpected {other!r} next to 'under'")
            lab = c["under"]
            if not isinstance(lab, str) or not lab:
                raise IndexInputError(f"{where}.under: expected a label name (a string)")
            labels = {lab} if self.under_of is None else set(self.under_of(lab, f"{where}.under"))
            return Under(lab, frozenset(labels))
        if "key" not in c:
            got = ", ".join(repr(k) for k in sorted(c)) or "none"
            raise IndexInputError(
                f"{where}: expected {{key, match|in|range}}, {{under}} or a nested filter "
                f"(must / should / must_not); got the fields {got}"
            )
        key = self.key(c["key"], f"{where}.key")
        ops = [op for op in ("match", "in", "range") if op in c]
        extra = sorted(set(c) - {"key", "match", "in", "range"})
        if extra:
            raise IndexInputError(f"{where}: unknown field {extra[0]!r}")
        if len(ops) != 1:
            raise IndexInputError(
                f"{where}: give exactly one of match, in, range (got {', '.join(ops) or 'none'})"
            )
        op = ops[0]
        if op == "range":
            if key[0] != "payload":
                raise IndexInputError(f"{where}.range: {key[0]} values are strings, not numbers")
            return Condition(key, "range", bounds=self.bounds(c["range"], f"{where}.range"))
        raw = [c["match"]] if op == "match" else c["in"]
        if op == "in":
            if not isinstance(raw, list):
                raise IndexInputError(f"{where}.in: expected a list, got {type(raw).__name__}")
            if len(raw) > MAX_VALUES:
                raise IndexInputError(f"{where}.in: at most {MAX_VALUES} values, got {len(raw)}")
        values = set()
        for j, v in enumerate(raw):
            at = f"{where}.match" if op == "match" else f"{where}.in[{j}]"
            cv = _canon(v)
            if cv is None:
                raise IndexInputError(
                    f"{at}: expected a string, a finite number or a boolean, got {_show(v)}"
                )
            if key[0] != "payload" and cv[0] != "s":
                raise IndexInputError(f"{at}: {key[0]} values are strings, got {_show(v)}")
            values.add(cv)
        return Condition(key, op, values=frozenset(values))

    @staticmethod
    def key(k: Any, where: str) -> tuple[str, ...]:
        if not isinstance(k, str):
            raise IndexInputError(f"{where}: expected a string, got {type(k).__name__}")
        if k in ("label", "id"):
            return (k,)
        head, dot, rest = k.partition(".")
        if head != "payload":
            raise IndexInputError(
                f"{where}: unknown key {k[:100]!r} (use label, id or payload.<field>)"
            )
        if not dot or not rest:
            raise IndexInputError(f"{where}: {k!r} names no field (e.g. payload.color)")
        if len(k) > MAX_KEY_CHARS:
            raise IndexInputError(f"{where}: longer than {MAX_KEY_CHARS} characters")
        segs = tuple(rest.split("."))
        for s in segs:
            if not s or '"' in s or "\\" in s:
                raise IndexInputError(
                    f"{where}: {k[:100]!r}: field names are non-empty and hold no '\"' or '\\'"
                )
        return ("payload", *segs)

    @staticmethod
    def bounds(r: Any, where: str):
        if not isinstance(r, Mapping):
            raise IndexInputError(
                f"{where}: expected an object with gt, gte, lt, lte, got {type(r).__name__}"
            )
        extra = sorted(set(r) - set(_BOUNDS))
        if extra:
            raise IndexInputError(f"{where}: unknown bound {extra[0]!r} (use gt, gte, lt, lte)")
        if not r:
            raise IndexInputError(f"{where}: give at least one of gt, gte, lt, lte")
        out = []
        for b in _BOUNDS:
            v = r.get(b)
            if v is None:
                out.append(None)
                continue
            x = _number(v)
            if x is None:
                raise IndexInputError(f"{where}.{b}: expected a finite number, got {_show(v)}")
            out.append(x)
        return tuple(out)


def _show(v: Any) -> str:
    s = json.dumps(v) if not isinstance(v, float) or math.isfinite(v) else repr(v)
    return s if len(s) <= 60 else s[:57] + "..."


def parse_filter(
    obj: Any,
    name: str = "filter",
    *,
    under_of: Callable[[str, str], Iterable[str]] | None = None,
    limits: FilterLimits | None = None,
) -> Filter:
    """Check a filter expression (see the module docstring) and return it parsed.

    ``under_of(label, where)``: the labels an ``{"under": label}`` condition
    covers (``where`` names the condition, for the caller's own errors);
    default: the label itself.  ``limits``: the bounds (default
    :class:`FilterLimits`). A :class:`Filter` is returned as it is."""
    if isinstance(obj, Filter):
        return obj
    parser = _Parser(under_of, limits)
    f = parser.filter(obj, name, 0)
    lim = parser.limits
    keys = f.payload_keys()
    if len(keys) > lim.payload_keys:
        raise IndexInputError(
            f"{name}: names {len(keys):,} payload fields, at most {lim.payload_keys:,}"
            f"{lim.keys_note}"
        )
    return f


# ---------------------------------------------------------------- evaluation


class _Column:
    """One payload field over the slots of a table: value -> slots (``match``,
    ``in``) and a float64 array of the scalar numbers (``range``; NaN where the
    value is not a number) plus the numbers of array values."""

    def __init__(self, capacity: int) -> None:
        self.eq: dict[tuple, set[int]] = {}
        self.capacity = max(16, capacity)
        # allocated with the first number: a field no item has (or with no numbers)
        # costs no array
        self.num: np.ndarray | None = None
        self.multi: dict[int, list[float]] = {}  # slot -> the numbers of an array value
        self.keys: dict[int, Any] = {}  # slot -> its canonical value(s) (to unlink)

    def nbytes(self) -> int:
        """About what the column holds in memory (its array and its maps)."""
        n = 0 if self.num is None else self.num.nbytes
        slots = sum(len(v) for v in self.eq.values())
        return n + 200 * len(self.eq) + 100 * slots + 150 * len(self.keys) + 120 * len(self.multi)

    def load(self, rows: Iterable[tuple[str, Any]], slot_of: dict[str, int]) -> None:
        """Fill an empty column from ``(id, value)`` rows (the bulk form of :meth:`set`)."""
        eq: dict[tuple, list[int]] = {}
        nums_s, nums_x = [], []
        keys = self.keys
        for item_id, value in rows:
            s = slot_of.get(item_id)
            if s is None:
                continue
            if isinstance(value, list):
                self.set(s, value)
                continue
            cv = _canon(value)
            if cv is None:
                continue
            eq.setdefault(cv, []).append(s)
            keys[s] = cv
            if cv[0] == "n":
                nums_s.append(s)
                nums_x.append(cv[1])
        for cv, slots in eq.items():
            have = self.eq.get(cv)
            if have is None:
                self.eq[cv] = set(slots)
            else:
                have.update(slots)
        if nums_s:
            self._grow(max(nums_s) + 1)
            self.num[np.asarray(nums_s, dtype=np.int64)] = nums_x

    def _grow(self, need: int) -> None:
        if self.num is None:
            self.num = np.full(max(need, self.capacity), np.nan)
        elif need > len(self.num):
            grown = np.full(max(need, int(len(self.num) * 1.5)), np.nan)
            grown[: len(self.num)] = self.num
            self.num = grown

    def set(self, slot: int, value: Any) -> None:
        old = self.keys.pop(slot, None)
        for cv in () if old is None else (old if isinstance(old, list) else [old]):
            s = self.eq.get(cv)
            if s is not None:
                s.discard(slot)
                if not s:
                    del self.eq[cv]
        self.multi.pop(slot, None)
        if self.num is not None and slot < len(self.num):
            self.num[slot] = np.nan
        if value is _MISSING or value is None:
            return
        vals = value if isinstance(value, list) else [value]
        keys = list({cv for cv in map(_canon, vals) if cv is not None})
        for cv in keys:
            self.eq.setdefault(cv, set()).add(slot)
        if keys:
            self.keys[slot] = keys
        if isinstance(value, list):
            nums = [x for x in map(_number, value) if x is not None]
            if nums:
                self.multi[slot] = nums
        else:
            x = _number(value)
            if x is not None:
                self._grow(slot + 1)
                self.num[slot] = x

    def range_mask(self, n: int, b) -> np.ndarray:
        gt, gte, lt, lte = b
        if self.num is None:
            m = np.zeros(n, dtype=bool)
            for slot, nums in self.multi.items():
                if slot < n and any(_in_bounds(v, b) for v in nums):
                    m[slot] = True
            return m
        x = self.num[:n] if len(self.num) >= n else np.pad(self.num, (0, n - len(self.num)))
        with np.errstate(invalid="ignore"):
            m = ~np.isnan(x)
            if gt is not None:
                m &= x > gt
            if gte is not None:
                m &= x >= gte
            if lt is not None:
                m &= x < lt
            if lte is not None:
                m &= x <= lte
        for slot, nums in self.multi.items():
            if slot < n and any(_in_bounds(v, b) for v in nums):
                m[slot] = True
        return m


def _mask_of(slots: Iterable[int] | set[int], n: int) -> np.ndarray:
    m = np.zeros(n, dtype=bool)
    if slots:
        a = np.fromiter(slots, dtype=np.int64, count=len(slots))  # type: ignore[arg-type]
        m[a[a < n]] = True
    return m


class PayloadColumns:
    """The payload columns of one index, aligned with the slots of its current
    table (dropped when the table is replaced: compaction, rebuild).

    ``load(path)`` reads one field of every live item from the store: an
    iterable of ``(id, value)`` (``value`` parsed JSON, ``_MISSING`` when absent).
    Callers hold the index's read lock to evaluate and its write lock to
    :meth:`update`; the column cache has its own lock (readers may build
    columns at the same time).

    The columns are a cache: at most ``max_columns`` of them and about
    ``max_bytes`` in all, the least recently used dropped first (built again
    from the store when a filter names the field again)."""

    def __init__(
        self,
        load: Callable[[tuple[str, ...]], Iterable[tuple[str, Any]]],
        *,
        max_columns: int = CACHE_COLUMNS,
        max_bytes: int = CACHE_BYTES,
    ) -> None:
        self._load = load
        self._lock = threading.Lock()
        self._table: ItemTable | None = None
        self._cols: OrderedDict[tuple[str, ...], _Column] = OrderedDict()
        self.max_columns = max_columns
        self.max_bytes = max_bytes

    def limit(self, max_columns: int, max_bytes: int) -> None:
        """New bounds of the cache (applied from the next column built)."""
        with self._lock:
            self.max_columns, self.max_bytes = max(1, int(max_columns)), max(1, int(max_bytes))
            self._evict(None)

    def cached(self) -> tuple[int, int]:
        """``(columns, bytes)`` the cache holds now."""
        with self._lock:
            return len(self._cols), sum(c.nbytes() for c in self._cols.values())

    def _evict(self, keep: tuple[str, ...] | None) -> None:
        cols = self._cols
        total = sum(c.nbytes() for c in cols.values())
        while cols and (len(cols) > self.max_columns or total > self.max_bytes):
            path = next(iter(cols))
            if path == keep:
                if len(cols) == 1:
                    break
                cols.move_to_end(path)
                path = next(iter(cols))
            total -= cols.pop(path).nbytes()

    def _column(self, table: ItemTable, path: tuple[str, ...]) -> _Column:
        with self._lock:
            if self._table is not table:
                self._table, self._cols = table, OrderedDict()
            col = self._cols.get(path)
            if col is None:
                col = _Column(len(table.alive))
                col.load(self._load(path), table.slot_of)
                self._cols[path] = col
                self._evict(path)
            else:
                self._cols.move_to_end(path)
            return col

    def has_columns(self) -> bool:
        return bool(self._cols)

    def update(self, table: ItemTable, ids: list[str], payloads: list[Any]) -> None:
        """Items just written (their parsed payloads) into the columns built so far."""
        with self._lock:
            if self._table is not table:
                self._table, self._cols = table, OrderedDict()
                return
            for path, col in self._cols.items():
                for i, p in zip(ids, payloads, strict=True):
                    s = table.slot_of.get(i)
                    if s is not None:
                        col.set(s, field_value(p, path))

    def mask(self, table: ItemTable, f: Filter) -> np.ndarray:
        """Boolean mask over ``table``'s slots: the live items passing ``f``."""
        n = table.n_slots
        return self._filter_mask(table, f, n)

    def _filter_mask(self, table: ItemTable, f: Filter, n: int) -> np.ndarray:
        m = table.alive[:n].copy()
        for c in f.must:
            m &= self._cond_mask(table, c, n)
        if f.should:
            any_ = np.zeros(n, dtype=bool)
            for c in f.should:
                any_ |= self._cond_mask(table, c, n)
            m &= any_
        for c in f.must_not:
            m &= ~self._cond_mask(table, c, n)
        return m

    def _cond_mask(self, table: ItemTable, c, n: int) -> np.ndarray:
        if isinstance(c, Filter):
            return self._filter_mask(table, c, n)
        if isinstance(c, Under):
            return _mask_of(table.slots_for_labels(c.labels), n)
        if c.key == ("label",):
            return _mask_of(table.slots_for_labels(v for _, v in c.values), n)
        if c.key == ("id",):
            return _mask_of(table.slots_for_ids(v for _, v in c.values), n)
        col = self._column(table, c.key[1:])
        if c.op == "range":
            return col.range_mask(n, c.bounds)
        slots: set[int] = set()
        for v in c.values:
            s = col.eq.get(v)
            if s:
                slots |= s
        return _mask_of(slots, n)
