r"""Auxiliary objectives of image training, beside the main loss of
:data:`models.training.losses.LOSSES`.

Each is a term added to the main objective with its own weight (options of
:class:`~models.training.config.TrainConfig`, flags of ``hypsearch train``):

* :func:`hier_loss` (``hier_weight``; HIER, Kim et al. CVPR 2023):
  learnable proxies in the space of the embeddings (:class:`HierProxies`, on
  the ball for a hyperbolic model) act as the inner nodes of a latent
  hierarchy. For a triplet (i, j, k) where (i, j) is the closer pair, the
  lowest common ancestor of a set S is the proxy minimising
  :math:`\max_{s\in S} d(z_s, \rho)` (:func:`hier_lca`); the loss asks
  :math:`\rho_{ij}` to be nearer to i and j than :math:`\rho_{ijk}` is, and
  :math:`\rho_{ijk}` nearer to k than :math:`\rho_{ij}` is (margin
  ``hier_margin``), for triplets whose two LCAs differ. The same term on the
  proxies themselves builds their own hierarchy.
* :func:`contrastive_loss` (``contrastive`` ``hyperbolic`` or ``euclidean``,
  ``contrastive_weight``): NT-Xent over two augmented views, with the
  similarity :math:`-d/\tau` of the model's space (hyperbolic contrastive
  learning, Yue et al. 2023, on the ball) or the cosine of the tangent
  vectors at the head's base point (SimCLR's similarity).
* :func:`byol_loss` and :func:`barlow_loss` (``ssl`` ``byol`` or ``barlow``,
  ``ssl_weight``): BYOL (Grill et al. 2020: an online projector and
  predictor against an exponential moving average of the encoder and
  projector) and Barlow Twins (Zbontar et al. 2021: the cross-correlation of
  the two views' projections pushed to the identity), on the encoder's
  features through an MLP projector (:class:`SSLHead`).
* :func:`hmlr_logits` (``classifier="hmlr"``; Ganea et al. 2018): the
  hyperbolic multinomial logistic regression of the ball embeddings,
  :class:`HMLR`, in place of the linear auxiliary classifier on the features.
* :func:`log_ratio_loss` (``unsupervised``; Yan et al. CVPR 2021 with the
  log-ratio loss of Kim et al. CVPR 2019): the embedding's log distance
  ratios match the log ratios of the levels at which two images merge in a
  hierarchical clustering of the embeddings (:func:`cluster_levels`, redone
  every epoch).
* :func:`sampled_columns` (``negative_sample``): the prototype softmax over the
  trained classes and a uniform sample of the other taxonomy nodes, so a
  step's cost does not grow with the taxonomy (every node sampled: the full
  softmax).

:class:`Extras` holds the trainable parts of these terms (saved in the run
state under ``extra.``, dropped after training) and computes their sum for a
step.
"""

from __future__ import annotations

import copy
import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..geometry import numerics as nm
from ..geometry import poincare
from ..vision.heads import Space
from .losses import nt_xent, sampled_columns

__all__ = [
    "HMLR",
    "Extras",
    "HierProxies",
    "SSLHead",
    "barlow_loss",
    "build_extras",
    "byol_loss",
    "cluster_levels",
    "contrastive_loss",
    "hier_lca",
    "hier_loss",
    "hmlr_logits",
    "log_ratio_loss",
    "merge_levels",
    "sampled_columns",
]


# ---------------------------------------------------------------- hyperbolic MLR


