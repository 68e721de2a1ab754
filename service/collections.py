"""Collections: several named indexes in one server, aliases, and snapshots over REST.

The collection ``default`` is the index the service was started with
(:attr:`service.deps.Services.runtime`); every other collection is a
:class:`service.runtime.Runtime` of its own, with its own space
(``poincare:D[@c]``), labels and optionally a model, kept under
``$HYPSEARCH_HOME/collections/``::

    collections/registry.json          collections and aliases (written atomically)
    collections/<name>-<rnd>/labels.safetensors   its label points (unless a model gives them)
    collections/<name>-<rnd>/index-<rnd>/         its index (the registry names the live one)
    collections/<name>-<rnd>/images/              pictures uploaded into it
    collections/<name>-<rnd>/snapshots/<id>.tar   its snapshots (and <id>.json)
    collections/_default/snapshots/               the default collection's snapshots

The registry file is the commit point of every change: a collection exists once
the registry names it, is dropped once the registry no longer does, and a
restore swaps the index folder the registry names (a crash leaves the old or
the new folder in use, never a half-written one; folders the registry does not
name are removed at the next start).

Requests reach a collection through :meth:`Collections.acquire` (by
:func:`service.deps.get_served`): it resolves aliases to a :class:`Served`
(runtime, search worker, embedding worker) and holds a lease on it until the
request is answered, so a dropped or restored collection is closed only once the
requests still using it are done: concurrent searches see the old or the new
state, never an error. The default collection is leased the same way, through its
:class:`DefaultSlot`, and is restored in place (:meth:`Collections._restore_default`:
its index folder is the one ``HYPSEARCH_INDEX`` names, swapped by
:func:`indexing.swap.swap_in`).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import json
import logging
import math
import os
import re
import shutil
import tarfile
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from indexing import HyperbolicIndex, IndexInputError
from indexing.build import BuildInputError, OutsideRootsError, check_under_roots
from indexing.geometry import IndexSpace, PoincareIndexSpace, make_index_space
from indexing.sharded import is_sharded
from indexing.store import fsync_dir
from indexing.swap import STEPS, recover, stage_path, swap_in, swap_lock
from models.fileio import atomic_write_bytes

from .errors import ApiError
from .jsontext import loads_bounded
from .runtime import Runtime, StartupError

log = logging.getLogger("service")

__all__ = [
    "DEFAULT",
    "NAME_PATTERN",
    "SNAPSHOT_PATTERN",
    "Collections",
    "Served",
]

DEFAULT = "default"
#: collection, alias and snapshot names: letters, digits, '_' and '-', 64 at most
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$"
SNAPSHOT_PATTERN = r"^[0-9]{8}T[0-9]{6}-[0-9a-f]{8}$"
_NAME = re.compile(NAME_PATTERN)
_SNAPSHOT = re.compile(SNAPSHOT_PATTERN)
_SYNSET = re.compile(r"^.+\.n\.\d\d$")  # WordNet noun synsets: their words are looked up
_MEMBER = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,200}$")
REGISTRY_FILE = "registry.json"
CHECKSUMS_FILE = "checksums.json"
LABELS_FILE = "labels.safetensors"
#: the cone family of label points placed by the cap construction
CAP_SPEC = {"theta0": 2.5, "beta": 0.5}
#: how long a dropped or replaced collection waits for the requests still using it
DRAIN_SECONDS = 60.0
#: how long a request waits for an in-place restore of the default collection
SWAP_WAIT_SECONDS = 120.0
RESTORING = "collection: the default collection is being restored; retry shortly"
RETIRED = "collection: it was restored or dropped while this write waited; retry"
#: stops the process at a step of an in-place restore (crash tests): one of RESTORE_STEPS
CRASH_ENV = "HYPSEARCH_TEST_CRASH_AT"
RESTORE_STEPS = ("restore-staged", "restore-closed", *STEPS)


@dataclass(eq=False)
class Served:
    """What requests of one collection use: the runtime and its workers."""

    runtime: Runtime
    searcher: Any  # MicroBatcher (searches)
    batcher: Any | None = None  # MicroBatcher (image embeddings), with a model
    owned: bool = True  # closed by the registry (not the default collection)
    _leases: int = 0
    _cond: threading.Condition = field(default_factory=threading.Condition)

    def acquire(self) -> Served:
        with self._cond:
            self._leases += 1
        return self

    def release(self) -> None:
        with self._cond:
            self._leases -= 1
            if self._leases <= 0:
                self._cond.notify_all()

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no request holds a lease (``False``: still used after ``timeout``)."""
        with self._cond:
            return self._cond.wait_for(lambda: self._leases <= 0, timeout=timeout)

    def close_when_idle(self, then: Callable[[], None] | None = None) -> None:
        """In a thread: wait until no request uses it (at most :data:`DRAIN_SECONDS`),
        close the workers and the index, then call ``then`` (remove its folder)."""

        def run() -> None:
            self.wait_idle(DRAIN_SECONDS)
            self.runtime.retire(RETIRED)
            self.close()
            if then is not None:
                try:
                    then()
                except OSError as e:
                    log.warning("removing a replaced collection folder failed: %s", e)

        threading.Thread(target=run, name="collection-close", daemon=True).start()

    def close(self) -> None:
        if self.batcher is not None:
            self.batcher.close()
        self.searcher.close()
        self.runtime.close()


