"""One index interface: :class:`indexing.Index` (a ``typing.Protocol``).

Every concrete index class has every member of the Protocol, with a signature
that accepts every call the Protocol allows (same positional parameters in the
same order, the same defaults, keyword-only parameters accepted by name,
anything extra optional); instances of each (ball, product space, sharded) are
``Index`` instances; and every member the service calls on an index is in the
Protocol. The sharded index's answers are checked against one index over the
same items in ``tests/indexing/test_ray.py`` (in this process and on a real Ray cluster).
"""

from __future__ import annotations

import inspect
import re
import sys
import typing
from pathlib import Path

import pytest

from indexing import HyperbolicIndex, Index
from indexing.sharded import ShardedIndex

ROOT = Path(__file__).resolve().parents[2]
CLASSES = [HyperbolicIndex, ShardedIndex]
P = inspect.Parameter


def protocol_members() -> dict[str, object]:
    """Name -> the Protocol's own attribute (property, function or classmethod)."""
    own = {n: v for n, v in vars(Index).items() if not n.startswith("_abc")}
    skip = {"__module__", "__doc__", "__dict__", "__weakref__", "__annotations__", "__init__"}
    skip |= {"__parameters__", "__orig_bases__", "__protocol_attrs__", "__subclasshook__"}
    skip |= {"__non_callable_proto_members__", "__abstractmethods__", "__static_attributes__"}
    skip |= {"__firstlineno__", "__callable_proto_members_only__", "_is_protocol"}
    skip |= {"_is_runtime_protocol", "__qualname__", "__type_params__", "__slots__"}
    return {n: v for n, v in own.items() if n not in skip}


def typed_keywords(fn) -> set[str] | None:
    """The keys of the TypedDict of ``fn``'s ``**options: Unpack[TD]`` (None: no such
    annotation), resolved in ``fn``'s module."""
    var = [p for p in inspect.signature(fn).parameters.values() if p.kind is P.VAR_KEYWORD]
    ann = var[0].annotation if var else P.empty
    if isinstance(ann, str):
        ann = eval(ann, vars(sys.modules[fn.__module__]))  # noqa: S307 - the module's own names
    if typing.get_origin(ann) is not typing.Unpack:
        return None
    td = typing.get_args(ann)[0]
    return set(td.__required_keys__) | set(td.__optional_keys__)


def incompatibilities(
    want: inspect.Signature, got: inspect.Signature, typed: set[str] | None = None
) -> list[str]:
    """Why ``got`` does not accept every call ``want`` allows (empty: it does);
    ``typed``: the keywords ``got``'s ``**options`` is typed to take (each keyword of
    ``want`` must be one of them then)."""
    out = []
    wp = [p for p in want.parameters.values() if p.name not in ("self", "cls")]
    gp = [p for p in got.parameters.values() if p.name not in ("self", "cls")]
    g_by_name = {p.name: p for p in gp}
    g_varkw = any(p.kind is P.VAR_KEYWORD for p in gp)
    g_varpos = any(p.kind is P.VAR_POSITIONAL for p in gp)
    w_pos = [p for p in wp if p.kind in (P.POSITIONAL_ONLY, P.POSITIONAL_OR_KEYWORD)]
    g_pos = [p for p in gp if p.kind in (P.POSITIONAL_ONLY, P.POSITIONAL_OR_KEYWORD)]
    for i, w in enumerate(w_pos):
        if i >= len(g_pos):
            out.append(f"positional parameter {w.name} missing")
            continue
        g = g_pos[i]
        if g.name != w.name:
            out.append(f"positional parameter {i} is {g.name}, expected {w.name}")
        if w.default is not P.empty and g.default != w.default:
            out.append(f"{w.name}: default {g.default!r}, expected {w.default!r}")
    for g in g_pos[len(w_pos) :]:
        if g.default is P.empty and g.name not in {w.name for w in wp}:
            out.append(f"extra required parameter {g.name}")
    for w in wp:
        if w.kind is P.KEYWORD_ONLY:
            g = g_by_name.get(w.name)
            if g is None:
                if not g_varkw:
                    out.append(f"keyword {w.name} not accepted")
                elif typed is not None and w.name not in typed:
                    out.append(f"keyword {w.name} not among the typed **options")
            elif g.kind not in (P.KEYWORD_ONLY, P.POSITIONAL_OR_KEYWORD):
                out.append(f"{w.name} cannot be given by name")
            elif w.default is not P.empty and g.default != w.default:
                out.append(f"{w.name}: default {g.default!r}, expected {w.default!r}")
        elif w.kind is P.VAR_KEYWORD and not g_varkw:
            out.append(f"**{w.name} not accepted")
        elif w.kind is P.VAR_POSITIONAL and not g_varpos:
            out.append(f"*{w.name} not accepted")
    for g in gp:
        if g.kind is P.KEYWORD_ONLY and g.default is P.empty:
            out.append(f"extra required keyword {g.name}")
    return out


