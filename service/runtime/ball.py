"""The runtime of a Poincaré-ball collection: labels, their cones, hierarchical search.

It adds to the index what HTTP needs and the index does not keep in memory: the
label prototypes of the labels in use (:class:`_LabelView`, rebuilt when the
tallies change) and how many items each label holds.

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
:attr:`BallRuntime.cones_hold`. Otherwise they are by the taxonomy chain
(``"taxonomy"``), and ``/v1/embed`` answers the nearest nodes only.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from indexing import Index, LabelCones
from indexing.geometry import PoincareIndexSpace, make_index_space
from models.geometry import cones as mcones
from models.geometry import poincare_np
from models.labels import LabelEmbedding
from models.prototypes import Prototypes, label_cone_spec, prediction_labels
from models.taxonomy.graph import Taxonomy
from models.taxonomy.wordnet import WordResolver

from .base import Runtime, StartupError

log = logging.getLogger("service")

#: the share of non-root taxonomy nodes that a parent's cone must hold for the
#: labels' cones to count as holding the taxonomy (cone levels by default)
HOLD_SHARE = 0.95


@dataclass(frozen=True)
class _LabelView:
    """Labels in use, and derived lookups, for one version of the tallies."""

    version: int
    used: tuple[str, ...]  # labels carried by at least one live item, sorted
    candidates: Prototypes  # what a prediction chooses among (models.prototypes)
    anc_or_self: dict[str, frozenset[str]]  # used label -> its ancestors and itself


class BallRuntime(Runtime):
    """A Poincaré-ball collection: the loaded model (optional), label embedding,
    taxonomy and index."""

    product = False

    def __init__(
        self,
        index: Index,
        labels: LabelEmbedding,
        model: Any | None = None,
        *,
        image_dir: str | Path | None = None,
        data_dir: str | Path | None = None,
        taxonomy: Taxonomy | None = None,
        wordnet_dir: str | Path | None = None,
    ) -> None:
        space = make_index_space(index.dim, index.curvature, index.space)
        if not isinstance(space, PoincareIndexSpace):
            raise StartupError(f"index: the product space {space.spec} has no labels to serve")
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
        super().__init__(index, model, space, image_dir, data_dir)
        self.labels = labels
        self.wordnet_dir = wordnet_dir
        if taxonomy is not None and taxonomy != labels.taxonomy:
            raise StartupError("taxonomy: not the taxonomy the labels were trained on")
        self.taxonomy: Taxonomy = taxonomy if taxonomy is not None else labels.taxonomy
        self.curvature = float(labels.curvature)
        self.dim = int(labels.dim)
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
        self._view: _LabelView | None = None
        self._view_lock = threading.Lock()
        self._under_cache: dict[tuple[int, str], int] = {}
        self._extras: dict[str, tuple[tuple[str, tuple[str, ...]], ...]] = {}
        self._open_nodes: dict[str, tuple[str, ...]] | None = None  # (_open)
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
        self._open()  # at load, not at the first label query
        self._load_tallies()

    @property
    def space_name(self) -> str:
        return f"poincare:{self.dim}@{self.curvature:g}"

    def with_index(self, index: Index) -> BallRuntime:
        return BallRuntime(
            index,
            self.labels,
            self.model,
            image_dir=self.pictures.folder,
            data_dir=self.pictures.data_dir,
            taxonomy=self.taxonomy,
            wordnet_dir=self.wordnet_dir,
        )

    def _label_view(self) -> _LabelView:
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
        return self._label_view().used

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
        return self._resolver.resolve(text, prefer=lambda n: float(self.items_under(n)))

    def label_point(self, name: str) -> np.ndarray:
        """A label's point of the label embedding (its cone's apex), float64 (D,)."""
        return self._points[self.taxonomy.index(name)].copy()

    def prototype(self, name: str) -> np.ndarray:
        """What a search by a label's name starts from, float64 (D,): where the model puts
        that label's images (:meth:`models.vision.image_model.ImageModel.search_points`: the label
        point, its scaled stand-in, or a placed model's anchor); the label point without
        a model."""
        return self._search[self.taxonomy.index(name)].copy()

    def nearest_used_labels(self, x: np.ndarray) -> list[str]:
        """For each row of ``x``: the nearest prototype among the labels that
        indexed items carry (every taxonomy node when the index is empty): the one
        rule of :mod:`models.prototypes`."""
        return self._label_view().candidates.nearest(x)

    def nearest_nodes(self, x: np.ndarray, k: int = 5) -> list[tuple[str, float]]:
        """The ``k`` nearest label prototypes of the whole taxonomy to one point
        (ascending distance; equal distances in taxonomy order)."""
        return self._prototypes.nearest_k(x, k)

    def embed_labels(self, x: np.ndarray, k: int = 5) -> list[tuple[str, float]]:
        """The labels of ``/v1/embed``: first the deepest label whose cone holds
        ``x`` (when :attr:`cones_hold` and some cone holds it), then the nearest
        nodes of the whole taxonomy, ``k`` in all, none twice."""
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
        the items of their cones as the label's (:mod:`indexing.entailment`).

        Only the nodes whose subtree is not closed are looked below (:meth:`_open`),
        and of their children only those that may be extras or lead to one: the same
        answer as a look at every descendant (a test holds it to that), without
        visiting the 82,115 nouns below ``entity.n.01``."""
        got = self._extras.get(label)
        if got is not None:
            return got
        below = self._open()
        chain = self.cones.chain
        tops: set[str] = {label}
        out: list[tuple[str, tuple[str, ...]]] = []
        seen = {label}
        # every node of the frontier lies in the cone of a top, and is open
        frontier = [(label, ())] if label in below else []
        while frontier:
            nxt = []
            for node, path in frontier:
                for ch in below[node]:
                    if ch in seen:
                        continue
                    seen.add(ch)
                    p = path + (ch,)
                    if tops.isdisjoint(chain(ch)):
                        tops.add(ch)
                        out.append((ch, p))
                    if ch in below:
                        nxt.append((ch, p))
            frontier = nxt
        got = tuple(out)
        self._extras[label] = got
        return got

    def _open(self) -> dict[str, tuple[str, ...]]:
        """The nodes whose subtree is not closed, each with the children a look for
        :meth:`cone_extras` must visit (by name). A node is closed when each child
        lies in its cone subtree (the child's cone chain passes it) and is closed too
        (leaves are): every node below a closed node lies in its cone, so none is an
        extra of a label above it. Below an open node, a closed child whose cone
        parent it is lies in its cone as well: it is not visited."""
        if self._open_nodes is None:
            tax, names, cones = self.taxonomy, self.taxonomy.names, self.cones
            closed: list[bool | None] = [None] * len(names)
            for start in range(len(names)):
                stack = [start]
                while stack:  # children first
                    v = stack[-1]
                    todo = [c for c in tax.child_ids(v) if closed[c] is None]
                    if todo:
                        stack += todo
                        continue
                    stack.pop()
                    if closed[v] is None:
                        closed[v] = all(
                            closed[c] and names[v] in cones.chain(names[c])
                            for c in tax.child_ids(v)
                        )
            self._open_nodes = {
                names[v]: tuple(
                    names[c]
                    for c in tax.child_ids(v)  # by name
                    if not closed[c] or cones.parent(names[c]) != names[v]
                )
                for v in range(len(names))
                if not closed[v]
            }
        return self._open_nodes

    def holder_of(self, x: np.ndarray) -> str | None:
        """The deepest label whose cone holds the point ``x`` (``None``: no root's
        cone holds it), as the index computes the holders of its items."""
        return self.cones.holding_labels(np.asarray(x, dtype=np.float64)[None])[0]

    def aperture(self, name: str) -> float:
        """The aperture of the label's cone (:func:`models.geometry.cones.aperture_np`)."""
        return float(mcones.aperture_np(self.label_point(name), self.cone_spec, c=self.curvature))

    def distance_to_origin(self, x: np.ndarray) -> np.ndarray:
        """Distance to the origin, of one point (a float) or of rows."""
        return poincare_np.distance_to_origin(x, c=self.curvature)

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