class DefaultSlot:
    """The default collection's :class:`Served`, leased by every request that uses it
    (:func:`service.deps.get_services`, the search fast path), and swapped by an
    in-place restore: :meth:`begin_swap` makes new requests wait (:meth:`acquire`
    with ``wait``) until :meth:`end_swap` hands them the restored one."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.served: Served | None = None
        self.swapping = False

    def set(self, served: Served | None) -> None:
        with self._cond:
            self.served = served
            self.swapping = False
            self._cond.notify_all()

    def try_acquire(self) -> Served | None:
        """A lease on the current one, or ``None`` (a swap runs, or none is loaded yet)."""
        with self._cond:
            if self.swapping or self.served is None:
                return None
            return self.served.acquire()

    def acquire(self, wait: float = 0.0) -> Served | None:
        """A lease, waiting up to ``wait`` seconds for a swap to end (503 after);
        ``None`` while nothing is loaded. Blocks: call it off the event loop."""
        with self._cond:
            if not self._cond.wait_for(lambda: not self.swapping, timeout=wait):
                raise ApiError(503, RESTORING)
            return None if self.served is None else self.served.acquire()

    def begin_swap(self) -> Served:
        with self._cond:
            if self.swapping:
                raise ApiError(409, "collection: a restore of the default collection is running")
            if self.served is None:
                raise ApiError(503, "the default collection is not loaded")
            self.swapping = True
            return self.served

    def end_swap(self, served: Served | None) -> None:
        """Hand ``served`` (the restored one, or the old one when the swap was called
        off) to the requests waiting."""
        self.set(served)


@dataclass
class _Entry:
    """A named collection: its record in the registry and what serves it."""

    name: str
    record: dict[str, Any]  # space, model, taxonomy, folder, index, created
    served: Served | None = None
    error: str | None = None  # why it could not be opened at start
    lock: threading.Lock = field(default_factory=threading.Lock)  # restores, snapshots

    @property
    def space(self) -> str:
        return self.record["space"]


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _read_meta(path: Path) -> dict[str, Any] | None:
    """A kept snapshot's metadata, or ``None`` when it is missing or malformed."""
    try:
        raw = path.read_bytes()
        meta = json.loads(raw) if len(raw) <= MAX_CHECKSUMS_BYTES else None
    except (OSError, ValueError, RecursionError):
        return None
    return meta if _meta_ok(meta) else None


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def check_name(name: str, what: str = "name") -> str:
    if not isinstance(name, str) or not _NAME.match(name):
        raise ApiError(
            422, f"{what}: {name!r} is not a valid name (letters, digits, '_', '-'; 64 at most)"
        )
    return name


