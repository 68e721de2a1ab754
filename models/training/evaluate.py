r"""Retrieval, hierarchy, zero-shot and uncertainty metrics of an image model.

Every query is a test image searched against the rest of the split (itself
excluded), by the model's own distance (geodesic in the ball; Euclidean for a
Euclidean twin). Definitions (``q`` a query of class ``c``, ranked list
``r_1, r_2, …``):

* **Recall@k**: share of queries with an item of class ``c`` among the k nearest.
* **mAP@R** (Musgrave et al. 2020): ``R`` = number of other items of class
  ``c``; :math:`\frac1R\sum_{i\le R} P(i)\,[r_i \in c]`.
* **hop mAP@50 at h hops** (Long et al. 2020): an item is relevant when its
  class is within ``h`` hops of ``c`` in the taxonomy (0: the class, 2:
  siblings, 4: cousins); :math:`\frac{1}{\min(50, R_h)}\sum_{i\le 50}P(i)\,rel_i`
  with ``R_h`` the number of relevant items.
* **hierarchical Hit@k** (Liu et al. 2020): among the k taxonomy nodes
  nearest to the image, one is its class or a parent of its class. Candidates
  are every node of the taxonomy for images of trained classes; for
  held-out classes (zero-shot) every node except the trained classes (the
  standard zero-shot protocol, with the whole taxonomy as distractors), and
  also reported over every node (``…_all_nodes``, generalised zero-shot).
* **nearest-label accuracy**: the nearest of all taxonomy nodes is the class.
* **mistake severity** (:func:`mistake_severity`, ``mistakes``; Bertinetto et al.
  2020): the nearest trained-class prototype is the prediction; over the wrong
  ones, the mean taxonomy hops between the true and the predicted class.
* **back-off prediction** (:func:`backoff_predict`, ``backoff`` and
  ``backoff_hier_hit@1``): the most specific candidate node that holds at
  least half of the posterior over the trained classes (softmax of
  :math:`-d/\tau`); a confident image gets its class, an uncertain one the
  lowest common ancestor of the classes it hesitates between. The same rule
  for trained and held-out classes; reported as hierarchical Hit@1, exact
  accuracy and the share of images that backed off.
* **cone shares** (``cones``, ball models only): with the label
  checkpoint's cone family (:func:`models.prototypes.label_cone_spec`,
  membership by :func:`models.geometry.cones.membership_margin_np` ``>= 0``),
  the share of test images of trained classes inside their class's cone
  (``in_class``), the mean over images of the share of their class's
  ancestors whose cone holds them (``in_ancestors_mean``), the share held by
  every ancestor's cone (``in_all_ancestors``), and the share inside the cone
  of a trained class that is neither the class nor an ancestor
  (``in_other_class``). ``deepest_hier_hit@1``: the deepest holding label
  (:func:`models.prototypes.deepest_holder` over every taxonomy node) is the
  class or a parent.
* **name search precision@50** of a held-out class: share of its images among
  the 50 test images nearest to where a search by its name starts
  (:meth:`ImageModel.search_points <models.vision.image_model.ImageModel.search_points>`:
  its prototype; a placed model's anchor), as the service searches.
* **OOD AUROC**: Fashion-MNIST test images (positive) against the
  handwritten digits bundled with scikit-learn (8x8, upscaled by the model's
  preprocessing), scored by distance to the origin (Khrulkov et al. 2020),
  by distance to the head's base point (where a zero feature vector lands;
  for the Euclidean twin both are the norm of its vectors) and by the maximum
  softmax probability over the trained classes' prototypes (logits
  :math:`-d/\tau`).
* **δ_rel** of the encoder's features (Euclidean, before the head) and the
  curvature it suggests (:func:`models.geometry.delta.delta_hyperbolicity`).
"""

from __future__ import annotations

import time

import numpy as np
import torch

from ..geometry.cones import membership_margin_np
from ..geometry.delta import delta_hyperbolicity
from ..images.datasets import ImageSet
from ..prototypes import deepest_holder, label_cone_spec
from ..vision.heads import Space

__all__ = [
    "auroc",
    "evaluate_model",
    "hop_map",
    "label_hits",
    "load_ood_digits",
    "ranked_neighbours",
    "retrieval_metrics",
]


