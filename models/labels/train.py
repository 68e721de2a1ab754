r"""Label training: Riemannian SGD on float64 coordinates, in two stages.

1. **Poincaré embeddings** (Nickel and Kiela 2017). For every closure edge
   :math:`(u, v)` (``v`` an ancestor of ``u``) and sampled negatives
   :math:`v'` with :math:`(u, v')` not an edge, minimise
   :math:`-\log \frac{e^{-d(u,v)}}{\sum_{v''\in\{v\}\cup N(u)} e^{-d(u,v'')}}`.
   A burn-in of a few epochs uses a tenth of the learning rate and negatives
   drawn by frequency (degree^0.75), as the paper does. The points start
   from :func:`models.labels.start.hierarchical_start` by default.
2. **Entailment cones** (Ganea et al. 2018), optional (``cone_epochs``):
   hinge on the cone energy, :math:`E(v, u)` for edges and
   :math:`\max(0, \gamma - E(v, u'))` for negatives, so that each node's cone
   holds its descendants and not the rest. Points are kept at norm at least
   the cone's inner radius.

An optional leaf-spreading term (Long et al. 2020) pushes leaves at least a
margin apart, which makes fine-grained classes easier to tell apart.

The random state of epoch ``k`` depends only on the seed and ``k``, and the
state is checkpointed after epochs, so an interrupted run resumes exactly.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from typing import Any

import torch

from ..geometry import cones, poincare
from ..geometry.sparse import dist_and_grad, fast_gap
from ..taxonomy.graph import Taxonomy
from ._progress import _Progress
from .construct import cap_construction
from .embedding import LabelEmbedding, LabelTrainConfig
from .start import hierarchical_start

__all__ = ["get_lr", "train_labels"]


def get_lr(cfg: LabelTrainConfig, epoch: int, epochs: int) -> float:
    """Learning rate of an epoch: burn-in at lr * burnin_factor, then linear from lr to lr/10."""
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
    """Ganea et al. 2018 loss on a batch: E(v, u) for edges, max(0, margin - E(v', u)) else.

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


def _options(cfg: LabelTrainConfig, prefix: str) -> dict[str, Any]:
    """The config's fields named ``prefix + name`` as ``{name: value}`` (``cap_margin``
    -> ``margin``): the keywords of the start they configure."""
    return {
        f.name.removeprefix(prefix): getattr(cfg, f.name)
        for f in dataclasses.fields(cfg)
        if f.name.startswith(prefix)
    }


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
    t0 = time.perf_counter()
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

    construction: dict[str, Any] = {}
    if resume is not None:
        if resume.taxonomy != taxonomy:
            raise ValueError("cannot resume: the checkpoint was trained on another taxonomy")
        if resume.config != cfg_dict:
            raise ValueError("cannot resume: the checkpoint was trained with other options")
        theta = resume.embeddings.clone().to(torch.float64)
        start = resume.epoch
    else:
        start = 0
        if cfg.init == "cap":
            placed = cap_construction(
                taxonomy,
                cfg.dim,
                curvature=cfg.curvature,
                theta0=cfg.cone_theta0,
                beta=cfg.cone_beta,
                seed=cfg.seed,
                **_options(cfg, "cap_"),
            )
            theta = placed.points
            construction = placed.info
        elif cfg.init == "hierarchical":
            theta = hierarchical_start(
                taxonomy, cfg.dim, curvature=cfg.curvature, seed=cfg.seed, **_options(cfg, "init_")
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
    emb = LabelEmbedding(
        taxonomy, theta, cfg.curvature, config=cfg_dict, epoch=start, cone=cfg.cone_spec()
    )
    emb.metrics = dict(resume.metrics) if resume is not None else {"loss": None}
    if construction:
        emb.metrics["construction"] = construction
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
            emb.metrics |= {"loss": loss, "train_seconds": time.perf_counter() - t0}
            if checkpoint_path is not None and (
                (epoch + 1) % save_every == 0 or epoch + 1 == total_epochs
            ):
                emb.save(checkpoint_path)
            if on_epoch is not None:
                on_epoch(epoch + 1, loss, theta)
    finally:
        bar.close()
        torch.set_num_threads(torch_threads)
    emb.metrics.setdefault("train_seconds", time.perf_counter() - t0)
    emb.metrics["finished"] = True
    if checkpoint_path is not None:
        emb.save(checkpoint_path)
    return emb
