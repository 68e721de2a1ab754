"""Atomic file writes, shared by checkpoints, taxonomy files and index snapshots,
and the read of a file a user named (one-line errors that name it).

Light on purpose (standard library only): the index's writer processes use it
without importing torch.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

__all__ = ["atomic_write_bytes", "read_named_file"]


def atomic_write_bytes(
    path: str | os.PathLike, data: bytes | Iterable[bytes], *, mode: int | None = None
) -> str:
    """Write ``data`` (bytes, or chunks of bytes) to ``path`` atomically; returns its sha256.

    A temporary file in the same folder is written, fsynced and renamed over
    ``path``, then the folder is fsynced: a reader sees the old file or the
    whole new one, never a part. ``mode`` sets the file's permissions
    (default: private, as ``mkstemp`` makes it).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    chunks = [data] if isinstance(data, bytes | bytearray | memoryview) else data
    h = hashlib.sha256()
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            for chunk in chunks:
                h.update(chunk)
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    try:  # make the rename itself durable
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass
    return h.hexdigest()


def read_named_file(
    path: str | os.PathLike,
    error: type[Exception],
    *,
    missing: str,
    directory: str,
    unreadable: str | None = None,
) -> bytes:
    """The bytes of the file at ``path``, a file a user named.

    A missing file raises ``error(missing)``, a folder ``error(directory)``,
    any other read failure ``error(unreadable)`` (or the ``OSError`` itself
    when ``unreadable`` is ``None``); the messages are format strings with
    ``{path}`` and ``{reason}`` (the system's words).
    """
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        raise error(missing.format(path=path)) from None
    except IsADirectoryError:
        raise error(directory.format(path=path)) from None
    except OSError as e:
        if unreadable is None:
            raise
        raise error(unreadable.format(path=path, reason=e.strerror)) from None
