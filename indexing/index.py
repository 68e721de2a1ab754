"""``HyperbolicIndex``: the public index (see the package docstring).

The class holds the locks and the store and hands each job to its module:

- :mod:`indexing.validation` checks the caller's input;
- :mod:`indexing.backend_choice` picks the backend (``auto``) and checks its parameters;
- :mod:`indexing.store` commits every write to SQLite first;
- :mod:`indexing.live` then applies it to the table and the backend, and searches;
- :mod:`indexing.snapshot` saves and restores the in-memory state;
- :mod:`indexing.holding` checks and persists the label cones;
- :mod:`indexing.hierarchical` runs the level-by-level search.

Locks: ``_write_mutex`` serialises writers (store commit + apply); ``_rw``
keeps searches off the in-memory state while a write is applied to it;
``_save_mutex`` serialises snapshots.
"""

from __future__ import annotations

import heapq
import json
import logging
import os
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from operator import attrgetter
from pathlib import Path
from typing import Any

import numpy as np

from .backend_choice import BackendChoice
from .cones import HierarchicalHit, LabelCones
from .entailment import Candidates, EntailmentHit, Holders, candidates, entailment_order
from .errors import IndexInputError
from .filters import Filter, PayloadColumns, parse_filter
from .geometry import IndexSpace, PoincareIndexSpace, make_index_space
from .hierarchical import chain_levels, search_levels
from .holding import check_cones, load_cones, save_cones
from .kept import CANDIDATE_CACHE, KeptAnswers
from .live import LiveIndex
from .rwlock import RWLock
from .snapshot import MANIFEST_FILE, SnapshotError, read_manifest, restore_snapshot, save_snapshot
from .store import STORE_FILE, Store
from .swap import recover
from .table import ItemBatch
from .validation import check_batch, check_folder, check_ids, check_pos_int, check_str_set

__all__ = ["CANDIDATE_CACHE", "HyperbolicIndex", "Item"]

log = logging.getLogger("indexing")


@dataclass(frozen=True)
class Item:
    """What :meth:`HyperbolicIndex.get` returns."""

    id: str
    vector: np.ndarray  # float64 (dim,)
    label: str | None
    payload: Any
    holder: str | None  # the deepest holding label (or the label, without cones)


