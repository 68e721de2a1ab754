"""What the service holds while it runs: the model, the labels, the index.

:class:`Runtime` is built once by the app's lifespan (or by a test, around a
small index) and injected into the routes (:mod:`service.deps`). It adds to
the index what HTTP needs and the index does not keep in memory: the label of
every live item (so answers name labels without a store round trip), how many
items each label holds, and the label prototypes of the labels in use.

It also installs the label checkpoint's entailment cones on the index
(:func:`label_cones`: every taxonomy node's point, its cone family
:func:`models.prototypes.label_cone_spec`, each node under the parent whose cone
holds it), so every upsert and build stores the item's holding label (the
deepest label whose cone holds its point) and a restart keeps them (the
cones' fingerprint is in the index's store: the same labels recompute nothing).
The hierarchical mode's default levels are by cone (``"cone"``) when the loaded
labels' cones hold their taxonomy (at least :data:`HOLD_SHARE` of the non-root
nodes inside a parent's cone) and the model puts images inside them (its
``places_in_cones``: trained with the cone term, or the pretrained placement;
with no model, vectors are the user's and the cones are trusted):
:attr:`Runtime.cones_hold`. Otherwise they are by the taxonomy chain
(``"taxonomy"``), and ``/v1/embed`` answers the nearest nodes only.

Every write of the service goes through :meth:`Runtime.upsert` and
:meth:`Runtime.delete`, so those tallies always match the index.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from indexing import Index, LabelCones
from indexing.build import open_index
from indexing.geometry import PoincareIndexSpace, make_index_space
from models.geometry import cones as mcones
from models.geometry import poincare_np
from models.labels import LabelEmbedding
from models.prototypes import Prototypes, label_cone_spec, prediction_labels
from models.taxonomy.graph import Taxonomy, with_words
from models.taxonomy.wordnet import WordResolver

from .group_commit import GroupCommit
from .pictures import Pictures

log = logging.getLogger("service")

__all__ = [
    "HOLD_SHARE",
    "LabelsUnsupportedError",
    "RetiredError",
    "Runtime",
    "StartupError",
    "label_cones",
    "open_runtime",
]

#: the share of non-root taxonomy nodes that a parent's cone must hold for the
#: labels' cones to count as holding the taxonomy (cone levels by default)
HOLD_SHARE = 0.95


class StartupError(Exception):
    """The service cannot start with these artifacts (one line)."""


class LabelsUnsupportedError(Exception):
    """A label, cone or hierarchical feature asked of a product-space collection,
    which holds vectors only (answered 422)."""


class RetiredError(Exception):
    """A write reached a runtime that was replaced or dropped meanwhile (answered
    503, to be retried)."""


@dataclass(frozen=True)
class _LabelView:
    """Labels in use, and derived lookups, for one version of the tallies."""

    version: int
    used: tuple[str, ...]  # labels carried by at least one live item, sorted
    candidates: Prototypes  # what a prediction chooses among (models.prototypes)
    anc_or_self: dict[str, frozenset[str]]  # used label -> its ancestors and itself


class Runtime:
    """The loaded model (optional), label embedding, taxonomy and index."""

    #: bounds of a request's filter (``indexing.filters.FilterLimits``; set by the app)
    filter_limits: Any = None

    def __init__(
        self,
        index: Index,
        labels: LabelEmbedding | None,
        model: Any | None = None,
        *,
        image_dir: str | Path | None = None,
        data_dir: str | Path | None = None,
        taxonomy: Taxonomy | None = None,
        wordnet_dir: str | Path | None = None,
    ) -> None:
        self.space = make_index_space(index.dim, index.curvature, index.space)
        #: a product space: vectors only (no labels, cones or model; :meth:`no_labels`)
        self.product = not isinstance(self.space, PoincareIndexSpace)
        if self.product or labels is None:
            if not self.product:
                raise StartupError(
                    "labels: only a product-space collection is served without labels"
                )
            geometry = getattr(model, "geometry", "poincare")
            spec = getattr(getattr(model, "space", None), "spec", None) if model else None
            if model is not None and (geometry != "product" or spec != self.space.spec):
                what = f"{geometry} model" if geometry != "product" else f"{spec} model"
                raise StartupError(
                    f"model: a {what} cannot fill the product-space index {self.space.spec}"
                )
            self._init_vectors_only(index, image_dir, data_dir, model)
            return
        if model is not None and getattr(model, "geometry", "poincare") != "poincare":
            raise StartupError(
                f"model: a {model.geometry} model cannot be served (the index is a Poincaré ball)"
            )
        if index.dim != labels.dim:
            raise StartupError(
                f"index: dimension {index.dim} does not match the labels' dimension {labels.dim}"
            )
        if model is not None and model.dim != index.dim:
            raise StartupError(
                f"index: dimension {index.dim} does not match the model's dimension {model.dim}"
            )
        if not np.isclose(index.curvature, labels.curvature):
            raise StartupError(
                f"index: curvature {index.curvature:g} does not match the labels' "
                f"curvature {labels.curvature:g}"
            )
        self.index = index
        self.labels = labels
        self.model = model
        self.wordnet_dir = wordnet_dir
        self.retired: str | None = None  # why writes are refused (retire)
        if taxonomy is not None and taxonomy != labels.taxonomy:
            raise StartupError("taxonomy: not the taxonomy the labels were trained on")
        self.taxonomy: Taxonomy = taxonomy if taxonomy is not None else labels.taxonomy
        self.curvature = float(labels.curvature)
        self.dim = int(labels.dim)
        self.pictures = Pictures(image_dir, data_dir)  # the items' pictures
        # label prototypes, float64 numpy (the per-request geometry runs on the numpy
        # twins of models.geometry.poincare_np: torch costs far more a call on one vector)
        # where the model's embeddings of each label's images gather (the label points,
        # unless the model was trained with scaled prototypes and is not placed)
        ball_model = model is not None and getattr(model, "geometry", None) == "poincare"
        self._prototypes = (
            Prototypes.of_model(model) if ball_model else Prototypes.of_labels(labels)
        )
        self._points = labels.embeddings.detach().cpu().double().numpy()  # the label points
        # where a search by a label's name starts: where the model puts its images
        self._search = self._prototypes.points
        if ball_model and hasattr(model, "search_points"):
            self._search = model.search_points().detach().cpu().double().numpy()
        self._write_lock = threading.Lock()  # one write at a time (index, then tallies)
        self._commits = GroupCommit(self._write_lock, self._apply_upsert, self._check_live)
        self._tally_lock = threading.Lock()  # tallies change or are copied under it
        self._item_label: dict[str, str | None] = {}
        self._counts: Counter[str] = Counter()
        self._version = 0
        self._view: _LabelView | None = None
        self._view_lock = threading.Lock()
        self._under_cache: dict[tuple[int, str], int] = {}
        self._extras: dict[str, tuple[tuple[str, tuple[str, ...]], ...]] = {}
        self._resolver = WordResolver(self.taxonomy, wordnet_dir)
        self.cone_spec = label_cone_spec(labels)
        self.cones, self.cones_held_share = label_cones(labels, self.cone_spec)
        self.cones_hold = self.cones_held_share >= HOLD_SHARE and (
            model is None or bool(getattr(model, "places_in_cones", False))
        )
        self.default_levels = "cone" if self.cones_hold else "taxonomy"
        if model is not None and not self.cones_hold:
            log.warning(
                "this model does not place its images inside the labels' cones: label "
                "queries still rank by the cones (entailment, the default), hierarchical "
                "levels follow the taxonomy"
            )
        index.set_cones(self.cones)  # recomputes the holders only when the cones changed
        self._load_tallies()

    def _init_vectors_only(self, index: Index, image_dir, data_dir, model=None) -> None:
        """A product-space runtime: items carry vectors and payloads, no labels; a
        product-space image model (``hypsearch train --space``), if given, embeds
        pictures (search by image, picture items, ``/v1/embed`` without labels)."""
        self.index, self.labels, self.model = index, None, model
        self.wordnet_dir, self.retired = None, None
        self.taxonomy = Taxonomy.from_edges([], nodes=())
        self.curvature = float(index.curvature)
        self.dim = int(index.dim)
        self.pictures = Pictures(image_dir, data_dir)  # the items' pictures
        self._write_lock = threading.Lock()
        self._commits = GroupCommit(self._write_lock, self._apply_upsert, self._check_live)
        self._tally_lock = threading.Lock()
        self._item_label = {}
        self._counts = Counter()
        self._version = 0
        self._view = None
        self._view_lock = threading.Lock()
        self._under_cache = {}
        self.cone_spec, self.cones, self.cones_held_share = {}, None, 0.0
        self.cones_hold, self.default_levels = False, "taxonomy"
        self._origin = np.zeros((1, self.dim))
        self._load_tallies()

    def no_labels(self, what: str = "label and hierarchical searches") -> LabelsUnsupportedError:
        """The error of a label feature asked of a product-space runtime."""
        return LabelsUnsupportedError(
            f"{what}: this collection has the product space {self.space.spec}: label, "
            "'under' and hierarchical features need a Poincaré-ball collection "
            "(search it by vector or by id)"
        )

    @property
    def space_name(self) -> str:
        """The space string: ``poincare:D@c`` or the product's (``poincare:8,sphere:4,...``)."""
        return self.space.spec if self.product else f"poincare:{self.dim}@{self.curvature:g}"

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

    def _label_view(self) -> _LabelView:
        if self.product:
            raise self.no_labels()
        view = self._view
        if view is not None and view.version == self._version:
            return view
        with self._view_lock:
            with self._tally_lock:
                version = self._version
                used = tuple(sorted(lab for lab, n in self._counts.items() if n > 0))
            used = tuple(u for u in used if u in self.taxonomy)
            candidates = self._prototypes.subset(prediction_labels(used, self.taxonomy.names))
            anc = {u: frozenset(self.taxonomy.ancestors(u)) | {u} for u in used}
            self._view = _LabelView(version, used, candidates, anc)
            self._under_cache = {}
            return self._view

    def used_labels(self) -> tuple[str, ...]:
        return () if self.product else self._label_view().used

    def used_under(self, node: str) -> set[str]:
        """Labels in use that are ``node`` or below it."""
        view = self._label_view()
        return {u for u, anc in view.anc_or_self.items() if node in anc}

    def items_under(self, node: str) -> int:
        """Live items whose label is ``node`` or one of its descendants."""
        view = self._label_view()
        key = (view.version, node)
        got = self._under_cache.get(key)
        if got is None:
            got = sum(self._counts.get(u, 0) for u, anc in view.anc_or_self.items() if node in anc)
            self._under_cache[key] = got
        return got

    # -- labels ---------------------------------------------------------------------
    def resolve(self, text: str) -> str:
        """Node for a synset name or a word: among a word's senses, the one with the
        most items under it (WordNet's sense order breaks ties); plurals resolve
        through their base forms (:class:`WordResolver`). Raises
        :class:`models.taxonomy.graph.UnknownLabelError`."""
        if self.product:
            raise self.no_labels()
        return self._resolver.resolve(text, prefer=lambda n: float(self.items_under(n)))

    def label_point(self, name: str) -> np.ndarray:
        """A label's point of the label embedding (its cone's apex), float64 (D,)."""
        return self._points[self.taxonomy.index(name)].copy()

    def prototype(self, name: str) -> np.ndarray:
        """What a search by a label's name starts from, float64 (D,): where the model puts
        that label's images (:meth:`models.image_model.ImageModel.search_points`: the label
        point, its scaled stand-in, or a placed model's anchor); the label point without
        a model."""
        return self._search[self.taxonomy.index(name)].copy()

    def nearest_used_labels(self, x: np.ndarray) -> list[str]:
        """For each row of ``x``: the nearest prototype among the labels that
        indexed items carry (every taxonomy node when the index is empty): the one
        rule of :mod:`models.prototypes`. A product space: ``None`` for each."""
        if self.product:
            return [None] * len(x)
        return self._label_view().candidates.nearest(x)

    def nearest_nodes(self, x: np.ndarray, k: int = 5) -> list[tuple[str, float]]:
        """The ``k`` nearest label prototypes of the whole taxonomy to one point
        (ascending distance; equal distances in taxonomy order)."""
        return self._prototypes.nearest_k(x, k)

    def embed_labels(self, x: np.ndarray, k: int = 5) -> list[tuple[str, float]]:
        """The labels of ``/v1/embed``: first the deepest label whose cone holds
        ``x`` (when :attr:`cones_hold` and some cone holds it), then the nearest
        nodes of the whole taxonomy, ``k`` in all, none twice; none in a product space."""
        if self.product:
            return []
        near = self.nearest_nodes(x, k)
        holder = self.holder_of(x) if self.cones_hold else None
        if holder is None:
            return near
        d = float(poincare_np.dist(x, self.label_point(holder), c=self.curvature))
        rest = [(n, dd) for n, dd in near if n != holder]
        return [(holder, d)] + rest[: k - 1]

    def cone_extras(self, label: str) -> tuple[tuple[str, tuple[str, ...]], ...]:
        """The taxonomy descendants of ``label`` that its cone cannot hold, each with
        its taxonomy path below ``label``: the shallowest descendants (breadth first)
        whose cone chain passes neither ``label`` nor an earlier one of them (a node
        whose cone lies under another parent: ``clothing.n.01`` under
        ``covering.n.02``, not under ``consumer_goods.n.01``). A label query counts
        the items of their cones as the label's (:mod:`indexing.entailment`)."""
        got = self._extras.get(label)
        if got is not None:
            return got
        tops: set[str] = {label}
        out: list[tuple[str, tuple[str, ...]]] = []
        seen = {label}
        frontier: list[tuple[str, tuple[str, ...]]] = [(label, ())]
        while frontier:
            nxt = []
            for node, path in frontier:
                for ch in sorted(self.taxonomy.children(node)):
                    if ch in seen:
                        continue
                    seen.add(ch)
                    p = path + (ch,)
                    if not tops.intersection(self.cones.chain(ch)):
                        tops.add(ch)
                        out.append((ch, p))
                    nxt.append((ch, p))
            frontier = nxt
        got = tuple(out)
        self._extras[label] = got
        return got

    def holder_of(self, x: np.ndarray) -> str | None:
        """The deepest label whose cone holds the point ``x`` (``None``: no root's
        cone holds it), as the index computes the holders of its items."""
        return self.cones.holding_labels(np.asarray(x, dtype=np.float64)[None])[0]

    def aperture(self, name: str) -> float:
        """The aperture of the label's cone (:func:`models.geometry.cones.aperture_np`)."""
        return float(mcones.aperture_np(self.label_point(name), self.cone_spec, c=self.curvature))

    def distance_to_origin(self, x: np.ndarray) -> np.ndarray:
        """Distance to the origin (a product space: the product distance to 0)."""
        if self.product:
            x = np.asarray(x, dtype=np.float64)
            d = self.space.pairwise(np.atleast_2d(x), self._origin)[:, 0]
            return d if x.ndim == 2 else d[0]
        return poincare_np.distance_to_origin(x, c=self.curvature)

    def check_points(self, x: np.ndarray, name: str) -> np.ndarray:
        """Rows of the index's space (:meth:`indexing.geometry.IndexSpace.as_points`),
        or :class:`indexing.IndexInputError` naming ``name`` and the row."""
        return self.space.as_points(x, name, allow_1d=True)

    def chain(self, label: str, levels: str = "taxonomy") -> list[str]:
        """``[label, parent, grandparent, ..., root]``; where a node has several
        parents, the one with the most items under it (then the shallower one,
        then the first by name) continues the chain; for ``levels="cone"`` the
        parent whose cone holds the node (:func:`label_cones`)."""
        if levels == "cone":
            return list(self.cones.chain(label))
        out = [label]
        seen = {label}
        while True:
            parents = [p for p in self.taxonomy.parents(out[-1]) if p not in seen]
            if not parents:
                return out
            p = min(parents, key=lambda n: (-self.items_under(n), self.taxonomy.depth(n), n))
            out.append(p)
            seen.add(p)

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

    def with_index(self, index: Index) -> Runtime:
        """The same model, labels and folders around another index (an in-place restore)."""
        return Runtime(
            index,
            self.labels,
            self.model,
            image_dir=self.pictures.folder,
            data_dir=self.pictures.data_dir,
            taxonomy=None if self.product else self.taxonomy,
            wordnet_dir=self.wordnet_dir,
        )

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

    def _untally(self, ids: list[str]) -> None:
        with self._tally_lock:
            for i in ids:
                if i in self._item_label:
                    self._tally(i, None)
                    del self._item_label[i]
            self._version += 1

    def close(self) -> None:
        self.index.close()


