"""Dynamic micro-batching: image embeddings, and searches.

Concurrent requests each :meth:`MicroBatcher.submit` one item (a decoded
picture, a search query); a single worker thread takes the first waiting item,
waits at most ``max_wait`` seconds for more (up to ``max_size``), runs them in
one call (one forward pass; one index search per kind of query) and hands each
caller its own result -- or its own exception, when the call returns one in
that caller's place. Under load, batches fill without waiting; a lone request
waits ``max_wait`` at most (``0``: batches are whatever queued meanwhile).

Async routes ``await batcher.run(item)``: no thread-pool hop per request, the
event loop keeps reading requests while the worker computes.  Their results go
back through one callback on the loop (``call_soon_threadsafe``: one wake-up of
the loop for a batch, or for all the batches that came before the loop took the
first: not one a request), into plain asyncio futures (a
``concurrent.futures.Future`` per request, with its lock and condition, cost the
loop more than the search of a small index).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future

import numpy as np

log = logging.getLogger("service")

__all__ = ["MicroBatcher", "BatcherClosed"]


class BatcherClosed(RuntimeError):
    """The service is shutting down."""


class MicroBatcher:
    """``embed(list of items) -> n results`` (rows of an array, tuples, ...) behind a
    queue and one worker thread (or ``workers``, each taking its own batches: while
    one waits for a remote index's answers, the next batch is formed and sent); each
    caller gets its own result (an exception instance among the results is raised to
    that caller only)."""

    def __init__(
        self,
        embed: Callable[[list[np.ndarray]], Sequence],
        *,
        max_size: int = 32,
        max_wait: float = 0.002,
        on_batch: Callable[[int, float], None] | None = None,
        name: str = "embed-batcher",
        workers: int = 1,
    ) -> None:
        if max_size < 1:
            raise ValueError("max_size must be at least 1")
        if workers < 1:
            raise ValueError("workers must be at least 1")
        self._embed = embed
        self.max_size = int(max_size)
        self.max_wait = float(max_wait)
        self._on_batch = on_batch
        # (item, future, its event loop or None for a concurrent future)
        self._q: queue.SimpleQueue[tuple | None] = queue.SimpleQueue()
        self._closed = False
        self._threads = [
            threading.Thread(target=self._run, name=f"{name}-{j}" if j else name, daemon=True)
            for j in range(workers)
        ]
        for t in self._threads:
            t.start()

    def submit(self, image: np.ndarray) -> Future:
        """Queue one picture; the future's result is its row of ``embed``'s answer."""
        if self._closed:
            raise BatcherClosed("the embedding worker is stopped")
        fut: Future = Future()
        self._q.put((image, fut, None))
        return fut

    async def run(self, item):
        """The item's result, awaited on the event loop (no thread of the caller blocks)."""
        if self._closed:
            raise BatcherClosed("the embedding worker is stopped")
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._q.put((item, fut, loop))
        return await fut

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            for _ in self._threads:  # one stop for each worker
                self._q.put(None)
            for t in self._threads:
                t.join(timeout=10)

    def _run(self) -> None:
        while True:
            first = self._q.get()
            if first is None:
                break
            batch = [first]
            deadline = time.perf_counter() + self.max_wait
            stop = False
            while len(batch) < self.max_size:
                remaining = deadline - time.perf_counter()
                try:
                    nxt = self._q.get(timeout=remaining) if remaining > 0 else self._q.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    stop = True
                    break
                batch.append(nxt)
            self._process(batch)
            if stop:
                break
        # fail whatever is still queued (the other workers' stops put back for them)
        stops = 0
        while True:
            try:
                item = self._q.get_nowait()
            except queue.Empty:
                break
            if item is None:
                stops += 1
            else:
                _settle([(item, BatcherClosed("the embedding worker is stopped"), True)])
        for _ in range(stops):
            self._q.put(None)

    def _process(self, batch: list[tuple]) -> None:
        live = [e for e in batch if _start(e)]
        if not live:
            return
        t0 = time.perf_counter()
        try:
            z = self._embed([e[0] for e in live])
        except Exception as e:  # noqa: BLE001 - handed to every caller of the batch
            log.exception("embedding a batch of %d failed", len(live))
            _settle([(entry, e, True) for entry in live])
            return
        seconds = time.perf_counter() - t0
        _settle([(e, z[j], isinstance(z[j], BaseException)) for j, e in enumerate(live)])
        if self._on_batch is not None:
            try:
                self._on_batch(len(live), seconds)
            except Exception:  # noqa: BLE001 - metrics never break inference
                log.exception("batch metrics callback failed")


def _start(entry) -> bool:
    """Whether the caller of a queued entry still waits (a concurrent future is
    marked running; a cancelled one, or an awaited one cancelled, is dropped)."""
    _, fut, loop = entry
    if loop is None:
        return fut.set_running_or_notify_cancel()
    return not fut.done()


def _settle(results: list[tuple]) -> None:
    """Hand each ``(entry, value, is_exception)`` to its caller: concurrent futures
    here, asyncio futures through their loop's :class:`_Inbox`."""
    loops: dict = {}
    for (_, fut, loop), value, failed in results:
        if loop is None:
            if failed:
                fut.set_exception(value)
            else:
                fut.set_result(value)
        else:
            loops.setdefault(loop, []).append((fut, value, failed))
    for loop, items in loops.items():
        _Inbox.of(loop).put(items)


class _Inbox:
    """Results waiting for one event loop: the first batch to arrive wakes the loop
    (``call_soon_threadsafe``: a system call in the worker and a wake-up of the
    loop); batches that arrive before the loop has taken them join it without
    another (under load the loop is busy answering the previous batch)."""

    _all: dict = {}
    _all_lock = threading.Lock()

    def __init__(self, loop) -> None:
        self.loop = loop
        self.lock = threading.Lock()
        self.items: list[tuple] = []

    @classmethod
    def of(cls, loop) -> _Inbox:
        inbox = cls._all.get(loop)
        if inbox is None:
            with cls._all_lock:
                for old in [lp for lp in cls._all if lp.is_closed()]:
                    del cls._all[old]  # loops gone (tests make many)
                inbox = cls._all.setdefault(loop, cls(loop))
        return inbox

    def put(self, items: list[tuple]) -> None:
        with self.lock:
            wake = not self.items
            self.items.extend(items)
        if wake:
            try:
                self.loop.call_soon_threadsafe(self._take)
            except RuntimeError:  # the loop is closed: nobody awaits them any more
                with self.lock:
                    self.items.clear()

    def _take(self) -> None:
        with self.lock:
            items, self.items = self.items, []
        _resolve(items)


def _resolve(items: list[tuple]) -> None:
    """On the loop: set each awaited future (unless its caller gave up)."""
    for fut, value, failed in items:
        if fut.done():
            continue
        if failed:
            fut.set_exception(value)
        else:
            fut.set_result(value)
