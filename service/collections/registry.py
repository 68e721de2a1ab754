"""The registry of collections and aliases (``registry.json``, the commit point of
every change), lookups, and creating and dropping collections."""

from __future__ import annotations

import json
import logging
import shutil
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from indexing import IndexInputError
from indexing.geometry import IndexSpace, PoincareIndexSpace
from models.fileio import atomic_write_bytes

from ..errors import ApiError
from ..runtime import Runtime, StartupError
from .aliases import AliasesMixin
from .names import DEFAULT, check_name, utc_now
from .restore_default import DefaultRestoreMixin
from .snapshots import SnapshotsMixin
from .spaces import check_space, space_name
from .store import Entry, Served, Slot, StoreMixin

log = logging.getLogger("service")

REGISTRY_FILE = "registry.json"


class Collections(StoreMixin, AliasesMixin, SnapshotsMixin, DefaultRestoreMixin):
    """The registry of collections and aliases of one service (see the module docstring).

    ``default``: the default collection's :class:`Slot` (the app fills it once its
    artifacts are loaded); ``start``: builds the :class:`Served` of a runtime (its
    search worker, and its embedding worker when it has a model); ``jobs``: the
    index jobs (held off while the default collection is restored in place)."""

    def __init__(
        self,
        settings,
        default: Slot,
        start: Callable[[Runtime], Served],
        *,
        jobs=None,
    ) -> None:
        self.settings = settings
        self.root = Path(settings.home) / "collections"
        self._start = start
        self._jobs = jobs
        self._lock = threading.RLock()  # changes of the registry, one at a time
        self._default_lock = threading.Lock()  # in-place restores of the default collection
        #: every collection by name, ``default`` included (its record is ``None``)
        self._entries: dict[str, Entry] = {DEFAULT: Entry(DEFAULT, None, default)}
        self._pending: set[str] = set()  # collections being created (outside the lock)
        self._aliases: dict[str, str] = {}
        self.loaded = threading.Event()

    def close(self) -> None:
        """Close every collection (at shutdown)."""
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

    def _write_registry(self, entries: dict[str, Entry], aliases: dict[str, str]) -> None:
        doc = {
            "format": 1,
            "collections": {
                n: e.record for n, e in sorted(entries.items()) if e.record is not None
            },
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
                entry = Entry(name, rec)
                try:
                    entry.slot.set(self._open(rec))
                except (StartupError, ApiError, OSError, ValueError, IndexInputError) as e:
                    entry.slot.fail(str(getattr(e, "detail", e)))
                    log.error("collection %s could not be opened: %s", name, entry.slot.error)
                self._entries[name] = entry
            self._aliases = {a: c for a, c in aliases.items() if c in self._entries}
            self._clean_folders()
        finally:
            self.loaded.set()

    def _named(self) -> list[Entry]:
        """The collections with a record (every one but the default collection)."""
        return [e for e in self._entries.values() if e.record is not None]

    def _clean_folders(self) -> None:
        used = {e.record["folder"] for e in self._named()}
        for p in self.root.glob(".upload-*"):
            p.unlink(missing_ok=True)
        for p in self.root.iterdir():
            if p.is_dir() and p.name not in used and p.name != "_default":
                shutil.rmtree(p, ignore_errors=True)
        for e in self._named():
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
        if target in self._entries:
            return target
        if not self.loaded.is_set():
            raise ApiError(503, "the collections are still loading; retry shortly")
        raise ApiError(404, f"collection: no collection or alias {name!r}")

    def slot(self, name: str) -> Slot:
        """The :class:`Slot` of a collection or alias (404 when none)."""
        entry = self._entries.get(self.resolve(name))
        if entry is None:  # dropped meanwhile
            raise ApiError(404, f"collection: no collection or alias {name!r}")
        return entry.slot

    def acquire(self, name: str, wait: float = 0.0) -> Served:
        """The :class:`Served` of a collection or alias, with a lease (release it).
        During an in-place restore: waits up to ``wait`` seconds for the restored
        one (blocking: off the event loop), then 503."""
        return self.slot(name).acquire(wait)

    def _entry(self, name: str) -> Entry:
        """The entry of a collection or alias."""
        return self._entries[self.resolve(name)]

    def describe(self, name: str) -> dict[str, Any]:
        target = self.resolve(name)
        entry = self._entries[target]
        if entry.record is not None:
            served = entry.served
            return self._described(entry.name, entry.record, served and served.runtime)
        # the default collection: its facts are its runtime's (503 while it loads)
        served = entry.slot.acquire()
        try:
            rt = served.runtime
            return self._described(target, {"space": rt.space_name, "model": rt.model_version}, rt)
        finally:
            served.release()

    def _described(self, name: str, rec: dict[str, Any], rt: Runtime | None) -> dict[str, Any]:
        """A collection as the REST API lists it: its record, aliases and runtime's size."""
        out = {
            "name": name,
            "space": rec["space"],
            "model": rec.get("model"),
            "taxonomy": rec.get("taxonomy_source"),
            "created": rec.get("created"),
            "aliases": sorted(a for a, c in self._aliases.items() if c == name),
        }
        if rt is not None:
            out.update(items=len(rt), dim=rt.dim, curvature=rt.curvature, labels=len(rt.taxonomy))
        else:
            out.update(items=None, dim=None, curvature=None, labels=None)
        return out

    def list(self) -> list[dict[str, Any]]:
        names = [DEFAULT, *sorted(n for n in self._entries if n != DEFAULT)]
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
        sp = check_space(space, self.settings)
        if not isinstance(sp, PoincareIndexSpace) and (model is not None or taxonomy):
            raise ApiError(
                422,
                f"{'model' if model is not None else 'taxonomy'}: the product space "
                f"{sp.spec} holds vectors only (models and taxonomies embed in one "
                "Poincaré ball)",
            )
        with self._lock:
            if name in self._entries or name in self._pending:
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
            "space": space_name(sp),
            "model": model,
            "taxonomy_source": taxonomy
            if isinstance(taxonomy, str)
            else ("inline" if taxonomy is not None else None),
            "folder": folder,
            "index": f"index-{uuid.uuid4().hex[:8]}",
            "created": utc_now(),
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
            entry = Entry(name, rec)
            entry.slot.set(served)
            entries = {**self._entries, name: entry}
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