class Collections:
    """The registry of collections and aliases of one service (see the module docstring).

    ``slot``: the default collection's :class:`DefaultSlot`; ``unloaded``: the
    error answered while it holds nothing (loading, or loading failed);
    ``start``: builds the :class:`Served` of a runtime (its search worker, and its
    embedding worker when it has a model); ``jobs``: the index jobs (held off
    while the default collection is restored in place); ``on_default``: called
    with the restored default :class:`Served` (the app's fields and metrics)."""

    def __init__(
        self,
        settings,
        slot: DefaultSlot,
        start: Callable[[Runtime], Served],
        *,
        unloaded: Callable[[], ApiError] = lambda: ApiError(503, "the service is starting"),
        jobs=None,
        on_default: Callable[[Served], None] | None = None,
    ) -> None:
        self.settings = settings
        self.root = Path(settings.home) / "collections"
        self.slot = slot
        self._unloaded = unloaded
        self._start = start
        self._jobs = jobs
        self._on_default = on_default
        self._lock = threading.RLock()  # changes of the registry, one at a time
        self._default_lock = threading.Lock()  # in-place restores of the default collection
        self._entries: dict[str, _Entry] = {}
        self._pending: set[str] = set()  # collections being created (outside the lock)
        self._aliases: dict[str, str] = {}
        self.loaded = threading.Event()

    def close(self) -> None:
        """Close every named collection (at shutdown)."""
        with self._lock:
            for e in self._entries.values():
                if e.served is not None:
                    try:
                        e.served.close()
                    except Exception:  # noqa: BLE001 - the others are closed still
                        log.exception("closing collection %s failed", e.name)

    # -- the registry file ---------------------------------------------------------
    def _registry_path(self) -> Path:
        return self.root / REGISTRY_FILE

    def _write_registry(self, entries: dict[str, _Entry], aliases: dict[str, str]) -> None:
        doc = {
            "format": 1,
            "collections": {n: e.record for n, e in sorted(entries.items())},
            "aliases": dict(sorted(aliases.items())),
        }
        atomic_write_bytes(
            self._registry_path(), json.dumps(doc, indent=2).encode() + b"\n", mode=0o644
        )

    def load(self) -> None:
        """Open every collection of the registry (at start; errors are logged and
        answered 503 for that collection) and remove folders it does not name."""
        try:
            path = self._registry_path()
            if not path.exists():
                return
            try:
                doc = json.loads(path.read_text())
                records = dict(doc.get("collections", {}))
                aliases = dict(doc.get("aliases", {}))
            except (ValueError, TypeError, AttributeError) as e:
                log.error("collections: %s is unreadable (%s); serving only 'default'", path, e)
                return
            for name, rec in records.items():
                entry = _Entry(name, rec)
                try:
                    entry.served = self._open(rec)
                except (StartupError, ApiError, OSError, ValueError, IndexInputError) as e:
                    entry.error = str(getattr(e, "detail", e))
                    log.error("collection %s could not be opened: %s", name, entry.error)
                self._entries[name] = entry
            self._aliases = {a: c for a, c in aliases.items() if c in records or c == DEFAULT}
            self._clean_folders()
        finally:
            self.loaded.set()

    def _clean_folders(self) -> None:
        used = {e.record["folder"] for e in self._entries.values()}
        for p in self.root.glob(".upload-*"):
            p.unlink(missing_ok=True)
        for p in self.root.iterdir():
            if p.is_dir() and p.name not in used and p.name != "_default":
                shutil.rmtree(p, ignore_errors=True)
        for e in self._entries.values():
            folder = self.root / e.record["folder"]
            for p in folder.glob("index-*"):
                if p.name != e.record["index"]:
                    shutil.rmtree(p, ignore_errors=True)
            snaps = folder / "snapshots"
            for p in snaps.glob(".*") if snaps.exists() else ():
                shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink()

    # -- lookups -------------------------------------------------------------------
    def resolve(self, name: str) -> str:
        """The collection a name or an alias names (404 with detail when none)."""
        target = self._aliases.get(name, name)
        if target == DEFAULT or target in self._entries:
            return target
        if not self.loaded.is_set():
            raise ApiError(503, "the collections are still loading; retry shortly")
        raise ApiError(404, f"collection: no collection or alias {name!r}")

    def acquire(self, name: str, wait: float = 0.0) -> Served:
        """The :class:`Served` of a collection or alias, with a lease (release it).
        The default collection during an in-place restore: waits up to ``wait``
        seconds for the restored one (blocking: off the event loop), then 503."""
        target = self.resolve(name)
        if target == DEFAULT:
            served = self.slot.acquire(wait)
            if served is None:
                raise self._unloaded()
            return served
        entry = self._entries.get(target)
        if entry is None:  # dropped meanwhile
            raise ApiError(404, f"collection: no collection or alias {name!r}")
        served = entry.served
        if served is None:
            raise ApiError(
                503, f"collection {target!r} could not be opened (the service log says why)"
            )
        return served.acquire()

    def _entry(self, name: str) -> _Entry | None:
        """The named collection's entry; ``None`` for the default collection."""
        target = self.resolve(name)
        return None if target == DEFAULT else self._entries[target]

    def describe(self, name: str) -> dict[str, Any]:
        target = self.resolve(name)
        aliases = sorted(a for a, c in self._aliases.items() if c == target)
        if target == DEFAULT:
            served = self.acquire(DEFAULT)
            try:
                rt = served.runtime
                out = {
                    "name": DEFAULT,
                    "space": rt.space_name,
                    "model": rt.model_version,
                    "taxonomy": None,
                    "created": None,
                    "aliases": aliases,
                    "items": len(rt),
                    "dim": rt.dim,
                    "curvature": rt.curvature,
                    "labels": len(rt.taxonomy),
                }
            finally:
                served.release()
            return out
        else:
            entry = self._entries[target]
            rec = entry.record
            out = {
                "name": target,
                "space": rec["space"],
                "model": rec.get("model"),
                "taxonomy": rec.get("taxonomy_source"),
                "created": rec.get("created"),
            }
            rt = entry.served.runtime if entry.served is not None else None
        out["aliases"] = aliases
        if rt is not None:
            out.update(items=len(rt), dim=rt.dim, curvature=rt.curvature, labels=len(rt.taxonomy))
        else:
            out.update(items=None, dim=None, curvature=None, labels=None)
        return out

    def list(self) -> list[dict[str, Any]]:
        names = [DEFAULT, *sorted(self._entries)]
        out = []
        for n in names:
            try:
                out.append(self.describe(n))
            except ApiError:  # the default collection still loading
                continue
        return out

    def aliases(self) -> dict[str, str]:
        return dict(sorted(self._aliases.items()))

    # -- create and drop -------------------------------------------------------------
    def create(
        self, name: str, space: str, model: str | None, taxonomy: str | list | None
    ) -> dict[str, Any]:
        check_name(name)
        sp = _check_space(space, self.settings)
        if not isinstance(sp, PoincareIndexSpace) and (model is not None or taxonomy):
            raise ApiError(
                422,
                f"{'model' if model is not None else 'taxonomy'}: the product space "
                f"{sp.spec} holds vectors only (models and taxonomies embed in one "
                "Poincaré ball)",
            )
        with self._lock:
            if name == DEFAULT or name in self._entries or name in self._pending:
                raise ApiError(409, f"name: a collection {name!r} exists already")
            if name in self._aliases:
                raise ApiError(409, f"name: {name!r} is an alias")
            self._pending.add(name)  # the name is taken; the slow work runs unlocked
        try:
            return self._create(name, sp, model, taxonomy)
        finally:
            with self._lock:
                self._pending.discard(name)

    def _create(
        self, name: str, sp: IndexSpace, model: str | None, taxonomy: str | list | None
    ) -> dict[str, Any]:
        """The slow part of :meth:`create` (labels placed, index opened), outside the
        registry lock; the registry is written under it."""
        folder = f"{name}-{uuid.uuid4().hex[:8]}"
        rec: dict[str, Any] = {
            "space": _space_name(sp),
            "model": model,
            "taxonomy_source": taxonomy
            if isinstance(taxonomy, str)
            else ("inline" if taxonomy is not None else None),
            "folder": folder,
            "index": f"index-{uuid.uuid4().hex[:8]}",
            "created": _now(),
        }
        path = self.root / folder
        try:
            path.mkdir(parents=True)
            if isinstance(sp, PoincareIndexSpace):
                self._place_labels(path, sp, model, taxonomy)
            served = self._open(rec)
        except BaseException:
            shutil.rmtree(path, ignore_errors=True)
            raise
        with self._lock:
            entries = {**self._entries, name: _Entry(name, rec, served)}
            try:
                self._write_registry(entries, self._aliases)
            except BaseException:
                served.close()
                shutil.rmtree(path, ignore_errors=True)
                raise
            self._entries = entries
        return self.describe(name)

    def drop(self, name: str) -> dict[str, Any]:
        check_name(name)
        with self._lock:
            if name == DEFAULT:
                raise ApiError(409, "collection: the default collection cannot be dropped")
            if name in self._aliases:
                raise ApiError(
                    409,
                    f"collection: {name!r} is an alias; delete it with DELETE /v1/aliases/{name}",
                )
            entry = self._entries.get(name)
            if entry is None:
                raise ApiError(404, f"collection: no collection {name!r}")
            pointing = sorted(a for a, c in self._aliases.items() if c == name)
            if pointing:
                raise ApiError(
                    409,
                    f"collection: {name!r} is the target of the alias(es) {', '.join(pointing)}; "
                    "point them elsewhere or delete them first",
                )
            entries = {n: e for n, e in self._entries.items() if n != name}
            self._write_registry(entries, self._aliases)
            self._entries = entries
        folder = self.root / entry.record["folder"]
        if entry.served is not None:
            entry.served.close_when_idle(lambda: shutil.rmtree(folder, ignore_errors=True))
        else:
            shutil.rmtree(folder, ignore_errors=True)
        return {"name": name, "dropped": True}

    # -- aliases -----------------------------------------------------------------------
    def set_alias(self, alias: str, collection: str) -> dict[str, Any]:
        check_name(alias, "alias")
        check_name(collection, "collection")
        with self._lock:
            if alias == DEFAULT or alias in self._entries or alias in self._pending:
                raise ApiError(409, f"alias: {alias!r} is the name of a collection")
            if collection in self._aliases:
                raise ApiError(
                    422, f"collection: {collection!r} is an alias (aliases name collections)"
                )
            if collection != DEFAULT and collection not in self._entries:
                raise ApiError(404, f"collection: no collection {collection!r}")
            aliases = {**self._aliases, alias: collection}
            self._write_registry(self._entries, aliases)
            previous = self._aliases.get(alias)
            self._aliases = aliases  # one assignment: a request sees the old or the new map
        return {"alias": alias, "collection": collection, "previous": previous}

    def drop_alias(self, alias: str) -> dict[str, Any]:
        check_name(alias, "alias")
        with self._lock:
            if alias not in self._aliases:
                raise ApiError(404, f"alias: no alias {alias!r}")
            aliases = {a: c for a, c in self._aliases.items() if a != alias}
            self._write_registry(self._entries, aliases)
            self._aliases = aliases
        return {"alias": alias, "deleted": True}

    # -- opening ---------------------------------------------------------------------------
    def _default_runtime(self) -> Runtime:
        """The default collection's runtime, for its model, labels and taxonomy (which
        an in-place restore keeps: no lease needed)."""
        served = self.slot.served
        if served is None:
            raise self._unloaded()
        return served.runtime

    def _place_labels(self, folder: Path, sp: PoincareIndexSpace, model, taxonomy) -> None:
        """Check the model, or write the collection's label points (``labels.safetensors``):
        a label checkpoint of that space as it is, else the taxonomy (given, or the
        default collection's) placed by the cap construction in that space."""
        from models.labels import LabelEmbedding

        if model is not None:
            if taxonomy is not None:
                raise ApiError(
                    422, "taxonomy: a model brings its own labels; give one or the other"
                )
            m = self._load_model(model)
            if m.dim != sp.dim or abs(float(m.curvature) - sp.c) > 1e-9:
                raise ApiError(
                    422,
                    f"space: the model {model!r} embeds in "
                    f"poincare:{m.dim}@{float(m.curvature):g}, not poincare:{sp.dim}@{sp.c:g}",
                )
            return
        labels = None
        if taxonomy is None:
            base = self._default_runtime()
            tax = base.labels.taxonomy
            if base.dim == sp.dim and abs(base.curvature - sp.c) < 1e-9:
                labels = base.labels
        elif isinstance(taxonomy, list):
            tax = _inline_taxonomy(taxonomy)
        else:
            real = self._server_path(taxonomy, "taxonomy")
            if real.suffix == ".safetensors":
                try:
                    labels = LabelEmbedding.load(real)
                except Exception as e:  # noqa: BLE001 - a bad checkpoint of any kind
                    raise ApiError(
                        422, f"taxonomy: {taxonomy} is not a label checkpoint ({e})"
                    ) from None
                tax = labels.taxonomy
                if labels.dim != sp.dim or abs(float(labels.curvature) - sp.c) > 1e-9:
                    labels = None  # placed again in this space
            else:
                from models.taxonomy import Taxonomy

                try:
                    tax = Taxonomy.from_tsv(real)
                except (ValueError, OSError) as e:
                    raise ApiError(422, f"taxonomy: {taxonomy}: {e}") from None
        if labels is None:
            work, most = len(tax) * sp.dim**2, self.settings.max_label_work
            if work > most:
                raise ApiError(
                    422,
                    f"space: placing {len(tax):,} labels in {sp.dim:,} dimensions is "
                    f"{work:,} (labels x dimension^2), at most {most:,} "
                    "(HYPSEARCH_MAX_LABEL_WORK); use a smaller dimension or taxonomy",
                )
            labels = _cap_labels(tax, sp)
        labels.save(folder / LABELS_FILE)

    def _server_path(self, path: str, what: str) -> Path:
        try:
            real = check_under_roots(path, self.settings.data_roots, what)
        except OutsideRootsError as e:
            raise ApiError(403, str(e)) from None
        except (BuildInputError, ValueError) as e:
            raise ApiError(422, str(e)) from None
        if not real.is_file():
            raise ApiError(404, f"{what}: {path} is not a file")
        return real

    def _load_model(self, model: str):
        if model == DEFAULT:
            m = self._default_runtime().model
            if m is None:
                raise ApiError(422, "model: the default collection has no model")
            return m
        from models.checkpoint import CheckpointError
        from models.image_model import load_model

        real = self._server_path(model, "model")
        try:
            return load_model(str(real))
        except (CheckpointError, ValueError, OSError) as e:
            raise ApiError(422, f"model: {model}: {e}") from None

    def _open(self, rec: dict[str, Any], index_folder: str | None = None) -> Served:
        """The runtime of a collection record (its live index folder, or ``index_folder``)."""
        from models.labels import LabelEmbedding
        from models.taxonomy import with_words

        folder = self.root / rec["folder"]
        model = labels = None
        sp = _check_space(rec["space"])
        ball = isinstance(sp, PoincareIndexSpace)
        if rec.get("model") is not None:
            model = self._load_model(rec["model"])
            labels = model.labels
        elif ball:
            labels = LabelEmbedding.load(folder / LABELS_FILE)
        path = folder / (index_folder or rec["index"])
        if (path / "store.sqlite3").exists():
            index = HyperbolicIndex.load(path)
        elif ball:
            index = HyperbolicIndex(dim=sp.dim, curvature=sp.c, path=path)
        else:
            index = HyperbolicIndex(dim=sp.dim, space=sp.spec, path=path)
        try:
            got = make_index_space(index.dim, index.curvature, index.space)
            if _space_name(got) != _space_name(sp):
                raise ApiError(
                    422,
                    f"snapshot: its index is {_space_name(got)}, "
                    f"the collection's space is {rec['space']}",
                )
            if not ball:
                return self._start(Runtime(index, None, image_dir=folder / "images", data_dir=None))
            taxonomy = None
            try:
                base = self._default_runtime()
            except ApiError:
                base = None
            if base is not None and labels.taxonomy == base.labels.taxonomy:
                taxonomy = base.taxonomy  # with its words already
            if taxonomy is None and all(_SYNSET.match(n) for n in labels.taxonomy.names):
                taxonomy = with_words(labels.taxonomy, self.settings.wordnet_dir)
            rt = Runtime(
                index,
                labels,
                model,
                image_dir=folder / "images",
                data_dir=self.settings.data_dir,
                taxonomy=taxonomy,
                wordnet_dir=self.settings.wordnet_dir,
            )
        except BaseException:
            index.close()
            raise
        return self._start(rt)

    # -- snapshots ------------------------------------------------------------------------
    def _snapshot_dir(self, target: str) -> Path:
        if target == DEFAULT:
            return self.root / "_default" / "snapshots"
        return self.root / self._entries[target].record["folder"] / "snapshots"

    def create_snapshot(self, name: str) -> dict[str, Any]:
        """A checksummed snapshot of the collection (a tar of the index's store,
        snapshot file and manifest, with ``checksums.json``)."""
        target = self.resolve(name)
        served = self.acquire(target, wait=SWAP_WAIT_SECONDS)
        try:
            snaps = self._snapshot_dir(target)
            snaps.mkdir(parents=True, exist_ok=True)
            now = _dt.datetime.now(_dt.UTC)
            sid = f"{now:%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:8]}"
            stage = snaps / f".stage-{sid}"
            try:
                index = served.runtime.index
                index.save(stage)
                files = {p.name: _sha256_file(p) for p in sorted(stage.iterdir()) if p.is_file()}
                sums = {
                    "format": 1,
                    "collection": target,
                    "space": served.runtime.space_name,
                    "items": len(index),
                    "created": _now(),
                    "files": files,
                }
                atomic_write_bytes(stage / CHECKSUMS_FILE, json.dumps(sums, indent=2).encode())
                tmp = snaps / f".{sid}.tar"
                with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
                    for fname in [CHECKSUMS_FILE, *files]:
                        tar.add(stage / fname, arcname=fname, recursive=False)
                with open(tmp, "rb+") as f:
                    os.fsync(f.fileno())
                digest = _sha256_file(tmp)
                info = {
                    "snapshot": sid,
                    "collection": target,
                    "space": sums["space"],
                    "items": sums["items"],
                    "created": sums["created"],
                    "bytes": tmp.stat().st_size,
                    "sha256": digest,
                }
                tmp.replace(snaps / f"{sid}.tar")
                atomic_write_bytes(snaps / f"{sid}.json", json.dumps(info).encode(), mode=0o644)
            finally:
                shutil.rmtree(stage, ignore_errors=True)
                (snaps / f".{sid}.tar").unlink(missing_ok=True)
        finally:
            served.release()
        return info

    def snapshots(self, name: str) -> list[dict[str, Any]]:
        snaps = self._snapshot_dir(self.resolve(name))
        out = []
        for p in sorted(snaps.glob("*.json")) if snaps.exists() else ():
            meta = _read_meta(p)
            if meta is not None:
                out.append(meta)
        return out

    def snapshot_file(self, name: str, sid: str) -> tuple[Path, dict[str, Any]]:
        if not _SNAPSHOT.match(sid):
            raise ApiError(422, f"snapshot: {sid!r} is not a snapshot id")
        snaps = self._snapshot_dir(self.resolve(name))
        meta, tar = snaps / f"{sid}.json", snaps / f"{sid}.tar"
        info = _read_meta(meta) if tar.exists() else None
        if info is None:
            raise ApiError(404, f"snapshot: no snapshot {sid!r} of {name!r}")
        return tar, info

    def delete_snapshot(self, name: str, sid: str) -> dict[str, Any]:
        tar, _ = self.snapshot_file(name, sid)
        tar.with_suffix(".json").unlink(missing_ok=True)
        tar.unlink(missing_ok=True)
        return {"snapshot": sid, "deleted": True}

    def restore(self, name: str, sid: str) -> dict[str, Any]:
        tar, _ = self.snapshot_file(name, sid)
        out = self._restore_tar(name, tar, sid)
        out.pop("space", None)
        out.pop("created", None)
        return out

    def restore_upload(self, name: str, upload: Path, sha256: str | None) -> dict[str, Any]:
        """Restore an uploaded snapshot tar; it is kept as a snapshot of the collection
        only once it restored, with what the restored index says (its space, its
        count), never what the upload's ``checksums.json`` claims."""
        entry = self._entry(name)
        target = DEFAULT if entry is None else entry.name
        if sha256 is not None and _sha256_file(upload) != sha256.lower():
            raise ApiError(422, "sha256: the upload does not have the checksum given")
        _verify_tar(upload, None, self.settings.max_snapshot_bytes)  # 422 before any work
        now = _dt.datetime.now(_dt.UTC)
        sid = f"{now:%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:8]}"
        out = self._restore_tar(target, upload, sid)
        try:
            snaps = self._snapshot_dir(target)
            snaps.mkdir(parents=True, exist_ok=True)
            dest = snaps / f"{sid}.tar"
            shutil.move(upload, dest)
            meta = {
                "snapshot": sid,
                "collection": target,
                "space": out.pop("space"),
                "items": out["items"],
                "created": out.pop("created"),
                "bytes": dest.stat().st_size,
                "sha256": _sha256_file(dest),
                "uploaded": _now(),
            }
            atomic_write_bytes(snaps / f"{sid}.json", json.dumps(meta).encode(), mode=0o644)
        except (OSError, ApiError, KeyError) as e:  # restored; only the copy is missing
            log.warning("the restored upload %s was not kept as a snapshot: %s", sid, e)
        out.pop("space", None)
        out.pop("created", None)
        return out

    def _restore_tar(self, name: str, tar: Path, sid: str) -> dict[str, Any]:
        """Restore ``tar`` into the collection: extracted to a new folder, opened and
        counted (the count must be the one ``checksums.json`` lists) before the
        collection is switched to it. Answers also carry ``space`` and ``created``
        (for the kept copy's metadata; the routes leave them out)."""
        entry = self._entry(name)
        if entry is None:
            return self._restore_default(tar, sid)
        with entry.lock:
            rec = entry.record
            folder = self.root / rec["folder"]
            new_index = f"index-{uuid.uuid4().hex[:8]}"
            stage = folder / new_index
            try:
                sums = _verify_tar(tar, stage, self.settings.max_snapshot_bytes)
                served = _open_staged(lambda: self._open(rec, new_index))
                try:
                    _check_count(sums, len(served.runtime))
                except BaseException:
                    served.close()
                    raise
            except BaseException:
                shutil.rmtree(stage, ignore_errors=True)
                raise
            with self._lock:
                if self._entries.get(entry.name) is not entry:  # dropped meanwhile
                    served.close()
                    shutil.rmtree(stage, ignore_errors=True)
                    raise ApiError(404, f"collection: {entry.name!r} was dropped meanwhile")
                old_index, old = rec["index"], entry.served
                entry.record = {**rec, "index": new_index, "restored": sid}
                try:
                    self._write_registry(self._entries, self._aliases)
                except BaseException:
                    entry.record = rec
                    served.close()
                    shutil.rmtree(stage, ignore_errors=True)
                    raise
                entry.served = served
                entry.error = None
        old_path = folder / old_index
        if old is not None:
            old.close_when_idle(lambda: shutil.rmtree(old_path, ignore_errors=True))
        else:
            shutil.rmtree(old_path, ignore_errors=True)
        return {
            "collection": entry.name,
            "snapshot": sid,
            "restored": True,
            "items": len(served.runtime),
            "space": served.runtime.space_name,
            "created": sums.get("created"),
        }

    def _restore_default(self, tar: Path, sid: str) -> dict[str, Any]:
        """Restore the default collection in place (its index stays at the path the
        service and the CLI open, ``HYPSEARCH_INDEX``):

        1. the snapshot is verified and extracted next to the index folder, opened
           once (its space must be the collection's) and closed;
        2. index jobs are held off (409 while one runs), new requests wait
           (:meth:`DefaultSlot.begin_swap`) and the requests using the old index
           finish (at most :data:`DRAIN_SECONDS`; else the restore is called off
           with a 503 and nothing changes); the old runtime refuses writes from then
           on and is closed (its SQLite files unlinked by name while still its own);
        3. :func:`indexing.swap.swap_in` moves the folders (a marker first: a crash
           at any step comes back, at the next open, as the old index or the
           restored one, whole);
        4. the restored index is opened at the path and handed to the waiting
           requests.
        """
        if not self._default_lock.acquire(blocking=False):
            raise ApiError(409, "collection: a restore of the default collection is running")
        try:
            old = self.slot.served
            if old is None:
                raise self._unloaded()
            index = old.runtime.index
            path = index.path
            if path is None or is_sharded(path):
                raise ApiError(
                    409,
                    "collection: the default collection's index is not one folder (sharded "
                    "or in memory) and is not restored in place; restore the snapshot into "
                    "a named collection and point an alias at it",
                )
            path = Path(path)
            with swap_lock(path):
                return self._restore_default_at(old, path, tar, sid)
        finally:
            self._default_lock.release()

    def _restore_default_at(self, old: Served, path: Path, tar: Path, sid: str) -> dict[str, Any]:
        stage = stage_path(path)
        swapping = False
        try:
            sums = _verify_tar(tar, stage, self.settings.max_snapshot_bytes)
            staged = _open_staged(lambda: HyperbolicIndex.load(stage))
            try:
                got = _space_name(make_index_space(staged.dim, staged.curvature, staged.space))
                _check_count(sums, len(staged))
            finally:
                staged.close()
            if got != old.runtime.space_name:
                raise ApiError(
                    422,
                    f"snapshot: its index is {got}, the collection's space is "
                    f"{old.runtime.space_name}",
                )
            _crash_point("restore-staged")
            holding = self._jobs.hold(RESTORING, "restore it") if self._jobs else _no_hold()
            with holding:
                swapping = True  # from here a failure leaves the stage to indexing.swap
                served = self._swap_default(old, path, stage)
        except BaseException:
            if not swapping:
                shutil.rmtree(stage, ignore_errors=True)
            raise

        return {
            "collection": DEFAULT,
            "snapshot": sid,
            "restored": True,
            "items": len(served.runtime),
            "space": served.runtime.space_name,
            "created": sums.get("created"),
        }

    def _swap_default(self, old: Served, path: Path, stage: Path) -> Served:
        self.slot.begin_swap()  # new requests wait from here
        try:
            if not old.wait_idle(DRAIN_SECONDS):
                shutil.rmtree(stage, ignore_errors=True)
                raise ApiError(
                    503,
                    f"collection: requests still used the default collection after "
                    f"{DRAIN_SECONDS:g} s; nothing was restored, retry",
                )
        except BaseException:
            self.slot.end_swap(old)
            raise
        # nothing uses the old runtime now; later writes that still hold it are refused
        old.runtime.retire(RETIRED)
        served = None
        try:
            old.close()
            _crash_point("restore-closed")
            swap_in(path, stage, carry=_inside(old.runtime.image_dir, path), hook=_crash_point)
            index = HyperbolicIndex.load(path)
            try:
                served = self._start(old.runtime.with_index(index))
            except BaseException:
                index.close()
                raise
        except BaseException:
            log.exception("restoring the default collection in place failed")
            served = self._reopen_default(old, path)
            raise
        finally:
            self.slot.end_swap(served)
            if served is not None and self._on_default is not None:
                self._on_default(served)
        log.info("default collection restored in place: %d items", len(served.runtime))
        return served

    def _reopen_default(self, old: Served, path: Path) -> Served | None:
        """After a failed swap: whatever index is at the path (old or restored), or none."""
        try:
            done = recover(path, held=True)  # this restore holds the swap lock
            if done:
                log.warning("%s", done)
            index = HyperbolicIndex.load(path)
        except Exception:  # noqa: BLE001 - logged; the collection answers 503 then
            log.exception("reopening the default collection failed")
            return None
        try:
            return self._start(old.runtime.with_index(index))
        except Exception:  # noqa: BLE001 - as above
            index.close()
            log.exception("reopening the default collection failed")
            return None


