r"""Label embeddings: the training options and the trained points, with their checkpoint.

:class:`LabelTrainConfig` holds every option of :func:`models.labels.train_labels`;
:class:`LabelEmbedding` is the result (one point of the Poincaré ball per
taxonomy node), saved and loaded as a ``labels`` checkpoint and exported as
text (``# curvature=<c> dim=<d> cone=<family> <param>=<value>…`` then one
``name<TAB>x1…xd`` line per node). The cone family and its parameters travel
in the checkpoint's metadata (``cone``); checkpoints without it are Ganea
cones of their ``cone_K``.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..checkpoint import (
    CheckpointError,
    decode_strings,
    encode_strings,
    load_checkpoint,
    save_checkpoint,
)
from ..geometry import cones
from ..taxonomy.graph import Taxonomy

__all__ = ["KIND", "LabelEmbedding", "LabelTrainConfig", "is_finished", "load_labels"]

KIND = "labels"


@dataclass
class LabelTrainConfig:
    """Every option of label training; the defaults are what the benchmarks use."""

    dim: int = 10
    curvature: float = 1.0
    epochs: int | None = None  # None: chosen from the number of closure edges
    lr: float = 0.03  # Riemannian SGD learning rate, decayed linearly to 0 after the burn-in
    negatives: int = 50
    # share of negatives drawn among the descendants of the edge's ancestor
    local_negatives: float = 0.0
    burnin: int = 5  # epochs at lr * burnin_factor with degree-weighted negatives
    burnin_factor: float = 0.1
    batch_size: int = 1024
    # "cap": the cap construction (models.labels.construct), cones that nest by
    # construction; "hierarchical": points by depth in the parent's direction;
    # "random": uniform in a tiny ball, as the paper
    init: str = "cap"
    init_step: float = 1.5  # hyperbolic radius added per level of depth
    init_spread: float = 1.5  # angular spread of the children of a depth-1 node
    init_decay: float = 0.5  # spread factor per further level
    cone_theta0: float = 2.5  # cap family: theta(x) = theta0 exp(-beta rho(x))
    cone_beta: float = 0.5
    cap_separation: float = 1.1  # sibling caps at least this factor apart
    cap_margin: float = 0.02  # children's caps this share inside the parent's
    cap_min_step: float = 1.0  # smallest radius of the root's children
    # "pull": children turned towards the nodes their subtrees have pairs with off the
    # spanning tree (second parents); "random": a random rotation (the layout before)
    cap_layout: str = "pull"
    # "general": a second parent's chain is folded into the chosen parent's cap also when
    # it has other children (counted as false pairs); "pass-through": only one-child chains
    cap_folds: str = "general"
    # > 0: closed subtrees (holding no ancestor of a node outside them) moved outward by
    # up to this much radius (models.labels.outward), no radius past cap_max_radius
    cap_outward: float = 0.0
    cap_max_radius: float = 32.0
    cone_epochs: int = 0
    cone_weight: float = 0.0  # weight of the cone loss added to every N&K step; 0: off
    cone_negatives: int = 10
    cone_K: float = 0.1
    cone_margin: float = 0.01
    cone_lr: float = 0.01  # Riemannian Adam
    leaf_spread: float = 0.0  # weight of the leaf-spreading term (Long et al. 2020); 0: off
    leaf_margin: float = 2.0
    seed: int = 0

    def resolved_epochs(self, n_edges: int) -> int:
        if self.epochs is not None:
            return self.epochs
        if self.init == "cap":  # the construction is the result
            return 0
        # about 1.5 million edge visits for small taxonomies, fewer passes over big ones
        return int(min(200, max(10, round(1.3e6 / max(n_edges, 1)))))

    def cone_spec(self) -> dict[str, Any]:
        """The cone family the result is measured with: caps for the cap init, else Ganea's."""
        if self.init == "cap":
            return {"family": "cap", "theta0": self.cone_theta0, "beta": self.cone_beta}
        return {"family": "ganea", "K": self.cone_K}

    def validate(self) -> None:
        if self.dim < 2:
            raise ValueError(f"dim must be at least 2, got {self.dim}")
        if not (self.curvature > 0 and math.isfinite(self.curvature)):
            raise ValueError(f"curvature must be a positive number, got {self.curvature}")
        if self.epochs is not None and self.epochs < 0:
            raise ValueError(f"epochs must be >= 0, got {self.epochs}")
        if self.negatives < 1:
            raise ValueError(f"negatives must be >= 1, got {self.negatives}")
        if self.batch_size < 1:
            raise ValueError(f"batch size must be >= 1, got {self.batch_size}")
        if self.init not in ("cap", "hierarchical", "random"):
            raise ValueError(f"init must be 'cap', 'hierarchical' or 'random', got {self.init!r}")
        if self.init == "cap" and (self.cone_epochs > 0 or self.cone_weight > 0):
            raise ValueError(
                "the cone stage (cone_epochs, cone_weight) trains Ganea cones: "
                "use init 'hierarchical' with it (the cap init's cones nest by construction)"
            )
        if self.cap_layout not in ("pull", "random"):
            raise ValueError(f"cap_layout must be 'pull' or 'random', got {self.cap_layout!r}")
        if self.cap_folds not in ("general", "pass-through"):
            raise ValueError(
                f"cap_folds must be 'general' or 'pass-through', got {self.cap_folds!r}"
            )
        if not self.cap_separation >= 1:
            raise ValueError(f"cap_separation must be >= 1, got {self.cap_separation}")
        if not (self.cap_outward >= 0 and math.isfinite(self.cap_outward)):
            raise ValueError(f"cap_outward must be a finite number >= 0, got {self.cap_outward}")
        if not 0 < self.cap_max_radius <= 36:
            raise ValueError(f"cap_max_radius must be in (0, 36], got {self.cap_max_radius}")
        cones.cone_spec(**self.cone_spec())
        if not self.lr > 0:
            raise ValueError(f"lr must be positive, got {self.lr}")


