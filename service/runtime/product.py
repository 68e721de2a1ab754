"""The runtime of a product-space collection (``poincare:8,sphere:4,euclidean:4``):
items carry vectors and payloads, no labels; every label, cone and hierarchical
feature raises :meth:`Runtime.no_labels`. A product-space image model
(``hypsearch train --space``), if given, embeds pictures (search by image,
picture items, ``/v1/embed`` without labels)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from indexing import Index
from indexing.geometry import PoincareIndexSpace, make_index_space
from models.taxonomy.graph import Taxonomy

from .base import Runtime, StartupError


class ProductRuntime(Runtime):
    """A product-space collection: its index and, optionally, a model of its space."""

    product = True
    labels = None
    cones = None
    cone_spec: dict = {}  # noqa: RUF012 - read only
    cones_held_share = 0.0
    cones_hold = False
    default_levels = "taxonomy"

    def __init__(
        self,
        index: Index,
        model: Any | None = None,
        *,
        image_dir: str | Path | None = None,
        data_dir: str | Path | None = None,
    ) -> None:
        space = make_index_space(index.dim, index.curvature, index.space)
        if isinstance(space, PoincareIndexSpace):
            raise StartupError("labels: only a product-space collection is served without labels")
        geometry = getattr(model, "geometry", "poincare")
        spec = getattr(getattr(model, "space", None), "spec", None) if model else None
        if model is not None and (geometry != "product" or spec != space.spec):
            what = f"{geometry} model" if geometry != "product" else f"{spec} model"
            raise StartupError(f"model: a {what} cannot fill the product-space index {space.spec}")
        super().__init__(index, model, space, image_dir, data_dir)
        self.taxonomy = Taxonomy.from_edges([], nodes=())
        self.curvature = float(index.curvature)
        self.dim = int(index.dim)
        self._origin = np.zeros((1, self.dim))
        self._load_tallies()

    @property
    def space_name(self) -> str:
        return self.space.spec

    def with_index(self, index: Index) -> ProductRuntime:
        return ProductRuntime(
            index, self.model, image_dir=self.pictures.folder, data_dir=self.pictures.data_dir
        )

    def distance_to_origin(self, x: np.ndarray) -> np.ndarray:
        """The product distance to 0, of one point (a float) or of rows."""
        x = np.asarray(x, dtype=np.float64)
        d = self.space.pairwise(np.atleast_2d(x), self._origin)[:, 0]
        return d if x.ndim == 2 else d[0]

    def used_labels(self) -> tuple[str, ...]:
        return ()

    def nearest_used_labels(self, x: np.ndarray) -> list[str | None]:
        return [None] * len(x)

    def embed_labels(self, x: np.ndarray, k: int = 5) -> list[tuple[str, float]]:
        return []

    # every label feature: the 422 of no_labels
    def used_under(self, node: str) -> set[str]:
        raise self.no_labels()

    def items_under(self, node: str) -> int:
        raise self.no_labels()

    def resolve(self, text: str) -> str:
        raise self.no_labels()

    def label_point(self, name: str) -> np.ndarray:
        raise self.no_labels()

    def prototype(self, name: str) -> np.ndarray:
        raise self.no_labels()

    def cone_extras(self, label: str) -> tuple[tuple[str, tuple[str, ...]], ...]:
        raise self.no_labels()

    def aperture(self, name: str) -> float:
        raise self.no_labels()

    def chain(self, label: str, levels: str = "taxonomy") -> list[str]:
        raise self.no_labels()