def label_cones(labels: LabelEmbedding, spec: dict) -> tuple[LabelCones, float]:
    """``(cones, share)``: the label cones of every taxonomy node of ``labels``
    (cone family ``spec``), each node under the parent whose cone holds its point
    with the largest margin (the first parent when none holds it), and the share
    of the non-root nodes that a parent's cone holds (1.0 for a taxonomy of roots
    only)."""
    tax = labels.taxonomy
    pts = labels.embeddings.detach().cpu().double().numpy()
    names = tax.names
    child, par = [], []
    for j in range(len(names)):
        for p in tax.parent_ids(j):
            child.append(j)
            par.append(p)
    parent: dict[str, str | None] = {n: None for n in names}
    held = 0
    if child:
        ci, pi = np.asarray(child), np.asarray(par)
        margin = mcones.membership_margin_np(pts[pi], pts[ci], spec, c=labels.curvature)
        best: dict[int, tuple[float, int]] = {}
        for c, p, m in zip(ci.tolist(), pi.tolist(), margin.tolist(), strict=True):
            if c not in best or m > best[c][0]:  # ties: the first parent
                best[c] = (m, p)
        for c, (m, p) in best.items():
            parent[names[c]] = names[p]
            held += m >= 0
    share = held / len(best) if child else 1.0
    return LabelCones((names, pts), parent, curvature=labels.curvature, spec=spec), share