def ranked_neighbours(z: torch.Tensor, space: Space, k: int, chunk: int = 512) -> torch.Tensor:
    """Indices (n, k) of each row's k nearest other rows, nearest first (ties by index)."""
    n = z.shape[0]
    k = min(k, n - 1)
    out = []
    for s in range(0, n, chunk):
        d = space.pairwise(z[s : s + chunk], z)  # (b, n)
        rows = torch.arange(d.shape[0])
        d[rows, rows + s] = float("inf")  # not itself
        # stable order: sort by (distance, index)
        idx = torch.argsort(d, dim=1, stable=True)[:, :k]
        out.append(idx)
    return torch.cat(out) if out else torch.zeros(0, k, dtype=torch.long)


def retrieval_metrics(
    z: torch.Tensor,
    targets: np.ndarray,
    space: Space,
    ks=(1, 5, 10),
    nn: torch.Tensor | None = None,
) -> dict[str, float]:
    """Recall@k and mAP@R of every item queried against the others."""
    t = torch.as_tensor(np.asarray(targets))
    counts = torch.bincount(t - t.min()) if len(t) else torch.zeros(0)
    R = counts[t - t.min()] - 1  # other items of the same class
    kmax = max(max(ks), int(R.max()) if len(R) else 1)
    if nn is None or nn.shape[1] < min(kmax, len(t) - 1):
        nn = ranked_neighbours(z, space, kmax)
    rel = (t[nn] == t[:, None]).to(torch.float64)  # (n, K)
    out = {f"recall@{k}": float(rel[:, :k].amax(1).mean()) for k in ks}
    ranks = torch.arange(1, rel.shape[1] + 1, dtype=torch.float64)
    prec = rel.cumsum(1) / ranks
    mask = ranks[None, :] <= R[:, None]
    ap = (prec * rel * mask).sum(1) / R.clamp_min(1)
    out["map@r"] = float(ap[R > 0].mean()) if (R > 0).any() else 0.0
    return out


def mistake_severity(
    z: torch.Tensor, nodes: list[str], seen: list[str], protos: torch.Tensor, space, taxonomy
) -> dict[str, float]:
    """How bad the mistakes are (Bertinetto et al. 2020, "Making Better Mistakes"): each
    image's prediction is the trained class of the nearest prototype; ``rate`` is the share
    predicted wrong, ``severity`` the mean taxonomy hops between the true and the predicted
    class over the mistakes (the shortest path through a common ancestor: siblings 2,
    cousins 4; lower is better), ``avg_hops@1`` the same mean over every image (0 when
    right)."""
    if len(z) == 0:
        return {"rate": 0.0, "severity": 0.0, "avg_hops@1": 0.0}
    pred = space.pairwise(z, protos).argmin(1).tolist()
    hops = []
    for node, j in zip(nodes, pred, strict=True):
        h = taxonomy.hops(node, seen[j])
        hops.append(float(10**6 if h is None else h))
    hops_a = np.asarray(hops)
    wrong = hops_a > 0
    return {
        "rate": float(wrong.mean()),
        "severity": float(hops_a[wrong].mean()) if wrong.any() else 0.0,
        "avg_hops@1": float(hops_a.mean()),
    }


def hop_map(
    z: torch.Tensor,
    targets: np.ndarray,
    class_nodes: list[str],
    taxonomy,
    space: Space,
    hops=(0, 2, 4),
    k: int = 50,
    nn: torch.Tensor | None = None,
) -> dict[str, float]:
    """hop mAP@k: relevant = class within h hops of the query's class (see the module docstring)."""
    t = np.asarray(targets)
    H = torch.as_tensor(taxonomy.hop_table(class_nodes, missing=10**6))
    if nn is None:
        nn = ranked_neighbours(z, space, k)
    nn = nn[:, :k]
    tt = torch.as_tensor(t)
    ranks = torch.arange(1, nn.shape[1] + 1, dtype=torch.float64)
    counts = torch.bincount(tt, minlength=len(class_nodes)).to(torch.float64)
    out = {}
    for h in hops:
        close = (H <= h).to(torch.float64)  # (K, K)
        rel = close[tt[:, None], tt[nn]]  # (n, k)
        total = close[tt] @ counts - 1  # relevant items other than the query
        prec = rel.cumsum(1) / ranks
        denom = total.clamp(min=1).clamp(max=k)
        ap = (prec * rel).sum(1) / denom
        out[str(h)] = float(ap[total > 0].mean())
    return out


