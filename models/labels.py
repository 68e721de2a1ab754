r"""Label-hierarchy embeddings in the Poincaré ball.

Training has two stages, both Riemannian SGD on float64 coordinates:

1. **Poincaré embeddings** (Nickel and Kiela 2017). For every closure edge
   :math:`(u, v)` (``v`` an ancestor of ``u``) and sampled negatives
   :math:`v'` with :math:`(u, v')` not an edge, minimise
   :math:`-\log \frac{e^{-d(u,v)}}{\sum_{v''\in\{v\}\cup N(u)} e^{-d(u,v'')}}`.
   A burn-in of a few epochs uses a tenth of the learning rate and negatives
   drawn by frequency (degree^0.75), as the paper does.
   Nodes do not start at random: a *hierarchical start* puts each node at a
   hyperbolic radius that grows with its depth, in a direction drawn close to
   its first parent's direction (closer the deeper), so descendants begin
   inside their ancestors' angular sector. On the WordNet noun closure this
   start alone gives a reconstruction MAP of about 0.87, where random points
   after one burn-in epoch give 0.003; the loss then repairs the local structure (see the
   README for the measurements).
2. **Entailment cones** (Ganea et al. 2018), optional (``cone_epochs``):
   hinge on the cone energy, :math:`E(v, u)` for edges and
   :math:`\max(0, \gamma - E(v, u'))` for negatives, so that each node's cone
   holds its descendants and not the rest. Points are kept at norm at least
   the cone's inner radius.

An optional leaf-spreading term (Long et al. 2020) pushes leaves at least a
margin apart, which makes fine-grained classes easier to tell apart.

Evaluation follows Nickel and Kiela 2017: for each closure edge
:math:`(u, v)`, the rank of :math:`d(u, v)` among the distances from
:math:`u` to every node that is neither ``u`` nor one of its closure
neighbours (its ancestors); mean rank over edges, average precision per node,
MAP over nodes. Cone containment precision, recall and F1 count the ordered
pairs :math:`(v, u)` with ``u`` in the cone of ``v`` against the closure.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .checkpoint import (
    CheckpointError,
    decode_strings,
    encode_strings,
    load_checkpoint,
    save_checkpoint,
)
from .geometry import cones, poincare
from .geometry.sparse import dist_and_grad, fast_gap
from .taxonomy import Taxonomy

__all__ = [
    "LabelEmbedding",
    "LabelTrainConfig",
    "evaluate_cones",
    "evaluate_reconstruction",
    "best_cone_threshold",
    "hierarchical_start",
    "train_labels",
]

KIND = "labels"


@dataclass
class LabelTrainConfig:
    """Every option of label training; the defaults are what the benchmarks use."""

    dim: int = 10
    curvature: float = 1.0
    epochs: int | None = None  # None: chosen from the number of closure edges
    lr: float = 0.03  # Riemannian SGD learning rate, decayed linearly to 0 after the burn-in
    negatives: int = 50
    local_negatives: float = 0.0  # share of negatives drawn among the descendants of the edge's ancestor
    burnin: int = 5  # epochs at lr * burnin_factor with degree-weighted negatives
    burnin_factor: float = 0.1
    batch_size: int = 1024
    init: str = "hierarchical"  # or "random" (uniform in a tiny ball, as the paper)
    init_step: float = 1.5  # hyperbolic radius added per level of depth
    init_spread: float = 1.5  # angular spread of the children of a depth-1 node
    init_decay: float = 0.5  # spread factor per further level
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
        # about 1.5 million edge visits for small taxonomies, fewer passes over big ones
        return int(min(200, max(10, round(1.3e6 / max(n_edges, 1)))))

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
        if self.init not in ("hierarchical", "random"):
            raise ValueError(f"init must be 'hierarchical' or 'random', got {self.init!r}")
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
        return cls(
            taxonomy=taxonomy,
            embeddings=emb.to(torch.float64),
            curvature=float(meta["curvature"]),
            config=meta.get("config", {}),
            metrics=meta.get("metrics", {}),
            epoch=int(meta.get("epoch", 0)),
        )

    @classmethod
    def load(cls, path: str | os.PathLike) -> LabelEmbedding:
        tensors, meta, version = load_checkpoint(path, kind=KIND)
        emb = cls.from_tensors(tensors, meta, str(path))
        emb.version = version
        return emb

    def export_tsv(self, path: str | os.PathLike) -> None:
        """``# curvature=<c> dim=<d>`` then ``name<TAB>x1…xd`` per node (17 significant digits)."""
        from .checkpoint import atomic_write_bytes

        lines = [f"# curvature={self.curvature!r} dim={self.dim}"]
        emb = self.embeddings.numpy()
        for name, row in zip(self.taxonomy.names, emb, strict=True):
            lines.append(name + "\t" + "\t".join(repr(float(v)) for v in row))
        atomic_write_bytes(path, ("\n".join(lines) + "\n").encode("utf-8"))