def _inside(folder: Path | None, path: Path) -> tuple[str, ...]:
    """``(name,)`` when ``folder`` is an entry of ``path`` (the default collection's
    pictures, ``<HYPSEARCH_INDEX>/images`` unless configured elsewhere): carried
    into the restored folder, since snapshots do not hold pictures."""
    if folder is not None and Path(folder).parent.resolve() == path.resolve():
        return (Path(folder).name,)
    return ()


@contextlib.contextmanager
def _no_hold():
    yield


def _crash_point(step: str) -> None:
    """Crash tests: stop the process at ``step`` of an in-place restore when the
    environment says so (:data:`CRASH_ENV`)."""
    if os.environ.get(CRASH_ENV) == step:
        log.error("%s=%s: stopping the process here", CRASH_ENV, step)
        os._exit(70)


def _space_name(sp: IndexSpace) -> str:
    """``poincare:D@c`` for the ball, the product's own string otherwise."""
    return f"poincare:{sp.dim}@{sp.c:g}" if isinstance(sp, PoincareIndexSpace) else sp.spec


#: one factor of a space string: kind, dimension (7 digits at most), curvature
_FACTOR = re.compile(r"^\s*([a-z]+)\s*:\s*([0-9]{1,7})\s*(?:@\s*([^\s,@]{1,32})\s*)?$")
#: curvatures a space may have
CURVATURE_RANGE = (1e-6, 1e6)


