r"""Evaluation of label embeddings: reconstruction and cone containment.

Reconstruction follows Nickel and Kiela 2017: for each closure edge
:math:`(u, v)`, the rank of :math:`d(u, v)` among the distances from
:math:`u` to every node that is neither ``u`` nor one of its closure
neighbours (its ancestors); mean rank over edges, average precision per node,
MAP over nodes. Cone containment precision, recall and F1 count the ordered
pairs :math:`(v, u)` with ``u`` in the cone of ``v`` against the closure.
"""

from __future__ import annotations

import numpy as np
import torch

from ..geometry import cones, poincare
from ..taxonomy import Taxonomy
from ._progress import _Progress
from .embedding import LabelEmbedding

__all__ = ["best_cone_threshold", "evaluate_cones", "evaluate_reconstruction"]


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