# ---------------------------------------------------------------- training


def hierarchical_start(
    taxonomy: Taxonomy,
    dim: int,
    *,
    curvature: float = 1.0,
    step: float = 1.5,
    spread: float = 1.5,
    decay: float = 0.5,
    seed: int = 0,
) -> torch.Tensor:
    r"""Starting points that already respect the hierarchy.

    A root sits at the origin (several roots: at radius ``step`` in random
    directions). A node of depth :math:`\ell \ge 1` sits at hyperbolic radius
    :math:`\text{step}\cdot\ell` in the direction of its first parent's
    direction plus Gaussian noise of scale
    :math:`\text{spread}\cdot\text{decay}^{\ell-1}/\sqrt{d}`.
    """
    rng = np.random.default_rng(seed)
    n = len(taxonomy)
    depth = taxonomy.depths.astype(np.int64)
    parents = [taxonomy.parent_ids(i) for i in range(n)]
    multi_root = len(taxonomy.roots()) > 1
    dirs = np.zeros((n, dim))
    radius = np.zeros(n)
    noise = rng.standard_normal((n, dim))
    for i in np.argsort(depth, kind="stable"):
        g = noise[i]
        ps = [p for p in parents[i] if depth[p] < depth[i]]
        if not ps:  # a root
            dirs[i] = g / np.linalg.norm(g)
            radius[i] = step if multi_root else 0.0
            continue
        p = ps[0]
        base = dirs[p] if radius[p] > 0 else np.zeros(dim)
        level = depth[i] if not multi_root else depth[i] + 1
        v = base + spread * decay ** max(level - 1, 0) * g / math.sqrt(dim)
        dirs[i] = v / np.linalg.norm(v)
        radius[i] = step * level
    x = torch.from_numpy(dirs) * poincare.radius_to_norm(
        torch.from_numpy(radius), c=curvature
    ).unsqueeze(-1)
    return poincare.project(x, c=curvature)


def get_lr(cfg: LabelTrainConfig, epoch: int, epochs: int) -> float:
    """Learning rate of an epoch: burn-in at lr * burnin_factor, then linear decay from lr to lr/10."""
    if epoch < cfg.burnin:
        return cfg.lr * cfg.burnin_factor
    span = max(epochs - cfg.burnin, 1)
    return cfg.lr * (1 - 0.9 * (epoch - cfg.burnin) / span)


