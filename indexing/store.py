"""Durability: the SQLite store (source of truth) and snapshot files (a cache).

Layout of an index folder::

    store.sqlite3          the items (WAL journal, synchronous=FULL)
    manifest.json          describes the current snapshot
    snapshot-<seq>-<rnd>.bin   the backend state at sequence number <seq>

SQLite schema (``FORMAT_VERSION`` 1)::

    meta(key TEXT PRIMARY KEY, value TEXT)   -- format_version, space, dim,
                                             -- curvature, store_uuid, cones_*
    items(id TEXT PRIMARY KEY, seq INTEGER, vector BLOB (float64 LE),
          label TEXT, holder TEXT, payload TEXT (JSON), deleted INTEGER)
    label_cones(label TEXT PRIMARY KEY, parent TEXT, vector BLOB)

Every write takes the next sequence numbers (one per row) and commits before it
returns.  A delete keeps a tombstone row (``deleted = 1``, vector and payload
cleared) with a fresh sequence number, so a snapshot taken before the delete is
corrected by replaying the rows with ``seq`` greater than the snapshot's.

A snapshot is written to a temporary file, fsynced and renamed; then the
manifest (which names it and carries its sha256) is written the same way, then
the folder is fsynced and older snapshots are removed.  A crash at any point
leaves either the old or the new (manifest, snapshot) pair.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import struct
import threading
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .errors import IndexStoreError

__all__ = [
    "FORMAT_VERSION",
    "STORE_FILE",
    "MANIFEST_FILE",
    "Store",
    "write_snapshot",
    "read_snapshot",
    "write_manifest",
    "read_manifest",
    "SnapshotError",
]

FORMAT_VERSION = 1
STORE_FILE = "store.sqlite3"
MANIFEST_FILE = "manifest.json"
_MAGIC = b"HYPSNAP\x01"

_UPSERT_META = "INSERT INTO meta VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value=excluded.value"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS items (
    id TEXT PRIMARY KEY,
    seq INTEGER NOT NULL,
    vector BLOB,
    label TEXT,
    holder TEXT,
    payload TEXT,
    deleted INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS items_seq ON items(seq);
CREATE TABLE IF NOT EXISTS label_cones (label TEXT PRIMARY KEY, parent TEXT, vector BLOB);
"""


class SnapshotError(Exception):
    """A snapshot or manifest is missing, corrupt or does not match the store."""


