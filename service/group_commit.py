"""Group commit of concurrent upserts: one index write (one SQLite transaction,
one fsync, one backend update) for every upsert that waited meanwhile.

:class:`GroupCommit` is the write path of :meth:`service.runtime.Runtime.upsert`.
Each caller queues its write and takes the runtime's write lock; whoever holds
the lock takes every queued write (its own among them, up to
:data:`MAX_GROUP_ITEMS` items), merges them in arrival order (an id written
twice keeps its last write, as writing one after the other would), applies
them with one call, and marks each done. A caller that gets the lock and finds
its write done returns at once. So a lone writer pays what it paid before, and
N concurrent writers share one fsync instead of queueing for N.

Every write is answered only once the group holding it is durable, and each
caller sees its own outcome: when the group's write fails on bad input
(:class:`indexing.IndexInputError`, which the service checks before queueing,
so this is rare), each write of the group is applied alone, so that only the
bad one fails; any other failure (the disk, a shard that does not answer)
fails every write of the group, none of which was acknowledged.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from indexing import IndexInputError

__all__ = ["MAX_GROUP_ITEMS", "GroupCommit"]

#: the most items one group commit writes (the rest wait for the next)
MAX_GROUP_ITEMS = 20_000


class _Write:
    __slots__ = ("done", "error", "ids", "labels", "payloads", "vectors")

    def __init__(self, ids, vectors, labels, payloads) -> None:
        self.ids = ids
        self.vectors = vectors
        self.labels = labels
        self.payloads = payloads
        self.done = False
        self.error: BaseException | None = None


Apply = Callable[[list[str], np.ndarray, list[str | None], list[Any] | None], None]


class GroupCommit:
    """Queued upserts applied in groups under ``lock`` by ``apply(ids, vectors,
    labels, payloads)`` (one durable write of unique ids); see the module docstring."""

    def __init__(self, lock: threading.Lock, apply: Apply, before: Callable[[], None]) -> None:
        self._lock = lock
        self._apply = apply
        self._before = before  # run under the lock before each group (raises: all fail)
        self._queue: list[_Write] = []
        self._queue_lock = threading.Lock()
        #: groups written and writes they held (tests, metrics)
        self.groups = 0
        self.writes = 0

    def submit(
        self,
        ids: Sequence[str],
        vectors: np.ndarray,
        labels: Sequence[str | None],
        payloads: Sequence[Any] | None,
    ) -> None:
        """Queue one upsert and return once it is durable (or raise its error)."""
        w = _Write(
            list(ids),
            np.asarray(vectors, dtype=np.float64),
            list(labels),
            None if payloads is None else list(payloads),
        )
        with self._queue_lock:
            self._queue.append(w)
        while True:
            with self._lock:
                if not w.done:
                    self._run_group()
            if w.done:
                break
        if w.error is not None:
            raise w.error

    def _take(self) -> list[_Write]:
        with self._queue_lock:
            n, cut = 0, 0
            for cut, w in enumerate(self._queue, 1):  # noqa: B007 - cut is used below
                n += len(w.ids)
                if n >= MAX_GROUP_ITEMS:
                    break
            group, self._queue = self._queue[:cut], self._queue[cut:]
        return group

    def _run_group(self) -> None:
        group = self._take()
        if not group:
            return
        try:
            self._before()
            self._write(group)
        except IndexInputError as e:
            if len(group) == 1:
                self._fail(group, e)
            else:  # which one: each alone
                for w in group:
                    try:
                        self._write([w])
                    except BaseException as e:  # noqa: BLE001 - that caller's own error
                        w.error = e
        except BaseException as e:  # noqa: BLE001 - every caller of the group gets it
            self._fail(group, e)
        finally:
            for w in group:
                w.done = True
            self.groups += 1
            self.writes += len(group)

    @staticmethod
    def _fail(group: list[_Write], e: BaseException) -> None:
        for w in group:
            w.error = e

    def _write(self, group: list[_Write]) -> None:
        if len(group) == 1:
            w = group[0]
            self._apply(w.ids, w.vectors, w.labels, w.payloads)
            return
        pos: dict[str, int] = {}
        ids: list[str] = []
        rows: list[np.ndarray] = []
        labels: list[str | None] = []
        payloads: list[Any] = []
        any_payload = any(w.payloads is not None for w in group)
        for w in group:
            for j, i in enumerate(w.ids):
                p = None if w.payloads is None else w.payloads[j]
                at = pos.get(i)
                if at is None:
                    pos[i] = len(ids)
                    ids.append(i)
                    rows.append(w.vectors[j])
                    labels.append(w.labels[j])
                    payloads.append(p)
                else:  # written again later in the group: the later write wins
                    rows[at], labels[at], payloads[at] = w.vectors[j], w.labels[j], p
        self._apply(ids, np.stack(rows), labels, payloads if any_payload else None)