def _space_bounds(space: str, max_dim: int, max_factors: int) -> None:
    """422 for a space string past the bounds, before anything is built for it:
    ``HYPSEARCH_MAX_SPACE_DIM`` dimensions in all, ``HYPSEARCH_MAX_SPACE_FACTORS``
    factors, curvatures in :data:`CURVATURE_RANGE`."""
    if not isinstance(space, str) or len(space) > 200:
        raise ApiError(422, "space: expected a space string of at most 200 characters")
    parts = space.split(",")
    if len(parts) > max_factors:
        raise ApiError(
            422,
            f"space: {len(parts)} factors, at most {max_factors} (HYPSEARCH_MAX_SPACE_FACTORS)",
        )
    total = 0
    for part in parts:
        m = _FACTOR.match(part)
        if m is None:
            raise ApiError(
                422,
                f"space: {part.strip()[:60]!r} is not kind:D or kind:D@c "
                "(e.g. poincare:10@1.0; D at most 7 digits)",
            )
        total += int(m.group(2))
        if m.group(3) is not None:
            try:
                c = float(m.group(3))
            except ValueError:
                raise ApiError(422, f"space: bad curvature {m.group(3)!r}") from None
            lo, hi = CURVATURE_RANGE
            if not (math.isfinite(c) and lo <= c <= hi):
                raise ApiError(422, f"space: curvature {m.group(3)} is outside [{lo:g}, {hi:g}]")
    if total > max_dim:
        raise ApiError(
            422,
            f"space: {total:,} dimensions, at most {max_dim:,} (HYPSEARCH_MAX_SPACE_DIM; "
            "vectors are at most 4,096 numbers)",
        )


