"""Snapshot files: a cache of an index's in-memory state beside its store.

A folder holds one ``snapshot-<seq>-<rnd>.bin`` and ``manifest.json``, which
names it and carries its sha256.  A snapshot file is::

    b"HYPSNAP\x01"  uint64 LE header length  header (JSON)  blob  blob ...

the header giving the blobs' names and lengths in order, besides the index's
identity (space, dim, curvature, store uuid), the backend and its parameters
and the store sequence number the state was taken at.  The blobs are the live
slots (int64 LE), their vectors (float64 LE), ids, labels and holding labels
(JSON) and the backend's own state (``backend.<name>``).

A snapshot is written to a temporary file, fsynced and renamed; then the
manifest is written the same way, then the folder is fsynced and older
snapshots are removed.  A crash at any point leaves either the old or the new
(manifest, snapshot) pair.

:func:`restore_snapshot` checks the manifest against the store (identity, and a
sequence number not ahead of the store's), the checksum and the sections,
restores the backend (or rebuilds it when the configuration now wants another)
and replays the store rows written after the snapshot.  Anything wrong raises
:class:`SnapshotError`; the index then rebuilds from the store.
"""

from __future__ import annotations

import hashlib
import json
import struct
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .backend_choice import BackendChoice
from .geometry import IndexSpace
from .live import LiveIndex
from .store import FORMAT_VERSION, Store, fsync_dir
from .table import ItemBatch, ItemTable

__all__ = [
    "MANIFEST_FILE",
    "SnapshotError",
    "read_manifest",
    "read_snapshot",
    "restore_snapshot",
    "save_snapshot",
    "write_manifest",
    "write_snapshot",
]

MANIFEST_FILE = "manifest.json"
_MAGIC = b"HYPSNAP\x01"


class SnapshotError(Exception):
    """A snapshot or manifest is missing, corrupt or does not match the store."""


# -- the file format --------------------------------------------------------------------


def _atomic_write(path: Path, chunks: Sequence[bytes]) -> str:
    """Write ``chunks`` to ``path`` atomically; returns the sha256 of the content."""
    from models.fileio import atomic_write_bytes

    return atomic_write_bytes(path, chunks, mode=0o644)


def write_snapshot(
    folder: Path, seq: int, header: dict[str, Any], blobs: dict[str, bytes]
) -> tuple[str, str]:
    """Write a snapshot file; returns ``(file name, sha256)``."""
    names = sorted(blobs)
    hdr = dict(header)
    hdr["blobs"] = [[n, len(blobs[n])] for n in names]
    raw = json.dumps(hdr, sort_keys=True).encode()
    name = f"snapshot-{int(seq):012d}-{uuid.uuid4().hex[:8]}.bin"
    chunks = [_MAGIC, struct.pack("<Q", len(raw)), raw] + [blobs[n] for n in names]
    digest = _atomic_write(folder / name, chunks)
    return name, digest


def read_snapshot(path: Path, sha256: str) -> tuple[dict[str, Any], dict[str, bytes]]:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise SnapshotError(f"snapshot file {path.name} is missing") from None
    if hashlib.sha256(data).hexdigest() != sha256:
        raise SnapshotError(f"snapshot file {path.name} is corrupt (sha256 mismatch)")
    if data[:8] != _MAGIC:
        raise SnapshotError(f"snapshot file {path.name}: not a snapshot")
    (n,) = struct.unpack("<Q", data[8:16])
    header = json.loads(data[16 : 16 + n])
    pos = 16 + n
    blobs = {}
    for name, length in header.pop("blobs"):
        blobs[name] = data[pos : pos + length]
        pos += length
    if pos != len(data):
        raise SnapshotError(f"snapshot file {path.name}: truncated or padded")
    return header, blobs


def write_manifest(folder: Path, manifest: dict[str, Any]) -> None:
    raw = json.dumps(manifest, indent=2, sort_keys=True).encode() + b"\n"
    _atomic_write(folder / MANIFEST_FILE, [raw])
    fsync_dir(folder)
    keep = manifest.get("snapshot")
    for p in folder.glob("snapshot-*.bin"):
        if p.name != keep:
            try:
                p.unlink()
            except OSError:
                pass
    for p in [*folder.glob(".snapshot-*.tmp"), *folder.glob(f".{MANIFEST_FILE}.*.tmp")]:
        try:
            p.unlink()
        except OSError:
            pass


