"""Cross-check of the hierarchical mode's two level rules on an index.

For every query label (default: every label that indexed items carry) and
every labelled item, the item's level by cone (the first label of the query's
cone chain whose cone holds the item's own point, by
:func:`models.geometry.cones.membership_margin_np`, a brute force independent of
the stored holders) is compared with its level by taxonomy (the first label of
the query's taxonomy chain that is the item's label or one of its ancestors).
``agreement`` is the share of (query, item) pairs with the same level (both
"in no level" counts as the same); ``holder_agreement`` the share of labelled
items whose stored holding label is their label.

Run: ``python -m service.crosscheck --index INDEX (--model MODEL | --labels
LABELS) [--queries a,b] [--json]`` (opens the runtime as ``hypsearch serve``
does, so the index's holders are brought up to date first).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

import numpy as np

from .runtime import Runtime

__all__ = ["level_agreement", "main"]


def _levels(chain: Sequence[str], held: np.ndarray) -> np.ndarray:
    """First row of ``held`` (chain x items, bool) that is true, or -1."""
    first = np.argmax(held, axis=0)
    return np.where(held.any(axis=0), first, -1)


def level_agreement(rt: Runtime, queries: Sequence[str] | None = None) -> dict:
    """See the module docstring."""
    ids = [i for i in rt.index.ids() if rt.label_of(i) in rt.taxonomy]
    items = [rt.index.get(i) for i in ids]
    items = [it for it in items if it is not None]
    if not items:
        return {"queries": 0, "items": 0, "pairs": 0, "agreement": None, "holder_agreement": None}
    x = np.array([np.asarray(it.vector, dtype=np.float64) for it in items])
    labels = [it.label for it in items]
    anc = {lab: rt.taxonomy.ancestors(lab) | {lab} for lab in set(labels)}
    queries = list(queries) if queries is not None else list(rt.used_labels())
    same = pairs = 0
    per_query = {}
    for q in queries:
        cone_chain = rt.chain(q, "cone")
        held = np.stack([rt.cones.margins(lab, x) >= 0 for lab in cone_chain])
        cone_lv = _levels(cone_chain, held)
        tax_chain = rt.chain(q, "taxonomy")
        in_tax = np.array([[lab in anc[il] for il in labels] for lab in tax_chain])
        tax_lv = _levels(tax_chain, in_tax)
        agree = int((cone_lv == tax_lv).sum())
        per_query[q] = agree / len(items)
        same += agree
        pairs += len(items)
    holder_ok = sum(it.holder == it.label for it in items) / len(items)
    return {
        "queries": len(queries),
        "items": len(items),
        "pairs": pairs,
        "agreement": same / pairs if pairs else None,
        "holder_agreement": holder_ok,
        "cones_hold": bool(rt.cones_hold),
        "cones_held_share": float(rt.cones_held_share),
        "per_query": per_query,
    }


def main(argv: Sequence[str] | None = None) -> int:
    from .runtime import StartupError, open_runtime
    from .settings import Settings

    ap = argparse.ArgumentParser(prog="python -m service.crosscheck", description=__doc__)
    ap.add_argument("--index", required=True)
    ap.add_argument("--model")
    ap.add_argument("--labels")
    ap.add_argument("--queries", help="comma-separated query labels (default: the labels in use)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    try:
        rt = open_runtime(Settings(index=args.index, model=args.model, labels=args.labels))
    except (StartupError, ValueError) as e:
        print(f"crosscheck: {e}", file=sys.stderr)
        return 2
    try:
        qs = None if args.queries is None else [rt.resolve(q) for q in args.queries.split(",")]
        out = level_agreement(rt, qs)
    finally:
        rt.close()
    if args.json:
        print(json.dumps(out))
    else:
        for k, v in out.items():
            if k != "per_query":
                print(f"{k}\t{v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