def hmlr_logits(z: torch.Tensor, p: torch.Tensor, a: torch.Tensor, c: float) -> torch.Tensor:
    r"""Logits of hyperbolic multinomial logistic regression (Ganea et al. 2018, eq. 25).

    z (n, D) points of the ball of curvature -c, p (K, D) points of the ball
    (the hyperplanes' offsets), a (K, D) their normals (tangent vectors at p):

    .. math::

        \xi_k(z) = \frac{\lambda_{p_k}\|a_k\|}{\sqrt c}
        \operatorname{asinh}\Bigl(\frac{2\sqrt c\,\langle -p_k \oplus_c z, a_k\rangle}
        {(1 - c\|-p_k \oplus_c z\|^2)\,\|a_k\|}\Bigr),\qquad
        \lambda_p = \frac{2}{1 - c\|p\|^2}.

    Returns (n, K). The signed distance to the k-th hyperplane times
    :math:`\lambda_{p_k}\|a_k\|`.
    """
    sc = math.sqrt(c)
    n, k = z.shape[0], p.shape[0]
    zz = z[:, None, :].expand(n, k, -1)
    pp = (-p)[None, :, :].expand(n, k, -1)
    w = poincare.mobius_add(pp, zz, c=c)  # (n, K, D)
    a_norm = nm.safe_norm(a)  # (K,)
    lam = 2.0 / nm.one_minus_c_sqnorm(p, c)  # (K,)
    inner = (w * a[None]).sum(-1)  # (n, K)
    denom = nm.one_minus_c_sqnorm(w, c) * a_norm[None]
    return lam[None] * a_norm[None] / sc * torch.asinh(2 * sc * inner / denom)


class HMLR(nn.Module):
    """Hyperbolic MLR over ``k`` classes in the ball (``geometry="poincare"``), or its
    Euclidean limit :math:`\\langle z - p_k, a_k\\rangle` for the twin; float64."""

    def __init__(self, k: int, dim: int, c: float, geometry: str, base: torch.Tensor):
        super().__init__()
        import geoopt

        self.c = float(c)
        self.geometry = geometry
        g = torch.Generator().manual_seed(0)
        a = torch.randn(k, dim, generator=g, dtype=torch.float64) * 0.1
        self.a = nn.Parameter(a)
        start = base.detach().to(torch.float64).expand(k, dim).clone()
        if geometry == "poincare":
            self.p = geoopt.ManifoldParameter(start, manifold=geoopt.PoincareBall(c=self.c))
        else:
            self.p = nn.Parameter(torch.zeros(k, dim, dtype=torch.float64))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        if self.geometry == "poincare":
            return hmlr_logits(z, self.p, self.a, self.c)
        return (z[:, None, :] - self.p[None]).mul(self.a[None]).sum(-1)


# ---------------------------------------------------------------- HIER


def hier_lca(d_i: torch.Tensor, d_j: torch.Tensor, d_k: torch.Tensor | None = None) -> torch.Tensor:
    """Index of the lowest common ancestor among the proxies: the proxy minimising the
    largest distance to the members, rows of (t, P) distance matrices -> (t,) long."""
    m = torch.maximum(d_i, d_j)
    if d_k is not None:
        m = torch.maximum(m, d_k)
    return m.argmin(1)


def _triplet_hinge(d: torch.Tensor, i, j, k, margin: float) -> torch.Tensor:
    """The HIER hinge of triplets (i, j, k) over ``d`` (points, P) distances to the proxies."""
    di, dj, dk = d[i], d[j], d[k]
    lij = hier_lca(di.detach(), dj.detach())
    lijk = hier_lca(di.detach(), dj.detach(), dk.detach())

    def at(rows, col):
        return rows.gather(1, col[:, None]).squeeze(1)

    loss = (
        (at(di, lij) - at(di, lijk) + margin).clamp_min(0)
        + (at(dj, lij) - at(dj, lijk) + margin).clamp_min(0)
        + (at(dk, lijk) - at(dk, lij) + margin).clamp_min(0)
    )
    valid = (lij != lijk).to(loss.dtype)
    return (loss * valid).sum() / max(1, len(loss))


