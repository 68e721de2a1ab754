"""The threads of the graph backend (:mod:`.graph`): the pool the queries of one
search call are spread over (the compiled kernels release the GIL), how many, and
the per-call visited buffers of the searches."""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

#: queries per search thread at least (below that one thread answers them all)
MIN_CHUNK = 16

_threads_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
_search_threads = 0


def search_threads() -> int:
    """Threads the queries of one search call are spread over (the kernels
    release the GIL): :func:`set_search_threads`, else ``HYPSEARCH_SEARCH_THREADS``,
    else the CPUs of the process."""
    if _search_threads:
        return _search_threads
    env = os.environ.get("HYPSEARCH_SEARCH_THREADS", "")
    if env.strip().isdigit() and int(env) > 0:
        return int(env)
    return cpus()


def set_search_threads(n: int) -> None:
    """Spread every later search call over ``n`` threads (0: back to the default)."""
    global _search_threads
    _search_threads = max(0, int(n))


def executor(n: int) -> ThreadPoolExecutor:
    global _pool
    with _threads_lock:
        if _pool is None or _pool._max_workers < n:
            _pool = ThreadPoolExecutor(max_workers=n, thread_name_prefix="hypsearch-graph")
        return _pool


class VisitedPool:
    """Per-call visited buffers (uint8 stamps, cleared every 255 searches:
    :func:`._graph_kernels.search_batch`) so concurrent searches never share one."""

    def __init__(self) -> None:
        self._free: list[list] = []  # [buffer, stamp]
        self._lock = threading.Lock()

    def take(self, n: int) -> list:
        with self._lock:
            while self._free:
                item = self._free.pop()
                if len(item[0]) >= n:
                    return item
        return [np.zeros(max(n, 1024) + n // 4, dtype=np.uint8), 0]

    def give(self, item: list) -> None:
        with self._lock:
            self._free.append(item)

    def clear(self) -> None:
        with self._lock:
            self._free.clear()


def cpus() -> int:
    """The CPUs this process may run on."""
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1)
