"""``ShardedIndex``: N shards, each a :class:`HyperbolicIndex` with its own store,
answering exactly what one index over all their items answers.

::

    index = ShardedIndex(path, shards=4, dim=10, curvature=1.0, ray=True)
    index.add(vectors, ids, labels=labels)       # routed by a hash of each id
    ids, dists = index.search(queries, k=10)     # every shard's top k, merged

Layout: ``path/shards.json`` (the number of shards, the space, the routing
rule) and one folder ``path/shard-III-of-NNN/`` per shard, an ordinary index
folder (``store.sqlite3``, manifest, snapshot): a shard can be opened alone
with :meth:`HyperbolicIndex.load`.

Routing: the shard of an id is ``blake2b(id, 8 bytes) mod N`` (:func:`shard_of`),
the same in every process and every run (never Python's ``hash``). The number
of shards is fixed when the index is created; opening it with another
``shards`` is refused (:class:`IndexStoreError`).

Exact merge: a nearest search asks every shard for its ``k`` nearest items
(with the same filters) and keeps the ``k`` smallest exact distances;
:meth:`search_hierarchical` asks every shard for its first ``offset + k`` hits
in (level, distance) order and keeps ``[offset, offset + k)`` of the merged
order. The global first ``offset + k`` are, shard by shard, among each shard's
first ``offset + k``, so the merged answer is the single index's answer (the
distances are the same float64 numbers: each is computed from the two points
alone). Equal distances are ordered by id.

Shards live either in this process (``ray=False``: plain indexes, for tests and
one machine) or in named Ray actors (``ray=True``; :class:`ShardServer`), one
actor per shard, named ``hypsearch-shard-<tag>-<i>`` in the Ray namespace
``hypsearch`` (``tag``: a hash of the index folder), detached, restarted
without limit (``max_restarts=-1``): a restarted actor reopens its shard's
store, so every acknowledged write is there again. Any process of the cluster
that opens the same folder finds the running actors by name (the Serve
replicas do) instead of starting others; only the process that started them
stops them (:meth:`close`).

Faults: a call to a shard whose actor died is repeated until the actor is back
(reads, upserts and deletes are idempotent), at most ``timeout`` seconds; past
that it raises :class:`ShardUnavailableError` naming the shard -- a search never
answers from some shards only. With ``fail_fast`` a read does not wait for a
restart: it fails as soon as its shard's actor is seen down (the call died with
it, or the GCS says it is not alive after ``shards.PROBE_SECONDS``). A write that
timed out may still be applied when the shard comes back; repeating it is safe.
Each shard's part of a batch is durable when :meth:`add` returns; a batch spread
over several shards is not atomic across them when one fails past the timeout
(the others keep their part).

Placement (Ray): actors ask for ``num_cpus`` (default 0.25) and, when the
cluster advertises a custom resource ``hypsearch_shard_<i>`` (``ray start
--resources '{"hypsearch_shard_0": 1}'``), a small share of it, which pins shard
``i`` to the nodes that have it. The shard's folder must be readable on that
node (a shared file system, or the node's own disk when it is pinned).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Unpack

import numpy as np

from models.fileio import atomic_write_bytes

from .channel import dumps
from .cones import HierarchicalHit, LabelCones
from .entailment import Candidates, EntailmentHit, entailment_order, merge_candidates
from .errors import IndexInputError, IndexStoreError
from .filters import Filter, parse_filter
from .geometry import PoincareIndexSpace, make_index_space
from .hierarchical import chain_levels
from .index import Item
from .interface import CandidateOptions, EntailmentOptions, LevelOptions, SearchOptions
from .kept import KeptParts
from .shards import (
    LocalShards,
    RayShards,
    ShardServer,
    ShardUnavailableError,
    shard_actor,
)
from .store import STORE_FILE
from .validation import check_batch, check_folder, check_ids, check_pos_int, check_str_set

#: the searches :meth:`ShardedIndex.run_calls` sends in one call per shard
_PLANNED = ("search", "search_hierarchical", "search_entailment", "entailment_candidates")

__all__ = [
    "SHARDS_FILE",
    "ShardServer",
    "ShardUnavailableError",
    "ShardedIndex",
    "is_sharded",
    "shard_of",
]

log = logging.getLogger("indexing")

SHARDS_FILE = "shards.json"
FORMAT = 1


def shard_of(item_id: str, n: int) -> int:
    """The shard of ``item_id`` among ``n``: blake2b (8 bytes, big-endian) mod ``n``."""
    h = hashlib.blake2b(item_id.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(h, "big") % n


def is_sharded(path: str | os.PathLike) -> bool:
    """Whether the folder holds a sharded index (``shards.json``)."""
    return (Path(path) / SHARDS_FILE).is_file()


def _shard_folder(root: Path, i: int, n: int) -> Path:
    return root / f"shard-{i:03d}-of-{n:03d}"


class _Descendants:
    """``descendants_of`` as a table (picklable: it travels to the shards)."""

    def __init__(self, table: dict[str, frozenset[str]]) -> None:
        self.table = table

    def __call__(self, label: str) -> frozenset[str]:
        return self.table[label]


def _kept_key(call: tuple) -> bytes | None:
    """The key under which the shards' answers to ``call`` are kept (its pickle), for
    the calls that repeat while nothing changes: levels by the cones
    (``own_levels``) and entailment candidates -- a label query's, from the label's
    own point; ``None`` for the others."""
    method, args, _ = call
    if method == "own_levels" or (method == "call" and args[0] == "entailment_candidates"):
        return dumps(call)
    return None


class ShardedIndex:
    """N shards behind the API of :class:`HyperbolicIndex` (see the module docstring).

    ``shards``: the number of shards of a new index (an existing one keeps its
    own; a different number is refused). ``ray``: shards in Ray actors of the
    cluster ``ray.init`` connected to (the caller connects), else in this
    process. ``timeout``: how long a call waits for a restarting shard.
    ``fail_fast``: reads (searches, gets, counts, scrolls) fail at once with
    :class:`ShardUnavailableError` when a shard's actor is down instead of waiting
    for its restart (the service's choice: a 503 now, not a request held for
    seconds); writes wait either way. ``channel`` (Ray): those fail-fast reads go to
    the shards on this machine through their direct channel
    (:mod:`indexing.channel`), not a Ray task each."""

    def __init__(
        self,
        path: str | os.PathLike,
        shards: int | None = None,
        *,
        dim: int | None = None,
        curvature: float = 1.0,
        space: str | None = None,
        backend: str = "auto",
        ray: bool = False,
        timeout: float = 60.0,
        fail_fast: bool = False,
        num_cpus: float = 0.25,
        channel: bool = True,
        **backend_params: Any,
    ) -> None:
        root = check_folder(path)
        meta = self._meta(root, shards, dim, curvature, space, backend)
        self._root = root
        self._n = int(meta["shards"])
        self._curvature = float(meta["curvature"])
        self._space = make_index_space(int(meta["dim"]), self._curvature, meta["space"])
        args = [
            (str(_shard_folder(root, i, self._n)), meta["space"], self._curvature, backend,
             dict(backend_params))
            for i in range(self._n)
        ]  # fmt: skip
        if ray:
            tag = hashlib.blake2b(str(root.resolve()).encode(), digest_size=4).hexdigest()
            names = [f"hypsearch-shard-{tag}-{i}" for i in range(self._n)]
            self._shards = RayShards(
                names,
                lambda i: shard_actor(names[i], i, args[i], num_cpus),
                timeout,
                channel=channel,
            )
        else:
            self._shards = LocalShards([ShardServer(*a) for a in args])
        self._ray = ray
        self._fail_fast = bool(fail_fast)
        self._cones: LabelCones | None = None  # the cones set here (set_cones), and their
        self._cones_fp = ""  # fingerprint: the shards' own levels are asked by it
        self._kept = KeptParts()  # the shards' answers to label queries, per their state
        self._closed = False

    @staticmethod
    def _meta(root: Path, shards, dim, curvature, space, backend) -> dict:
        f = root / SHARDS_FILE
        if f.exists():
            try:
                meta = json.loads(f.read_text())
                int(meta["shards"]), int(meta["dim"]), float(meta["curvature"]), meta["space"]
            except (OSError, ValueError, KeyError, TypeError) as e:
                raise IndexStoreError(f"{f}: not a sharded index description ({e})") from None
            if meta.get("format") != FORMAT:
                raise IndexStoreError(f"{f}: format {meta.get('format')!r}, expected {FORMAT}")
            if shards is not None and int(shards) != int(meta["shards"]):
                raise IndexStoreError(
                    f"{root}: holds {meta['shards']} shards, not {shards} (the number of "
                    "shards is fixed when the index is created)"
                )
            return meta
        if (root / STORE_FILE).exists():
            raise IndexStoreError(f"{root}: holds an unsharded index")
        n = check_pos_int(2 if shards is None else shards, "shards")
        sp = make_index_space(dim, curvature, space)
        c = sp.c if isinstance(sp, PoincareIndexSpace) else float(curvature)
        meta = {
            "format": FORMAT,
            "shards": n,
            "route": "blake2b-8 mod shards",
            "space": sp.spec,
            "dim": sp.dim,
            "curvature": c,
            "backend": backend,
        }
        atomic_write_bytes(f, (json.dumps(meta, indent=1) + "\n").encode())
        return meta

    @classmethod
    def load(cls, path: str | os.PathLike, **kw: Any) -> ShardedIndex:
        """Open the sharded index in ``path`` (``FileNotFoundError`` when there is none)."""
        if not is_sharded(path):
            raise FileNotFoundError(f"no sharded index at {Path(path) / SHARDS_FILE}")
        return cls(path, **kw)

    open = load

    # -- properties ---------------------------------------------------------------
    @property
    def dim(self) -> int:
        return self._space.dim

    @property
    def curvature(self) -> float:
        return self._curvature

    @property
    def space(self) -> str:
        return self._space.spec

    @property
    def path(self) -> Path:
        return self._root

    @property
    def n_shards(self) -> int:
        return self._n

    @property
    def backend(self) -> str:
        names = self._all("attr", "backend")
        return f"sharded({self._n}: {','.join(sorted(set(names)))})"

    def __repr__(self) -> str:
        where = "ray" if self._ray else "local"
        return f"ShardedIndex(space={self.space!r}, shards={self._n} ({where}), path={self._root})"

    # -- fan-out ------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the index is closed")

    def _run(self, calls, *, read: bool = False) -> list:
        """The calls' answers; a ``read`` fails at once on a shard that is down when
        the index was opened with ``fail_fast`` (else it waits for the restart)."""
        self._check_open()
        return self._shards.run(calls, fail_fast=read and self._fail_fast)

    def _all(self, method: str, *args, **kwargs) -> list:
        return self._run([(i, method, args, kwargs) for i in range(self._n)])

    def _read_all(self, method: str, *args, **kwargs) -> list:
        return self._run([(i, method, args, kwargs) for i in range(self._n)], read=True)

    def _route(self, ids: Sequence[str]) -> dict[int, list[int]]:
        """Shard -> positions of ``ids`` routed to it."""
        out: dict[int, list[int]] = {}
        for j, i in enumerate(ids):
            out.setdefault(shard_of(i, self._n), []).append(j)
        return out

    def shard_info(self) -> list[dict]:
        """Per shard: ``pid``, ``started`` (its process and start time) and ``items``."""
        return self._all("info")

    # -- writes ---------------------------------------------------------------------
    def add(self, vectors, ids, labels=None, payloads=None) -> None:
        """Upsert; the whole batch is checked before any shard is written."""
        pays = None if payloads is None else list(payloads)
        x, ids, labels, _ = check_batch(self._space, vectors, ids, labels, pays)
        calls = []
        for s, pos in sorted(self._route(ids).items()):
            part = (
                x[pos],
                [ids[j] for j in pos],
                [labels[j] for j in pos],
                None if pays is None else [pays[j] for j in pos],
            )
            calls.append((s, "call", ("add", *part), {}))
        if calls:
            self._run(calls)

    def delete(self, ids: Iterable[str]) -> int:
        ids = check_ids(ids, "ids")
        calls = [
            (s, "call", ("delete", [ids[j] for j in pos]), {})
            for s, pos in sorted(self._route(ids).items())
        ]
        return int(sum(self._run(calls))) if calls else 0

    def delete_where(self, where: Filter | Mapping) -> list[str]:
        """Delete the items passing ``where`` on every shard (each shard in one
        committed transaction); returns their ids."""
        f = parse_filter(where, "filter")
        return [i for part in self._all("call", "delete_where", f) for i in part]

    def set_cones(self, cones: LabelCones | None) -> None:
        self._all("call", "set_cones", cones)
        self._cones, self._cones_fp = cones, "" if cones is None else cones.fingerprint()

    @property
    def cones(self) -> LabelCones | None:
        return self._run([(0, "attr", ("cones",), {})])[0]

    # -- reads ----------------------------------------------------------------------
    def __len__(self) -> int:
        return int(sum(self._read_all("call", "__len__")))

    def __contains__(self, item_id: object) -> bool:
        if not isinstance(item_id, str):
            return False
        return bool(
            self._run(
                [(shard_of(item_id, self._n), "call", ("__contains__", item_id), {})], read=True
            )[0]
        )

    def contains_many(self, ids: Sequence[str]) -> list[bool]:
        """``[id in index for id in ids]`` with one call per shard."""
        routed = sorted(self._route(ids).items())
        got = self._run(
            [(s, "contains", ([ids[j] for j in pos],), {}) for s, pos in routed], read=True
        )
        out = [False] * len(ids)
        for (_, pos), flags in zip(routed, got, strict=True):
            for j, f in zip(pos, flags, strict=True):
                out[j] = f
        return out

    def ids(self) -> list[str]:
        """The live ids, shard by shard."""
        return [i for part in self._all("call", "ids") for i in part]

    def item_labels(self) -> dict[str, str | None]:
        """Every live item's label, by id (one call per shard)."""
        out: dict[str, str | None] = {}
        for part in self._all("item_labels"):
            out.update(part)
        return out

    def get(self, item_id: str) -> Item | None:
        if not isinstance(item_id, str):
            raise IndexInputError(f"id: expected str, got {type(item_id).__name__}")
        return self._run([(shard_of(item_id, self._n), "call", ("get", item_id), {})], read=True)[0]

    def get_many(self, ids: Sequence[str], *, vectors: bool = True) -> list[Item]:
        """The stored items among ``ids``, in that order (absent ids left out), one
        call per shard; ``vectors=False`` skips reading the vectors."""
        ids = check_ids(ids, "ids")
        routed = sorted(self._route(ids).items())
        got = self._run(
            [(s, "call", ("get_many", [ids[j] for j in pos]), {"vectors": vectors})
             for s, pos in routed],
            read=True,
        )  # fmt: skip
        by_id = {it.id: it for part in got for it in part}
        return [by_id[i] for i in ids if i in by_id]

    def filter_mask(self, where: Filter | Mapping) -> np.ndarray:
        """The shards' masks one after another (shard 0's slots, then shard 1's, ...):
        as many ``True`` as :meth:`count` of ``where``."""
        f = parse_filter(where, "filter")
        parts = self._read_all("call", "filter_mask", f)
        return np.concatenate(parts) if parts else np.zeros(0, dtype=bool)

    def count(self, where: Filter | Mapping | None = None) -> int:
        """How many live items pass ``where`` (all of them for ``None``)."""
        f = None if where is None else parse_filter(where, "filter")
        return int(sum(self._read_all("call", "count", f)))

    def scroll(
        self,
        where: Filter | Mapping | None = None,
        limit: int = 100,
        after: str | None = None,
    ) -> tuple[list[str], str | None]:
        """What :meth:`HyperbolicIndex.scroll` answers over all the items: every
        shard's first ``limit`` ids after ``after`` (id order), merged, the first
        ``limit`` of them; ``next_after`` is the last id of the page when any shard
        holds more (the global first ``limit`` are, shard by shard, among each
        shard's first ``limit``)."""
        limit = check_pos_int(limit, "limit")
        if after is not None and not isinstance(after, str):
            raise IndexInputError(f"after: expected str, got {type(after).__name__}")
        f = None if where is None else parse_filter(where, "filter")
        parts = self._read_all("call", "scroll", f, limit, after)
        merged = sorted(i for ids, _ in parts for i in ids)
        more = len(merged) > limit or any(nxt is not None for _, nxt in parts)
        page = merged[:limit]
        return page, (page[-1] if more and page else None)

    @staticmethod
    def _filters(**given: Any) -> dict[str, Any]:
        """The filters given, checked here (before any shard is asked) and ready to
        travel: id and label sets as sets, ``where`` parsed."""
        unknown = sorted(set(given) - {"filter_ids", "labels", "under", "where"})
        if unknown:
            raise TypeError(f"unexpected keyword argument(s): {', '.join(unknown)}")
        out: dict[str, Any] = {}
        for name, v in given.items():
            if v is None:
                continue
            out[name] = parse_filter(v, "filter") if name == "where" else check_str_set(v, name)
        return out

    def search(
        self, queries, k: int = 10, **options: Unpack[SearchOptions]
    ) -> tuple[np.ndarray, np.ndarray]:
        """Every shard's ``k`` nearest (same filters: ``filter_ids``, ``labels``,
        ``under``, ``where``), merged by exact distance (then id); the options of
        :meth:`indexing.Index.search`."""
        return self._fan(self._plan_search(queries, k, **options))

    def search_hierarchical(
        self, query, chain, descendants_of, k: int = 10, offset: int = 0,
        **options: Unpack[LevelOptions],
    ) -> list[HierarchicalHit]:  # fmt: skip
        """Every shard's first ``offset + k`` hits in (level, distance) order (or
        (level, firmness) with ``firmness``), merged (then by id); ``[offset,
        offset + k)`` of that order. Levels by the cones set with :meth:`set_cones`
        (``descendants_of`` their ``held_by``) are each shard's own (kept there until
        it changes); any other ``descendants_of`` travels as a table of the chain's
        labels. The options of :meth:`indexing.Index.search_hierarchical`."""
        return self._fan(
            self._plan_search_hierarchical(query, chain, descendants_of, k, offset, **options)
        )

    def entailment_candidates(
        self, apex: str, query, want: int, **options: Unpack[CandidateOptions]
    ) -> Candidates:
        """Every shard's candidates merged (:func:`indexing.entailment.merge_candidates`):
        the candidates of one index over all the items (a shard ranks its outside
        items whenever it holds fewer than ``want``, so whenever all do)."""
        return self._fan(self._plan_entailment_candidates(apex, query, want, **options))

    def search_entailment(
        self, apex: str, query, k: int = 10, offset: int = 0, **options: Unpack[EntailmentOptions]
    ) -> list[EntailmentHit]:
        """:meth:`indexing.HyperbolicIndex.search_entailment` over every shard's items."""
        return self._fan(self._plan_search_entailment(apex, query, k, offset, **options))

    def run_calls(self, calls: Sequence[tuple[str, tuple, dict]]) -> list:
        """The answers of several calls ``(method, args, kwargs)`` of this index, each
        what the call returns or the exception it raises: the searches (``search``,
        ``search_hierarchical``, ``search_entailment``, ``entailment_candidates``) all
        in one call per shard (a service's micro-batch: one Ray round trip a shard, not
        one a query), any other method one by one. A shard that is down is every
        search's answer (:class:`ShardUnavailableError`). The shards' answers to the
        calls a label query repeats (levels by the cones, entailment candidates) are
        kept here while no shard changes (:meth:`indexing.shards.RayShards.state`,
        read without asking them): a repeated label query asks no shard at all."""
        out: list[Any] = [None] * len(calls)
        plans: list[tuple[int, tuple, Callable]] = []
        for j, (method, args, kwargs) in enumerate(calls):
            try:
                if method in _PLANNED:
                    plans.append((j, *getattr(self, f"_plan_{method}")(*args, **kwargs)))
                else:
                    out[j] = getattr(self, method)(*args, **kwargs)
            except Exception as e:  # noqa: BLE001 - that call's answer
                out[j] = e
        state = self._shards.state() if plans else None
        asked: list[tuple[int, tuple, Callable, bytes | None]] = []
        for j, call, merge in plans:
            key = _kept_key(call) if state is not None else None
            parts = None if key is None else self._kept.get(key, state)
            if parts is None:
                asked.append((j, call, merge, key))
                continue
            try:
                out[j] = merge(parts)
            except Exception as e:  # noqa: BLE001 - that call's answer
                out[j] = e
        if not asked:
            return out
        try:
            per_shard = self._read_all("many", [call for _, call, _, _ in asked])
        except ShardUnavailableError as e:
            for j, _, _, _ in asked:
                out[j] = e
            return out
        for t, (j, _, merge, key) in enumerate(asked):
            parts = [answers[t] for answers in per_shard]
            failed = [v for ok, v in parts if not ok]
            if failed:
                out[j] = failed[0]
                continue
            values = [v for _, v in parts]
            if key is not None:
                self._kept.put(key, state, values)
            try:
                out[j] = merge(values)
            except Exception as e:  # noqa: BLE001 - that call's answer
                out[j] = e
        return out

    # -- plans: (the call every shard gets, the merge of their answers) ----------------
    def _fan(self, plan: tuple[tuple, Callable]):
        (method, args, kwargs), merge = plan
        return merge(self._read_all(method, *args, **kwargs))

    def _plan_search(self, queries, k=10, *, ef=None, **given) -> tuple[tuple, Callable]:
        q = self._space.as_points(queries, "queries", allow_1d=True)
        k = check_pos_int(k, "k")
        filters = self._filters(**given)
        if ef is not None:
            filters["ef"] = check_pos_int(ef, "ef")

        def merge(parts):
            ids = np.concatenate([p[0] for p in parts], axis=1)
            dists = np.concatenate([p[1] for p in parts], axis=1)
            width = min(k, ids.shape[1])
            out_i = np.empty((len(q), width), dtype=ids.dtype)
            out_d = np.empty((len(q), width), dtype=np.float64)
            for r in range(len(q)):
                order = np.lexsort((ids[r], dists[r]))[:width]
                out_i[r], out_d[r] = ids[r][order], dists[r][order]
            return out_i, out_d

        return ("call", ("search", q, k), filters), merge

    def _plan_search_hierarchical(
        self, query, chain, descendants_of, k=10, offset=0, *, ef=None, by="holder",
        labels=None, where=None, firmness=False,
    ) -> tuple[tuple, Callable]:  # fmt: skip
        q = self._space.as_points(query, "query", allow_1d=True)
        if len(q) != 1:
            raise IndexInputError(f"query: expected one vector, got {len(q)}")
        k = check_pos_int(k, "k")
        offset = check_pos_int(offset, "offset", 0)
        options: dict[str, Any] = {"by": by, **self._filters(labels=labels, where=where)}
        if ef is not None:
            options["ef"] = check_pos_int(ef, "ef")
        if firmness:
            options["firmness"] = True
        own = self._cones is not None and getattr(descendants_of, "__self__", None) is self._cones
        if own and getattr(descendants_of, "__func__", None) is LabelCones.held_by:
            chain, _ = chain_levels(chain, lambda _: ())  # checks the chain (IndexInputError)
            call = ("own_levels", (q, chain, self._cones_fp, offset + k, 0), options)
        else:
            table: dict[str, frozenset[str]] = {}

            def record(label: str):
                if label not in table:
                    table[label] = frozenset(descendants_of(label))
                return table[label]

            chain, _ = chain_levels(chain, record)  # checks the chain (IndexInputError)
            args = ("search_hierarchical", q, chain, _Descendants(table), offset + k, 0)
            call = ("call", args, options)

        def merge(parts):
            hits = [h for part in parts for h in part]
            if firmness:
                hits.sort(key=lambda h: (h.level, -(h.firmness or 0.0), h.id))
            else:
                hits.sort(key=lambda h: (h.level, h.distance, h.id))
            return hits[offset : offset + k]

        return call, merge

    def _plan_entailment_candidates(
        self, apex, query, want, *, labels=None, where=None, extra=()
    ) -> tuple[tuple, Callable]:
        q = self._space.as_points(query, "query", allow_1d=True)
        want = check_pos_int(want, "want")
        filters = self._filters(labels=labels, where=where)
        if extra:
            filters["extra"] = [(str(a), list(b)) for a, b in extra]
        call = ("call", ("entailment_candidates", apex, q, want), filters)
        return call, lambda parts: merge_candidates(parts, want)

    def _plan_search_entailment(
        self, apex, query, k=10, offset=0, *, spread=True, **given
    ) -> tuple[tuple, Callable]:
        k = check_pos_int(k, "k")
        offset = check_pos_int(offset, "offset", 0)
        call, merge = self._plan_entailment_candidates(apex, query, offset + k, **given)
        return call, lambda parts: entailment_order(merge(parts), offset + k, spread=spread)[
            offset:
        ]

    # -- snapshots ------------------------------------------------------------------
    def save(self, path: str | os.PathLike | None = None) -> Path:
        """A snapshot of every shard in its folder (or, with ``path``, a copy of the
        whole sharded index there)."""
        if path is None:
            self._all("call", "save")
            return self._root
        dest = check_folder(path)
        dest.mkdir(parents=True, exist_ok=True)
        self._run(
            [
                (i, "call", ("save", str(_shard_folder(dest, i, self._n))), {})
                for i in range(self._n)
            ]
        )
        atomic_write_bytes(dest / SHARDS_FILE, (self._root / SHARDS_FILE).read_bytes())
        return dest

    def stats(self) -> dict[str, Any]:
        parts = self._read_all("call", "stats")
        return {
            "items": sum(p["items"] for p in parts),
            "shards": parts,
            "backend": self.backend,
        }

    def close(self) -> None:
        """Snapshot and stop the shards this process started (Ray: the actors it
        created; others keep serving)."""
        if self._closed:
            return
        try:
            self._shards.stop()
        finally:
            self._closed = True

    def __enter__(self) -> ShardedIndex:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
