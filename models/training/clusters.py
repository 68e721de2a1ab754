"""The cluster tree of an unsupervised run (``TrainConfig.unsupervised``) as a taxonomy.

:func:`models.training.objectives.cluster_levels` cuts one average-linkage dendrogram
of the embeddings at a few cluster counts (coarsest first); the cuts nest, so
the clusters form a tree. :func:`cluster_labels` turns it into a
:class:`~models.labels.LabelEmbedding`: nodes ``clusters`` (the root) and
``cluster.<level>.<i>`` (level 1 the coarsest), each child's parent the
cluster of the level above that holds it, and as label points the clusters'
centroids in the model's space (the finest clusters' midpoints; a coarser
cluster's point the midpoint of its children's, the root's of all). So the
nearest label point of an image is the cluster the run assigned it to, and
an index built with predicted labels answers hierarchical queries along the
learned clusters (docs/image-model.md).

:func:`attach_clusters` puts the tree into the trained model: always in its
metrics (``clusters``: levels and the child -> parent edges), and, for a run
without label embeddings (a placeholder), as the model's labels and classes.
"""

from __future__ import annotations

import numpy as np
import torch

from ..labels import LabelEmbedding
from ..taxonomy.graph import Taxonomy

__all__ = [
    "ROOT",
    "attach_clusters",
    "cluster_edges",
    "cluster_labels",
    "placeholder_labels",
    "write_cluster_tsv",
]

ROOT = "clusters"


def _name(level: int, i: int) -> str:
    return f"cluster.{level + 1}.{int(i)}"


def cluster_edges(paths: np.ndarray) -> list[tuple[str, str]]:
    """Direct child -> parent edges of the tree whose leaves have the ``paths`` (n, L)
    (cluster ids per level, coarsest first)."""
    edges: set[tuple[str, str]] = set()
    for path in np.asarray(paths):
        parent = ROOT
        for level, i in enumerate(path):
            edges.add((_name(level, i), parent))
            parent = _name(level, i)
    return sorted(edges)


def cluster_labels(tree: dict, space, curvature: float) -> LabelEmbedding:
    """The cluster tree of :meth:`models.training.objectives.Extras.recluster` as label
    embeddings."""
    paths = np.asarray(tree["paths"])
    cents = tree["centroids"].to(torch.float64)
    tax = Taxonomy.from_edges(cluster_edges(paths))
    points: dict[str, torch.Tensor] = {}
    depth = paths.shape[1]
    for row, path in enumerate(paths):
        points[_name(depth - 1, path[-1])] = cents[row]
    for level in range(depth - 2, -1, -1):
        for i in np.unique(paths[:, level]):
            kids = [
                points[_name(level + 1, j)]
                for j in np.unique(paths[paths[:, level] == i][:, level + 1])
            ]
            points[_name(level, i)] = space.midpoint(torch.stack(kids))
    points[ROOT] = space.midpoint(
        torch.stack([points[_name(0, i)] for i in np.unique(paths[:, 0])])
    )
    emb = torch.stack([points[n] for n in tax.names])
    return LabelEmbedding(
        taxonomy=tax,
        embeddings=emb,
        curvature=float(curvature),
        config={"init": "clusters", "levels": list(tree["levels"])},
    )


def placeholder_labels(dim: int, curvature: float) -> LabelEmbedding:
    """The stand-in label embedding of an unsupervised run without labels (one node at the
    origin); :func:`attach_clusters` replaces it by the cluster tree."""
    tax = Taxonomy.from_edges([], nodes=[ROOT])
    return LabelEmbedding(
        taxonomy=tax,
        embeddings=torch.zeros(1, dim, dtype=torch.float64),
        curvature=float(curvature),
        config={"placeholder": True},
    )


def attach_clusters(model, tree: dict, *, replace_labels: bool) -> None:
    """Record the cluster tree in ``model`` (an :class:`~models.vision.image_model.ImageModel`)."""
    paths = np.asarray(tree["paths"])
    model.metrics["clusters"] = {
        "levels": list(tree["levels"]),
        "leaves": int(len(paths)),
        "edges": [list(e) for e in cluster_edges(paths)],
    }
    if replace_labels:
        labels = cluster_labels(tree, model.space, model.curvature)
        leaves = [_name(paths.shape[1] - 1, p[-1]) for p in paths]
        model.labels = labels
        model.classes = [(n, n) for n in leaves]
        model.holdout = []


def write_cluster_tsv(model, path) -> bool:
    """The cluster tree of an unsupervised model as a closure TSV (child<TAB>ancestor);
    False when the model has none."""
    info = model.metrics.get("clusters")
    if not info:
        return False
    tax = Taxonomy.from_edges([tuple(e) for e in info["edges"]])
    tax.to_tsv(path)
    return True