def open_runtime(settings, index=None) -> Runtime:
    """Load the model (or labels) and open (or create) the index of ``settings``
    (or serve ``index``, e.g. an :class:`indexing.sharded.ShardedIndex`)."""
    from models.checkpoint import CheckpointError

    model = None
    try:
        if settings.model is not None:
            from models.image_model import load_model

            spec = str(settings.model)
            if not spec.startswith("pretrained:") and not Path(spec).is_file():
                raise StartupError(f"model: no such file {settings.model}")
            kw = {"cache_dir": Path(settings.home) / "pretrained"}
            if settings.wordnet_dir is not None:
                kw["wordnet_dir"] = settings.wordnet_dir
            model = load_model(spec, **kw) if spec.startswith("pretrained:") else load_model(spec)
            labels = model.labels
            if getattr(model, "geometry", "poincare") == "product":
                labels = None  # a mixed-curvature model: vectors of its space, no label points
        elif settings.labels is not None:
            if not Path(settings.labels).is_file():
                raise StartupError(f"labels: no such file {settings.labels}")
            labels = LabelEmbedding.load(settings.labels)
        else:
            raise StartupError(
                "give a model (HYPSEARCH_MODEL) or a label checkpoint (HYPSEARCH_LABELS)"
            )
    except CheckpointError as e:
        raise StartupError(str(e)) from None
    if index is None and labels is None:
        try:
            index = open_index(
                settings.index, dim=model.dim, curvature=1.0, space=model.head_cfg.space
            )
        except (ValueError, RuntimeError) as e:  # IndexInputError, IndexStoreError
            raise StartupError(f"index: {e}") from None
    if index is None:
        index = open_index(settings.index, dim=labels.dim, curvature=labels.curvature)
    try:
        return Runtime(
            index,
            labels,
            model,
            image_dir=settings.images_folder,
            data_dir=settings.data_dir,
            taxonomy=None if labels is None else with_words(labels.taxonomy, settings.wordnet_dir),
            wordnet_dir=settings.wordnet_dir,
        )
    except BaseException:
        index.close()
        raise
