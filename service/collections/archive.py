"""The snapshot format: a tar of an index folder's files and ``checksums.json``,
checked member by member before anything of it is used."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from indexing.store import fsync_dir

from ..errors import ApiError
from ..jsontext import loads_bounded

log = logging.getLogger("service")

SNAPSHOT_PATTERN = r"^[0-9]{8}T[0-9]{6}-[0-9a-f]{8}$"
SNAPSHOT_ID = re.compile(SNAPSHOT_PATTERN)
CHECKSUMS_FILE = "checksums.json"


def read_meta(path: Path) -> dict[str, Any] | None:
    """A kept snapshot's metadata, or ``None`` when it is missing or malformed."""
    try:
        raw = path.read_bytes()
        meta = json.loads(raw) if len(raw) <= MAX_CHECKSUMS_BYTES else None
    except (OSError, ValueError, RecursionError):
        return None
    return meta if _meta_ok(meta) else None


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


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


def verify_tar(tar: Path, dest: Path | None, max_bytes: int | None = None) -> dict[str, Any]:
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


def open_staged(open_it: Callable[[], Any]) -> Any:
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


def check_count(sums: dict[str, Any], got: int) -> None:
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
