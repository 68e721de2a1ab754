"""What a build reads: a built-in split, a folder ``DIR/<class>/<images>`` or a
CSV manifest ``id,path[,label]``, as a :class:`Plan` of :class:`Source` s.

* Ids: ``fashion-mnist-<split>-<row>`` for a built-in split, paths relative to
  ``DIR`` for a folder, the ``id`` column for a manifest (listed by
  :func:`models.images.datasets.list_folder` / ``list_manifest``). A class name
  becomes a taxonomy node through :func:`models.images.datasets.map_class`.
* Forgiving: a row naming an unknown class or a file outside the allowed roots
  (:func:`service.ingest.roots.inside_roots`) is *skipped* with its reason,
  never fatal. A folder or manifest that cannot be read at all is a
  :class:`~service.ingest.roots.BuildInputError`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from models.images.datasets import (
    DataError,
    Listing,
    list_folder,
    list_manifest,
    list_photos,
    map_class,
)

from .roots import BuildInputError, inside_roots

__all__ = [
    "Plan",
    "Source",
    "plan_dataset",
    "plan_folder",
    "plan_manifest",
    "plan_path",
    "plan_photos",
]


@dataclass(frozen=True)
class Source:
    """One picture to index."""

    id: str
    label: str | None  # taxonomy node, or None (predicted at embedding time)
    path: str | None = None  # a file (folder, manifest), or
    row: int | None = None  # a row of the plan's in-memory images (built-in data set)


@dataclass
class Plan:
    """What to read: the sources, and what was skipped while listing them."""

    name: str
    sources: list[Source]
    images: np.ndarray | None = None  # in-memory pictures of a built-in split
    payload: dict[str, Any] = field(default_factory=dict)  # common payload (data set, split)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (source, reason)


def plan_dataset(dataset: str, split: str, data_dir: str | os.PathLike) -> Plan:
    from models.images.datasets import load_fashion_mnist

    if dataset != "fashion-mnist":
        raise BuildInputError(f"dataset {dataset!r}: unknown (built in: fashion-mnist)")
    try:
        data = load_fashion_mnist(split, data_dir)
    except DataError as e:
        raise BuildInputError(str(e)) from None
    labels = data.labels
    sources = [Source(data.ids[i], labels[i], row=i) for i in range(len(data.ids))]
    return Plan(
        f"{dataset}:{split}",
        sources,
        images=data.images,
        payload={"dataset": dataset, "split": split},
    )


def _plan(listing: Listing, taxonomy, class_map, manifest: bool) -> Plan:
    """A listing -> sources; problems and classes that do not map are skipped."""
    plan = Plan(listing.source, [])
    name = Path(listing.source).name
    for where, reason, item_id in listing.problems:
        if manifest:  # rows by their line, or by their id once it is known
            where = item_id if item_id is not None else f"{name}:{where.rsplit(':', 1)[1]}"
        plan.skipped.append((where, reason))
    nodes: dict[str, str | None] = {}
    for e in listing.entries:
        node = None
        if e.label:
            if e.label not in nodes:
                try:
                    nodes[e.label] = map_class(e.label, class_map, taxonomy)
                except DataError:
                    nodes[e.label] = None
            node = nodes[e.label]
            if node is None:
                plan.skipped.append((e.id, f"class {e.label!r} is not in the taxonomy"))
                continue
        plan.sources.append(Source(e.id, node, path=e.path))
    return plan


def _listed(lister, path, taxonomy, class_map, roots, manifest: bool) -> Plan:
    inside = None if roots is None else inside_roots(roots)
    try:
        return _plan(lister(path, inside=inside), taxonomy, class_map, manifest=manifest)
    except DataError as e:
        raise BuildInputError(str(e)) from None


def plan_folder(
    folder: str | os.PathLike, *, taxonomy=None, class_map: dict[str, str] | None = None, roots=None
) -> Plan:
    return _listed(list_folder, folder, taxonomy, class_map, roots, manifest=False)


def plan_manifest(
    path: str | os.PathLike, *, taxonomy=None, class_map: dict[str, str] | None = None, roots=None
) -> Plan:
    return _listed(list_manifest, path, taxonomy, class_map, roots, manifest=True)


def plan_photos(folder: str | os.PathLike) -> Plan:
    """Every picture under ``folder``, unlabelled (:func:`models.images.datasets.list_photos`):
    each gets the model's nearest label."""
    try:
        return _plan(list_photos(folder), None, None, manifest=False)
    except DataError as e:
        raise BuildInputError(str(e)) from None


def plan_path(path: str | os.PathLike, *, taxonomy=None, class_map=None, roots=None) -> Plan:
    """A folder, or a manifest (``.csv``)."""
    p = Path(path)
    if p.suffix.lower() == ".csv" and not p.is_dir():
        return plan_manifest(p, taxonomy=taxonomy, class_map=class_map, roots=roots)
    return plan_folder(p, taxonomy=taxonomy, class_map=class_map, roots=roots)
