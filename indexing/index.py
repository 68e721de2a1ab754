"""``HyperbolicIndex``: the public index (see the package docstring)."""

from __future__ import annotations

import json
import logging
import math
import os
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .backends import BACKENDS, Backend, make_backend
from .backends.base import EMPTY
from .backends.exact import exact_search
from .cones import HierarchicalHit, LabelCones
from .errors import IndexInputError
from .geometry import IndexSpace, PoincareIndexSpace, make_index_space
from .rwlock import RWLock
from .store import (
    FORMAT_VERSION,
    STORE_FILE,
    SnapshotError,
    Store,
    read_manifest,
    read_snapshot,
    write_manifest,
    write_snapshot,
)
from .table import ItemTable

__all__ = ["HyperbolicIndex", "Item"]

log = logging.getLogger("indexing")

AUTO_THRESHOLD = 20_000
#: The graph backend ``auto`` uses above ``AUTO_THRESHOLD`` live items in the
#: Poincaré ball: the faster one at recall@10 >= 0.99 in ``benchmarks/ann.py``.
AUTO_BACKEND = "graph"
#: Backends that index the Poincaré ball only (product spaces use ``exact``).
BALL_ONLY = ("graph", "hnsw")
COMPACT_FRACTION = 0.30
COMPACT_MIN_SLOTS = 1_000


@dataclass(frozen=True)
class Item:
    """What :meth:`HyperbolicIndex.get` returns."""

    id: str
    vector: np.ndarray  # float64 (dim,)
    label: str | None
    payload: Any
    holder: str | None  # the deepest holding label (or the label, without cones)


# -- input checks ---------------------------------------------------------------------


def _check_ids(ids, name: str = "ids", n: int | None = None) -> list[str]:
    if isinstance(ids, (str, bytes)):
        raise IndexInputError(
            f"{name}: expected a sequence of str, got a single {type(ids).__name__} "
            "(wrap one id in a list)"
        )
    if isinstance(ids, np.ndarray) and ids.ndim != 1:
        raise IndexInputError(f"{name}: expected a 1-d sequence, got shape {ids.shape}")
    try:
        ids = list(ids)
    except TypeError:
        raise IndexInputError(
            f"{name}: expected a sequence of str, got {type(ids).__name__}"
        ) from None
    first: dict[str, int] = {}
    for j, i in enumerate(ids):
        if isinstance(i, np.str_):
            i = ids[j] = str(i)
        if not isinstance(i, str):
            raise IndexInputError(f"{name}[{j}]: expected str, got {type(i).__name__} ({i!r})")
        if not i:
            raise IndexInputError(f"{name}[{j}]: empty id")
        if i in first:
            raise IndexInputError(f"{name}[{j}]: duplicate id {i!r} (also at {name}[{first[i]}])")
        first[i] = j
    if n is not None and len(ids) != n:
        raise IndexInputError(f"{name}: {len(ids)} ids for {n} vectors")
    return ids


def _check_labels(labels, n: int, name: str = "labels") -> list[str | None]:
    if labels is None:
        return [None] * n
    if isinstance(labels, (str, bytes)):
        raise IndexInputError(f"{name}: expected a sequence of str or None, got a single str")
    labels = list(labels)
    if len(labels) != n:
        raise IndexInputError(f"{name}: {len(labels)} labels for {n} vectors")
    for j, lab in enumerate(labels):
        if isinstance(lab, np.str_):
            labels[j] = str(lab)
        elif lab is not None and not isinstance(lab, str):
            raise IndexInputError(f"{name}[{j}]: expected str or None, got {type(lab).__name__}")
    return labels


def _check_payloads(payloads, n: int) -> list[str | None]:
    if payloads is None:
        return [None] * n
    if isinstance(payloads, (str, bytes, Mapping)):
        raise IndexInputError("payloads: expected a sequence with one JSON value per vector")
    payloads = list(payloads)
    if len(payloads) != n:
        raise IndexInputError(f"payloads: {len(payloads)} payloads for {n} vectors")
    out = []
    for j, p in enumerate(payloads):
        if p is None:
            out.append(None)
            continue
        try:
            out.append(json.dumps(p, allow_nan=False, separators=(",", ":")))
        except (TypeError, ValueError) as exc:
            raise IndexInputError(f"payloads[{j}]: not JSON-serialisable ({exc})") from None
    return out