def _sample_triplets(sim: torch.Tensor, pos: torch.Tensor, per_anchor: int, gen):
    """(i, j, k): j among the anchor's positives, k among the rest, ``per_anchor`` per anchor."""
    n = sim.shape[0]
    eye = torch.eye(n, dtype=torch.bool)
    pos = pos & ~eye
    neg = ~pos & ~eye
    ok = pos.any(1) & neg.any(1)
    anchors = torch.nonzero(ok).flatten()
    if len(anchors) == 0:
        return None
    # a random positive and negative by Gumbel-max over masked uniform scores
    pw = pos[anchors].to(torch.float64)
    nw = neg[anchors].to(torch.float64)
    j = torch.multinomial(pw, per_anchor, replacement=True, generator=gen)
    k = torch.multinomial(nw, per_anchor, replacement=True, generator=gen)
    i = anchors[:, None].expand_as(j)
    return i.reshape(-1), j.reshape(-1), k.reshape(-1)


def hier_loss(
    z: torch.Tensor,
    y: torch.Tensor | None,
    proxies: torch.Tensor,
    space: Space,
    margin: float = 0.1,
    per_anchor: int = 4,
    topk: int = 8,
    gen: torch.Generator | None = None,
) -> torch.Tensor:
    """HIER on a batch ``z`` (n, D) and ``proxies`` (P, D) of the same space.

    Positive pairs: the same class (``y``), or, without labels (or beside
    them), reciprocal nearest neighbours among the ``topk`` nearest in the
    batch; negatives: the rest. Plus the same term on the proxies themselves
    (their reciprocal neighbours), so the proxies form their own hierarchy.
    """
    n = z.shape[0]
    everything = torch.cat([z, proxies])
    d_all = space.pairwise(everything, proxies)  # (n + P, P)
    d_zp = d_all[:n]

    def reciprocal(d):
        kk = min(topk, d.shape[0] - 1)
        if kk < 1:
            return torch.zeros_like(d, dtype=torch.bool)
        dd = d.detach().clone()
        dd.fill_diagonal_(float("inf"))
        idx = dd.topk(kk, dim=1, largest=False).indices
        nnm = torch.zeros_like(dd, dtype=torch.bool).scatter_(1, idx, True)
        return nnm & nnm.T

    d_zz = space.pairwise(z.detach(), z.detach())
    pos = reciprocal(d_zz)
    if y is not None and (y >= 0).all():
        pos = pos | (y[:, None] == y[None, :])
    loss = z.sum() * 0.0
    t = _sample_triplets(d_zz, pos, per_anchor, gen)
    if t is not None:
        loss = loss + _triplet_hinge(d_zp, *t, margin)
    d_pp = d_all[n:]
    t = _sample_triplets(d_pp, reciprocal(d_pp), per_anchor, gen)
    if t is not None:
        loss = loss + _triplet_hinge(d_pp, *t, margin)
    return loss


class HierProxies(nn.Module):
    """``n`` learnable proxies around the head's base point (on the ball for a
    hyperbolic model, Riemannian Adam; plain vectors for the twin)."""

    def __init__(self, n: int, dim: int, c: float, geometry: str, base: torch.Tensor, seed=0):
        super().__init__()
        import geoopt

        g = torch.Generator().manual_seed(seed)
        v = torch.randn(n, dim, generator=g, dtype=torch.float64)
        v = v / v.norm(dim=1, keepdim=True) * 0.9 * torch.rand(n, 1, generator=g).double()
        if geometry == "poincare":
            start = poincare.mobius_add(
                base.detach().double().expand(n, dim), poincare.expmap0(v, c=c), c=c
            )
            self.points = geoopt.ManifoldParameter(start, manifold=geoopt.PoincareBall(c=c))
        else:
            self.points = nn.Parameter(v * 2)


# ---------------------------------------------------------------- contrastive and SSL