def _check_space(space: str, settings=None) -> IndexSpace:
    """A collection's space: the Poincaré ball ``poincare:D[@c]`` (D >= 2) or a product
    (``poincare:8,sphere:4,euclidean:4``: vectors only, no labels or model), within
    the settings' bounds (:func:`_space_bounds`) when ``settings`` are given."""
    if settings is not None:
        _space_bounds(space, settings.max_space_dim, settings.max_space_factors)
    try:
        sp = make_index_space(None, 1.0, space)
    except (IndexInputError, ValueError, OverflowError) as e:
        raise ApiError(422, f"space: {str(e)[:300]}") from None
    if sp.dim < 2:
        raise ApiError(422, f"space: {space!r}: the dimension must be at least 2")
    return sp


def _inline_taxonomy(edges: list):
    from models.taxonomy import Taxonomy

    pairs = []
    for i, e in enumerate(edges):
        if (
            not isinstance(e, list | tuple)
            or len(e) != 2
            or not all(isinstance(s, str) and s.strip() for s in e)
        ):
            raise ApiError(422, f"taxonomy[{i}]: expected [child, parent], two non-empty names")
        pairs.append((e[0].strip(), e[1].strip()))
    if not pairs:
        raise ApiError(422, "taxonomy: no edges")
    try:
        return Taxonomy.from_edges(pairs)
    except ValueError as e:
        raise ApiError(422, f"taxonomy: {e}") from None


