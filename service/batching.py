"""Dynamic micro-batching: image embeddings, and searches.

Concurrent requests each :meth:`MicroBatcher.submit` one item (a decoded
picture, a search query); a single worker thread takes the first waiting item,
waits at most ``max_wait`` seconds for more (up to ``max_size``), runs them in
one call (one forward pass; one index search per kind of query) and hands each
caller its own result -- or its own exception, when the call returns one in
that caller's place. Under load, batches fill without waiting; a lone request
waits ``max_wait`` at most (``0``: batches are whatever queued meanwhile).

Async routes ``await batcher.run(item)``: no thread-pool hop per request, the
event loop keeps reading requests while the worker computes.
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
        self._q: queue.SimpleQueue[tuple[np.ndarray, Future] | None] = queue.SimpleQueue()
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
        self._q.put((image, fut))
        return fut

    async def run(self, item):
        """The item's result, awaited on the event loop (no thread of the caller blocks)."""
        return await asyncio.wrap_future(self.submit(item))

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
            elif not item[1].done():
                item[1].set_exception(BatcherClosed("the embedding worker is stopped"))
        for _ in range(stops):
            self._q.put(None)

    def _process(self, batch: list[tuple[np.ndarray, Future]]) -> None:
        live = [(im, f) for im, f in batch if f.set_running_or_notify_cancel()]
        if not live:
            return
        t0 = time.perf_counter()
        try:
            z = self._embed([im for im, _ in live])
        except Exception as e:  # noqa: BLE001 - handed to every caller of the batch
            log.exception("embedding a batch of %d failed", len(live))
            for _, f in live:
                f.set_exception(e)
            return
        seconds = time.perf_counter() - t0
        for j, (_, f) in enumerate(live):
            if isinstance(z[j], BaseException):
                f.set_exception(z[j])
            else:
                f.set_result(z[j])
        if self._on_batch is not None:
            try:
                self._on_batch(len(live), seconds)
            except Exception:  # noqa: BLE001 - metrics never break inference
                log.exception("batch metrics callback failed")