def contrastive_loss(
    z1: torch.Tensor, z2: torch.Tensor, space: Space, kind: str, tau: float
) -> torch.Tensor:
    """NT-Xent of two views: ``hyperbolic`` similarity -d/tau of ``space`` (on the ball:
    Yue et al. 2023), ``euclidean`` the cosine of the tangent vectors at the base point / tau."""
    if kind == "hyperbolic":
        return nt_xent(z1, z2, space, tau)
    if kind != "euclidean":
        raise ValueError(f"unknown contrastive similarity {kind!r} (hyperbolic or euclidean)")
    t1, t2 = _tangent(z1, space), _tangent(z2, space)
    n = z1.shape[0]
    t = F.normalize(torch.cat([t1, t2]), dim=1)
    logits = t @ t.T / tau
    logits = logits.masked_fill(torch.eye(2 * n, dtype=torch.bool), float("-inf"))
    target = torch.cat([torch.arange(n, 2 * n), torch.arange(n)])
    return F.cross_entropy(logits, target)


def _tangent(z: torch.Tensor, space: Space) -> torch.Tensor:
    """Tangent vectors at the head's base point (the twin's vectors are those already)."""
    c = getattr(space, "c", 1.0)
    if getattr(space, "name", "") != "poincare":
        return z
    base = getattr(space, "base", None)
    if base is not None:
        z = poincare.mobius_add(-base.to(z.dtype).expand_as(z), z, c=c)
    return poincare.logmap0(z, c=c)