def _check_pos_int(v, name: str, minimum: int = 1) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < minimum:
        raise IndexInputError(f"{name}: must be an integer >= {minimum}, got {v!r}")
    return int(v)


def _check_str_set(v, name: str) -> set[str]:
    if isinstance(v, (str, bytes)):
        raise IndexInputError(f"{name}: expected a collection of str, got a single str")
    try:
        out = set(v)
    except TypeError:
        raise IndexInputError(
            f"{name}: expected a collection of str, got {type(v).__name__}"
        ) from None
    for x in out:
        if not isinstance(x, str):
            raise IndexInputError(f"{name}: contains {type(x).__name__} {x!r}, expected str")
    return out


def _same_dir(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return a.resolve() == b.resolve()


# -- the index ---------------------------------------------------------------------


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
        self._space: IndexSpace = make_index_space(dim, curvature, space)
        sp = self._space
        self._curvature = sp.c if isinstance(sp, PoincareIndexSpace) else float(curvature)
        self._init_common(backend, backend_params)
        if path is None:
            self._path = None
            self._store = Store(None)
            self._meta = self._store.init_meta(
                space=self._space.spec, dim=self._space.dim, curvature=self._curvature
            )
            self._table = ItemTable(self._space.dim)
            self._backend = self._make_backend(self._desired_backend(0))
            self._backend.build(self._table)
        else:
            self._path = Path(path)
            if self._path.exists() and not self._path.is_dir():
                raise IndexInputError(f"path: {self._path} exists and is not a directory")
            self._store = Store(self._path)
            try:
                self._meta = self._store.init_meta(
                    space=self._space.spec, dim=self._space.dim, curvature=self._curvature
                )
                self._load_state()
            except BaseException:
                self._store.close()
                raise
        self._install_cones(cones)

    def _init_common(self, backend: str, backend_params: dict[str, Any]) -> None:
        if backend != "auto" and backend not in BACKENDS:
            raise IndexInputError(
                f"backend: unknown backend {backend!r} (known: auto, {', '.join(sorted(BACKENDS))})"
            )
        params = {
            k: v.item() if isinstance(v, np.generic) else v for k, v in backend_params.items()
        }
        try:
            json.dumps(params)
        except (TypeError, ValueError):
            raise IndexInputError(f"backend_params: not JSON-serialisable: {params!r}") from None
        self._auto_threshold = _check_pos_int(
            params.pop("auto_threshold", AUTO_THRESHOLD), "auto_threshold", 0
        )
        self._backend_config = backend
        self._backend_params = params
        if backend in BALL_ONLY and not isinstance(self._space, PoincareIndexSpace):
            raise IndexInputError(
                f"backend: {backend} supports the Poincaré ball only, not {self._space.spec!r}; "
                "product spaces use the exact backend (backend='exact' or 'auto')"
            )
        # check the parameters now rather than at the first switch to the graph
        names = (backend,)
        if backend == "auto":
            names = (AUTO_BACKEND,) if isinstance(self._space, PoincareIndexSpace) else ()
        for name in names:
            try:
                make_backend(name, self._space, **params)
            except (TypeError, ValueError) as exc:
                raise IndexInputError(f"backend_params: {exc}") from None
        self._rw = RWLock()
        self._write_mutex = threading.Lock()
        self._save_mutex = threading.Lock()
        self._applied_seq = 0
        self._cones: LabelCones | None = None
        self._closed = False

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
        if not (folder / STORE_FILE).exists():
            raise FileNotFoundError(f"no index store at {folder / STORE_FILE}")
        store = Store(folder, create=False)
        try:
            meta = store.check_format()
            man = None
            try:
                man = read_manifest(folder)
            except SnapshotError:
                pass
            if backend is None:
                backend = (man or {}).get("backend_config", "auto")
                if backend != "auto" and backend not in BACKENDS:
                    backend = "auto"
                params = dict((man or {}).get("config_params", {}))
                if "auto_threshold" in (man or {}):
                    params["auto_threshold"] = man["auto_threshold"]
                params.update(backend_params)
            else:
                params = dict(backend_params)
            self = cls.__new__(cls)
            spec = meta["space"]
            self._space = make_index_space(int(meta["dim"]), float(meta["curvature"]), spec)
            self._curvature = float(meta["curvature"])
            self._init_common(backend, params)
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
    def path(self) -> Path | None:
        return self._path

    @property
    def backend(self) -> str:
        """The backend in use now (``exact``, ``graph`` or ``hnsw``)."""
        return self._backend.name

    @property
    def backend_config(self) -> str:
        return self._backend_config

    @property
    def cones(self) -> LabelCones | None:
        return self._cones

    def __len__(self) -> int:
        return self._table.n_alive

    def ids(self) -> list[str]:
        """The ids of the live items (in slot order)."""
        with self._rw.read():
            t = self._table
            return [t.ids[s] for s in t.live_slots().tolist()]

    def __contains__(self, item_id: object) -> bool:
        return isinstance(item_id, str) and item_id in self._table.slot_of

    def __repr__(self) -> str:
        where = f", path={str(self._path)!r}" if self._path else ""
        return (
            f"HyperbolicIndex(space={self.space!r}, curvature={self._curvature}, "
            f"backend={self._backend_config!r}->{self.backend!r}, n={len(self)}{where})"
        )

    def stats(self) -> dict[str, Any]:
        with self._rw.read():
            return {
                "items": self._table.n_alive,
                "slots": self._table.n_slots,
                "backend": self._backend.name,
                "backend_config": self._backend_config,
                "backend_params": self._backend.params,
                "applied_seq": self._applied_seq,
                "memory_bytes": self._table.nbytes() + self._backend.nbytes(),
            }

    # -- backends --------------------------------------------------------------------
    def _desired_backend(self, n_alive: int, current: str | None = None) -> str:
        if self._backend_config != "auto":
            return self._backend_config
        if not isinstance(self._space, PoincareIndexSpace):
            return "exact"  # the graphs are for the ball only (see backends/hnsw.py)
        if n_alive > self._auto_threshold:
            return AUTO_BACKEND
        if current == AUTO_BACKEND and n_alive >= self._auto_threshold // 2:
            return AUTO_BACKEND  # hysteresis: do not flip back and forth around the threshold
        return "exact"

    def _make_backend(self, name: str) -> Backend:
        params = self._backend_params if name != "exact" or self._backend_config != "auto" else {}
        return make_backend(name, self._space, **params)

    def _maintain(self) -> None:
        """Compaction and auto backend switching; write lock held."""
        t = self._table
        rebuild = False
        if t.n_slots >= COMPACT_MIN_SLOTS and t.n_holes > COMPACT_FRACTION * t.n_slots:
            log.info("compacting: %d of %d slots are deleted", t.n_holes, t.n_slots)
            self._table = t.compacted()
            rebuild = True
        want = self._desired_backend(self._table.n_alive, self._backend.name)
        if want != self._backend.name:
            log.info("switching backend %s -> %s at %d items", self._backend.name, want, len(self))
            self._backend = self._make_backend(want)
            rebuild = True
        if rebuild:
            self._backend.build(self._table)

    # -- loading -------------------------------------------------------------------
    def _load_state(self) -> None:
        """Snapshot + replay, or a rebuild from the store (with a warning)."""
        try:
            self._restore_snapshot()
            return
        except Exception as exc:  # noqa: BLE001 - whatever is wrong with the cache, rebuild
            if not isinstance(exc, SnapshotError):
                exc = SnapshotError(f"the snapshot could not be used ({type(exc).__name__}: {exc})")
            if self._store.count_live() or (self._path / "manifest.json").exists():
                log.warning(
                    "index %s: %s; rebuilding the index from the store (%d items)",
                    self._path,
                    exc,
                    self._store.count_live(),
                )
        self._rebuild_from_store()

    def _rebuild_from_store(self) -> None:
        table = ItemTable(self._space.dim, capacity=max(1024, int(self._store.count_live() * 1.1)))
        seq = self._store.last_seq
        for ids, vecs, labels, holders in self._store.iter_live(self._space.dim):
            table.upsert(ids, vecs, labels, holders)
        self._table = table
        self._backend = self._make_backend(self._desired_backend(table.n_alive))
        self._backend.build(table)
        self._applied_seq = seq

    def _restore_snapshot(self) -> None:
        folder = self._path
        man = read_manifest(folder)
        for key, want in (
            ("space", self._space.spec),
            ("dim", self._space.dim),
            ("curvature", self._curvature),
            ("store_uuid", self._meta.get("store_uuid")),
        ):
            if man.get(key) != want:
                raise SnapshotError(
                    f"the snapshot is stale ({key} {man.get(key)!r} "
                    f"does not match the store's {want!r})"
                )
        last_seq = int(man.get("last_seq", -1))
        if last_seq < 0 or last_seq > self._store.last_seq:
            raise SnapshotError(
                f"the snapshot is stale (sequence {last_seq} is ahead of "
                f"the store's {self._store.last_seq})"
            )
        header, blobs = read_snapshot(folder / str(man.get("snapshot")), str(man.get("sha256")))
        if header.get("last_seq") != last_seq or header.get("store_uuid") != man.get("store_uuid"):
            raise SnapshotError("the snapshot does not match its manifest")
        try:
            slots = np.frombuffer(blobs["slots"], dtype="<i8").astype(np.int64)
            vectors = np.frombuffer(blobs["vectors"], dtype="<f8").reshape(-1, self._space.dim)
            ids = json.loads(blobs["ids"])
            labels = json.loads(blobs["labels"])
            holders = json.loads(blobs["holders"])
            n_slots = int(header["n_slots"])
            if not (len(slots) == len(vectors) == len(ids) == len(labels) == len(holders)):
                raise ValueError("section lengths differ")
            table = ItemTable.from_slots(n_slots, slots, ids, vectors.copy(), labels, holders)
        except (KeyError, ValueError, TypeError) as exc:
            raise SnapshotError(f"the snapshot is corrupt ({exc})") from None
        name = header.get("backend")
        want = self._desired_backend(table.n_alive, name)
        backend = self._make_backend(want)
        if want == name:
            state = {k[8:]: v for k, v in blobs.items() if k.startswith("backend.")}
            try:
                backend.restore(table, state)
            except Exception as exc:  # noqa: BLE001 - any failure means a corrupt snapshot
                raise SnapshotError(f"the snapshot's {name} state is corrupt ({exc})") from None
        else:
            backend.build(table)
        self._table, self._backend, self._applied_seq = table, backend, last_seq
        # replay what was written after the snapshot
        for ids_, vecs, labels_, holders_, deleted in self._store.iter_after(
            last_seq, self._space.dim
        ):
            dead = [i for i, d in zip(ids_, deleted, strict=True) if d]
            keep = [j for j, d in enumerate(deleted) if not d]
            if dead:
                self._apply_delete(dead)
            if keep:
                self._apply_upsert(
                    [ids_[j] for j in keep],
                    vecs[keep],
                    [labels_[j] for j in keep],
                    [holders_[j] for j in keep],
                )
        self._applied_seq = self._store.last_seq
        if self._table.n_alive != self._store.count_live():
            raise SnapshotError(
                f"the snapshot is stale ({self._table.n_alive} items after replay, "
                f"the store has {self._store.count_live()})"
            )
        self._maintain()

    # -- cones ------------------------------------------------------------------------
    def _install_cones(self, cones: LabelCones | None) -> None:
        if cones is None:
            meta = self._store.meta()
            if meta.get("cones_fingerprint"):
                records = self._store.load_cones()
                self._cones = LabelCones.from_records(
                    records, curvature=float(meta["cones_curvature"]), K=float(meta["cones_K"])
                )
            return
        self.set_cones(cones)

    def set_cones(self, cones: LabelCones | None) -> None:
        """Use ``cones`` for holding labels: persisted in the store, and the
        holding label of every item is recomputed (when the cones changed)."""
        if cones is not None:
            if not isinstance(cones, LabelCones):
                raise IndexInputError(f"cones: expected LabelCones, got {type(cones).__name__}")
            if not isinstance(self._space, PoincareIndexSpace):
                raise IndexInputError("cones: entailment cones need a poincare space")
            if cones.dim != self._space.dim:
                raise IndexInputError(
                    f"cones: prototypes have dimension {cones.dim}, index {self.dim}"
                )
            if not math.isclose(cones.curvature, self._curvature):
                raise IndexInputError(
                    f"cones: curvature {cones.curvature} differs from the index's {self._curvature}"
                )
        with self._write_mutex:
            self._check_open()
            old = self._store.meta().get("cones_fingerprint", "")
            new = "" if cones is None else cones.fingerprint()
            self._cones = cones
            if old == new:
                return
            if cones is None:
                self._store.save_cones({"cones_fingerprint": ""}, [])
            else:
                self._store.save_cones(
                    {
                        "cones_fingerprint": new,
                        "cones_K": repr(cones.K),
                        "cones_curvature": repr(cones.curvature),
                    },
                    cones.records(),
                )
            with self._rw.read():
                live = self._table.live_slots()
                ids = [self._table.ids[s] for s in live]
                vecs = self._table.vectors[live].copy()
                labels = [self._table.labels[s] for s in live]
            holders = labels if cones is None else cones.holding_labels(vecs)
            seq = self._store.set_holders(ids, holders)
            with self._rw.write():
                self._table.set_holders(live, holders)
                self._applied_seq = seq

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
        x = self._space.as_points(vectors, "vectors")
        n = len(x)
        ids = _check_ids(ids, "ids", n)
        labels = _check_labels(labels, n)
        payload_json = _check_payloads(payloads, n)
        if n == 0:
            return
        with self._write_mutex:
            self._check_open()
            cones = self._cones
            holders = labels if cones is None else cones.holding_labels(x)
            seq = self._store.upsert(ids, x, labels, holders, payload_json)
            with self._rw.write():
                self._apply(lambda: self._apply_upsert(ids, x, labels, holders), seq)

    def delete(self, ids: Iterable[str]) -> int:
        """Delete items; unknown ids are ignored.  Returns how many were deleted."""
        ids = _check_ids(ids, "ids")
        if not ids:
            return 0
        with self._write_mutex:
            self._check_open()
            deleted, seq = self._store.delete(ids)
            with self._rw.write():
                self._apply(lambda: self._apply_delete(deleted), seq)
        return len(deleted)

    def _apply(self, fn: Callable[[], None], seq: int) -> None:
        """Apply a committed write to the in-memory state (write lock held).

        The write is durable once committed; should applying it fail (memory,
        hnswlib), the in-memory state is rebuilt from the store so that it
        matches what was acknowledged -- and only if that fails too does the
        error reach the caller (the index is then closed)."""
        try:
            fn()
            self._applied_seq = seq
            self._maintain()
        except Exception:
            log.exception("applying a committed write failed; rebuilding the index from the store")
            try:
                self._rebuild_from_store()
            except Exception:
                self._closed = True
                raise

    def _apply_upsert(self, ids, x, labels, holders) -> None:
        t = self._table
        changed = []
        for j, i in enumerate(ids):
            s = t.slot_of.get(i)
            if s is not None and np.array_equal(t.vectors[s], x[j]):
                # same vector: metadata only, the backend keeps its slot
                t.relabel(s, labels[j], holders[j])
            else:
                changed.append(j)
        if not changed:
            return
        if len(changed) < len(ids):
            ids = [ids[j] for j in changed]
            x = x[changed]
            labels = [labels[j] for j in changed]
            holders = [holders[j] for j in changed]
        new, old = t.upsert(ids, x, labels, holders)
        if len(old):
            self._backend.remove(t, old)
        self._backend.add(t, new)

    def _apply_delete(self, ids) -> None:
        slots = self._table.remove(ids)
        if len(slots):
            self._backend.remove(self._table, slots)

    # -- reads ----------------------------------------------------------------------------
    def get(self, item_id: str) -> Item | None:
        """The stored item, or ``None``."""
        if not isinstance(item_id, str):
            raise IndexInputError(f"id: expected str, got {type(item_id).__name__}")
        row = self._store.get(item_id)
        if row is None:
            return None
        return Item(row["id"], row["vector"], row["label"], row["payload"], row["holder"])

    def _allowed(self, filter_ids, labels, under) -> np.ndarray | None:
        t = self._table
        sets = []
        if filter_ids is not None:
            sets.append(t.slots_for_ids(filter_ids))
        if labels is not None:
            sets.append(t.slots_for_labels(labels))
        if under is not None:
            sets.append(t.slots_for_holders(under))
        if not sets:
            return None
        sets.sort(key=len)
        out = sets[0].intersection(*sets[1:]) if len(sets) > 1 else sets[0]
        return np.fromiter(sorted(out), dtype=np.int64, count=len(out))

    def search(
        self,
        queries,
        k: int = 10,
        *,
        filter_ids: Iterable[str] | None = None,
        labels: Iterable[str] | None = None,
        under: Iterable[str] | None = None,
        ef: int | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """The ``k`` nearest items of each query.

        Returns ``(ids, distances)`` of shape ``(q, min(k, m))`` where ``m`` is
        the number of live items passing the filters: ids as a numpy str array,
        exact float64 geodesic distances in ascending order.  Filters (combined
        by intersection): ``filter_ids`` (only these ids), ``labels`` (items
        whose label is in the set), ``under`` (items whose holding label is in
        the set — pass the descendants-or-self of a taxonomy node).
        """
        q = self._space.as_points(queries, "queries", allow_1d=True)
        k = _check_pos_int(k, "k")
        if ef is not None:
            ef = _check_pos_int(ef, "ef")
        fi = None if filter_ids is None else _check_str_set(filter_ids, "filter_ids")
        la = None if labels is None else _check_str_set(labels, "labels")
        un = None if under is None else _check_str_set(under, "under")
        with self._rw.read():
            self._check_open()
            allowed = self._allowed(fi, la, un)
            slots, dists = self._search_locked(q, k, allowed, ef)
            ids = self._ids_of(slots)
        return ids, dists

    def _search_locked(self, q, k, allowed, ef):
        n = self._table.n_alive if allowed is None else len(allowed)
        kk = min(k, n)
        if kk == 0 or len(q) == 0:
            return np.empty((len(q), kk), dtype=np.int64), np.empty((len(q), kk))
        slots, dists = self._backend.search(self._table, q, kk, allowed=allowed, ef=ef)
        bad = (slots == EMPTY).any(axis=1)
        if bad.any():  # never hand out padding: exact scan for those rows
            rows = np.nonzero(bad)[0]
            s, d = exact_search(self._space, self._table, None, q[rows], kk, allowed=allowed)
            slots[rows], dists[rows] = s, d
        return slots, dists

    def _ids_of(self, slots: np.ndarray) -> np.ndarray:
        ids = self._table.ids
        if slots.size == 0:
            return np.empty(slots.shape, dtype=str)
        return np.array([[ids[s] for s in row] for row in slots.tolist()], dtype=str)

    def search_hierarchical(
        self,
        query,
        chain: Sequence[str],
        descendants_of: Callable[[str], Iterable[str]],
        k: int = 10,
        offset: int = 0,
        *,
        ef: int | None = None,
    ) -> list[HierarchicalHit]:
        """Hierarchical (cone) search for one query vector.

        ``chain`` = ``[l0, l1, ..., root]`` with ``l0`` the query's label and
        ``l(i+1)`` the parent of ``l(i)``; ``descendants_of(label)`` gives the
        label's descendants (with or without itself).  Level ``i`` holds the
        items whose holding label is a descendant-or-self of ``l(i)`` and not
        of any earlier chain label; results are ordered by level, then by
        distance, and ``[offset, offset + k)`` of that order is returned as
        :class:`HierarchicalHit` ``(id, distance, level, via=l(i))``.
        """
        q = self._space.as_points(query, "query", allow_1d=True)
        if len(q) != 1:
            raise IndexInputError(f"query: expected one vector, got {len(q)}")
        k = _check_pos_int(k, "k")
        offset = _check_pos_int(offset, "offset", 0)
        if ef is not None:
            ef = _check_pos_int(ef, "ef")
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
            d = _check_str_set(descendants_of(lab), f"descendants_of({lab!r})")
            d.add(lab)
            levels.append(d - seen)
            seen |= d
        out: list[HierarchicalHit] = []
        with self._rw.read():
            self._check_open()
            t = self._table
            pos = 0  # rank of the first item of the current level
            for lvl, labs in enumerate(levels):
                need = offset + k - pos
                if need <= 0:
                    break
                count = t.count_for_holders(labs)
                if count == 0:
                    continue
                if pos + count <= offset:
                    pos += count
                    continue
                allowed = np.fromiter(
                    sorted(t.slots_for_holders(labs)), dtype=np.int64, count=count
                )
                take = min(count, need)
                slots, dists = self._search_locked(q, take, allowed, ef)
                for j in range(take):
                    if pos + j >= offset:
                        out.append(
                            HierarchicalHit(
                                t.ids[int(slots[0, j])], float(dists[0, j]), lvl, chain[lvl]
                            )
                        )
                pos += count
        return out[:k]

    # -- snapshots ------------------------------------------------------------------------
    def save(self, path: str | os.PathLike | None = None) -> Path:
        """Write a snapshot (and, for another folder, a copy of the store) to
        ``path`` (a folder; default: the index's own).  Returns the folder."""
        if path is None:
            if self._path is None:
                raise IndexInputError("path: an in-memory index needs a folder to save to")
            folder = self._path
        else:
            folder = Path(path)
            if folder.exists() and not folder.is_dir():
                raise IndexInputError(f"path: {folder} exists and is not a directory")
        folder.mkdir(parents=True, exist_ok=True)
        with self._save_mutex, self._rw.read():
            self._check_open()
            own = self._path is not None and _same_dir(folder, self._path)
            if not own:
                self._store.backup_to(folder)
            t = self._table
            live = t.live_slots()
            seq = self._applied_seq
            header = {
                "format_version": FORMAT_VERSION,
                "space": self._space.spec,
                "dim": self._space.dim,
                "curvature": self._curvature,
                "store_uuid": self._meta.get("store_uuid"),
                "backend": self._backend.name,
                "backend_params": self._backend.params,
                "last_seq": seq,
                "n_items": int(len(live)),
                "n_slots": t.n_slots,
            }
            blobs = {
                "slots": live.astype("<i8").tobytes(),
                "vectors": np.ascontiguousarray(t.vectors[live], dtype="<f8").tobytes(),
                "ids": json.dumps([t.ids[s] for s in live]).encode(),
                "labels": json.dumps([t.labels[s] for s in live]).encode(),
                "holders": json.dumps([t.holders[s] for s in live]).encode(),
            }
            for name, blob in self._backend.state().items():
                blobs["backend." + name] = blob
            snap, digest = write_snapshot(folder, seq, header, blobs)
            manifest = {
                "format_version": FORMAT_VERSION,
                "space": self._space.spec,
                "dim": self._space.dim,
                "curvature": self._curvature,
                "store_uuid": self._meta.get("store_uuid"),
                "backend": self._backend.name,
                "backend_params": self._backend.params,
                "backend_config": self._backend_config,
                "config_params": self._backend_params,
                "auto_threshold": self._auto_threshold,
                "item_count": int(len(live)),
                "last_seq": seq,
                "snapshot": snap,
                "sha256": digest,
            }
            write_manifest(folder, manifest)
        return folder

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