def _same_dir(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return a.resolve() == b.resolve()


class HyperbolicIndex:
    """k-nearest-neighbour index of points of the Poincaré ball (or a product space).

    See the :mod:`indexing` package docstring for the full contract.
    """

    def __init__(
        self,
        dim: int | None = None,
        curvature: float = 1.0,
        *,
        space: str | None = None,
        backend: str = "auto",
        path: str | os.PathLike | None = None,
        cones: LabelCones | None = None,
        **backend_params: Any,
    ) -> None:
        sp = make_index_space(dim, curvature, space)
        self._init_common(sp, sp.c if isinstance(sp, PoincareIndexSpace) else float(curvature))
        self._choice = BackendChoice(sp, backend, backend_params)
        self._path = None if path is None else check_folder(path)
        self._store = Store(self._path)
        try:
            self._meta = self._store.init_meta(space=sp.spec, dim=sp.dim, curvature=self._curvature)
            if self._path is None:
                self._live = LiveIndex.build(sp, self._choice, [], 0)
            else:
                self._load_state()
        except BaseException:
            self._store.close()
            raise
        self._install_cones(cones)

    def _init_common(self, space: IndexSpace, curvature: float) -> None:
        self._space = space
        self._curvature = curvature
        self._rw = RWLock()
        self._write_mutex = threading.Lock()
        self._save_mutex = threading.Lock()
        self._cones: LabelCones | None = None
        self._closed = False
        self._columns = PayloadColumns(lambda path: self._store.payload_field(path))
        # unfiltered entailment candidates and cone levels, valid while the index
        # has not changed (see entailment_candidates)
        self._cand_cache = KeptAnswers(CANDIDATE_CACHE)

    @classmethod
    def load(
        cls,
        path: str | os.PathLike,
        *,
        backend: str | None = None,
        cones: LabelCones | None = None,
        **backend_params: Any,
    ) -> HyperbolicIndex:
        """Open the index stored in the folder ``path``.

        The snapshot is used when its manifest matches the store; rows written
        after it are replayed; a missing, stale or corrupt snapshot is rebuilt
        from the store (with a logged warning).  ``backend=None`` keeps the
        backend configuration and parameters recorded in the manifest.
        """
        folder = Path(path)
        done = recover(folder)  # a swap of this folder (indexing.swap) a crash interrupted
        if done:
            log.warning("%s", done)
        if not (folder / STORE_FILE).exists():
            raise FileNotFoundError(f"no index store at {folder / STORE_FILE}")
        store = Store(folder, create=False)
        try:
            meta = store.check_format()
            if backend is None:
                try:
                    man = read_manifest(folder)
                except SnapshotError:
                    man = None
                backend, params = BackendChoice.recorded(man, backend_params)
            else:
                params = dict(backend_params)
            self = cls.__new__(cls)
            curvature = float(meta["curvature"])
            sp = make_index_space(int(meta["dim"]), curvature, meta["space"])
            self._init_common(sp, curvature)
            self._choice = BackendChoice(sp, backend, params)
            self._path = folder
            self._store = store
            self._meta = meta
            self._load_state()
        except BaseException:
            store.close()
            raise
        self._install_cones(cones)
        return self

    open = load

    # -- properties ---------------------------------------------------------------
    dim = property(attrgetter("_space.dim"), doc="The dimension of the vectors.")
    curvature = property(attrgetter("_curvature"), doc="The curvature ``c`` of the index.")
    space = property(attrgetter("_space.spec"), doc="The space string (``poincare:D``, ...).")
    path = property(attrgetter("_path"), doc="The folder of a durable index, or ``None``.")
    backend = property(
        attrgetter("_live.backend.name"),
        doc="The backend in use now (``exact``, ``graph`` or ``hnsw``).",
    )
    backend_config = property(
        attrgetter("_choice.config"), doc="The configured backend (``auto`` or a backend name)."
    )
    cones = property(attrgetter("_cones"), doc="The label cones in use, or ``None``.")
    _backend = property(attrgetter("_live.backend"))

    def __len__(self) -> int:
        return self._live.table.n_alive

    def ids(self) -> list[str]:
        """The ids of the live items (in slot order)."""
        with self._rw.read():
            t = self._live.table
            return [t.ids[s] for s in t.live_slots().tolist()]

    def item_labels(self) -> dict[str, str | None]:
        """Every live item's label, by id (from memory: no store read)."""
        with self._rw.read():
            t = self._live.table
            return {t.ids[s]: t.labels[s] for s in t.live_slots().tolist()}

    def contains_many(self, ids: Sequence[str]) -> list[bool]:
        """``[id in index for id in ids]``."""
        slot_of = self._live.table.slot_of
        return [isinstance(i, str) and i in slot_of for i in ids]

    def __contains__(self, item_id: object) -> bool:
        return isinstance(item_id, str) and item_id in self._live.table.slot_of

    def __repr__(self) -> str:
        where = f", path={str(self._path)!r}" if self._path else ""
        return (
            f"HyperbolicIndex(space={self.space!r}, curvature={self._curvature}, "
            f"backend={self.backend_config!r}->{self.backend!r}, n={len(self)}{where})"
        )

    def stats(self) -> dict[str, Any]:
        with self._rw.read():
            live = self._live
            return {
                "items": live.table.n_alive,
                "slots": live.table.n_slots,
                "backend": live.backend.name,
                "backend_config": self._choice.config,
                "backend_params": live.backend.params,
                "applied_seq": live.applied_seq,
                "memory_bytes": live.table.nbytes() + live.backend.nbytes(),
            }

    # -- loading -------------------------------------------------------------------
    def _identity(self) -> dict[str, Any]:
        """What a snapshot must match to be used for this index."""
        return {
            "space": self._space.spec,
            "dim": self._space.dim,
            "curvature": self._curvature,
            "store_uuid": self._meta.get("store_uuid"),
        }

    def _load_state(self) -> None:
        """Snapshot + replay, or a rebuild from the store (with a warning)."""
        try:
            self._live = restore_snapshot(
                self._path, self._identity(), self._store, self._space, self._choice
            )
            return
        except Exception as exc:  # noqa: BLE001 - whatever is wrong with the cache, rebuild
            if not isinstance(exc, SnapshotError):
                exc = SnapshotError(f"the snapshot could not be used ({type(exc).__name__}: {exc})")
            if self._store.count_live() or (self._path / MANIFEST_FILE).exists():
                log.warning(
                    "index %s: %s; rebuilding the index from the store (%d items)",
                    self._path,
                    exc,
                    self._store.count_live(),
                )
        self._rebuild_from_store()

    def _rebuild_from_store(self) -> None:
        store = self._store
        seq = store.last_seq
        capacity = max(1024, int(store.count_live() * 1.1))
        batches = store.iter_live(self._space.dim)
        self._live = LiveIndex.build(self._space, self._choice, batches, seq, capacity)

    # -- cones ------------------------------------------------------------------------
    def _install_cones(self, cones: LabelCones | None) -> None:
        if cones is None:
            self._cones = load_cones(self._store)
        else:
            self.set_cones(cones)

    def set_cones(self, cones: LabelCones | None) -> None:
        """Use ``cones`` for holding labels: persisted in the store, and the
        holding label of every item is recomputed (when the cones changed)."""
        if cones is not None:
            check_cones(cones, self._space, self._curvature)
        with self._write_mutex:
            self._check_open()
            self._cones = cones
            if not save_cones(self._store, cones):
                return
            with self._rw.read():
                live = self._live.table.live_slots()
                items = self._live.table.batch(live)
            holders = items.labels if cones is None else cones.holding_labels(items.vectors)
            seq = self._store.set_holders(items.ids, holders)
            with self._rw.write():
                self._live.table.set_holders(live, holders)
                self._live.applied_seq = seq

    # -- writes ---------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the index is closed")

    def add(
        self,
        vectors,
        ids: Sequence[str],
        labels: Sequence[str | None] | None = None,
        payloads: Sequence[Any] | None = None,
    ) -> None:
        """Insert or replace (upsert) items.

        Durable when this returns (for an index with a path); visible to
        searches all at once.  Raises :class:`IndexInputError` on bad input,
        before anything is written.
        """
        x, ids, labels, payload_json = check_batch(self._space, vectors, ids, labels, payloads)
        n = len(x)
        if n == 0:
            return
        with self._write_mutex:
            self._check_open()
            cones = self._cones
            holders = labels if cones is None else cones.holding_labels(x)
            items = ItemBatch(ids, x, labels, holders)
            seq = self._store.upsert(items, payload_json)
            with self._rw.write():
                self._apply(lambda: self._live.upsert(items), seq)
                if self._columns.has_columns():
                    parsed = [None if p is None else json.loads(p) for p in payload_json]
                    self._columns.update(self._live.table, ids, parsed)

    def delete(self, ids: Iterable[str]) -> int:
        """Delete items; unknown ids are ignored.  Returns how many were deleted."""
        ids = check_ids(ids, "ids")
        if not ids:
            return 0
        with self._write_mutex:
            self._check_open()
            return len(self._delete_locked(ids))

    def delete_where(self, where: Filter | Mapping) -> list[str]:
        """Delete the items passing the filter ``where`` (:mod:`indexing.filters`),
        in one committed transaction; returns their ids."""
        f = parse_filter(where, "filter")
        with self._write_mutex:
            self._check_open()
            with self._rw.read():
                t = self._live.table
                slots = np.nonzero(self._columns.mask(t, f))[0].tolist()
                ids = [t.ids[s] for s in slots]
            return self._delete_locked(ids) if ids else []

    def _delete_locked(self, ids: list[str]) -> list[str]:
        deleted, seq = self._store.delete(ids)
        with self._rw.write():
            self._apply(lambda: self._live.delete(deleted), seq)
        return deleted

    def _apply(self, fn: Callable[[], None], seq: int) -> None:
        """Apply a committed write to the in-memory state (write lock held).

        The write is durable once committed; should applying it fail (memory,
        hnswlib), the in-memory state is rebuilt from the store so that it
        matches what was acknowledged -- and only if that fails too does the
        error reach the caller (the index is then closed)."""
        try:
            fn()
            self._live.applied_seq = seq
            self._live.maintain()
        except Exception:
            log.exception("applying a committed write failed; rebuilding the index from the store")
            try:
                self._rebuild_from_store()
            except Exception:
                self._closed = True
                raise

    # -- reads ----------------------------------------------------------------------------
    def get(self, item_id: str) -> Item | None:
        """The stored item, or ``None``."""
        if not isinstance(item_id, str):
            raise IndexInputError(f"id: expected str, got {type(item_id).__name__}")
        row = self._store.get(item_id)
        if row is None:
            return None
        return Item(row["id"], row["vector"], row["label"], row["payload"], row["holder"])

    def get_many(self, ids: Sequence[str], *, vectors: bool = True) -> list[Item]:
        """The stored items among ``ids``, in that order (absent ids left out);
        ``vectors=False`` skips reading the vectors (``Item.vector`` is then empty)."""
        ids = check_ids(ids, "ids")
        rows = self._store.get_many(ids, vectors=vectors)
        empty = np.empty(0)
        return [
            Item(r["id"], r.get("vector", empty), r["label"], r["payload"], r["holder"])
            for r in (rows.get(i) for i in ids)
            if r is not None
        ]

    def filter_mask(self, where: Filter | Mapping) -> np.ndarray:
        """The live slots passing ``where`` as a boolean mask (tests, benchmarks)."""
        f = parse_filter(where, "filter")
        with self._rw.read():
            return self._columns.mask(self._live.table, f)

    def count(self, where: Filter | Mapping | None = None) -> int:
        """How many live items pass the filter ``where`` (all of them for ``None``)."""
        if where is None:
            return len(self)
        f = parse_filter(where, "filter")
        with self._rw.read():
            self._check_open()
            return int(np.count_nonzero(self._columns.mask(self._live.table, f)))

    def scroll(
        self,
        where: Filter | Mapping | None = None,
        limit: int = 100,
        after: str | None = None,
    ) -> tuple[list[str], str | None]:
        """``(ids, next_after)``: up to ``limit`` ids of live items passing ``where``,
        in id order, all greater than ``after``; ``next_after`` is the last id
        when more may follow (pass it as ``after``), else ``None``.  Every item
        that lives through a whole scroll is listed exactly once, whatever is
        written meanwhile."""
        limit = check_pos_int(limit, "limit")
        if after is not None and not isinstance(after, str):
            raise IndexInputError(f"after: expected str, got {type(after).__name__}")
        f = None if where is None else parse_filter(where, "filter")
        with self._rw.read():
            self._check_open()
            t = self._live.table
            if f is None:
                got = self._store.ids_after(after, limit + 1)
            else:
                got = self._scroll_filtered(t, self._columns.mask(t, f), limit + 1, after)
        if len(got) > limit:
            return got[:limit], got[limit - 1]
        return got, None

    def _scroll_filtered(self, t, mask: np.ndarray, want: int, after: str | None) -> list[str]:
        m = int(np.count_nonzero(mask))
        if m == 0:
            return []
        if m <= 0.05 * max(1, t.n_alive):  # few pass: pick them from the table
            ids = (t.ids[s] for s in np.nonzero(mask)[0].tolist())
            if after is not None:
                ids = (i for i in ids if i > after)
            return heapq.nsmallest(want, ids)
        # many pass: walk the store in id order, keeping those that pass
        out: list[str] = []
        chunk = max(256, int(2 * want * t.n_alive / m))
        slot_of, n = t.slot_of, len(mask)
        while len(out) < want:
            rows = self._store.ids_after(after, chunk)
            for i in rows:
                s = slot_of.get(i)
                if s is not None and s < n and mask[s]:
                    out.append(i)
                    if len(out) == want:
                        break
            if len(rows) < chunk:
                break
            after = rows[-1]
        return out

    def search(
        self,
        queries,
        k: int = 10,
        *,
        filter_ids: Iterable[str] | None = None,
        labels: Iterable[str] | None = None,
        under: Iterable[str] | None = None,
        ef: int | None = None,
        where: Filter | Mapping | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """The ``k`` nearest items of each query.

        Returns ``(ids, distances)`` of shape ``(q, min(k, m))`` where ``m`` is
        the number of live items passing the filters: ids as a numpy str array,
        exact float64 geodesic distances in ascending order.  Filters (combined
        by intersection): ``filter_ids`` (only these ids), ``labels`` (items
        whose label is in the set), ``under`` (items whose holding label is in
        the set — pass the descendants-or-self of a taxonomy node), ``where``
        (a filter expression of :mod:`indexing.filters`, or a parsed ``Filter``).
        """
        q = self._space.as_points(queries, "queries", allow_1d=True)
        k = check_pos_int(k, "k")
        if ef is not None:
            ef = check_pos_int(ef, "ef")
        fi = None if filter_ids is None else check_str_set(filter_ids, "filter_ids")
        la = None if labels is None else check_str_set(labels, "labels")
        un = None if under is None else check_str_set(under, "under")
        f = None if where is None else parse_filter(where, "filter")
        with self._rw.read():
            self._check_open()
            live = self._live
            allowed = live.allowed(fi, la, un)
            if f is not None:
                mask = self._columns.mask(live.table, f)
                allowed = np.nonzero(mask)[0] if allowed is None else allowed[mask[allowed]]
            slots, dists = live.search(q, k, allowed, ef)
            ids = live.ids_of(slots)
        return ids, dists

    def search_hierarchical(
        self,
        query,
        chain: Sequence[str],
        descendants_of: Callable[[str], Iterable[str]],
        k: int = 10,
        offset: int = 0,
        *,
        ef: int | None = None,
        by: str = "holder",
        labels: Iterable[str] | None = None,
        where: Filter | Mapping | None = None,
        firmness: bool = False,
    ) -> list[HierarchicalHit]:
        """Hierarchical (cone) search for one query vector.

        ``chain`` = ``[l0, l1, ..., root]`` with ``l0`` the query's label and
        ``l(i+1)`` the parent of ``l(i)``; ``descendants_of(label)`` gives the
        label's descendants (with or without itself).  Level ``i`` holds the
        items whose holding label is a descendant-or-self of ``l(i)`` and not
        of any earlier chain label; results are ordered by level, then by
        distance, and ``[offset, offset + k)`` of that order is returned as
        :class:`HierarchicalHit` ``(id, distance, level, via=l(i))``.
        ``by="label"`` groups items by their own label instead of their holding
        label; ``labels`` keeps only the items whose label is in that set, and
        ``where`` those passing that filter (:mod:`indexing.filters`).
        ``firmness``: each level ordered by firmness in its chain label's cone
        (:mod:`indexing.entailment`; the index's cones), not by distance.
        """
        q = self._space.as_points(query, "query", allow_1d=True)
        if len(q) != 1:
            raise IndexInputError(f"query: expected one vector, got {len(q)}")
        k = check_pos_int(k, "k")
        offset = check_pos_int(offset, "offset", 0)
        if ef is not None:
            ef = check_pos_int(ef, "ef")
        la = None if labels is None else check_str_set(labels, "labels")
        f = None if where is None else parse_filter(where, "filter")
        with self._rw.read():
            self._check_open()
            # levels by this index's cones: kept like the entailment candidates (a
            # function of the cones alone) without a filter; only the labels holding
            # items matter, tested on their points alone (Holders.held, kept per state)
            own = getattr(descendants_of, "__self__", None) is (self._cones or object())
            key = None
            if f is None and la is None and own:
                key = ("levels", q[0].tobytes(), tuple(chain), k, offset, ef, by, firmness)
                got = self._cand_cache.get(key, self._state())
                if got is not None:
                    return list(got)
            if by == "holder" and own:
                descendants_of = self._holders().held
            chain, levels = chain_levels(chain, descendants_of)
            mask = None if f is None else self._columns.mask(self._live.table, f)
            hits = search_levels(
                self._live,
                q,
                chain,
                levels,
                k,
                offset,
                ef,
                by=by,
                labels=la,
                mask=mask,
                cones=self._cones if firmness else None,
            )
            if key is not None:
                self._cand_cache.put(key, self._state(), list(hits))
            return hits

    def _state(self) -> tuple:
        return (self._live.applied_seq, self._live.table, self._cones)

    def _holders(self) -> Holders:
        """The labels holding items, prepared for label queries while they stay the same."""
        return self._cand_cache.one(self._state(), lambda: Holders(self._live.table, self._cones))

    def entailment_candidates(
        self,
        apex: str,
        query,
        want: int,
        *,
        labels: Iterable[str] | None = None,
        where: Filter | Mapping | None = None,
        extra: Sequence[tuple[str, Sequence[str]]] = (),
    ) -> Candidates:
        """The firmest ``want`` items of each branch of ``apex``'s cone, and (when
        fewer than ``want`` items are held) of the items outside it, with their
        distances to ``query``: :func:`indexing.entailment.candidates` over this
        index's items (``labels``, ``where``: filters as in :meth:`search`;
        ``extra``: more cones that count, see there). Without filters the answer
        is kept until the index changes (any write, the cones, a compaction) and
        handed to the next caller asking the same: read it, never change it."""
        q = self._space.as_points(query, "query", allow_1d=True)
        if len(q) != 1:
            raise IndexInputError(f"query: expected one vector, got {len(q)}")
        want = check_pos_int(want, "want")
        la = None if labels is None else check_str_set(labels, "labels")
        f = None if where is None else parse_filter(where, "filter")
        with self._rw.read():
            self._check_open()
            cones = self._cones
            if cones is None:
                raise IndexInputError("cones: the index has no label cones to rank by")
            t = self._live.table
            only = None
            if f is not None:
                only = self._columns.mask(t, f)
            if la is not None:
                keep = np.zeros(t.n_slots, dtype=bool)
                keep[list(t.slots_for_labels(la))] = True
                only = keep if only is None else only[: t.n_slots] & keep
            key = None
            if only is None:  # the answer depends on the items alone: kept
                extras = tuple((a, tuple(p)) for a, p in extra)
                key = ("candidates", apex, want, q[0].tobytes(), extras)
                got = self._cand_cache.get(key, self._state())
                if got is not None:
                    return got
            kw = {"only": only, "extra": extra, "holders": self._holders()}
            held = candidates(t, cones, apex, q[0], want, outside=False, **kw)
            if held.n_held < want:
                held = candidates(t, cones, apex, q[0], want, **kw)
            if key is not None:
                self._cand_cache.put(key, self._state(), held)
            return held

    def search_entailment(
        self,
        apex: str,
        query,
        k: int = 10,
        offset: int = 0,
        *,
        spread: bool = True,
        labels: Iterable[str] | None = None,
        where: Filter | Mapping | None = None,
        extra: Sequence[tuple[str, Sequence[str]]] = (),
    ) -> list[EntailmentHit]:
        """Results ``[offset, offset + k)`` of the entailment ranking of the cone of
        the label ``apex`` (:mod:`indexing.entailment`: held items firmest first,
        round robin over the apex's branches unless ``spread=False``, then the
        items outside, least far outside first), distances to ``query``."""
        k = check_pos_int(k, "k")
        offset = check_pos_int(offset, "offset", 0)
        cand = self.entailment_candidates(
            apex, query, offset + k, labels=labels, where=where, extra=extra
        )
        return entailment_order(cand, offset + k, spread=spread)[offset:]

    # -- snapshots ------------------------------------------------------------------------
    def save(self, path: str | os.PathLike | None = None) -> Path:
        """Write a snapshot (and, for another folder, a copy of the store) to
        ``path`` (a folder; default: the index's own).  Returns the folder."""
        if path is None:
            if self._path is None:
                raise IndexInputError("path: an in-memory index needs a folder to save to")
            folder = self._path
        else:
            folder = check_folder(path)
        folder.mkdir(parents=True, exist_ok=True)
        with self._save_mutex, self._rw.read():
            self._check_open()
            if self._path is None or not _same_dir(folder, self._path):
                self._store.backup_to(folder)
            save_snapshot(folder, self._live, self._identity(), self._choice)
        return folder

    def limit_filter_cache(self, max_columns: int, max_bytes: int) -> None:
        """Bounds of the payload-column cache of filters (count and bytes)."""
        self._columns.limit(max_columns, max_bytes)

    def close(self) -> None:
        """Release the store (further calls raise)."""
        with self._write_mutex, self._rw.write():
            if not self._closed:
                self._closed = True
                self._store.close()

    def __enter__(self) -> HyperbolicIndex:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
