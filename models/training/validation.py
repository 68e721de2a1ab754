"""Evaluation during and after a training run (:mod:`models.training.run`): validation
metrics, the feature novelty rule fitted, the cone placement's back-offs calibrated on
the validation split."""

from __future__ import annotations

import time

import torch
from torch import nn

from ..vision.image_model import ImageModel
from .config import TrainConfig
from .data import Prepared
from .setup import Model, autocast, encode, model_inputs


@torch.no_grad()
def validate(model: Model, prep: Prepared, amp: bool, batch_size: int = 1024) -> dict:
    """Loss-free metrics of the validation split: nearest-prototype accuracy (or Recall@1)."""
    pixels, targets = prep.val_pixels, prep.val_targets
    if len(pixels) == 0:
        return {}
    f = split_features(model, prep, pixels, amp, batch_size)
    model.train(False)
    z = model.head(f)
    out = {}
    space = model.space
    if model.protos is not None and (targets >= 0).any():
        pred = space.pairwise(z, model.protos.classes).argmin(1)
        ok = targets >= 0
        out["val_acc"] = float((pred[ok] == targets[ok]).double().mean())
        if isinstance(model.aux, nn.Linear):  # the auxiliary classifier's accuracy
            pred = model.aux(f).argmax(1)
            out["val_aux_acc"] = float((pred[ok] == targets[ok]).double().mean())
    elif (targets >= 0).sum() > 1:
        d = space.pairwise(z, z)
        d.fill_diagonal_(float("inf"))
        nn_ = d.argmin(1)
        out["val_r1"] = float((targets[nn_] == targets).double().mean())
    model.train()
    return out


@torch.no_grad()
def split_features(
    model: Model, prep: Prepared, pixels: torch.Tensor, amp: bool, batch_size: int = 1024
) -> torch.Tensor:
    """Encoder features (n, F) float32 of rows of a split (eval mode; train mode after):
    with ``model.tta`` the mean of each image's and its mirror image's, as
    :meth:`ImageModel.features` computes them."""
    model.train(False)
    fs = []
    for s in range(0, len(pixels), batch_size):
        x = model_inputs(prep, pixels[s : s + batch_size])
        with autocast(amp):
            f = encode(model.encoder, prep, x).float()
            if model.tta and x.dim() == 4:
                f = (f + encode(model.encoder, prep, x.flip(-1)).float()) / 2
            fs.append(f)
    model.train()
    return torch.cat(fs) if fs else torch.zeros(0, 0)


#: training images the feature novelty statistics are fitted on (a seeded sample)
NOVELTY_FIT_IMAGES = 20_000


def fit_novelty(out: ImageModel, model: Model, prep: Prepared, cfg: TrainConfig) -> None:
    """The feature novelty rule (:mod:`models.vision.novelty`): fitted on up to
    :data:`NOVELTY_FIT_IMAGES` training images, its threshold calling
    ``cfg.novelty_rate`` of the validation images novel; kept in ``out.novelty``,
    ``out.config["novelty_threshold"]`` and ``out.metrics["novelty"]``. Features in
    float32 (no bfloat16 autocast), as :meth:`ImageModel.embed` computes them."""
    from ..vision.novelty import FeatureNovelty

    rate = cfg.resolved_novelty_rate(len(prep.classes))
    tr, va = prep.train_targets >= 0, prep.val_targets >= 0
    if rate <= 0 or not bool(va.any()):
        return
    gen = torch.Generator().manual_seed(cfg.seed * 7_919 + 1)
    rows = torch.nonzero(tr).flatten()
    rows = rows[torch.randperm(len(rows), generator=gen)[:NOVELTY_FIT_IMAGES]].sort().values
    t0 = time.perf_counter()
    try:
        nov = FeatureNovelty.fit(
            split_features(model, prep, prep.train_pixels[rows], False), prep.train_targets[rows]
        )
    except ValueError:  # a trained class without a sampled image: no rule rather than a bad one
        return
    threshold = nov.calibrate(split_features(model, prep, prep.val_pixels[va], False), rate)
    out.novelty = nov
    out.config |= {"novelty_rate": rate, "novelty_threshold": threshold}
    out.metrics["novelty"] = {
        "rate": rate,
        "threshold": threshold,
        "fit_images": len(rows),
        "seconds": time.perf_counter() - t0,
    }
    out._placement = None