@dataclass
class LabelEmbedding:
    """Trained label embeddings: points of the Poincaré ball of one curvature."""

    taxonomy: Taxonomy
    embeddings: torch.Tensor  # (n, dim) float64, row i is taxonomy.names[i]
    curvature: float
    config: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)
    epoch: int = 0  # epochs done (for resuming)
    version: str = ""
    # the cone family and its parameters (models.geometry.cones.cone_spec)
    cone: dict[str, Any] = field(default_factory=lambda: cones.cone_spec("ganea"))

    @property
    def names(self) -> list[str]:
        return self.taxonomy.names

    @property
    def dim(self) -> int:
        return int(self.embeddings.shape[1])

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.embeddings[self.taxonomy.index(name)]

    # ---------------------------------------------------------------- io
    def tensors_and_meta(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        edges = torch.from_numpy(self.taxonomy.direct_edges())
        tensors = {
            "embeddings": self.embeddings.to(torch.float64),
            "names": encode_strings(self.taxonomy.names),
            "edges": edges,
        }
        meta = {
            "curvature": self.curvature,
            "dim": self.dim,
            "nodes": len(self.taxonomy),
            "config": self.config,
            "metrics": self.metrics,
            "epoch": self.epoch,
            "cone": self.cone,
        }
        return tensors, meta

    def save(self, path: str | os.PathLike) -> str:
        tensors, meta = self.tensors_and_meta()
        self.version = save_checkpoint(path, KIND, tensors, meta)
        return self.version

    @classmethod
    def from_tensors(cls, tensors: dict[str, torch.Tensor], meta: dict[str, Any], where: str):
        try:
            names = decode_strings(tensors["names"])
            edges = tensors["edges"].numpy()
            emb = tensors["embeddings"]
        except KeyError as e:
            raise CheckpointError(f"{where}: label checkpoint lacks {e.args[0]!r}") from None
        if emb.ndim != 2 or emb.shape[0] != len(names):
            raise CheckpointError(f"{where}: embeddings do not match the {len(names)} names")
        taxonomy = Taxonomy.from_edges(
            ((names[c], names[p]) for c, p in edges.tolist()), nodes=names
        )
        if taxonomy.names != names:
            raise CheckpointError(f"{where}: taxonomy in the checkpoint is inconsistent")
        config = meta.get("config", {})
        # checkpoints from before the cone field: Ganea cones of the trained K
        cone = meta.get("cone") or {"family": "ganea", "K": config.get("cone_K", 0.1)}
        try:
            cone = cones.cone_spec(**cone)
        except (TypeError, ValueError) as e:
            raise CheckpointError(f"{where}: bad cone description {cone!r} ({e})") from None
        return cls(
            taxonomy=taxonomy,
            embeddings=emb.to(torch.float64),
            curvature=float(meta["curvature"]),
            config=config,
            metrics=meta.get("metrics", {}),
            epoch=int(meta.get("epoch", 0)),
            cone=cone,
        )

    @classmethod
    def load(cls, path: str | os.PathLike) -> LabelEmbedding:
        tensors, meta, version = load_checkpoint(path, kind=KIND)
        emb = cls.from_tensors(tensors, meta, str(path))
        emb.version = version
        return emb

    def export_tsv(self, path: str | os.PathLike) -> None:
        """``# curvature=<c> dim=<d> cone=<family> <param>=<value>…`` then
        ``name<TAB>x1…xd`` per node (17 significant digits)."""
        from ..checkpoint import atomic_write_bytes

        lines = [f"# curvature={self.curvature!r} dim={self.dim} {cones.format_cone(self.cone)}"]
        emb = self.embeddings.numpy()
        for name, row in zip(self.taxonomy.names, emb, strict=True):
            lines.append(name + "\t" + "\t".join(repr(float(v)) for v in row))
        atomic_write_bytes(path, ("\n".join(lines) + "\n").encode("utf-8"))


def is_finished(emb: LabelEmbedding) -> bool:
    return bool(emb.metrics.get("finished"))


def load_labels(path: str | os.PathLike) -> LabelEmbedding:
    return LabelEmbedding.load(Path(path))