def test_the_checker_tells_compatible_from_incompatible():
    def want(self, a, k=10, *, ef=None, **kw): ...

    ok = [
        lambda self, a, k=10, *, ef=None, extra=1, **kw: None,
        lambda self, a, k=10, *, ef=None, **options: None,
    ]
    bad = [
        lambda self, a, k=5, *, ef=None, **kw: None,  # another default
        lambda self, b, k=10, *, ef=None, **kw: None,  # another name
        lambda self, a, k=10, *, ef=None: None,  # no **kw
        lambda self, a, k=10, **kw: None if False else None,  # ef only through **kw: fine
        lambda self, a, k=10, *, ef=None, must, **kw: None,  # a required extra keyword
        lambda self, a: None,  # k missing
    ]
    sw = inspect.signature(want)
    for f in ok:
        assert incompatibilities(sw, inspect.signature(f)) == []
    varkw = inspect.signature(lambda self, a, k=10, **options: None)
    assert incompatibilities(sw, varkw, {"ef", "by"}) == []
    assert incompatibilities(sw, varkw, {"by"}) == ["keyword ef not among the typed **options"]
    verdicts = [incompatibilities(sw, inspect.signature(f)) for f in bad]
    assert [bool(v) for v in verdicts] == [True, True, True, False, True, True], verdicts


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_every_index_class_has_every_member_with_a_compatible_signature(cls):
    members = protocol_members()
    assert {"search", "get_many", "scroll", "count", "delete_where", "filter_mask"} <= set(members)
    problems = {}
    for name, want in members.items():
        got = inspect.getattr_static(cls, name, None)
        if got is None:
            problems[name] = "missing"
            continue
        if isinstance(want, property):
            if not isinstance(got, property):
                problems[name] = f"a property in the Protocol, {type(got).__name__} here"
            continue
        if isinstance(want, classmethod):
            if not isinstance(got, classmethod):
                problems[name] = "a classmethod in the Protocol"
                continue
            want, got = want.__func__, got.__func__
        if not callable(got):
            problems[name] = f"not callable ({type(got).__name__})"
            continue
        why = incompatibilities(
            inspect.signature(want), inspect.signature(got), typed_keywords(got)
        )
        if why:
            problems[name] = why
    assert not problems, f"{cls.__name__}: {problems}"


def test_instances_of_every_kind_are_indexes(tmp_path):
    ball = HyperbolicIndex(dim=4, backend="exact")
    product = HyperbolicIndex(space="poincare:2,sphere:2,euclidean:2")
    sharded = ShardedIndex(tmp_path / "sharded", shards=2, dim=4)
    try:
        for ix in (ball, product, sharded):
            assert isinstance(ix, Index), type(ix)
    finally:
        for ix in (ball, product, sharded):
            ix.close()


def test_the_service_calls_only_protocol_members_on_an_index():
    """Every ``rt.index.X`` / ``self.index.X`` / ``runtime.index.X`` in service/ is a
    member of the Protocol, and so is every index call a search yields
    (``yield ("X", args, kwargs)``, made by ``indexing.interface.run_calls``); the
    service names no concrete index class in its type hints."""
    members = set(protocol_members()) | {"__len__", "__contains__"}
    called: dict[str, set[str]] = {}
    yielded: set[str] = set()
    for f in sorted((ROOT / "service").rglob("*.py")):
        text = f.read_text()
        for m in re.finditer(r"\b(?:rt|self|runtime|old\.runtime)\.index\.(\w+)", text):
            called.setdefault(m.group(1), set()).add(f.relative_to(ROOT).as_posix())
        for m in re.finditer(r"\byield \(\s*\"(\w+)\"", text):
            called.setdefault(m.group(1), set()).add(f.relative_to(ROOT).as_posix())
            yielded.add(m.group(1))
        hint = r"(?<!lambda)(?:->|:)\s*\"?(HyperbolicIndex|ShardedIndex)\b(?![.(])"
        for m in re.finditer(hint, text):
            raise AssertionError(f"{f.relative_to(ROOT)}: a type hint names {m.group(1)}")
    assert called, "no index call found: the pattern is stale"
    assert {"search", "search_entailment", "search_hierarchical"} <= yielded, yielded
    unknown = {n: sorted(fs) for n, fs in called.items() if n not in members}
    assert not unknown, f"the service calls these outside the Protocol: {unknown}"


def test_the_protocol_keeps_up_with_the_reference_index():
    """Every parameter of a :class:`HyperbolicIndex` method that the Protocol names
    is in the Protocol too: an option added there (and used by the service) is
    added to the Protocol, and so held against the sharded index."""
    missing = {}
    for name, want in protocol_members().items():
        if isinstance(want, property):
            continue
        got = inspect.getattr_static(HyperbolicIndex, name)
        if isinstance(want, classmethod):
            continue  # load: each class's own options (backend parameters)
        params = set(inspect.signature(want).parameters)
        extra = [p for p in inspect.signature(got).parameters if p not in params]
        if extra:
            missing[name] = extra
    assert not missing, f"HyperbolicIndex takes options the Protocol lacks: {missing}"