def label_hits(
    z: torch.Tensor,
    nodes: list[str],
    candidates: list[str],
    labels,
    space: Space,
    ks=(1, 5),
) -> dict[str, float]:
    """Hierarchical Hit@k (the class or a parent among the k nearest candidate nodes) and
    exact accuracy of the nearest candidate, for images whose class nodes are ``nodes``."""
    tax = labels.taxonomy
    cand_idx = [tax.index(c) for c in candidates]
    P = space.from_ball(labels.embeddings[cand_idx])
    pos = {c: i for i, c in enumerate(candidates)}
    kmax = max(ks)
    out = {f"hier_hit@{k}": 0.0 for k in ks} | {"nearest_label_acc": 0.0}
    if len(nodes) == 0:
        return out
    hits = {k: 0 for k in ks}
    exact = 0
    for s in range(0, len(nodes), 1024):
        top = (
            space.pairwise(z[s : s + 1024], P).topk(kmax, dim=1, largest=False).indices
        )  # (b, kmax)
        for row, node in zip(top.tolist(), nodes[s : s + 1024], strict=True):
            ok = {pos[x] for x in [node, *tax.parents(node)] if x in pos}
            for k in ks:
                hits[k] += any(r in ok for r in row[:k])
            exact += row[0] == pos.get(node, -1)
    n = len(nodes)
    return {f"hier_hit@{k}": hits[k] / n for k in ks} | {"nearest_label_acc": exact / n}


def backoff_predict(
    z: torch.Tensor,
    seen: list[str],
    candidates: list[str],
    labels,
    space: Space,
    tau: float = 1.0,
    threshold: float = 0.5,
) -> tuple[list[str], np.ndarray]:
    r"""The hierarchical prediction of each image: the most specific node it most likely belongs to.

    The posterior over the trained classes is the softmax of
    :math:`-d(z, p_k)/\tau` (the logits the model was trained on); a taxonomy
    node's probability is the sum over the trained classes in its subtree
    (itself included). The prediction is the candidate node of probability at
    least ``threshold`` with the fewest trained classes below it (then the
    deepest; then the nearest): a confident image gets its class, an uncertain
    one backs off to the lowest common ancestor of the classes it hesitates
    between (Deng et al. 2012, "hedging your bets"; the back-off of
    hierarchical zero-shot prediction, Liu et al. 2020). With ``threshold`` >
    0.5 in a tree the eligible nodes form one chain. When no candidate
    qualifies (say, the common ancestor is not a candidate), the nearest
    candidate is the answer. Returns the predicted nodes and, per image,
    whether the prediction backed off (is not the nearest trained class).
    """
    tax = labels.taxonomy
    if len(z) == 0:
        return [], np.zeros(0, dtype=bool)
    protos = space.from_ball(labels.embeddings[[tax.index(n) for n in seen]])
    cand = space.from_ball(labels.embeddings[[tax.index(n) for n in candidates]])
    # member[v, k]: trained class k is v or below v
    member = torch.zeros(len(candidates), len(seen), dtype=torch.float64)
    for i, v in enumerate(candidates):
        below = tax.descendants(v) | {v}
        for k, c in enumerate(seen):
            if c in below:
                member[i, k] = 1.0
    size = member.sum(1)  # trained classes below each candidate
    depth = torch.tensor([tax.depth(v) for v in candidates], dtype=torch.float64)
    preds: list[str] = []
    backed = []
    for s in range(0, len(z), 1024):
        zb = z[s : s + 1024]
        d_seen = space.pairwise(zb, protos)  # (b, K)
        post = torch.softmax(-d_seen / tau, dim=1)
        mass = post @ member.T  # (b, C)
        d_cand = space.pairwise(zb, cand)  # (b, C)
        ok = (mass >= threshold) & (size > 0)
        # lexicographic: fewest classes below, then deepest, then nearest
        key = size[None, :] * 1e6 - depth[None, :] * 1e3 + d_cand.clamp(max=999.0)
        key = key.masked_fill(~ok, float("inf"))
        best = key.argmin(1)
        none = ~ok.any(1)
        best = torch.where(none, d_cand.argmin(1), best)
        top = d_seen.argmin(1)
        for b, t in zip(best.tolist(), top.tolist(), strict=True):
            preds.append(candidates[b])
            backed.append(candidates[b] != seen[t])
    return preds, np.asarray(backed)


