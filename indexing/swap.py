"""Replace an index folder by another one in place, crash-safe.

An in-place restore (of the service's default collection: its index lives at a
fixed path, ``HYPSEARCH_INDEX``, which the CLI and every restart open by name)
must put the restored folder at that path. Two renames do it, and a marker
written before the first one makes a crash between them recoverable::

    <parent>/.<name>.restore-<rnd>/   the new folder (verified, fsynced, closed)
    <parent>/.<name>.swap.json        the marker: {"stage": ..., "old": ...}
    <parent>/.<name>.old-<rnd>/       the old folder, moved aside

:func:`swap_in` writes the marker, moves the old folder aside, moves the new one
to the path, removes the marker and then the old folder (each step fsyncs the
parent; entries named in ``carry``, such as the uploaded pictures' folder, move
from the old folder into the new one before it moves). :func:`recover` (run by
:func:`indexing.batches.open_index` and :meth:`indexing.HyperbolicIndex.load`
before they open a folder) rolls a
half-done swap forward: with a marker, the new folder ends at the path whatever
step the crash stopped at; without one (a crash before the marker), the old
folder is the index and leftover stages are removed. So a reader opens either
the old index or the new one, whole, never a mix. A restore holds
:func:`swap_lock` from staging to the end, and :func:`recover` touches nothing
while it is held (another process opening the index meanwhile, or the restore
itself opening the new folder).

Both folders must be closed while they move: SQLite in WAL mode keeps file
*names* (closing a store checkpoints and unlinks ``<folder>/store.sqlite3-wal``
by name), so the index using the old folder is closed before :func:`swap_in`
and the new one opened at the path after it.
"""

from __future__ import annotations

import fcntl
import glob
import json
import os
import shutil
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from models.fileio import atomic_write_bytes

from .store import fsync_dir

__all__ = ["STEPS", "recover", "stage_path", "swap_in", "swap_lock"]

#: the points of :func:`swap_in` at which its ``hook`` is called (crash tests stop there)
STEPS = ("swap-marked", "swap-old-moved", "swap-new-moved", "swap-committed")


def _marker(path: Path) -> Path:
    return path.parent / f".{path.name}.swap.json"


def stage_path(path: str | os.PathLike) -> Path:
    """A fresh folder name next to ``path`` for the new folder (same file system)."""
    path = Path(path)
    return path.parent / f".{path.name}.restore-{uuid.uuid4().hex[:8]}"


def swap_in(
    path: str | os.PathLike,
    stage: str | os.PathLike,
    *,
    carry: Sequence[str] = (),
    hook: Callable[[str], None] | None = None,
) -> None:
    """Put the folder ``stage`` (from :func:`stage_path`) at ``path``; the old folder
    at ``path`` (if any) is removed, except its entries named in ``carry`` (e.g. the
    uploaded pictures' ``images``), which move into the new one unless it has them.
    ``hook(step)`` is called after each step of :data:`STEPS`. Neither folder may be
    open."""
    path, stage = Path(path), Path(stage)
    if stage.parent != path.parent:
        raise ValueError(f"stage {stage} is not next to {path}")
    hook = hook or (lambda _step: None)
    parent = path.parent
    old = parent / f".{path.name}.old-{uuid.uuid4().hex[:8]}"
    marker = _marker(path)
    doc = {"format": 1, "stage": stage.name, "old": old.name, "carry": list(carry)}
    atomic_write_bytes(marker, json.dumps(doc).encode() + b"\n", mode=0o644)
    hook("swap-marked")
    if path.exists():
        os.replace(path, old)
        fsync_dir(parent)
    hook("swap-old-moved")
    _carry(old, stage, carry)
    os.replace(stage, path)
    fsync_dir(parent)
    hook("swap-new-moved")
    marker.unlink()
    fsync_dir(parent)
    hook("swap-committed")
    shutil.rmtree(old, ignore_errors=True)


def _carry(old: Path, new: Path, names) -> None:
    """Move the entries ``names`` of ``old`` into ``new`` (those it does not have)."""
    moved = False
    for name in names:
        src, dst = old / str(name), new / str(name)
        if Path(str(name)).name == str(name) and src.exists() and not dst.exists():
            os.replace(src, dst)
            moved = True
    if moved:
        fsync_dir(new)


@contextmanager
def swap_lock(path: str | os.PathLike, *, wait: bool = True) -> Iterator[bool]:
    """Hold ``<parent>/.<name>.swap.lock`` (``flock``): a restore holds it from the
    moment it stages the new folder until the swap is done, and :func:`recover`
    leaves the folders alone while anyone holds it (it is released when a process
    dies). Yields whether the lock is held (``wait=False``: maybe not)."""
    path = Path(path)
    if not path.parent.is_dir():
        yield True
        return
    fd = os.open(path.parent / f".{path.name}.swap.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def recover(path: str | os.PathLike, *, held: bool = False) -> str | None:
    """Finish (roll forward) a swap of ``path`` that a crash interrupted, and remove
    what a swap left behind; nothing while a swap of ``path`` runs (its
    :func:`swap_lock` is held), unless ``held`` (the caller holds it: a swap that
    failed in this process). Returns what was done (``None``: nothing)."""
    path = Path(path)
    if not _marker(path).exists() and not _leftovers(path):
        return None  # the usual case: one stat and one listing, no lock file written
    if held:
        return _recover(path)
    with swap_lock(path, wait=False) as free:
        return _recover(path) if free else None


def _leftovers(path: Path) -> list[Path]:
    parent = path.parent
    if not parent.is_dir():
        return []
    name = glob.escape(path.name)
    return [*parent.glob(f".{name}.restore-*"), *parent.glob(f".{name}.old-*")]


def _recover(path: Path) -> str | None:
    parent = path.parent
    marker = _marker(path)
    done = None
    if marker.exists():
        try:
            doc = json.loads(marker.read_text())
            stage, old = parent / doc["stage"], parent / doc["old"]
        except (ValueError, KeyError, TypeError):
            doc = None
        if doc is not None and stage.is_dir():  # the new folder is not at the path yet
            if path.exists():
                if old.exists():  # cannot happen (old is a fresh name); keep both
                    raise OSError(f"{path}: half-done swap with {old} and {stage} both present")
                os.replace(path, old)
                fsync_dir(parent)
            _carry(old, stage, doc.get("carry") or ())
            os.replace(stage, path)
            fsync_dir(parent)
            done = f"finished the swap of {path} (the restored folder is in place)"
        elif doc is not None and not path.exists() and old.is_dir():
            # the new folder is gone (removed by hand?): the old one goes back
            os.replace(old, path)
            fsync_dir(parent)
            done = f"rolled back the swap of {path} (its new folder was missing)"
        elif doc is not None:
            done = f"finished the swap of {path} (cleaned up)"
        else:
            done = f"removed an unreadable swap marker of {path}"
        marker.unlink()
        fsync_dir(parent)
    for p in _leftovers(path):
        shutil.rmtree(p, ignore_errors=True)
        done = done or f"removed {p.name}, left by an interrupted restore"
    return done