def byol_loss(p: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """BYOL's 2 - 2 cos(p, t) with the target ``t`` detached, mean over rows."""
    return (2 - 2 * F.cosine_similarity(p, t.detach(), dim=1)).mean()


def barlow_loss(h1: torch.Tensor, h2: torch.Tensor, lam: float = 5e-3) -> torch.Tensor:
    r"""Barlow Twins: :math:`\sum_i (1 - C_{ii})^2 + \lambda \sum_{i \ne j} C_{ij}^2`, with
    C the cross-correlation of the batch-standardised projections (n, P); divided by P."""
    n = h1.shape[0]
    a = (h1 - h1.mean(0)) / h1.std(0).clamp_min(1e-6)
    b = (h2 - h2.mean(0)) / h2.std(0).clamp_min(1e-6)
    cc = a.T @ b / n
    on = (1 - cc.diagonal()).pow(2).sum()
    off = cc.pow(2).sum() - cc.diagonal().pow(2).sum()
    return (on + lam * off) / cc.shape[0]


def _mlp(i: int, h: int, o: int) -> nn.Module:
    return nn.Sequential(nn.Linear(i, h), nn.BatchNorm1d(h), nn.ReLU(), nn.Linear(h, o))


class SSLHead(nn.Module):
    """Projector (and BYOL's predictor and target networks) on the encoder's features."""

    def __init__(self, kind: str, encoder: nn.Module, features: int, hidden=256, out=64):
        super().__init__()
        self.kind = kind
        self.projector = _mlp(features, hidden, out)
        if kind == "byol":
            self.predictor = _mlp(out, hidden, out)
            self.target_encoder = copy.deepcopy(encoder)
            self.target_projector = copy.deepcopy(self.projector)
            for p in [*self.target_encoder.parameters(), *self.target_projector.parameters()]:
                p.requires_grad_(False)

    @torch.no_grad()
    def update_target(self, encoder: nn.Module, tau: float) -> None:
        """EMA: target <- tau target + (1 - tau) online."""
        pairs = [(self.target_encoder, encoder), (self.target_projector, self.projector)]
        for tgt, src in pairs:
            for pt, ps in zip(tgt.parameters(), src.parameters(), strict=True):
                pt.mul_(tau).add_(ps.detach(), alpha=1 - tau)
            for bt, bs in zip(tgt.buffers(), src.buffers(), strict=True):
                bt.copy_(bs)

    def loss(self, x: torch.Tensor, feats: torch.Tensor, autocast) -> torch.Tensor:
        h = self.projector(feats.float())
        h1, h2 = h.chunk(2)
        if self.kind == "barlow":
            return barlow_loss(h1, h2)
        with torch.no_grad(), autocast:
            self.target_encoder.train(self.projector.training)
            t = self.target_projector(self.target_encoder(x).float())
        t1, t2 = t.float().chunk(2)
        p1, p2 = self.predictor(h1).chunk(1)[0], self.predictor(h2)
        return 0.5 * (byol_loss(p1, t2) + byol_loss(p2, t1))


# ---------------------------------------------------------------- unsupervised: cluster levels


def cluster_levels(
    z: torch.Tensor, space: Space, levels: list[int]
) -> tuple[np.ndarray, np.ndarray]:
    """Agglomerative (average-linkage) clustering of ``z`` (m, D) by the space's distances,
    cut at each cluster count of ``levels`` (coarsest first). Cuts of one dendrogram nest.

    Returns ``assign`` (m, L) int (cluster of each point at each level, numbered
    within the level) and ``parent`` (L, max clusters) int: the cluster of the
    level above holding each cluster (-1 at the coarsest level).
    """
    from scipy.cluster.hierarchy import fcluster, linkage
    from scipy.spatial.distance import squareform

    d = space.pairwise(z.detach(), z.detach()).double().numpy()
    d = 0.5 * (d + d.T)
    np.fill_diagonal(d, 0.0)
    tree = linkage(squareform(d, checks=False), method="average")
    assign = np.stack([fcluster(tree, t=k, criterion="maxclust") - 1 for k in levels], axis=1)
    width = int(assign.max()) + 1
    parent = np.full((len(levels), width), -1, dtype=np.int64)
    for lv in range(1, len(levels)):
        parent[lv, assign[:, lv]] = assign[:, lv - 1]
    return assign.astype(np.int64), parent


def merge_levels(paths: torch.Tensor) -> torch.Tensor:
    """How far up two points merge: paths (n, L) cluster ids, coarsest first -> (n, n)
    in 1..L+1 (1: the same finest cluster; L+1: different clusters already at the top)."""
    same = paths[:, None, :] == paths[None, :, :]  # (n, n, L)
    # number of levels, from the finest, at which they differ (nested: a suffix)
    return 1 + (~same).sum(-1)


def log_ratio_loss(
    z: torch.Tensor, target: torch.Tensor, space: Space, k: int = 12, gen=None
) -> torch.Tensor:
    r"""Log-ratio loss (Kim et al. 2019): for an anchor a and two others i, j,
    :math:`(\log d_{ai} - \log d_{aj} - \log D_{ai} + \log D_{aj})^2`, ``D`` the target
    dissimilarities (n, n) > 0 (here the merge levels); ``k`` others sampled per anchor."""
    n = z.shape[0]
    k = min(k, n - 1)
    if k < 2:
        return z.sum() * 0.0
    scores = torch.rand(n, n, generator=gen)
    scores.fill_diagonal_(-1.0)
    others = scores.topk(k, dim=1).indices  # (n, k), never the anchor
    d = space.dist(z[:, None, :].expand(n, k, -1).reshape(n * k, -1), z[others].reshape(n * k, -1))
    ld = d.clamp_min(1e-6).log().view(n, k)
    lt = target.to(ld.dtype).gather(1, others).log()
    diff = (ld[:, :, None] - ld[:, None, :]) - (lt[:, :, None] - lt[:, None, :])
    iu = torch.triu_indices(k, k, 1)
    return diff[:, iu[0], iu[1]].pow(2).mean()


# ---------------------------------------------------------------- the extras of a run


class Extras(nn.Module):
    """The trainable parts of the auxiliary terms of a run and their weighted sum.

    Built by :func:`build_extras` from the config; :meth:`loss` adds, for one
    step, HIER, the contrastive term, the SSL term, the HMLR classifier and
    the unsupervised log-ratio term that are on. The cluster state of the
    unsupervised term (``centroids``, ``paths`` of the finest clusters) is
    refreshed each epoch by :meth:`recluster`.
    """

    def __init__(self, cfg, space: Space, encoder: nn.Module, features: int, k: int, c, base):
        super().__init__()
        self.cfg = cfg
        self.space = space
        self.gen = torch.Generator().manual_seed(cfg.seed * 7919 + 1)
        dim = base.shape[0]
        geometry = cfg.geometry if cfg.space is None else "euclidean"
        if cfg.hier_weight > 0:
            self.hier = HierProxies(cfg.hier_proxies, dim, c, geometry, base, seed=cfg.seed)
        if cfg.classifier == "hmlr" and cfg.aux > 0 and k > 0:
            self.hmlr = HMLR(k, dim, c, geometry, base)
        if cfg.ssl != "none":
            self.ssl = SSLHead(cfg.ssl, encoder, features)
        self.centroids: torch.Tensor | None = None
        self.paths: torch.Tensor | None = None
        self.cluster_tree: dict | None = None

    @property
    def two_views(self) -> bool:
        return self.cfg.contrastive != "none" or self.cfg.ssl != "none" or self.cfg.unsupervised

    def loss(self, x, feats, z, y, autocast) -> tuple[torch.Tensor, dict]:
        cfg = self.cfg
        total = z.sum() * 0.0
        parts: dict[str, float] = {}
        views = z.shape[0] // max(1, len(y))
        yy = y.repeat(views) if views > 1 else y
        labelled = bool(len(y)) and bool((y >= 0).all())
        if cfg.hier_weight > 0:
            term = hier_loss(
                z, yy if labelled else None, self.hier.points, self.space, cfg.hier_margin,
                gen=self.gen,
            )  # fmt: skip
            total = total + cfg.hier_weight * term
            parts["hier"] = float(term.detach())
        if getattr(self, "hmlr", None) is not None and labelled:
            term = F.cross_entropy(self.hmlr(z), yy)
            total = total + cfg.aux * term
            parts["hmlr"] = float(term.detach())
        if cfg.contrastive != "none" and views == 2:
            z1, z2 = z.chunk(2)
            term = contrastive_loss(z1, z2, self.space, cfg.contrastive, cfg.contrastive_tau)
            total = total + cfg.contrastive_weight * term
            parts["contrastive"] = float(term.detach())
        if cfg.ssl != "none" and views == 2:
            term = self.ssl.loss(x, feats, autocast)
            total = total + cfg.ssl_weight * term
            parts["ssl"] = float(term.detach())
        if cfg.unsupervised and self.centroids is not None:
            with torch.no_grad():
                leaf = self.space.pairwise(z.detach(), self.centroids).argmin(1)
            target = merge_levels(self.paths[leaf])
            term = log_ratio_loss(z, target, self.space, gen=self.gen)
            total = total + cfg.cluster_weight * term
            parts["log_ratio"] = float(term.detach())
        return total, parts

    def after_step(self, encoder: nn.Module) -> None:
        if getattr(self, "ssl", None) is not None and self.ssl.kind == "byol":
            self.ssl.update_target(encoder, self.cfg.byol_tau)

    @torch.no_grad()
    def recluster(self, z: torch.Tensor) -> None:
        """Cluster the sample's embeddings ``z`` (m, D) into ``cfg.cluster_levels`` levels;
        the finest clusters' centroids (the space's midpoints) assign a batch's images."""
        levels = [min(k, len(z)) for k in self.cfg.cluster_levels]
        assign, parent = cluster_levels(z, self.space, levels)
        fine = assign[:, -1]
        ids = np.unique(fine)
        cents = torch.stack([self.space.midpoint(z[torch.from_numpy(fine == i)]) for i in ids])
        paths = np.stack([assign[np.flatnonzero(fine == i)[0]] for i in ids])
        self.centroids = cents
        self.paths = torch.from_numpy(paths)
        self.cluster_tree = {"levels": levels, "paths": paths, "centroids": cents}


def build_extras(cfg, space: Space, encoder: nn.Module, features: int, k: int, c, base):
    """The :class:`Extras` of ``cfg`` (None when no auxiliary term is on)."""
    on = (
        cfg.hier_weight > 0
        or (cfg.classifier == "hmlr" and cfg.aux > 0 and k > 0)
        or cfg.contrastive != "none"
        or cfg.ssl != "none"
        or cfg.unsupervised
    )
    if not on:
        return None
    return Extras(cfg, space, encoder, features, k, c, base)