def backoff_hits(preds: list[str], nodes: list[str], taxonomy) -> dict[str, float]:
    """Share of predictions that are the class or its parent, and that are the class exactly."""
    n = max(1, len(nodes))
    hit = sum(p == c or p in taxonomy.parents(c) for p, c in zip(preds, nodes, strict=True))
    exact = sum(p == c for p, c in zip(preds, nodes, strict=True))
    return {"hier_hit@1": hit / n, "acc": exact / n}


def _held(apex_rows, z: np.ndarray, P: np.ndarray, spec, c: float) -> np.ndarray:
    """held[i, j]: point i in the cone of label row apex_rows[j] (bool (n, len(apex_rows)))."""
    out = np.zeros((len(z), len(apex_rows)), dtype=bool)
    if len(apex_rows) == 0 or len(z) == 0:
        return out
    A = P[np.asarray(apex_rows)]
    step = max(1, 2_000_000 // (len(apex_rows) * P.shape[1]))
    for s in range(0, len(z), step):
        m = membership_margin_np(A[None, :, :], z[s : s + step, None, :], spec, c=c)
        out[s : s + step] = m >= 0
    return out


def cone_shares(z: torch.Tensor, nodes: list[str], seen: list[str], labels) -> dict:
    """The cone shares of the module docstring for points ``z`` of class nodes ``nodes``."""
    tax = labels.taxonomy
    spec = label_cone_spec(labels)
    c = float(labels.curvature)
    P = labels.embeddings.detach().double().numpy()
    x = z.detach().double().numpy()
    out: dict = {"family": spec["family"], "images": len(nodes)}
    if not nodes:
        return out | {
            "in_class": 0.0,
            "in_ancestors_mean": 0.0,
            "in_all_ancestors": 0.0,
            "in_other_class": 0.0,
        }
    anc_names = sorted(
        set().union(*(tax.ancestors(n) for n in set(nodes))) | set(nodes) | set(seen)
    )
    rows = [tax.index(n) for n in anc_names]
    col = {n: j for j, n in enumerate(anc_names)}
    held = _held(rows, x, P, spec, c)
    own = np.array([held[i, col[n]] for i, n in enumerate(nodes)])
    anc_share, anc_all, other = [], [], []
    for i, n in enumerate(nodes):
        anc = sorted(tax.ancestors(n))
        h = [held[i, col[a]] for a in anc]
        anc_share.append(np.mean(h) if h else 1.0)
        anc_all.append(all(h))
        up = tax.ancestors(n) | {n}
        other.append(any(held[i, col[k]] for k in seen if k not in up))
    deepest = deepest_holder(x, tax.names, P, tax.children, spec, c)
    hit = [d == n or d in tax.parents(n) for d, n in zip(deepest, nodes, strict=True)]
    return out | {
        "in_class": float(own.mean()),
        "in_ancestors_mean": float(np.mean(anc_share)),
        "in_all_ancestors": float(np.mean(anc_all)),
        "in_other_class": float(np.mean(other)),
        "deepest_hier_hit@1": float(np.mean(hit)),
    }


def deepest_hits(z: torch.Tensor, nodes: list[str], candidates: list[str], labels) -> float:
    """Share of points whose deepest holding label among ``candidates`` is the class or a parent."""
    if not nodes:
        return 0.0
    tax = labels.taxonomy
    P = labels.embeddings.detach().double().numpy()[[tax.index(n) for n in candidates]]
    pred = deepest_holder(
        z.detach().double().numpy(),
        candidates,
        P,
        tax.children,
        label_cone_spec(labels),
        float(labels.curvature),
    )
    return float(np.mean([p == n or p in tax.parents(n) for p, n in zip(pred, nodes, strict=True)]))


def auroc(pos: np.ndarray, neg: np.ndarray) -> float:
    """Area under the ROC curve of scores where ``pos`` should be higher (ties count half)."""
    pos, neg = np.asarray(pos, np.float64), np.asarray(neg, np.float64)
    allv = np.concatenate([pos, neg])
    order = np.argsort(allv, kind="mergesort")
    ranks = np.empty(len(allv))
    sv = allv[order]
    # average ranks over ties
    _, start, counts = np.unique(sv, return_index=True, return_counts=True)
    avg = start + (counts - 1) / 2.0 + 1
    ranks[order] = np.repeat(avg, counts)
    r_pos = ranks[: len(pos)].sum()
    return float((r_pos - len(pos) * (len(pos) + 1) / 2) / (len(pos) * len(neg)))


def load_ood_digits() -> np.ndarray:
    """The 1797 handwritten digits bundled with scikit-learn as uint8 (n, 8, 8), light on dark."""
    from sklearn.datasets import load_digits  # local file in the sklearn package, no download

    x = load_digits().images  # 0..16
    return np.clip(np.round(x * (255.0 / 16.0)), 0, 255).astype(np.uint8)


def _msp(z: torch.Tensor, protos: torch.Tensor, space: Space, tau: float) -> np.ndarray:
    logits = -space.pairwise(z, protos) / tau
    return torch.softmax(logits, dim=1).amax(1).numpy()


def evaluate_model(
    model,
    data: ImageSet,
    *,
    ood: bool = True,
    delta: bool = True,
    progress: bool = False,
    delta_samples: int = 1000,
    threshold: float = 0.5,
) -> dict:
    """Every metric of the module docstring for ``model`` on ``data`` (labelled items only)."""
    t0 = time.perf_counter()
    space = model.space
    labels = model.labels
    tax = labels.taxonomy
    keep = np.flatnonzero(np.asarray(data.targets) >= 0)
    targets = np.asarray(data.targets)[keep]
    images = (
        data.images[keep] if isinstance(data.images, np.ndarray) else [data.images[i] for i in keep]
    )
    class_nodes = [node for _, node in data.classes]
    for node in class_nodes:
        if node not in tax:
            raise ValueError(f"class node {node!r} of the data is not in the model's taxonomy")
    bar = _bar(progress, 6)
    z = model.embed(images)
    bar.update(1)
    counts = np.bincount(targets, minlength=len(class_nodes))
    kmax = max(50, int(counts.max()) - 1)
    nn = ranked_neighbours(z, space, kmax)
    bar.update(1)
    out: dict = {
        "images": int(len(targets)),
        "geometry": model.geometry,
        "dim": model.dim,
        "curvature": model.curvature,
    }
    out |= retrieval_metrics(z, targets, space, nn=nn)
    out["hop_map@50"] = hop_map(z, targets, class_nodes, tax, space, nn=nn)
    bar.update(1)
    if model.geometry == "product":  # no label points in a product space: retrieval only
        bar.close()
        out["seconds"] = time.perf_counter() - t0
        return out

    holdout = set(model.holdout)
    seen = [n for n in model.seen_classes]
    item_nodes = [class_nodes[t] for t in targets]
    seen_rows = [i for i, n in enumerate(item_nodes) if n not in holdout]
    out |= label_hits(z[seen_rows], [item_nodes[i] for i in seen_rows], tax.names, labels, space)
    out["mistakes"] = mistake_severity(
        z[seen_rows], [item_nodes[i] for i in seen_rows], seen, model.prototypes(seen), space, tax
    )
    tau = float(model.config.get("tau", 1.0))
    bo_args = (labels, space, tau, threshold)
    preds, backed = backoff_predict(z[seen_rows], seen, tax.names, *bo_args)
    out["backoff"] = {
        "threshold": threshold,
        **backoff_hits(preds, [item_nodes[i] for i in seen_rows], tax),
        "backed_off": float(backed.mean()) if len(backed) else 0.0,
    }
    ball = model.geometry == "poincare"
    if ball:
        out["cones"] = cone_shares(z[seen_rows], [item_nodes[i] for i in seen_rows], seen, labels)
    bar.update(1)

    if holdout:
        zs: dict = {}
        not_seen = [n for n in tax.names if n not in set(seen)]
        all_rows: list[int] = []
        # a search by name starts where the service starts it (Runtime.prototype)
        starts = model.search_points() if hasattr(model, "search_points") else model.prototypes()
        for node in sorted(holdout):
            rows = [i for i, n in enumerate(item_nodes) if n == node]
            all_rows += rows
            p = starts[[tax.index(node)]].to(z.dtype)
            near = space.pairwise(p, z)[0].argsort(stable=True)[:50]
            prec = (
                float(np.mean([item_nodes[i] == node for i in near.tolist()])) if len(near) else 0.0
            )
            zsl = label_hits(z[rows], [node] * len(rows), not_seen, labels, space, ks=(1,))
            gzsl = label_hits(z[rows], [node] * len(rows), tax.names, labels, space, ks=(1,))
            bo, _ = backoff_predict(z[rows], seen, not_seen, *bo_args)
            bo_all, _ = backoff_predict(z[rows], seen, tax.names, *bo_args)
            parents = tax.parents(node)
            zs[node] = {
                "images": len(rows),
                "name_precision@50": prec,
                "hier_hit@1": zsl["hier_hit@1"],
                "hier_hit@1_all_nodes": gzsl["hier_hit@1"],
                "backoff_hier_hit@1": backoff_hits(bo, [node] * len(rows), tax)["hier_hit@1"],
                "backoff_hier_hit@1_all_nodes": backoff_hits(bo_all, [node] * len(rows), tax)[
                    "hier_hit@1"
                ],
            }
            if ball:
                held = _held(
                    [tax.index(p) for p in parents],
                    z[rows].double().numpy(),
                    labels.embeddings.double().numpy(),
                    label_cone_spec(labels),
                    float(labels.curvature),
                )
                zs[node]["in_parent_cone"] = float(held.any(1).mean()) if len(rows) else 0.0
                zs[node]["cone_hier_hit@1"] = deepest_hits(
                    z[rows], [node] * len(rows), not_seen, labels
                )
                zs[node]["cone_hier_hit@1_all_nodes"] = deepest_hits(
                    z[rows], [node] * len(rows), tax.names, labels
                )
        nodes_rows = [item_nodes[i] for i in all_rows]
        bo, _ = backoff_predict(z[all_rows], seen, not_seen, *bo_args)
        out["zero_shot"] = {
            "classes": zs,
            "hier_hit@1": label_hits(z[all_rows], nodes_rows, not_seen, labels, space, ks=(1,))[
                "hier_hit@1"
            ],
            "backoff_hier_hit@1": backoff_hits(bo, nodes_rows, tax)["hier_hit@1"],
            "name_precision@50": float(np.mean([v["name_precision@50"] for v in zs.values()])),
        }
        if ball:
            w = np.array([v["images"] for v in zs.values()], dtype=np.float64)
            for key in ("in_parent_cone", "cone_hier_hit@1", "cone_hier_hit@1_all_nodes"):
                vals = np.array([v[key] for v in zs.values()])
                out["zero_shot"][key] = float((vals * w).sum() / max(1.0, w.sum()))
    bar.update(1)

    if ood:
        try:
            digits = load_ood_digits()
        except ImportError:
            out["ood"] = {
                "skipped": "scikit-learn is not installed (its bundled digits are the OOD set)"
            }
        else:
            zo = model.embed(digits)
            protos = model.prototypes(seen)
            r_in, r_out = space.to_origin(z).numpy(), space.to_origin(zo).numpy()
            b_in, b_out = space.to_base(z).numpy(), space.to_base(zo).numpy()
            out["ood"] = {
                "dataset": "sklearn-digits",
                "images": int(len(digits)),
                "auroc_radius": auroc(r_in, r_out),
                "auroc_base": auroc(b_in, b_out),
                "auroc_msp": auroc(_msp(z, protos, space, tau), _msp(zo, protos, space, tau)),
                "mean_radius_in": float(r_in.mean()),
                "mean_radius_ood": float(r_out.mean()),
            }
    if delta:
        rng = np.random.default_rng(0)
        pick = np.sort(
            rng.choice(len(targets), size=min(delta_samples, len(targets)), replace=False)
        )
        sub = images[pick] if isinstance(images, np.ndarray) else [images[i] for i in pick]
        feats = model.features(sub).to(torch.float64)
        d = delta_hyperbolicity(feats, n_samples=delta_samples, seed=0)
        out["features_delta"] = {"points": int(len(pick)), **{k: float(v) for k, v in d.items()}}
    bar.update(1)
    bar.close()
    out["seconds"] = time.perf_counter() - t0
    return out


class _NoBar:
    def update(self, k):
        pass

    def close(self):
        pass


def _bar(enabled: bool, total: int):
    if not enabled:
        return _NoBar()
    from tqdm import tqdm

    return tqdm(total=total, desc="eval", unit="step", leave=False)
