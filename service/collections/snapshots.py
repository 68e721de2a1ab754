"""Snapshots of a collection: taken, listed, fetched, deleted, and restored into
a named collection (the default collection is restored in place:
:mod:`service.collections.restore_default`)."""

from __future__ import annotations

import datetime as _dt
import json
import logging
import os
import shutil
import tarfile
import uuid
from pathlib import Path
from typing import Any

from models.fileio import atomic_write_bytes

from ..errors import ApiError
from .archive import (
    CHECKSUMS_FILE,
    SNAPSHOT_ID,
    check_count,
    open_staged,
    read_meta,
    sha256_file,
    verify_tar,
)
from .names import DEFAULT, utc_now
from .store import SWAP_WAIT_SECONDS

log = logging.getLogger("service")


class SnapshotsMixin:
    """Snapshots of :class:`service.collections.Collections`."""

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
                files = {p.name: sha256_file(p) for p in sorted(stage.iterdir()) if p.is_file()}
                sums = {
                    "format": 1,
                    "collection": target,
                    "space": served.runtime.space_name,
                    "items": len(index),
                    "created": utc_now(),
                    "files": files,
                }
                atomic_write_bytes(stage / CHECKSUMS_FILE, json.dumps(sums, indent=2).encode())
                tmp = snaps / f".{sid}.tar"
                with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
                    for fname in [CHECKSUMS_FILE, *files]:
                        tar.add(stage / fname, arcname=fname, recursive=False)
                with open(tmp, "rb+") as f:
                    os.fsync(f.fileno())
                digest = sha256_file(tmp)
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
            meta = read_meta(p)
            if meta is not None:
                out.append(meta)
        return out

    def snapshot_file(self, name: str, sid: str) -> tuple[Path, dict[str, Any]]:
        if not SNAPSHOT_ID.match(sid):
            raise ApiError(422, f"snapshot: {sid!r} is not a snapshot id")
        snaps = self._snapshot_dir(self.resolve(name))
        meta, tar = snaps / f"{sid}.json", snaps / f"{sid}.tar"
        info = read_meta(meta) if tar.exists() else None
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
        target = self._entry(name).name
        if sha256 is not None and sha256_file(upload) != sha256.lower():
            raise ApiError(422, "sha256: the upload does not have the checksum given")
        verify_tar(upload, None, self.settings.max_snapshot_bytes)  # 422 before any work
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
                "sha256": sha256_file(dest),
                "uploaded": utc_now(),
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
        if entry.record is None:  # the default collection's index: restored in place
            return self._restore_default(tar, sid)
        with entry.lock:
            rec = entry.record
            folder = self.root / rec["folder"]
            new_index = f"index-{uuid.uuid4().hex[:8]}"
            stage = folder / new_index
            try:
                sums = verify_tar(tar, stage, self.settings.max_snapshot_bytes)
                served = open_staged(lambda: self._open(rec, new_index))
                try:
                    check_count(sums, len(served.runtime))
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
                entry.slot.set(served)
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
