"""``Index``: what every index of hypsearch offers, and what the service relies on.

Three classes implement it: :class:`indexing.HyperbolicIndex` (one process, the
Poincaré ball), the same class over a product space (``space="poincare:8,
sphere:4,euclidean:4"``: mixed curvature, exact backend; label features are the
service's to refuse) and :class:`indexing.sharded.ShardedIndex` (N shards in this
process or in Ray actors, answering exactly what one index over the same items
answers). ``tests/indexing/test_index_interface.py`` checks that each has every member
below with a compatible signature; the service's type hints name this
Protocol only.

The members (each documented in full on :class:`~indexing.HyperbolicIndex`):

* properties ``dim``, ``curvature``, ``space``, ``path``, ``backend``, ``cones``;
* writes: ``add``, ``delete``, ``delete_where``, ``set_cones``;
* reads: ``get``, ``get_many``, ``ids``, ``item_labels``, ``contains_many``,
  ``len()``, ``in``;
* filters: ``filter_mask``, ``count``, ``scroll``;
* searches: ``search``, ``search_hierarchical``, ``search_entailment`` (and the
  ``entailment_candidates`` it merges across shards);
* life: ``save``, ``load`` (a classmethod), ``stats``, ``close``, ``with``.

Semantics every implementation keeps:

* ``scroll(where, limit, after)`` lists ids in id order (Python string order,
  SQLite's ``BINARY``), all greater than ``after``; ``next_after`` is the last id
  of the page when more follow, else ``None``: a full scroll lists every item
  that lives through it exactly once, whatever is written meanwhile.
* ``count(where)`` equals ``np.count_nonzero(filter_mask(where))``.
* ``filter_mask(where)`` is a boolean mask over the index's slots (a sharded
  index: shard 0's slots, then shard 1's, ...): comparable by its count, not
  position by position across implementations.
* Errors of bad input are :class:`~indexing.IndexInputError` raised before
  anything is written (a sharded index raises the shard's own error, never a
  wrapper); a shard that does not answer is
  :class:`~indexing.sharded.ShardUnavailableError`.

The Protocol is open: a member added to every implementation (for example a
search ranked by cone membership) is added here with it, and the signature test
then holds each class to it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypedDict, runtime_checkable

import numpy as np

if TYPE_CHECKING:
    from .cones import HierarchicalHit, LabelCones
    from .entailment import Candidates, EntailmentHit
    from .filters import Filter
    from .index import Item

__all__ = [
    "CandidateOptions",
    "EntailmentOptions",
    "Index",
    "LevelOptions",
    "SearchOptions",
    "run_calls",
]


class SearchOptions(TypedDict, total=False):
    """The keyword options of :meth:`Index.search` (an index that passes them on
    takes ``**options: Unpack[SearchOptions]``)."""

    filter_ids: Iterable[str] | None
    labels: Iterable[str] | None
    under: Iterable[str] | None
    ef: int | None
    where: Filter | Mapping | None


class LevelOptions(TypedDict, total=False):
    """The keyword options of :meth:`Index.search_hierarchical`."""

    ef: int | None
    by: str
    labels: Iterable[str] | None
    where: Filter | Mapping | None
    firmness: bool


class CandidateOptions(TypedDict, total=False):
    """The keyword options of :meth:`Index.entailment_candidates`."""

    labels: Iterable[str] | None
    where: Filter | Mapping | None
    extra: Sequence[tuple[str, Sequence[str]]]


class EntailmentOptions(CandidateOptions, total=False):
    """The keyword options of :meth:`Index.search_entailment`."""

    spread: bool


@runtime_checkable
class Index(Protocol):
    """What every index offers (see the module docstring)."""

    # -- properties ---------------------------------------------------------------
    @property
    def dim(self) -> int: ...

    @property
    def curvature(self) -> float: ...

    @property
    def space(self) -> str: ...

    @property
    def path(self) -> Path | None: ...

    @property
    def backend(self) -> str: ...

    @property
    def cones(self) -> LabelCones | None: ...

    # -- writes ---------------------------------------------------------------------
    def add(
        self,
        vectors,
        ids: Sequence[str],
        labels: Sequence[str | None] | None = None,
        payloads: Sequence[Any] | None = None,
    ) -> None: ...

    def delete(self, ids: Iterable[str]) -> int: ...

    def delete_where(self, where: Filter | Mapping) -> list[str]: ...

    def set_cones(self, cones: LabelCones | None) -> None: ...

    # -- reads ----------------------------------------------------------------------
    def __len__(self) -> int: ...

    def __contains__(self, item_id: object) -> bool: ...

    def ids(self) -> list[str]: ...

    def item_labels(self) -> dict[str, str | None]: ...

    def contains_many(self, ids: Sequence[str]) -> list[bool]: ...

    def get(self, item_id: str) -> Item | None: ...

    def get_many(self, ids: Sequence[str], *, vectors: bool = True) -> list[Item]: ...

    def filter_mask(self, where: Filter | Mapping) -> np.ndarray: ...

    def count(self, where: Filter | Mapping | None = None) -> int: ...

    def scroll(
        self,
        where: Filter | Mapping | None = None,
        limit: int = 100,
        after: str | None = None,
    ) -> tuple[list[str], str | None]: ...

    # -- searches -------------------------------------------------------------------
    def search(
        self,
        queries,
        k: int = 10,
        *,
        filter_ids: Iterable[str] | None = None,
        labels: Iterable[str] | None = None,
        under: Iterable[str] | None = None,
        ef: int | None = None,
        where: Filter | Mapping | None = None,
    ) -> tuple[np.ndarray, np.ndarray]: ...

    def search_hierarchical(
        self,
        query,
        chain: Sequence[str],
        descendants_of: Callable[[str], Iterable[str]],
        k: int = 10,
        offset: int = 0,
        *,
        ef: int | None = None,
        by: str = "holder",
        labels: Iterable[str] | None = None,
        where: Filter | Mapping | None = None,
        firmness: bool = False,
    ) -> list[HierarchicalHit]: ...

    def entailment_candidates(
        self,
        apex: str,
        query,
        want: int,
        *,
        labels: Iterable[str] | None = None,
        where: Filter | Mapping | None = None,
        extra: Sequence[tuple[str, Sequence[str]]] = (),
    ) -> Candidates: ...

    def search_entailment(
        self,
        apex: str,
        query,
        k: int = 10,
        offset: int = 0,
        *,
        spread: bool = True,
        labels: Iterable[str] | None = None,
        where: Filter | Mapping | None = None,
        extra: Sequence[tuple[str, Sequence[str]]] = (),
    ) -> list[EntailmentHit]: ...

    # -- life -----------------------------------------------------------------------
    def save(self, path: str | os.PathLike | None = None) -> Path: ...

    @classmethod
    def load(cls, path: str | os.PathLike, **kw: Any) -> Index: ...

    def stats(self) -> dict[str, Any]: ...

    def close(self) -> None: ...

    def __enter__(self) -> Index: ...

    def __exit__(self, *exc) -> None: ...


def run_calls(index: Index, calls: Sequence[tuple[str, tuple, dict]]) -> list:
    """The answers of several calls ``(method, args, kwargs)`` of ``index``, each what
    the call returns or the exception it raises (no call's failure reaches another).
    An index that makes them together (:meth:`indexing.sharded.ShardedIndex.run_calls`:
    the searches of a batch in one call per shard) does; any other makes them in turn."""
    together = getattr(index, "run_calls", None)
    if together is not None:
        return together(calls)
    out: list = []
    for method, args, kwargs in calls:
        try:
            out.append(getattr(index, method)(*args, **kwargs))
        except Exception as e:  # noqa: BLE001 - that call's answer
            out.append(e)
    return out
