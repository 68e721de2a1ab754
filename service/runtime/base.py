"""The one interface of a collection's runtime (:class:`Runtime`), what every
runtime shares (the index, the model, the pictures, the writes and the tallies
of labels they keep), and the runtime's domain errors."""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from indexing import Index, LabelCones
from indexing.geometry import IndexSpace
from models.taxonomy.graph import Taxonomy

from ..group_commit import GroupCommit
from ..pictures import Pictures


class StartupError(Exception):
    """The service cannot start with these artifacts (one line)."""


class LabelsUnsupportedError(Exception):
    """A label, cone or hierarchical feature asked of a product-space collection,
    which holds vectors only (answered 422)."""


class RetiredError(Exception):
    """A write reached a runtime that was replaced or dropped meanwhile (answered
    503, to be retried)."""


class Runtime(ABC):
    """A collection's index, model (optional) and labels, as the routes and
    :mod:`service.searching` use them: :class:`service.runtime.BallRuntime` (a
    Poincaré ball with labels, cones and hierarchical search) or
    :class:`service.runtime.ProductRuntime` (a product space: vectors and payloads
    only). Built by :func:`service.runtime.runtime_for`.

    Every write of the service goes through :meth:`upsert`, :meth:`delete` and
    :meth:`delete_where`, so the tallies of labels (each live item's label, how
    many items each label holds) always match the index."""

    #: a product space: vectors only (the label features raise :meth:`no_labels`)
    product: ClassVar[bool]
    #: bounds of a request's filter (``indexing.filters.FilterLimits``; set by the app)
    filter_limits: Any = None

    index: Index
    model: Any | None
    labels: Any | None  # models.labels.LabelEmbedding of a ball runtime
    space: IndexSpace
    taxonomy: Taxonomy
    dim: int
    curvature: float
    #: the labels' cones (a ball runtime), their family, and whether they hold the taxonomy
    cones: LabelCones | None
    cone_spec: dict
    cones_hold: bool
    #: the hierarchical mode's default levels: ``"cone"`` or ``"taxonomy"``
    default_levels: str

    def __init__(
        self,
        index: Index,
        model: Any | None,
        space: IndexSpace,
        image_dir: str | Path | None,
        data_dir: str | Path | None,
    ) -> None:
        self.index = index
        self.model = model
        self.space = space
        self.pictures = Pictures(image_dir, data_dir)  # the items' pictures
        self.retired: str | None = None  # why writes are refused (retire)
        self._write_lock = threading.Lock()  # one write at a time (index, then tallies)
        self._commits = GroupCommit(self._write_lock, self._apply_upsert, self._check_live)
        self._tally_lock = threading.Lock()  # tallies change or are copied under it
        self._item_label: dict[str, str | None] = {}
        self._counts: Counter[str] = Counter()
        self._version = 0

    # -- what the two runtimes answer differently ------------------------------------
    @property
    @abstractmethod
    def space_name(self) -> str:
        """The space string: ``poincare:D@c`` or the product's (``poincare:8,sphere:4,...``)."""

    @abstractmethod
    def with_index(self, index: Index) -> Runtime:
        """The same model, labels and folders around another index (an in-place restore)."""

    @abstractmethod
    def distance_to_origin(self, x: np.ndarray) -> np.ndarray:
        """Distance to the origin of one point (a float) or of rows."""

    @abstractmethod
    def used_labels(self) -> tuple[str, ...]:
        """The labels that live items carry, sorted."""

    @abstractmethod
    def used_under(self, node: str) -> set[str]:
        """Labels in use that are ``node`` or below it."""

    @abstractmethod
    def items_under(self, node: str) -> int:
        """Live items whose label is ``node`` or one of its descendants."""

    @abstractmethod
    def resolve(self, text: str) -> str:
        """Node for a synset name or a word (:class:`models.taxonomy.graph.UnknownLabelError`)."""

    @abstractmethod
    def nearest_used_labels(self, x: np.ndarray) -> list[str | None]:
        """For each row of ``x``: the label an item there gets (``None``: no labels)."""

    @abstractmethod
    def embed_labels(self, x: np.ndarray, k: int = 5) -> list[tuple[str, float]]:
        """The labels of ``/v1/embed`` (none without labels)."""

    @abstractmethod
    def label_point(self, name: str) -> np.ndarray:
        """A label's point of the label embedding (its cone's apex), float64 (D,)."""

    @abstractmethod
    def prototype(self, name: str) -> np.ndarray:
        """What a search by a label's name starts from, float64 (D,)."""

    @abstractmethod
    def cone_extras(self, label: str) -> tuple[tuple[str, tuple[str, ...]], ...]:
        """The taxonomy descendants of ``label`` that its cone cannot hold."""

    @abstractmethod
    def aperture(self, name: str) -> float:
        """The aperture of the label's cone."""

    @abstractmethod
    def chain(self, label: str, levels: str = "taxonomy") -> list[str]:
        """``[label, parent, grandparent, ..., root]`` of the hierarchical levels."""

    def no_labels(self, what: str = "label and hierarchical searches") -> LabelsUnsupportedError:
        """The error of a label feature asked of a product-space runtime."""
        return LabelsUnsupportedError(
            f"{what}: this collection has the product space {self.space.spec}: label, "
            "'under' and hierarchical features need a Poincaré-ball collection "
            "(search it by vector or by id)"
        )

    # -- shared -----------------------------------------------------------------------
    @property
    def model_version(self) -> str | None:
        if self.model is None:
            return None
        return getattr(self.model, "version", None) or "unsaved"

    def __len__(self) -> int:
        return len(self.index)

    def label_of(self, item_id: str) -> str | None:
        return self._item_label.get(item_id)

    def label_counts(self) -> dict[str, int]:
        with self._tally_lock:
            return dict(self._counts)

    def check_points(self, x: np.ndarray, name: str) -> np.ndarray:
        """Rows of the index's space (:meth:`indexing.geometry.IndexSpace.as_points`),
        or :class:`indexing.IndexInputError` naming ``name`` and the row."""
        return self.space.as_points(x, name, allow_1d=True)

    def close(self) -> None:
        self.index.close()

    # -- tallies --------------------------------------------------------------------
    def _load_tallies(self) -> None:
        self._item_label = self.index.item_labels()  # from memory (a sharded index: a call a shard)
        self._counts.update(lab for lab in self._item_label.values() if lab is not None)
        self._version += 1

    def _tally(self, item_id: str, label: str | None) -> None:
        """Record that ``item_id`` now has ``label`` (``None`` with ``delete``)."""
        old = self._item_label.get(item_id)
        if old is not None:
            self._counts[old] -= 1
            if self._counts[old] <= 0:
                del self._counts[old]
        self._item_label[item_id] = label
        if label is not None:
            self._counts[label] += 1

    def _untally(self, ids: list[str]) -> None:
        with self._tally_lock:
            for i in ids:
                if i in self._item_label:
                    self._tally(i, None)
                    del self._item_label[i]
            self._version += 1

    # -- retiring ---------------------------------------------------------------------
    def retire(self, why: str) -> None:
        """Refuse every later write (:class:`RetiredError` with ``why``): this runtime
        is being replaced (an in-place restore) or dropped; a write already running
        finishes first."""
        with self._write_lock:
            self.retired = why

    def _check_live(self) -> None:
        if self.retired is not None:
            raise RetiredError(self.retired)

    # -- writes ---------------------------------------------------------------------
    def upsert(
        self,
        ids: Sequence[str],
        vectors: np.ndarray,
        labels: Sequence[str | None],
        payloads: Sequence[Any] | None = None,
    ) -> None:
        """Upsert through the index (durable when this returns), then update the
        tallies. Raises :class:`indexing.IndexInputError` on bad input (a label
        given in a product space: :meth:`no_labels`). Concurrent upserts
        are written together, one transaction and one fsync for all
        (:mod:`service.group_commit`)."""
        if self.product and any(lab is not None for lab in labels):
            raise self.no_labels("label")
        self._commits.submit(ids, vectors, labels, payloads)

    def _apply_upsert(self, ids, vectors, labels, payloads) -> None:
        """One group of upserts (unique ids; the write lock held): index, then tallies."""
        self.index.add(vectors, ids, labels=labels, payloads=payloads)
        with self._tally_lock:
            for i, lab in zip(ids, labels, strict=True):
                self._tally(i, lab)
            self._version += 1

    def delete(self, ids: Iterable[str]) -> int:
        ids = list(ids)
        with self._write_lock:
            self._check_live()
            n = self.index.delete(ids)
            self._untally(ids)
        return n

    def delete_where(self, where) -> int:
        """Delete the items passing a filter (:meth:`indexing.Index.delete_where`:
        one committed transaction, one a shard); returns how many."""
        with self._write_lock:
            self._check_live()
            ids = self.index.delete_where(where)
            self._untally(ids)
        return len(ids)
