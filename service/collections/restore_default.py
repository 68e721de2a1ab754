"""Restoring the default collection in place: its index stays at the folder the
service and the CLI open (``HYPSEARCH_INDEX``), swapped by
:func:`indexing.swap.swap_in` while requests wait."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from pathlib import Path
from typing import Any

from indexing import HyperbolicIndex
from indexing.geometry import make_index_space
from indexing.sharded import is_sharded
from indexing.swap import STEPS, recover, stage_path, swap_in, swap_lock

from ..errors import ApiError
from .archive import check_count, open_staged, verify_tar
from .names import DEFAULT
from .spaces import space_name
from .store import DRAIN_SECONDS, RESTORING, RETIRED, Served

log = logging.getLogger("service")

#: stops the process at a step of an in-place restore (crash tests): one of RESTORE_STEPS
CRASH_ENV = "HYPSEARCH_TEST_CRASH_AT"
RESTORE_STEPS = ("restore-staged", "restore-closed", *STEPS)


class DefaultRestoreMixin:
    """The in-place restore of the default collection, for
    :class:`service.collections.Collections`."""

    def _restore_default(self, tar: Path, sid: str) -> dict[str, Any]:
        """Restore the default collection in place (its index stays at the path the
        service and the CLI open, ``HYPSEARCH_INDEX``):

        1. the snapshot is verified and extracted next to the index folder, opened
           once (its space must be the collection's) and closed;
        2. index jobs are held off (409 while one runs), new requests wait
           (:meth:`Slot.begin_swap`) and the requests using the old index
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
            slot = self._entries[DEFAULT].slot
            old = slot.served
            if old is None:
                raise slot.unavailable()
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
            sums = verify_tar(tar, stage, self.settings.max_snapshot_bytes)
            staged = open_staged(lambda: HyperbolicIndex.load(stage))
            try:
                got = space_name(make_index_space(staged.dim, staged.curvature, staged.space))
                check_count(sums, len(staged))
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
        slot = self._entries[DEFAULT].slot
        slot.begin_swap()  # new requests wait from here
        try:
            if not old.wait_idle(DRAIN_SECONDS):
                shutil.rmtree(stage, ignore_errors=True)
                raise ApiError(
                    503,
                    f"collection: requests still used the default collection after "
                    f"{DRAIN_SECONDS:g} s; nothing was restored, retry",
                )
        except BaseException:
            slot.end_swap(old)
            raise
        # nothing uses the old runtime now; later writes that still hold it are refused
        old.runtime.retire(RETIRED)
        served = None
        try:
            old.close()
            _crash_point("restore-closed")
            carry = _inside(old.runtime.pictures.folder, path)
            swap_in(path, stage, carry=carry, hook=_crash_point)
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
            slot.end_swap(served)
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
