"""Answers an index keeps until it changes (:class:`KeptAnswers`): label queries ask
the same question until a write, new cones or a compaction, and a label search of the
demo spent 80% of its time ranking every item by firmness."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

__all__ = ["CANDIDATE_CACHE", "SHARD_ANSWERS", "KeptAnswers", "KeptParts"]

#: unfiltered entailment candidates (and cone levels) kept per index
CANDIDATE_CACHE = 256
#: the shards' answers kept by a sharded index's caller (KeptParts)
SHARD_ANSWERS = 256


class KeptAnswers:
    """At most ``size`` answers by key, each with the index state it was computed in
    (the applied write, the item table, the cones: compared by identity). An answer
    asked for in another state is not returned, and everything kept is dropped then
    (the index changed). Thread-safe; the oldest answer goes first when full."""

    def __init__(self, size: int = CANDIDATE_CACHE) -> None:
        self.size = size
        self._lock = threading.Lock()
        self._kept: dict[tuple, tuple] = {}
        self._one: tuple | None = None  # (state, value) of :meth:`one`

    def one(self, state: tuple, build: Callable[[], Any]) -> Any:
        """The value ``build()`` made in ``state``, kept beside the answers (neither
        counted among them nor pushed out by them) until the state changes: what
        every answer of one state starts from (the index's holding labels, prepared
        for cone tests: :class:`indexing.cones.HeldAmong`)."""
        seq, t, cones = state
        with self._lock:
            got = self._one
            if got is not None:
                (seq0, t0, c0), value = got
                if seq0 == seq and t0 is t and c0 is cones:
                    return value
        value = build()
        with self._lock:
            self._one = (state, value)
        return value

    def __len__(self) -> int:
        return len(self._kept)

    def get(self, key: tuple, state: tuple) -> Any:
        """The answer kept under ``key`` in ``state``, else ``None``."""
        seq, t, cones = state
        with self._lock:
            hit = self._kept.get(key)
            if hit is None:
                return None
            (seq0, t0, c0), got = hit
            if seq0 == seq and t0 is t and c0 is cones:
                return got
            self._kept.clear()
        return None

    def put(self, key: tuple, state: tuple, value: Any) -> None:
        with self._lock:
            if len(self._kept) >= self.size:
                self._kept.pop(next(iter(self._kept)))
            self._kept[key] = (state, value)


class KeptParts:
    """At most :data:`SHARD_ANSWERS` answers of the shards by key, each with the shards' state
    (:meth:`indexing.shards.RayShards.state`) it was made in; one asked for in another
    state drops them all (the shards changed). Thread-safe; oldest out first."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._kept: OrderedDict[bytes, tuple[tuple, list]] = OrderedDict()

    def get(self, key: bytes, state: tuple) -> list | None:
        with self._lock:
            hit = self._kept.get(key)
            if hit is None:
                return None
            if hit[0] != state:
                self._kept.clear()
                return None
            self._kept.move_to_end(key)
            return hit[1]

    def put(self, key: bytes, state: tuple, parts: list) -> None:
        with self._lock:
            self._kept[key] = (state, parts)
            self._kept.move_to_end(key)
            while len(self._kept) > SHARD_ANSWERS:
                self._kept.popitem(last=False)
