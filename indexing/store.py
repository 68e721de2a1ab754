"""Durability: the SQLite store of an index, the source of truth.

Layout of an index folder::

    store.sqlite3          the items (WAL journal, synchronous=FULL)
    manifest.json          describes the current snapshot  (:mod:`indexing.snapshot`)
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
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .errors import IndexStoreError
from .table import ItemBatch

__all__ = ["FORMAT_VERSION", "STORE_FILE", "Store", "fsync_dir"]

#: The version of the folder's format: the store's schema and the snapshot files.
FORMAT_VERSION = 1
STORE_FILE = "store.sqlite3"

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
            self._tx(lambda c: c.executemany(_UPSERT_META, items.items()))

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
    def upsert(self, items: ItemBatch, payloads: Sequence[str | None]) -> int:
        """Insert or replace items (``payloads``: JSON text) in one committed
        transaction; returns the last seq."""
        with self._lock:
            start = self._seq + 1
            vec = np.ascontiguousarray(items.vectors, dtype="<f8")
            labels, holders = items.labels, items.holders
            rows = [
                (i, start + j, vec[j].tobytes(), labels[j], holders[j], payloads[j])
                for j, i in enumerate(items.ids)
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

    def get_many(self, ids: Sequence[str], *, vectors: bool = True) -> dict[str, dict[str, Any]]:
        """The live items among ``ids`` (as :meth:`get` gives them; ``vectors=False``
        leaves ``vector`` out), by id."""
        cols = "id, seq, label, holder, payload" + (", vector" if vectors else "")
        out: dict[str, dict[str, Any]] = {}
        with self._lock:
            for a in range(0, len(ids), 500):
                chunk = list(ids[a : a + 500])
                q = ",".join("?" * len(chunk))
                for r in self._con.execute(
                    f"SELECT {cols} FROM items WHERE deleted=0 AND id IN ({q})", chunk
                ):
                    row = {
                        "id": r[0],
                        "seq": r[1],
                        "label": r[2],
                        "holder": r[3],
                        "payload": None if r[4] is None else json.loads(r[4]),
                    }
                    if vectors:
                        row["vector"] = np.frombuffer(r[5], dtype="<f8").astype(np.float64)
                    out[r[0]] = row
        return out

    def ids_after(self, after: str | None, limit: int) -> list[str]:
        """Up to ``limit`` live ids greater than ``after`` (all ids when ``None``), in
        id order (SQLite compares text by its UTF-8 bytes: code point order, as
        Python compares str)."""
        with self._lock:
            rows = self._con.execute(
                "SELECT id FROM items WHERE deleted=0 AND id > ? ORDER BY id LIMIT ?",
                ("" if after is None else after, int(limit)),
            ).fetchall()
        return [r[0] for r in rows]

    def payload_field(self, path: Sequence[str]) -> Iterator[tuple[str, Any]]:
        """``(id, value)`` of the field ``path`` of every live item's payload that has
        it (``value`` parsed: scalars as they are, arrays and objects from JSON)."""
        jp = "$" + "".join(f'."{seg}"' for seg in path)
        sql = (
            "SELECT id, json_type(payload, ?1), json_extract(payload, ?1) FROM items "
            "WHERE deleted=0 AND payload IS NOT NULL AND json_type(payload, ?1) IS NOT NULL"
        )
        with self._lock:
            rows = self._con.execute(sql, (jp,)).fetchall()
        for item_id, kind, value in rows:
            if kind in ("array", "object"):
                value = json.loads(value)
            elif kind == "true":
                value = True
            elif kind == "false":
                value = False
            elif kind == "null":
                value = None
            yield item_id, value

    def count_live(self) -> int:
        with self._lock:
            return int(
                self._con.execute("SELECT COUNT(*) FROM items WHERE deleted=0").fetchone()[0]
            )

    def iter_live(self, dim: int, batch: int = 50_000) -> Iterator[ItemBatch]:
        """Batches of the live items, by seq."""
        for items, _ in self._iter("deleted=0", (), dim, batch):
            yield items

    def iter_after(
        self, seq: int, dim: int, batch: int = 50_000
    ) -> Iterator[tuple[ItemBatch, list[bool]]]:
        """``(items, deleted)`` batches of the rows with a larger seq (tombstones
        included: ``deleted[j]`` is true for them, their vector is zero)."""
        yield from self._iter("seq>?", (int(seq),), dim, batch)

    def _iter(self, where, args, dim, batch):
        sql = f"SELECT id, vector, label, holder, deleted FROM items WHERE {where} ORDER BY seq"
        with self._lock:
            rows = self._con.execute(sql, args).fetchall()
        for a in range(0, len(rows), batch):
            part = rows[a : a + batch]
            vecs = np.zeros((len(part), dim), dtype=np.float64)
            for j, r in enumerate(part):
                if r[1] is not None:
                    vecs[j] = np.frombuffer(r[1], dtype="<f8")
            items = ItemBatch(
                [r[0] for r in part], vecs, [r[2] for r in part], [r[3] for r in part]
            )
            yield items, [bool(r[4]) for r in part]

    # -- label cones ---------------------------------------------------------------------
    def save_cones(
        self, meta: dict[str, str], rows: list[tuple[str, str | None, bytes | None]]
    ) -> None:
        with self._lock:

            def run(c):
                c.execute("DELETE FROM label_cones")
                c.executemany("INSERT INTO label_cones VALUES (?, ?, ?)", rows)
                c.executemany(_UPSERT_META, meta.items())

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
        fsync_dir(folder)

    def close(self) -> None:
        with self._lock:
            try:
                self._con.close()
            except sqlite3.Error:
                pass


def fsync_dir(folder: Path) -> None:
    """fsync a folder (a rename in it is durable after this); errors are ignored."""
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