def read_manifest(folder: Path) -> dict[str, Any]:
    path = folder / MANIFEST_FILE
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise SnapshotError("there is no snapshot (manifest.json is missing)") from None
    try:
        man = json.loads(raw)
    except ValueError:
        raise SnapshotError("manifest.json is corrupt (not JSON)") from None
    if not isinstance(man, dict):
        raise SnapshotError("manifest.json is corrupt (not an object)")
    if man.get("format_version") != FORMAT_VERSION:
        raise SnapshotError(
            f"manifest.json has format version {man.get('format_version')!r}, "
            f"expected {FORMAT_VERSION}"
        )
    return man


# -- an index's state -------------------------------------------------------------------


def save_snapshot(
    folder: Path, live: LiveIndex, identity: Mapping[str, Any], choice: BackendChoice
) -> None:
    """Write the snapshot of ``live`` and the manifest naming it to ``folder``.

    ``identity``: ``space``, ``dim``, ``curvature`` and ``store_uuid`` of the
    index, checked by :func:`restore_snapshot`."""
    t = live.table
    live_slots = t.live_slots()
    items = t.batch(live_slots)
    seq = live.applied_seq
    common = {
        "format_version": FORMAT_VERSION,
        **identity,
        "backend": live.backend.name,
        "backend_params": live.backend.params,
        "last_seq": seq,
    }
    header = {**common, "n_items": int(len(live_slots)), "n_slots": t.n_slots}
    blobs = {
        "slots": live_slots.astype("<i8").tobytes(),
        "vectors": np.ascontiguousarray(items.vectors, dtype="<f8").tobytes(),
        "ids": json.dumps(items.ids).encode(),
        "labels": json.dumps(items.labels).encode(),
        "holders": json.dumps(items.holders).encode(),
    }
    for name, blob in live.backend.state().items():
        blobs["backend." + name] = blob
    snap, digest = write_snapshot(folder, seq, header, blobs)
    manifest = {
        **common,
        **choice.manifest_fields(),
        "item_count": int(len(live_slots)),
        "snapshot": snap,
        "sha256": digest,
    }
    write_manifest(folder, manifest)


def restore_snapshot(
    folder: Path,
    identity: Mapping[str, Any],
    store: Store,
    space: IndexSpace,
    choice: BackendChoice,
) -> LiveIndex:
    """The state saved in ``folder``, brought up to date with ``store``."""
    man = read_manifest(folder)
    for key, want in identity.items():
        if man.get(key) != want:
            raise SnapshotError(
                f"the snapshot is stale ({key} {man.get(key)!r} "
                f"does not match the store's {want!r})"
            )
    last_seq = int(man.get("last_seq", -1))
    if last_seq < 0 or last_seq > store.last_seq:
        raise SnapshotError(
            f"the snapshot is stale (sequence {last_seq} is ahead of the store's {store.last_seq})"
        )
    header, blobs = read_snapshot(folder / str(man.get("snapshot")), str(man.get("sha256")))
    if header.get("last_seq") != last_seq or header.get("store_uuid") != man.get("store_uuid"):
        raise SnapshotError("the snapshot does not match its manifest")
    table = _read_table(header, blobs, space.dim)
    name = header.get("backend")
    want = choice.desired(table.n_alive, name)
    backend = choice.make(want)
    if want == name:
        state = {k[8:]: v for k, v in blobs.items() if k.startswith("backend.")}
        try:
            backend.restore(table, state)
        except Exception as exc:  # noqa: BLE001 - any failure means a corrupt snapshot
            raise SnapshotError(f"the snapshot's {name} state is corrupt ({exc})") from None
    else:
        backend.build(table)
    live = LiveIndex(space, choice, table, backend, last_seq)
    live.replay(store.iter_after(last_seq, space.dim))
    live.applied_seq = store.last_seq
    if live.table.n_alive != store.count_live():
        raise SnapshotError(
            f"the snapshot is stale ({live.table.n_alive} items after replay, "
            f"the store has {store.count_live()})"
        )
    live.maintain()
    return live


def _read_table(header: dict[str, Any], blobs: dict[str, bytes], dim: int) -> ItemTable:
    try:
        slots = np.frombuffer(blobs["slots"], dtype="<i8").astype(np.int64)
        vectors = np.frombuffer(blobs["vectors"], dtype="<f8").reshape(-1, dim)
        items = ItemBatch(
            json.loads(blobs["ids"]),
            vectors.copy(),
            json.loads(blobs["labels"]),
            json.loads(blobs["holders"]),
        )
        n_slots = int(header["n_slots"])
        sizes = {len(slots), len(vectors), len(items.ids), len(items.labels), len(items.holders)}
        if len(sizes) != 1:
            raise ValueError("section lengths differ")
        return ItemTable.from_slots(n_slots, slots, items)
    except (KeyError, ValueError, TypeError) as exc:
        raise SnapshotError(f"the snapshot is corrupt ({exc})") from None