def _cap_labels(tax, sp: PoincareIndexSpace):
    """The taxonomy's nodes placed in the ball by the cap construction (no training)."""
    from models.geometry import cones as mcones
    from models.labels import LabelEmbedding
    from models.labels.construct import cap_construction

    spec = mcones.cone_spec("cap", **CAP_SPEC)
    placed = cap_construction(tax, sp.dim, curvature=sp.c, seed=0, **CAP_SPEC)
    emb = LabelEmbedding(
        tax,
        placed.points,
        sp.c,
        config={"init": "cap", "cone_theta0": CAP_SPEC["theta0"], "cone_beta": CAP_SPEC["beta"]},
    )
    emb.cone = dict(spec)
    return emb


#: the files of an index folder a snapshot may hold (nothing else is extracted)
_INDEX_FILE = re.compile(r"^(store\.sqlite3|manifest\.json|snapshot-[0-9]{1,20}-[0-9a-f]{8}\.bin)$")
STORE_MEMBER = "store.sqlite3"
#: checksums.json is read whole: at most this many bytes
MAX_CHECKSUMS_BYTES = 1024 * 1024
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def _checked_sums(sums: Any, bad: str) -> dict[str, Any]:
    """``checksums.json``, its fields checked: ``files`` maps names to sha256 digests,
    ``items`` is a count, ``space``, ``collection`` and ``created`` short strings (or
    absent). Nothing of it is trusted beyond that: what a restore reports and keeps
    is measured on the restored index."""
    if not isinstance(sums, dict):
        raise ApiError(422, f"{bad} (checksums.json is not an object)")
    files = sums.get("files")
    if not isinstance(files, dict) or not all(
        isinstance(v, str) and _SHA256.match(v) for v in files.values()
    ):
        raise ApiError(422, f"{bad} (checksums.json: files is not a map of sha256 digests)")
    items = sums.get("items")
    if items is not None and (isinstance(items, bool) or not isinstance(items, int) or items < 0):
        raise ApiError(422, f"{bad} (checksums.json: items is not a count)")
    for key, most in (("space", 200), ("collection", 64), ("created", 40)):
        v = sums.get(key)
        if v is not None and (not isinstance(v, str) or len(v) > most):
            raise ApiError(422, f"{bad} (checksums.json: {key} is not a string of at most {most})")
    return {
        "files": dict(files),
        "items": items,
        "space": sums.get("space"),
        "collection": sums.get("collection"),
        "created": sums.get("created"),
    }


