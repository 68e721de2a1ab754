"""One trained model's weights under three placements: off, the plain cone placement, calibrated.

Writes, beside ``--out-prefix``, three model checkpoints with the same trained
weights (the placement is the last step of ``ImageModel.embed``, read from the
model's config):

* ``PREFIX-raw.safetensors``: ``placement: none`` (the head's output);
* ``PREFIX-placed.safetensors``: ``placement: cones`` without back-offs
  (confidence 0, no novelty rule);
* ``PREFIX-cal.safetensors``: ``placement: cones`` with the back-offs that
  :func:`models.vision.placement.calibrate` picks on the model's own validation split
  (the stratified split of ``hypsearch train``: same ``val_fraction``, ``seed``,
  held-out classes), as a model trained with ``--placement cones`` now gets them.

Then evaluate each with ``hypsearch eval --model M --dataset fashion-mnist
--split test --json``. Prints the calibration (grid of confidence, validation
in-class share, validation in-another-class share) as JSON.

    python benchmarks/placement.py --model MODEL --out-prefix var/bench/pl/model [--quantile 0.99]

``--test-grid`` also prints, on the test split, for each (confidence,
novelty) of a small grid: the share of held-out classes' images placed at
their class or a parent of it (the first ``/v1/embed`` label: the deepest
holder of a placed point is its node) and the share of trained classes'
images placed at their class.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np
import torch
from _common import ROOT

sys.path.insert(0, str(ROOT))


def validation_split(model):
    """``(data, targets, rows)``: the training split of the model's dataset and the rows
    of its validation split (the stratified split of ``hypsearch train``: the model's
    ``val_fraction``, ``seed``, ``limit`` and held-out classes)."""
    from models.images.datasets import load_dataset
    from models.training.data import split_rows

    cfg = model.config
    data = load_dataset(cfg.get("dataset", "fashion-mnist"), split="train")
    targets = np.asarray(data.targets)
    seen_ids = [i for i, (_, node) in enumerate(data.classes) if node not in model.holdout]
    idx = np.flatnonzero(np.isin(targets, seen_ids))
    _, va = split_rows(
        targets, idx, cfg.get("limit"), cfg.get("val_fraction", 0.05), cfg.get("seed", 0)
    )
    return data, targets, va


def main() -> int:
    from models.vision.image_model import load_model
    from models.vision.placement import ConePlacement, PlacementConfig, calibrate

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", required=True)
    ap.add_argument("--out-prefix", required=True)
    ap.add_argument("--quantile", type=float, default=0.99)
    ap.add_argument("--in-class", type=float, default=0.9)
    ap.add_argument("--other", type=float, default=0.05)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--test-grid", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model = load_model(args.model)
    cfg = model.config
    data, targets, va = validation_split(model)
    base = {k: v for k, v in cfg.items() if not k.startswith("placement_")}
    model.config = base | {"placement": "none"}
    model._placement = None
    z = model.embed(data.images[va])
    classes = [data.classes[t][1] for t in targets[va]]
    pl = ConePlacement(
        model.labels,
        model.seen_classes,
        PlacementConfig(tau=cfg.get("tau", 1.0)),
        prototypes=model.head_prototypes(),
    )
    got = calibrate(
        pl, z, classes, in_class=args.in_class, other=args.other, quantile=args.quantile
    )
    model.save(f"{args.out_prefix}-raw.safetensors")
    model.config = base | {"placement": "cones"}
    model.save(f"{args.out_prefix}-placed.safetensors")
    model.config = base | {
        "placement": "cones",
        "placement_confidence": got["confidence"],
        "placement_novelty": 1.0,
        "placement_radii": got["radii"],
    }
    model.save(f"{args.out_prefix}-cal.safetensors")
    print(json.dumps({k: got[k] for k in ("confidence", "val_in_class", "val_other", "grid")}))
    if args.test_grid:
        test_grid(model, pl, got["radii"])
    return 0


def test_grid(model, pl, radii) -> None:
    from dataclasses import replace

    from models.images.datasets import load_dataset

    test = load_dataset(model.config.get("dataset", "fashion-mnist"), split="test")
    model.config["placement"] = "none"
    model._placement = None
    z = model.embed(test.images)
    tax = model.labels.taxonomy
    nodes = np.array([test.classes[t][1] for t in test.targets])
    held = np.isin(nodes, model.holdout)
    pl.radius = torch.tensor([radii.get(n, np.inf) for n in pl.seen], dtype=torch.float64)
    base = pl.cfg
    for conf in (0.0, 0.5, 0.65, 0.8, 0.9, 0.95):
        for nov in (float("inf"), 1.0, 0.8):
            pl.cfg = replace(base, confidence=conf, novelty=nov)
            ch = np.array([pl.names[r] for r in pl.choose(z).tolist()])
            hit = np.array([c == n or c in tax.parents(n) for c, n in zip(ch, nodes, strict=True)])
            row = {"confidence": conf, "novelty": nov}
            row["trained_at_class"] = float((ch[~held] == nodes[~held]).mean())
            if held.any():
                row["held_class_or_parent"] = float(hit[held].mean())
                row |= {h: float(hit[nodes == h].mean()) for h in model.holdout}
            print(json.dumps(row))


if __name__ == "__main__":
    sys.exit(main())