#: what the placement's calibration asks of the validation images: at least this share
#: placed at their class, and at most ``PLACEMENT_OTHER`` in another class's cone -- 0.01
#: below the 0.05 aimed at on the test split (a model whose validation images gave 0.046
#: gave 0.053 on the test split: docs/image-model.md)
PLACEMENT_IN_CLASS, PLACEMENT_OTHER = 0.9, 0.04


def placement_merit(got: dict) -> tuple[bool, float]:
    """How good a calibrated placement is on validation (larger is better): first whether
    it meets both aims (:data:`PLACEMENT_IN_CLASS`, :data:`PLACEMENT_OTHER`), then the
    share of images placed at their class."""
    both = got["val_in_class"] >= PLACEMENT_IN_CLASS and got["val_other"] <= PLACEMENT_OTHER
    return both, got["val_in_class"]


def calibrate_placement(out: ImageModel, model: Model, prep: Prepared, cfg: TrainConfig) -> None:
    """The cone placement's back-offs from the validation split
    (:func:`models.vision.placement.calibrate`), written into ``out.config``
    (``placement_confidence``, ``placement_novelty``, ``placement_radii``) and
    ``out.metrics["placement"]``; with a kept classifier, its posterior or the
    distances', whichever does better on validation (:func:`placement_merit`;
    ``placement_posterior``, ``metrics["placement_val_in_class"]`` and
    ``["placement_val_other"]``)."""
    from ..vision.placement import ConePlacement, PlacementConfig, calibrate

    if cfg.placement_posterior == "classifier":
        if isinstance(model.aux, nn.Linear):  # kept for the placement's posterior
            out.classifier = (model.aux.weight.detach().clone(), model.aux.bias.detach().clone())
        else:  # no linear auxiliary classifier (--aux 0, --classifier hmlr): the distances
            out.config["placement_posterior"] = "distance"
    ok = prep.val_targets >= 0
    if not bool(ok.any()):
        return
    # float32 features, as ImageModel.embed computes them (no bfloat16 autocast)
    f = split_features(model, prep, prep.val_pixels[ok], False)
    with torch.no_grad():
        z = model.head(f).double()
    seen = [prep.classes[i][1] for i in prep.seen]
    classes = [seen[t] for t in prep.val_targets[ok].tolist()]

    def calibrated(classifier) -> dict:
        pl = ConePlacement(
            out.labels,
            seen,
            PlacementConfig(tau=out.config.get("tau", 1.0)),
            prototypes=out.head_prototypes(),
            classifier=classifier,
        )
        return calibrate(
            pl, z, classes, in_class=PLACEMENT_IN_CLASS, other=PLACEMENT_OTHER, features=f
        )

    got = calibrated(out.classifier)
    if out.classifier is not None:
        # the classifier's posterior unless the distances' does better on validation: meets
        # both aims where the classifier's does not, or places more images at their class
        # (a short run's classifier can lag behind the head)
        by_distance = calibrated(None)
        out.metrics["placement_val_in_class"] = {
            "classifier": got["val_in_class"],
            "distance": by_distance["val_in_class"],
        }
        out.metrics["placement_val_other"] = {
            "classifier": got["val_other"],
            "distance": by_distance["val_other"],
        }
        if placement_merit(by_distance) > placement_merit(got):
            got = by_distance
            out.classifier = None
            out.config["placement_posterior"] = "distance"
    out.config |= {
        "placement_confidence": got["confidence"],
        "placement_novelty": 1.0,
        "placement_radii": got["radii"],
    }
    out.metrics["placement"] = {k: got[k] for k in ("confidence", "val_in_class", "val_other")}
    out._placement = None