class _EdgeSet:
    """Membership test for (u, v) pairs as sorted int64 keys."""

    def __init__(self, edges: torch.Tensor, n: int):
        self.n = n
        self.keys = torch.sort(edges[:, 0] * n + edges[:, 1]).values

    def contains(self, u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        k = u * self.n + v
        pos = torch.searchsorted(self.keys, k).clamp_max(len(self.keys) - 1)
        return self.keys[pos] == k


class _Descendants:
    """Uniform sampling of a descendant of given ancestors (closure grouped by ancestor)."""

    def __init__(self, edges: torch.Tensor, n: int):
        order = torch.argsort(edges[:, 1], stable=True)
        self.desc = edges[order, 0]
        counts = torch.bincount(edges[:, 1], minlength=n)
        self.start = torch.cumsum(counts, 0) - counts
        self.count = counts

    def sample(self, anc: torch.Tensor, k: int, gen: torch.Generator) -> torch.Tensor:
        """(b,) ancestors -> (b, k) of their descendants (every ancestor of an edge has one)."""
        r = torch.rand(len(anc), k, generator=gen, dtype=torch.float64)
        cnt = self.count[anc][:, None]
        off = (r * cnt).long().clamp_max(cnt - 1)
        return self.desc[self.start[anc][:, None] + off]


def _project_rows(theta: torch.Tensor, rows: torch.Tensor, c: float, min_norm: float = 0.0):
    x = theta[rows]
    norm = x.norm(dim=-1, keepdim=True)
    r_max = float(poincare.max_norm(c))
    scale = torch.ones_like(norm)
    scale = torch.where(norm > r_max, r_max / norm, scale)
    if min_norm > 0:
        scale = torch.where(norm < min_norm, min_norm / norm.clamp_min(1e-300), scale)
    theta[rows] = x * scale


def _rsgd_step(theta, rows, grads, lr, c):
    """Riemannian SGD on the ball: x <- proj(x - lr (g_x^2/4) grad) for each (row, grad)."""
    g = fast_gap(theta[rows], c=c)[:, None]  # 1/lambda_x = g/2: the inverse metric is (g/2)^2
    theta.index_add_(0, rows, -lr * (g * g / 4) * grads)


def _nk_epoch(theta, edges, edge_set, local, cfg, gen, lr, burn, deg_cdf, progress):
    n = theta.shape[0]
    c = cfg.curvature
    perm = torch.randperm(len(edges), generator=gen)
    total = 0.0
    for s in range(0, len(edges), cfg.batch_size):
        e = edges[perm[s : s + cfg.batch_size]]
        u, v = e[:, 0], e[:, 1]
        b = len(u)
        if burn:
            r = torch.rand(b * cfg.negatives, generator=gen, dtype=torch.float64)
            neg = torch.searchsorted(deg_cdf, r).clamp_max(n - 1).view(b, cfg.negatives)
        else:
            neg = torch.randint(0, n, (b, cfg.negatives), generator=gen)
            k = int(round(cfg.local_negatives * cfg.negatives))
            if k > 0:
                neg[:, :k] = local.sample(v, k, gen)
        bad = edge_set.contains(u[:, None].expand_as(neg), neg) | (neg == u[:, None])
        cand = torch.cat([v[:, None], neg], 1)  # (b, 1 + negatives)
        d, gu, gc = dist_and_grad(theta[u], theta[cand], c=c)
        logits = (-d).clone()
        logits[:, 1:].masked_fill_(bad, float("-inf"))
        p = torch.softmax(logits, 1)
        total += float((d[:, 0] + torch.logsumexp(logits, 1)).sum())
        # L = d_0 + logsumexp(-d): dL/dd_j = [j = 0] - p_j
        w = -p
        w[:, 0] += 1
        grad_u = (w[..., None] * gu).sum(1)
        grad_c = (w[..., None] * gc).reshape(-1, theta.shape[1])
        rows = torch.cat([u, cand.reshape(-1)])
        grads = torch.cat([grad_u, grad_c])
        if cfg.cone_weight > 0 and not burn:
            crows, cgrad, closs = _cone_grads(theta, u, v, neg, bad, cfg)
            rows = torch.cat([rows, crows])
            grads = torch.cat([grads, cfg.cone_weight * cgrad])
            total += cfg.cone_weight * closs
        _rsgd_step(theta, rows, grads, lr, c)
        if cfg.leaf_spread > 0:
            total += _leaf_spread_step(theta, progress.leaves, cfg, gen, lr)
        _project_rows(theta, rows, c)
        progress.advance(b)
    return total / max(len(edges), 1)


def _cone_grads(theta, u, v, neg, bad, cfg):
    """Ganea et al. 2018 loss on a batch: E(v, u) for edges, max(0, margin - E(v', u)) for negatives.

    ``v'`` are the batch's sampled non-ancestors of ``u``. Returns the rows,
    their Euclidean gradients and the loss value.
    """
    c, k = cfg.curvature, cfg.cone_K
    m = min(neg.shape[1], cfg.cone_negatives)
    negv = neg[:, :m]
    ok = (~bad[:, :m]).to(theta.dtype)
    rows, inverse = torch.unique(torch.cat([u, v, negv.reshape(-1)]), return_inverse=True)
    x = theta[rows].clone().requires_grad_(True)
    b = len(u)
    xu = x[inverse[:b]]
    xv = x[inverse[b : 2 * b]]
    xn = x[inverse[2 * b :]].view(b, m, -1)
    pos = cones.cone_energy(xv, xu, c=c, K=k)
    negative = cones.cone_energy(xn, xu[:, None, :], c=c, K=k)
    loss = pos.sum() + (ok * torch.relu(cfg.cone_margin - negative)).sum()
    (grad,) = torch.autograd.grad(loss, x)
    return rows, grad, float(loss.detach())


def _leaf_spread_step(theta, leaves, cfg, gen, lr):
    """Long et al. 2020: hinge pushing random pairs of leaves at least ``leaf_margin`` apart."""
    if len(leaves) < 2:
        return 0.0
    m = min(cfg.batch_size, len(leaves))
    a = leaves[torch.randint(0, len(leaves), (m,), generator=gen)]
    b = leaves[torch.randint(0, len(leaves), (m,), generator=gen)]
    keep = a != b
    a, b = a[keep], b[keep]
    d, ga, gb = dist_and_grad(theta[a], theta[b][:, None, :], c=cfg.curvature)
    active = (d[:, 0] < cfg.leaf_margin).to(theta.dtype)[:, None]
    w = -cfg.leaf_spread * active
    rows = torch.cat([a, b])
    _rsgd_step(theta, rows, torch.cat([w * ga[:, 0], w * gb[:, 0]]), lr, cfg.curvature)
    _project_rows(theta, rows, cfg.curvature)
    return float((cfg.leaf_spread * torch.relu(cfg.leaf_margin - d[:, 0])).sum())


def _cone_epoch(theta, edges, edge_set, cfg, gen, progress, state):
    """Ganea et al. 2018: energies of edges down, of negatives above the margin.

    Riemannian Adam (geoopt) on the ball: the cone energy's gradient varies by
    orders of magnitude between near and far pairs, which plain RSGD does not
    survive at any single learning rate.
    """
    import geoopt

    n = theta.shape[0]
    c = cfg.curvature
    k = cfg.cone_K
    min_norm = float(cones.inner_radius(c=c, K=k)) * (1 + 1e-6)
    if "param" not in state:
        state["param"] = geoopt.ManifoldParameter(theta.clone(), manifold=geoopt.PoincareBall(c=c))
        state["opt"] = geoopt.optim.RiemannianAdam([state["param"]], lr=cfg.cone_lr)
    param, opt = state["param"], state["opt"]
    perm = torch.randperm(len(edges), generator=gen)
    total = 0.0
    nneg = max(1, cfg.cone_negatives)
    for s in range(0, len(edges), cfg.batch_size):
        e = edges[perm[s : s + cfg.batch_size]]
        u, v = e[:, 0], e[:, 1]  # u is a descendant of v
        b = len(u)
        # negatives: corrupt the descendant (v, u') or the ancestor (v', u)
        neg_u = torch.randint(0, n, (b, nneg), generator=gen)
        neg_v = torch.randint(0, n, (b, nneg), generator=gen)
        ok_u = ~(edge_set.contains(neg_u, v[:, None].expand_as(neg_u)) | (neg_u == v[:, None]))
        ok_v = ~(edge_set.contains(u[:, None].expand_as(neg_v), neg_v) | (neg_v == u[:, None]))
        apex = torch.cat([v, v[:, None].expand_as(neg_u).reshape(-1), neg_v.reshape(-1)])
        tail = torch.cat([u, neg_u.reshape(-1), u[:, None].expand_as(neg_v).reshape(-1)])
        weight = torch.cat([ok_u.reshape(-1), ok_v.reshape(-1)]).to(theta.dtype)
        opt.zero_grad(set_to_none=True)
        energy = cones.cone_energy(param[apex], param[tail], c=c, K=k)
        loss = energy[:b].sum() + (weight * torch.relu(cfg.cone_margin - energy[b:])).sum()
        (loss / b).backward()
        opt.step()
        with torch.no_grad():
            rows = torch.unique(torch.cat([apex, tail]))
            _project_rows(param.data, rows, c, min_norm=min_norm)
        total += float(loss.detach())
        progress.advance(b)
    theta.copy_(param.data)
    return total / max(len(edges), 1)


class _Progress:
    """tqdm over edge visits (stderr), or nothing."""

    def __init__(self, total: int, enabled: bool, desc: str, unit: str = "edge"):
        self.bar = None
        if enabled:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, desc=desc, unit=unit, unit_scale=True, leave=True)
        self.leaves: torch.Tensor | None = None

    def advance(self, k: int) -> None:
        if self.bar is not None:
            self.bar.update(k)

    def post(self, **kw) -> None:
        if self.bar is not None:
            self.bar.set_postfix(**kw)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def train_labels(
    taxonomy: Taxonomy,
    config: LabelTrainConfig | None = None,
    *,
    progress: bool = False,
    checkpoint_path: str | os.PathLike | None = None,
    resume: LabelEmbedding | None = None,
    save_every: int = 1,
    on_epoch: Callable[[int, float, torch.Tensor], None] | None = None,
) -> LabelEmbedding:
    """Train label embeddings of ``taxonomy``.

    With ``checkpoint_path``, a checkpoint of the current state is written
    atomically every ``save_every`` epochs (and at the end); ``resume`` (a
    loaded, unfinished checkpoint of the same taxonomy and config) continues
    from its last saved epoch. The random state of epoch ``k`` depends only
    on the seed and ``k``, so a resumed run ends where an uninterrupted one
    would.
    """
    cfg = config or LabelTrainConfig()
    cfg.validate()
    torch_threads = torch.get_num_threads()
    edges_np = taxonomy.closure_edges()
    if len(edges_np) == 0:
        raise ValueError("the taxonomy has no edges to train on")
    edges = torch.from_numpy(edges_np)
    n = len(taxonomy)
    nk_epochs = cfg.resolved_epochs(len(edges))
    total_epochs = nk_epochs + cfg.cone_epochs
    cfg_dict = dataclasses.asdict(cfg) | {"epochs": nk_epochs}

    if resume is not None:
        if resume.taxonomy != taxonomy:
            raise ValueError("cannot resume: the checkpoint was trained on another taxonomy")
        if resume.config != cfg_dict:
            raise ValueError("cannot resume: the checkpoint was trained with other options")
        theta = resume.embeddings.clone().to(torch.float64)
        start = resume.epoch
    else:
        start = 0
        if cfg.init == "hierarchical":
            theta = hierarchical_start(
                taxonomy,
                cfg.dim,
                curvature=cfg.curvature,
                step=cfg.init_step,
                spread=cfg.init_spread,
                decay=cfg.init_decay,
                seed=cfg.seed,
            )
        else:
            gen = torch.Generator().manual_seed(cfg.seed)
            theta = (torch.rand(n, cfg.dim, generator=gen, dtype=torch.float64) - 0.5) * 2e-3
    theta = theta.contiguous()

    edge_set = _EdgeSet(edges, n)
    local = _Descendants(edges, n)
    deg = torch.bincount(edges.reshape(-1), minlength=n).to(torch.float64) ** 0.75
    deg_cdf = torch.cumsum(deg, 0)
    deg_cdf /= deg_cdf[-1].clone()
    bar = _Progress(len(edges) * (total_epochs - start), progress, "labels")
    if cfg.leaf_spread > 0:
        bar.leaves = torch.tensor([taxonomy.index(x) for x in taxonomy.leaves()])
    emb = LabelEmbedding(taxonomy, theta, cfg.curvature, config=cfg_dict, epoch=start)
    t0 = time.perf_counter()
    cone_state: dict[str, Any] = {}
    try:
        for epoch in range(start, total_epochs):
            gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + epoch + 1)
            if epoch < nk_epochs:
                burn = epoch < cfg.burnin
                lr = get_lr(cfg, epoch, nk_epochs)
                loss = _nk_epoch(theta, edges, edge_set, local, cfg, gen, lr, burn, deg_cdf, bar)
            else:
                loss = _cone_epoch(theta, edges, edge_set, cfg, gen, bar, cone_state)
            if not torch.isfinite(theta).all():
                raise FloatingPointError(f"training diverged at epoch {epoch + 1} (non-finite)")
            bar.post(epoch=epoch + 1, loss=f"{loss:.4f}")
            emb.epoch = epoch + 1
            emb.metrics = {"loss": loss, "train_seconds": time.perf_counter() - t0}
            if checkpoint_path is not None and (
                (epoch + 1) % save_every == 0 or epoch + 1 == total_epochs
            ):
                emb.save(checkpoint_path)
            if on_epoch is not None:
                on_epoch(epoch + 1, loss, theta)
    finally:
        bar.close()
        torch.set_num_threads(torch_threads)
    emb.metrics["finished"] = True
    if checkpoint_path is not None:
        emb.save(checkpoint_path)
    return emb


