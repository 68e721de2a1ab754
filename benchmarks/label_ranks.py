"""Reconstruction ranks of a label checkpoint split by the closure pairs its cones hold.

For a uniform sample of nodes, each closure pair (node, ancestor) is ranked as
in ``hypsearch labels eval`` (1 + the non-ancestors nearer to the node than
the ancestor) and reported separately for the pairs whose ancestor's cone
holds the node (``membership_margin_np >= 0``) and the others (for the cap
construction: the ancestors reached only through a second parent).

    python benchmarks/label_ranks.py LABELS [SAMPLE]
"""

import sys

import numpy as np
import torch
from _common import ROOT

sys.path.insert(0, str(ROOT))


def main() -> int:
    from models.geometry import cones, poincare
    from models.labels import LabelEmbedding

    torch.set_num_threads(1)
    emb = LabelEmbedding.load(sys.argv[1])
    sample = int(sys.argv[2]) if len(sys.argv) > 2 else 500
    tax = emb.taxonomy
    n, theta, c = len(tax), emb.embeddings.double(), emb.curvature
    spec = cones.cone_spec(**emb.cone)
    edges = tax.closure_edges()
    rng = np.random.default_rng(0)
    nodes = np.unique(edges[:, 0])
    us = np.sort(rng.choice(nodes, min(sample, len(nodes)), replace=False))
    starts = np.searchsorted(edges[:, 0], np.arange(n + 1))
    P = theta.numpy()
    held_r, off_r = [], []
    for u in us:
        anc = edges[starts[u] : starts[u + 1], 1]
        z = poincare.pairwise_dist_arg(theta[[u]], theta, c=c)[0]
        mask = torch.ones(n, dtype=torch.bool)
        mask[torch.from_numpy(anc)] = False
        mask[u] = False
        neg = torch.sort(z[mask]).values
        ranks = torch.searchsorted(neg, z[torch.from_numpy(anc)].contiguous()).numpy() + 1
        held = cones.membership_margin_np(P[anc], P[u], spec, c=c) >= 0
        held_r += ranks[held].tolist()
        off_r += ranks[~held].tolist()
    held_r, off_r = np.array(held_r), np.array(off_r)
    tot = np.concatenate([held_r, off_r])
    print(f"nodes {len(us)} pairs {len(tot)} mean rank {tot.mean():.2f}")
    print(f"held pairs {len(held_r)} mean rank {held_r.mean():.2f} median {np.median(held_r):.0f}")
    if len(off_r):
        print(
            f"other pairs {len(off_r)} mean rank {off_r.mean():.2f} median {np.median(off_r):.0f}"
            f"; share of the rank sum {off_r.sum() / tot.sum():.3f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