def _verify_tar(tar: Path, dest: Path | None, max_bytes: int | None = None) -> dict[str, Any]:
    """Check a snapshot tar and extract it to ``dest`` when given; returns its
    ``checksums.json`` (checked: :func:`_checked_sums`). Raises a 422 :class:`ApiError`.

    Only an index folder's own files (``store.sqlite3``, required; ``manifest.json``
    and one ``snapshot-*.bin``, optional) and ``checksums.json`` are accepted, each a
    regular member (no links, devices or sparse members, which could expand far past
    the tar's size), each once, their sizes together within the tar's own size and
    ``max_bytes`` (``HYPSEARCH_MAX_SNAPSHOT_BYTES``); ``checksums.json`` is read with
    a bound and must list exactly those files, each matching its sha256."""
    bad = "snapshot: the upload is not a hypsearch snapshot"
    try:
        size = tar.stat().st_size
        with tarfile.open(tar, "r:") as tf:
            members = tf.getmembers()
            names = [m.name for m in members]
            if CHECKSUMS_FILE not in names or len(set(names)) != len(names):
                raise ApiError(422, f"{bad} (no checksums.json, or a member twice)")
            for m in members:
                if (
                    m.type not in (tarfile.REGTYPE, tarfile.AREGTYPE)
                    or m.issparse()
                    or any(k.startswith("GNU.sparse") for k in m.pax_headers)
                ):
                    raise ApiError(422, f"{bad} (member {m.name[:100]!r} is not a regular file)")
                if m.name != CHECKSUMS_FILE and not _INDEX_FILE.match(m.name):
                    raise ApiError(
                        422, f"{bad} (member {m.name[:100]!r} is not a file of an index folder)"
                    )
            if STORE_MEMBER not in names:
                raise ApiError(422, f"{bad} (no {STORE_MEMBER}: it holds no items)")
            total = sum(m.size for m in members)
            if total > size:
                raise ApiError(422, f"{bad} (its members are larger than the tar)")
            if max_bytes is not None and total > max_bytes:
                raise ApiError(
                    413,
                    f"snapshot: {total:,} bytes of files, over the limit of {max_bytes:,} "
                    "(HYPSEARCH_MAX_SNAPSHOT_BYTES)",
                )
            info = tf.getmember(CHECKSUMS_FILE)
            if info.size > MAX_CHECKSUMS_BYTES:
                raise ApiError(422, f"{bad} (checksums.json is over {MAX_CHECKSUMS_BYTES:,} bytes)")
            raw = tf.extractfile(info).read(MAX_CHECKSUMS_BYTES + 1)
            sums = _checked_sums(
                loads_bounded(
                    raw, "snapshot: checksums.json", max_bytes=MAX_CHECKSUMS_BYTES, max_depth=8
                ),
                bad,
            )
            files = sums["files"]
            if set(files) != set(names) - {CHECKSUMS_FILE}:
                raise ApiError(422, f"{bad} (checksums.json does not list its files)")
            if dest is not None:
                dest.mkdir(parents=True)
            for m in members:
                if m.name == CHECKSUMS_FILE:
                    continue
                h = hashlib.sha256()
                src = tf.extractfile(m)
                out = open(dest / m.name, "wb") if dest is not None else None  # noqa: SIM115
                try:
                    left = m.size
                    while left > 0:
                        chunk = src.read(min(1 << 20, left))
                        if not chunk:
                            break
                        left -= len(chunk)
                        h.update(chunk)
                        if out is not None:
                            out.write(chunk)
                    if out is not None:
                        out.flush()
                        os.fsync(out.fileno())
                finally:
                    if out is not None:
                        out.close()
                if h.hexdigest() != files[m.name]:
                    raise ApiError(422, f"snapshot: {m.name} is corrupt (sha256 mismatch)")
            if dest is not None:
                fsync_dir(dest)
    except (tarfile.TarError, OSError, ValueError, UnicodeDecodeError, EOFError) as e:
        raise ApiError(422, f"{bad} ({type(e).__name__}: {str(e)[:200]})") from None
    return sums


def _open_staged(open_it: Callable[[], Any]) -> Any:
    """``open_it()`` (a restored index folder opened), any failure of a store that does
    not open (garbage with a right checksum: SQLite's errors, a corrupt snapshot) a 422."""
    try:
        return open_it()
    except ApiError:
        raise
    except Exception as e:  # noqa: BLE001 - whatever a malformed store raises
        log.warning("a restored snapshot does not open: %s: %s", type(e).__name__, e)
        raise ApiError(
            422, f"snapshot: its index does not open ({type(e).__name__}: {str(e)[:200]})"
        ) from None


def _check_count(sums: dict[str, Any], got: int) -> None:
    want = sums.get("items")
    if want is not None and want != got:
        raise ApiError(
            422, f"snapshot: checksums.json lists {want:,} items, its store holds {got:,}"
        )


def _meta_ok(meta: Any) -> bool:
    """Whether a kept snapshot's ``<id>.json`` has the fields and types listings show."""
    if not isinstance(meta, dict):
        return False
    types = {
        "snapshot": str,
        "collection": str,
        "sha256": str,
        "bytes": int,
    }
    optional = {"space": str, "items": int, "created": str, "uploaded": str}
    for k, t in types.items():
        if not isinstance(meta.get(k), t) or isinstance(meta.get(k), bool):
            return False
    for k, t in optional.items():
        v = meta.get(k)
        if v is not None and (not isinstance(v, t) or isinstance(v, bool)):
            return False
    return True