def is_finished(emb: LabelEmbedding) -> bool:
    return bool(emb.metrics.get("finished"))


# ---------------------------------------------------------------- evaluation


def _grouped(edges: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    order = np.lexsort((edges[:, 1], edges[:, 0]))
    es = edges[order]
    starts = np.searchsorted(es[:, 0], np.arange(n + 1))
    return es, starts


def evaluate_reconstruction(
    emb: LabelEmbedding,
    taxonomy: Taxonomy | None = None,
    *,
    sample: int | None = None,
    seed: int = 0,
    chunk: int = 256,
    progress: bool = False,
) -> dict[str, float]:
    """Mean rank and MAP of the closure edges (Nickel and Kiela 2017).

    ``taxonomy`` defaults to the embedding's own; its closure edges
    ``(u, v)`` are ranked among the non-neighbours of ``u``. ``sample``
    evaluates a random subset of the nodes (faster, for progress reports).
    """
    taxonomy = taxonomy or emb.taxonomy
    names = taxonomy.names
    if names != emb.taxonomy.names:
        rows = torch.tensor([emb.taxonomy.index(x) for x in names])
        theta = emb.embeddings[rows]
    else:
        theta = emb.embeddings
    n = len(names)
    edges = taxonomy.closure_edges()
    es, starts = _grouped(edges, n)
    us = np.unique(edges[:, 0])
    if sample is not None and sample < len(us):
        us = np.sort(np.random.default_rng(seed).choice(us, sample, replace=False))
    c = emb.curvature
    rank_sum = 0.0
    rank_n = 0
    ap_sum = 0.0
    bar = _Progress(len(us), progress, "reconstruction", unit="node")
    for s in range(0, len(us), chunk):
        ub = torch.from_numpy(us[s : s + chunk])
        b = len(ub)
        z = poincare.pairwise_dist_arg(theta[ub], theta, c=c)  # monotone in the distance
        z[torch.arange(b), ub] = float("inf")
        # positives (ancestors) of each row, sorted, padded with +inf
        counts = starts[us[s : s + chunk] + 1] - starts[us[s : s + chunk]]
        pmax = int(counts.max())
        cols = torch.zeros(b, pmax, dtype=torch.long)
        valid = torch.arange(pmax)[None, :] < torch.from_numpy(counts)[:, None]
        for r, u in enumerate(ub.tolist()):
            cols[r, : counts[r]] = torch.from_numpy(es[starts[u] : starts[u + 1], 1])
        zp = torch.gather(z, 1, cols).masked_fill(~valid, float("inf"))
        zp, _ = torch.sort(zp, dim=1)
        # only values below the farthest positive matter: take those, sorted
        zmax = zp.masked_fill(~valid, float("-inf")).max(dim=1, keepdim=True).values
        k = int((z <= zmax).sum(dim=1).max())
        closest = torch.topk(z, k, dim=1, largest=False, sorted=True).values
        closer = torch.searchsorted(closest, zp.contiguous(), side="left")  # nodes strictly closer
        j = torch.arange(1, pmax + 1, dtype=torch.float64)[None, :]
        ranks = (closer - (j - 1) + 1).to(torch.float64)
        rank_sum += float(ranks[valid].sum())
        rank_n += int(valid.sum())
        prec = (j / (closer + 1)).masked_fill(~valid, 0.0)
        ap_sum += float((prec.sum(1) / torch.from_numpy(counts).to(torch.float64)).sum())
        bar.advance(b)
    bar.close()
    return {
        "nodes": n,
        "edges": int(len(edges)),
        "mean_rank": rank_sum / max(rank_n, 1),
        "map": ap_sum / max(len(us), 1),
        "evaluated_nodes": int(len(us)),
    }


def evaluate_cones(
    emb: LabelEmbedding,
    taxonomy: Taxonomy | None = None,
    *,
    K: float | None = None,
    tol: float = 0.0,
    chunk: int = 128,
    sample: int | None = None,
    seed: int = 0,
    progress: bool = False,
) -> dict[str, float]:
    """Precision, recall and F1 of "u is in the cone of v" against the closure pairs.

    Every ordered pair (v, u), u != v, is predicted "u entails v" when the
    cone energy E(v, u) <= ``tol``. ``sample`` evaluates the pairs of a random
    subset of apexes v only (an unbiased estimate of the counts, for big
    taxonomies).
    """
    taxonomy = taxonomy or emb.taxonomy
    theta = emb.embeddings
    if taxonomy.names != emb.taxonomy.names:
        theta = theta[torch.tensor([emb.taxonomy.index(x) for x in taxonomy.names])]
    K = float(emb.config.get("cone_K", 0.1)) if K is None else K
    n = len(taxonomy)
    edges = taxonomy.closure_edges()
    # group by ancestor: row v holds its descendants
    by_anc = edges[:, ::-1].copy()
    es, starts = _grouped(by_anc, n)
    apexes = np.arange(n)
    if sample is not None and sample < n:
        apexes = np.sort(np.random.default_rng(seed).choice(n, sample, replace=False))
    tp = fp = 0
    n_pos = 0
    bar = _Progress(len(apexes), progress, "cones", unit="node")
    for s in range(0, len(apexes), chunk):
        vb = torch.from_numpy(apexes[s : s + chunk])
        e = cones.pairwise_cone_energy(theta[vb], theta, c=emb.curvature, K=K)
        pred = e <= tol
        pred[torch.arange(len(vb)), vb] = False
        truth = torch.zeros_like(pred)
        for r, v in enumerate(vb.tolist()):
            truth[r, torch.from_numpy(es[starts[v] : starts[v + 1], 1])] = True
        n_pos += int(truth.sum())
        tp += int((pred & truth).sum())
        fp += int((pred & ~truth).sum())
        bar.advance(len(vb))
    bar.close()
    fn = n_pos - tp
    precision = tp / max(tp + fp, 1)
    recall = tp / max(tp + fn, 1)
    f1 = 2 * precision * recall / max(precision + recall, 1e-300)
    return {
        "cone_precision": precision,
        "cone_recall": recall,
        "cone_f1": f1,
        "cone_K": K,
        "cone_tol": tol,
        "cone_apexes": int(len(apexes)),
    }


def best_cone_threshold(
    emb: LabelEmbedding,
    taxonomy: Taxonomy | None = None,
    *,
    K: float | None = None,
    sample: int | None = 2000,
    seed: int = 0,
) -> dict[str, float]:
    """The energy threshold with the best containment F1, as Ganea et al. tune it.

    Computed on the pairs of a sample of apexes; pass the threshold back to
    :func:`evaluate_cones` as ``tol`` to score all pairs.
    """
    taxonomy = taxonomy or emb.taxonomy
    theta = emb.embeddings
    K = float(emb.config.get("cone_K", 0.1)) if K is None else K
    n = len(taxonomy)
    rng = np.random.default_rng(seed)
    apexes = np.arange(n) if sample is None or sample >= n else rng.choice(n, sample, replace=False)
    by_anc = taxonomy.closure_edges()[:, ::-1].copy()
    es, starts = _grouped(by_anc, n)
    energies, labels = [], []
    for s in range(0, len(apexes), 128):
        vb = torch.from_numpy(np.asarray(apexes[s : s + 128]))
        e = cones.pairwise_cone_energy(theta[vb], theta, c=emb.curvature, K=K)
        truth = torch.zeros_like(e, dtype=torch.bool)
        for r, v in enumerate(vb.tolist()):
            truth[r, torch.from_numpy(es[starts[v] : starts[v + 1], 1])] = True
        e[torch.arange(len(vb)), vb] = float("inf")
        energies.append(e.flatten())
        labels.append(truth.flatten())
    vals = torch.cat(energies)
    lab = torch.cat(labels)
    order = torch.argsort(vals)
    hit = lab[order].to(torch.float64)
    tp = torch.cumsum(hit, 0)
    fp = torch.cumsum(1 - hit, 0)
    total = hit.sum().clamp_min(1)
    f1 = 2 * tp / (tp + fp + total)
    i = int(torch.argmax(f1))
    return {"threshold": float(vals[order][i]), "f1": float(f1[i])}


def load_labels(path: str | os.PathLike) -> LabelEmbedding:
    return LabelEmbedding.load(Path(path))