class Store:
    """The SQLite store of one index; ``folder=None`` keeps it in memory.

    One connection, guarded by a lock: the index serialises writes itself, the
    lock only keeps reads (``get``) off a connection that is mid-transaction.
    """

    def __init__(self, folder: str | os.PathLike | None, *, create: bool = True) -> None:
        self.folder = None if folder is None else Path(folder)
        if self.folder is None:
            target = ":memory:"
        else:
            db = self.folder / STORE_FILE
            if not db.exists():
                if not create:
                    raise FileNotFoundError(f"no index store at {db}")
                self.folder.mkdir(parents=True, exist_ok=True)
            target = str(db)
        self._lock = threading.RLock()
        self._con = sqlite3.connect(target, isolation_level=None, check_same_thread=False)
        if self.folder is not None:
            mode = self._con.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise IndexStoreError(f"{target}: cannot switch SQLite to WAL mode (got {mode})")
        self._con.execute("PRAGMA synchronous=FULL")
        self._con.executescript(_SCHEMA)
        self._seq = int(self._con.execute("SELECT COALESCE(MAX(seq), 0) FROM items").fetchone()[0])

    # -- meta ---------------------------------------------------------------------------
    def meta(self) -> dict[str, str]:
        with self._lock:
            return dict(self._con.execute("SELECT key, value FROM meta").fetchall())

    def init_meta(self, *, space: str, dim: int, curvature: float) -> dict[str, str]:
        """Write the meta data of a new store, or check an existing store's."""
        with self._lock:
            meta = self.meta()
            want = {"space": space, "dim": str(int(dim)), "curvature": repr(float(curvature))}
            if not meta:
                rows = {
                    "format_version": str(FORMAT_VERSION),
                    "store_uuid": uuid.uuid4().hex,
                    **want,
                }
                self._tx(lambda c: c.executemany("INSERT INTO meta VALUES (?, ?)", rows.items()))
                return rows
            self.check_format(meta)
            for key, value in want.items():
                if meta.get(key) != value:
                    raise IndexStoreError(
                        f"{self.folder}: the store holds {key}={meta.get(key)!r}, "
                        f"the index was asked for {key}={value!r}"
                    )
            return meta

    def check_format(self, meta: dict[str, str] | None = None) -> dict[str, str]:
        meta = self.meta() if meta is None else meta
        if not meta:
            raise IndexStoreError(f"{self.folder}: not an index store (no meta data)")
        if meta.get("format_version") != str(FORMAT_VERSION):
            raise IndexStoreError(
                f"{self.folder}: store format version {meta.get('format_version')!r}, "
                f"this code reads version {FORMAT_VERSION}"
            )
        return meta

    def set_meta(self, items: dict[str, str]) -> None:
        with self._lock:
            self._tx(
                lambda c: c.executemany(
                    _UPSERT_META,
                    items.items(),
                )
            )

    # -- transactions ----------------------------------------------------------------
    def _tx(self, fn):
        con = self._con
        con.execute("BEGIN IMMEDIATE")
        try:
            out = fn(con)
        except BaseException:
            con.execute("ROLLBACK")
            raise
        con.execute("COMMIT")
        return out

    @property
    def last_seq(self) -> int:
        return self._seq

    # -- writes ------------------------------------------------------------------------
    def upsert(
        self,
        ids: Sequence[str],
        vectors: np.ndarray,
        labels: Sequence[str | None],
        holders: Sequence[str | None],
        payloads: Sequence[str | None],
    ) -> int:
        """Insert or replace items in one committed transaction; returns the last seq."""
        with self._lock:
            start = self._seq + 1
            vec = np.ascontiguousarray(vectors, dtype="<f8")
            rows = [
                (i, start + j, vec[j].tobytes(), labels[j], holders[j], payloads[j])
                for j, i in enumerate(ids)
            ]
            self._tx(
                lambda c: c.executemany(
                    "INSERT INTO items (id, seq, vector, label, holder, payload, deleted) "
                    "VALUES (?, ?, ?, ?, ?, ?, 0) ON CONFLICT(id) DO UPDATE SET "
                    "seq=excluded.seq, vector=excluded.vector, label=excluded.label, "
                    "holder=excluded.holder, payload=excluded.payload, deleted=0",
                    rows,
                )
            )
            self._seq = start + len(rows) - 1
            return self._seq

    def set_holders(self, ids: Sequence[str], holders: Sequence[str | None]) -> int:
        """Update the holding labels of live items (new sequence numbers)."""
        with self._lock:
            start = self._seq + 1
            rows = [(h, start + j, i) for j, (i, h) in enumerate(zip(ids, holders, strict=True))]
            self._tx(
                lambda c: c.executemany(
                    "UPDATE items SET holder=?, seq=? WHERE id=? AND deleted=0", rows
                )
            )
            self._seq = start + len(rows) - 1 if rows else self._seq
            return self._seq

    def delete(self, ids: Sequence[str]) -> tuple[list[str], int]:
        """Tombstone the live items among ``ids``; returns ``(deleted_ids, last_seq)``."""
        with self._lock:

            def run(c):
                live = []
                for a in range(0, len(ids), 500):
                    chunk = list(ids[a : a + 500])
                    q = ",".join("?" * len(chunk))
                    live += [
                        r[0]
                        for r in c.execute(
                            f"SELECT id FROM items WHERE deleted=0 AND id IN ({q})", chunk
                        )
                    ]
                live.sort(key={i: n for n, i in enumerate(ids)}.__getitem__)
                start = self._seq + 1
                c.executemany(
                    "UPDATE items SET deleted=1, seq=?, vector=NULL, payload=NULL WHERE id=?",
                    [(start + j, i) for j, i in enumerate(live)],
                )
                return live, start

            live, start = self._tx(run)
            if live:
                self._seq = start + len(live) - 1
            return live, self._seq

    # -- reads -----------------------------------------------------------------------------
    def get(self, item_id: str) -> dict[str, Any] | None:
        with self._lock:
            row = self._con.execute(
                "SELECT id, seq, vector, label, holder, payload FROM items "
                "WHERE id=? AND deleted=0",
                (item_id,),
            ).fetchone()
        if row is None:
            return None
        return {
            "id": row[0],
            "seq": row[1],
            "vector": np.frombuffer(row[2], dtype="<f8").astype(np.float64),
            "label": row[3],
            "holder": row[4],
            "payload": None if row[5] is None else json.loads(row[5]),
        }

    def count_live(self) -> int:
        with self._lock:
            return int(
                self._con.execute("SELECT COUNT(*) FROM items WHERE deleted=0").fetchone()[0]
            )

    def iter_live(self, dim: int, batch: int = 50_000) -> Iterator[tuple]:
        """``(ids, vectors, labels, holders)`` batches of the live items, by seq."""
        yield from self._iter(
            "SELECT id, vector, label, holder, deleted FROM items WHERE deleted=0 ORDER BY seq",
            (),
            dim,
            batch,
        )

    def iter_after(self, seq: int, dim: int, batch: int = 50_000) -> Iterator[tuple]:
        """``(ids, vectors, labels, holders, deleted)`` batches of rows with a larger seq."""
        yield from self._iter(
            "SELECT id, vector, label, holder, deleted FROM items WHERE seq>? ORDER BY seq",
            (int(seq),),
            dim,
            batch,
            with_deleted=True,
        )

    def _iter(self, sql, args, dim, batch, with_deleted=False):
        with self._lock:
            rows = self._con.execute(sql, args).fetchall()
        for a in range(0, len(rows), batch):
            part = rows[a : a + batch]
            ids = [r[0] for r in part]
            vecs = np.zeros((len(part), dim), dtype=np.float64)
            for j, r in enumerate(part):
                if r[1] is not None:
                    vecs[j] = np.frombuffer(r[1], dtype="<f8")
            labels = [r[2] for r in part]
            holders = [r[3] for r in part]
            if with_deleted:
                yield ids, vecs, labels, holders, [bool(r[4]) for r in part]
            else:
                yield ids, vecs, labels, holders

    # -- label cones ---------------------------------------------------------------------
    def save_cones(
        self, meta: dict[str, str], rows: list[tuple[str, str | None, bytes | None]]
    ) -> None:
        with self._lock:

            def run(c):
                c.execute("DELETE FROM label_cones")
                c.executemany("INSERT INTO label_cones VALUES (?, ?, ?)", rows)
                c.executemany(
                    _UPSERT_META,
                    meta.items(),
                )

            self._tx(run)

    def load_cones(self) -> list[tuple[str, str | None, bytes | None]]:
        with self._lock:
            return self._con.execute("SELECT label, parent, vector FROM label_cones").fetchall()

    # -- copies ---------------------------------------------------------------------------
    def backup_to(self, folder: str | os.PathLike) -> None:
        """A consistent copy of the store as ``folder/store.sqlite3`` (replaced)."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        dest = folder / STORE_FILE
        for suffix in ("", "-wal", "-shm"):
            p = Path(str(dest) + suffix)
            if p.exists():
                p.unlink()
        tmp = sqlite3.connect(str(dest), isolation_level=None)
        try:
            with self._lock:
                self._con.backup(tmp)
            tmp.execute("PRAGMA journal_mode=WAL")
            tmp.execute("PRAGMA synchronous=FULL")
        finally:
            tmp.close()
        _fsync_dir(folder)

    def close(self) -> None:
        with self._lock:
            try:
                self._con.close()
            except sqlite3.Error:
                pass


# -- snapshot files ---------------------------------------------------------------------


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(str(folder), os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


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
    _fsync_dir(folder)
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
