r"""Evaluation of label embeddings: reconstruction and cone containment.

Reconstruction follows Nickel and Kiela 2017: for each closure edge
:math:`(u, v)`, the rank of :math:`d(u, v)` among the distances from
:math:`u` to every node that is neither ``u`` nor one of its closure
neighbours (its ancestors); mean rank over edges, average precision per node,
MAP over nodes. Cone containment precision, recall and F1 count the ordered
pairs :math:`(v, u)` with ``u`` in the cone of ``v`` against the closure:
strictly over every ordered pair (:func:`evaluate_cones`), and as Ganea et
al. 2018 do, on sampled negatives at a threshold chosen on a validation split
(:func:`evaluate_cone_protocol`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ..geometry import cones, poincare
from ..taxonomy.graph import Taxonomy
from ._progress import _Progress
from .embedding import LabelEmbedding

__all__ = [
    "best_cone_threshold",
    "evaluate_cone_protocol",
    "evaluate_cones",
    "evaluate_reconstruction",
]


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
    theta = _theta(emb, taxonomy)
    n = len(taxonomy)
    edges = taxonomy.closure_edges()
    es, starts = _grouped(edges, n)
    us = _sampled(np.unique(edges[:, 0]), sample, seed)
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


def _sampled(nodes: np.ndarray, sample: int | None, seed: int) -> np.ndarray:
    """``sample`` of ``nodes`` drawn without replacement (seeded), in order; all when
    ``sample`` is None or not fewer."""
    if sample is None or sample >= len(nodes):
        return nodes
    return np.sort(np.random.default_rng(seed).choice(nodes, sample, replace=False))


def _spec(emb: LabelEmbedding, K: float | None) -> dict[str, Any]:
    # K given: Ganea cones of that K (the old keyword); else the embedding's own family
    return cones.cone_spec("ganea", K=K) if K is not None else cones.cone_spec(**emb.cone)


def _theta(emb: LabelEmbedding, taxonomy: Taxonomy) -> torch.Tensor:
    theta = emb.embeddings
    if taxonomy.names != emb.taxonomy.names:
        theta = theta[torch.tensor([emb.taxonomy.index(x) for x in taxonomy.names])]
    return theta


def _pair_margins(theta, spec, c, apex: np.ndarray, tail: np.ndarray, chunk: int = 1 << 16):
    """Membership margins of the pairs (apex[i], tail[i]) (float64 numpy)."""
    out = np.empty(len(apex))
    for s in range(0, len(apex), chunk):
        a = torch.from_numpy(apex[s : s + chunk])
        t = torch.from_numpy(tail[s : s + chunk])
        out[s : s + chunk] = cones.membership_margin(theta[a], theta[t], spec, c=c).numpy()
    return out


def _is_pair(keys: np.ndarray, n: int, apex: np.ndarray, tail: np.ndarray) -> np.ndarray:
    k = tail.astype(np.int64) * n + apex
    pos = np.searchsorted(keys, k).clip(max=len(keys) - 1)
    return keys[pos] == k


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
    max_pairs: int = 40_000_000,
    negative_sample: int = 4_000_000,
) -> dict[str, Any]:
    """Precision, recall and F1 of "u is in the cone of v" against the closure pairs.

    Every ordered pair (v, u), u != v, is predicted "u entails v" when the
    membership margin of u in the cone of v (:func:`models.geometry.cones.
    membership_margin`, the embedding's cone family, or Ganea's with ``K``)
    is at least ``-tol`` (for Ganea cones: energy ``<= tol``). Every closure
    pair is a positive, every other ordered pair a negative.

    Up to ``max_pairs`` ordered pairs the counts are exact. Beyond, the
    positives are still all counted and the false positives are estimated
    from ``negative_sample`` uniformly drawn non-pairs, scaled to all
    non-pairs (unbiased; ``cone_negatives_sampled`` says how many).
    ``sample`` keeps the old estimate instead: the pairs of a random subset
    of apexes v only.
    """
    taxonomy = taxonomy or emb.taxonomy
    theta = _theta(emb, taxonomy)
    spec = _spec(emb, K)
    c = emb.curvature
    n = len(taxonomy)
    edges = taxonomy.closure_edges()
    n_neg_all = n * (n - 1) - len(edges)
    sampled = 0
    if sample is None and n * (n - 1) > max_pairs:
        # positives exact, negatives by a uniform sample of the non-pairs
        keys = np.sort(edges[:, 0].astype(np.int64) * n + edges[:, 1])
        pos = _pair_margins(theta, spec, c, edges[:, 1].copy(), edges[:, 0].copy()) >= -tol
        tp = int(pos.sum())
        n_pos = len(edges)
        rng = np.random.default_rng(seed)
        apex_s, tail_s = [], []
        need = negative_sample
        while need > 0:
            a = rng.integers(0, n, 2 * need)
            t = rng.integers(0, n, 2 * need)
            ok = (a != t) & ~_is_pair(keys, n, a, t)
            apex_s.append(a[ok][:need])
            tail_s.append(t[ok][:need])
            need -= len(apex_s[-1])
        a, t = np.concatenate(apex_s), np.concatenate(tail_s)
        fp_rate = float((_pair_margins(theta, spec, c, a, t) >= -tol).mean())
        fp = fp_rate * n_neg_all
        sampled = len(a)
        apexes = np.arange(n)
    else:
        by_anc = edges[:, ::-1].copy()  # group by ancestor: row v holds its descendants
        es, starts = _grouped(by_anc, n)
        apexes = _sampled(np.arange(n), sample, seed)
        tp = fp = 0
        n_pos = 0
        bar = _Progress(len(apexes), progress, "cones", unit="node")
        for s in range(0, len(apexes), chunk):
            vb = torch.from_numpy(apexes[s : s + chunk])
            pred = cones.pairwise_membership_margin(theta[vb], theta, spec, c=c) >= -tol
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
    out: dict[str, Any] = {
        "cone_precision": precision,
        "cone_recall": recall,
        "cone_f1": f1,
        "cone_family": spec["family"],
        "cone": cones.format_cone(spec).removeprefix("cone="),
        "cone_tol": tol,
        "cone_apexes": int(len(apexes)),
        "cone_positives": int(n_pos),
        "cone_true_positives": int(tp),
        "cone_false_positives": fp,
        "cone_negatives_sampled": int(sampled),
    }
    if spec["family"] == "ganea":
        out["cone_K"] = spec["K"]
    return out


def _energies(theta, spec, c, apex, tail) -> np.ndarray:
    # violation of membership, 0 inside the cone (Ganea's energy for his cones)
    return np.maximum(0.0, -_pair_margins(theta, spec, c, apex, tail))


def _best_f1(energy: np.ndarray, label: np.ndarray) -> tuple[float, float]:
    order = np.argsort(energy, kind="stable")
    hit = label[order].astype(np.float64)
    tp = np.cumsum(hit)
    fp = np.cumsum(1 - hit)
    f1 = 2 * tp / (tp + fp + max(hit.sum(), 1))
    i = int(np.argmax(f1))
    return float(energy[order][i]), float(f1[i])


def _prf(pred: np.ndarray, label: np.ndarray) -> tuple[float, float, float]:
    tp = float((pred & label).sum())
    p = tp / max(float(pred.sum()), 1)
    r = tp / max(float(label.sum()), 1)
    return p, r, 2 * p * r / max(p + r, 1e-300)


def evaluate_cone_protocol(
    emb: LabelEmbedding,
    taxonomy: Taxonomy | None = None,
    *,
    K: float | None = None,
    negatives: int = 10,
    validation: float = 0.5,
    seed: int = 0,
) -> dict[str, Any]:
    """Containment F1 as Ganea et al. 2018 measure it, beside :func:`evaluate_cones`.

    Every closure pair (v, u) is a positive; for each, ``negatives`` non-pairs
    made by replacing u or v (half each) by a uniformly drawn node. The
    positives (each with its negatives) are split at random, ``validation``
    of them to choose the violation threshold with the best F1, the rest to
    measure precision, recall and F1 at that threshold (``protocol_*``) and
    strictly, at threshold 0 (``protocol_strict_f1``).
    """
    taxonomy = taxonomy or emb.taxonomy
    theta = _theta(emb, taxonomy)
    spec = _spec(emb, K)
    c = emb.curvature
    n = len(taxonomy)
    edges = taxonomy.closure_edges()
    keys = np.sort(edges[:, 0].astype(np.int64) * n + edges[:, 1])
    rng = np.random.default_rng(seed)
    m = len(edges)
    apex = np.repeat(edges[:, 1], negatives)
    tail = np.repeat(edges[:, 0], negatives)
    swap_apex = rng.random(m * negatives) < 0.5
    bad = np.ones(m * negatives, dtype=bool)
    na, nt = apex.copy(), tail.copy()
    for attempt in range(1000):
        if not bad.any():
            break
        if attempt % 10 == 9:  # e.g. the root's pairs: every other tail is a descendant
            swap_apex[bad] = ~swap_apex[bad]
        k = int(bad.sum())
        draw = rng.integers(0, n, k)
        na[bad] = np.where(swap_apex[bad], draw, apex[bad])
        nt[bad] = np.where(swap_apex[bad], tail[bad], draw)
        bad[bad] = (na[bad] == nt[bad]) | _is_pair(keys, n, na[bad], nt[bad])
    group = rng.random(m) < validation  # True: validation
    e_pos = _energies(theta, spec, c, edges[:, 1].copy(), edges[:, 0].copy())
    e_neg = _energies(theta, spec, c, na, nt)
    g_neg = np.repeat(group, negatives)

    def part(g_p, g_n):
        return np.concatenate([e_pos[g_p], e_neg[g_n]]), np.concatenate(
            [np.ones(int(g_p.sum()), bool), np.zeros(int(g_n.sum()), bool)]
        )

    ev, lv = part(group, g_neg)
    et, lt = part(~group, ~g_neg)
    threshold, _ = _best_f1(ev, lv)
    p, r, f1 = _prf(et <= threshold, lt)
    _, _, strict = _prf(et <= 0.0, lt)
    return {
        "protocol_precision": p,
        "protocol_recall": r,
        "protocol_f1": f1,
        "protocol_threshold": threshold,
        "protocol_strict_f1": strict,
        "protocol_negatives": negatives,
        "protocol_test_pairs": int(len(et)),
    }


def best_cone_threshold(
    emb: LabelEmbedding,
    taxonomy: Taxonomy | None = None,
    *,
    K: float | None = None,
    sample: int | None = 2000,
    seed: int = 0,
) -> dict[str, float]:
    r"""The violation threshold with the best containment F1, as Ganea et al. tune it.

    The violation is :math:`\max(0, -\text{margin})` (Ganea's energy for his
    cones). Computed on the pairs of a sample of apexes; pass the threshold
    back to :func:`evaluate_cones` as ``tol`` to score all pairs.
    """
    taxonomy = taxonomy or emb.taxonomy
    theta = _theta(emb, taxonomy)
    spec = _spec(emb, K)
    n = len(taxonomy)
    rng = np.random.default_rng(seed)
    apexes = np.arange(n) if sample is None or sample >= n else rng.choice(n, sample, replace=False)
    by_anc = taxonomy.closure_edges()[:, ::-1].copy()
    es, starts = _grouped(by_anc, n)
    energies, labels = [], []
    for s in range(0, len(apexes), 128):
        vb = torch.from_numpy(np.asarray(apexes[s : s + 128]))
        e = torch.relu(-cones.pairwise_membership_margin(theta[vb], theta, spec, c=emb.curvature))
        truth = torch.zeros_like(e, dtype=torch.bool)
        for r, v in enumerate(vb.tolist()):
            truth[r, torch.from_numpy(es[starts[v] : starts[v + 1], 1])] = True
        e[torch.arange(len(vb)), vb] = float("inf")
        energies.append(e.flatten())
        labels.append(truth.flatten())
    threshold, f1 = _best_f1(torch.cat(energies).numpy(), torch.cat(labels).numpy())
    return {"threshold": threshold, "f1": f1}
