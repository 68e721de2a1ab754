r"""Training of the image encoder: images -> points of the Poincaré ball next to their labels.

Reads top to bottom: the schedule (:func:`get_lr`, :func:`plan_epochs`), one
epoch (:func:`train_epoch`: views, forward, objective, backward, clipping,
step), then :func:`train`, which runs the epochs with an evaluation on the
validation split and a resumable checkpoint after each. The set-up
(:func:`~models.training.setup.build_model`, :func:`~models.training.setup.build_optimizer`)
is :mod:`models.training.setup`; the validation and what is fitted after the run
(the novelty rule, the placement's calibration) :mod:`models.training.validation`. The
options are :class:`~models.training.config.TrainConfig`, the
data :func:`~models.training.data.prepare_data`, the run state on disk
:mod:`models.training.state`, the objectives :data:`models.training.losses.LOSSES`.

The default objective (``loss="prototype"``): softmax cross-entropy over
:math:`-d(z, p)/\tau` against the label points of every taxonomy node (the
image's class is the target; its ancestors are neither target nor negative;
held-out classes and their subtrees are left out entirely), plus ``pull``
times :math:`d(z, p_{class})`, which gathers each class around its label
point, plus the expected cost :math:`\sum_k p_k\,\mathrm{hops}(y, k)^{2}` of a class
drawn from the posterior over the trained classes (:func:`models.training.losses.expected_hops`,
``hop_weight`` times it, default 1 up to 2,048 trained classes; ``hop_power`` 2;
:func:`class_hops`): of two wrong posteriors, the one on near relatives costs less.
With ``cone_weight`` > 0 (default 0: off, see docs/image-model.md; ball geometry) the cone term
:func:`models.training.losses.cone_hinge` (``cone_weight`` times it) asks each image to
lie inside the cone of its class's label point (in the label checkpoint's cone
family, :func:`models.prototypes.label_cone_spec`; with nested cones, inside
every ancestor's too) and outside the cones of the other trained classes; a
cone lies beyond its label point, so the head's default reach is then
``cone_reach`` farther. The head works around a base point, the Einstein midpoint of the
trained classes' label points (see :class:`models.vision.heads.HyperbolicHead`): the
label points of a deep WordNet subtree sit in a thin cone far from the
origin (the Fashion-MNIST classes point in nearly the same direction), and
seen from their midpoint they spread in every direction. The Euclidean twin
(``geometry="euclidean"``) trains the same encoder and loss against the
tangent vectors of the same label points at that base point.

With ``aux`` > 0 a linear softmax classifier on the encoder's features adds
its cross-entropy (times ``aux``) for the labelled losses: deep supervision
of the encoder, dropped after training. Distances to fixed label points far
from the base point make slow logits (for far prototypes :math:`-d` varies
like :math:`-2\log\sin(\theta/2)` in the angle to the prototype), and the
encoder learns markedly faster with the plain classifier beside them (see the
measurements in docs/image-model.md). The default encoder is Conv-4 with pool-first blocks
(conv, max pool, batch norm, ReLU: the same function class, cheaper) and no
augmentation: in the few epochs the default time budget allows on a small
CPU the model underfits, and crops or shifts cost more accuracy than they
gain.

Optimisation is Riemannian Adam (geoopt): Euclidean parameters get plain
Adam, parameters that live on the ball (the bias of the optional Möbius
layer; the base point with ``learn_base``) are updated along the manifold.
Warm-up then cosine decay (:func:`get_lr`), gradient-norm clipping, and a
time budget that fits the schedule to the epochs that fit it, planned after
the first epoch and again after the second (the first carries start-up
costs; never beyond the requested epochs). The encoder runs under bfloat16
autocast on CPUs that support it, in channels-last layout, with one torch
thread by default (faster than two on a shared small machine); heads,
distances and losses are float64.
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..images.augment import Augment
from ..images.datasets import ImageSet
from ..images.preprocess import normalize
from ..labels import LabelEmbedding
from ..prototypes import label_cone_spec
from ..vision.image_model import ImageModel
from .config import TrainConfig, TrainError
from .data import Prepared, prepare_data
from .losses import Criterion, build_criterion
from .setup import (
    Model,
    amp_supported,
    autocast,
    build_model,
    build_optimizer,
    encode,
    model_inputs,
)
from .state import load_partial_config, resume_run, save_run
from .validation import calibrate_placement, fit_novelty, validate

__all__ = [
    "Prepared",
    "TrainConfig",
    "TrainError",
    "get_lr",
    "load_partial_config",
    "plan_epochs",
    "prepare_data",
    "train",
]


# ---------------------------------------------------------------- the schedule


def get_lr(it: int, cfg: TrainConfig, max_iters: int) -> float:
    """Linear warm-up for ``warmup_iters``, then cosine decay to ``min_lr`` at ``max_iters``."""
    if it < cfg.warmup_iters:
        return cfg.lr * (it + 1) / cfg.warmup_iters
    if it >= max_iters:
        return cfg.min_lr
    ratio = (it - cfg.warmup_iters) / max(1, max_iters - cfg.warmup_iters)
    coeff = 0.5 * (1.0 + math.cos(math.pi * ratio))  # 1 -> 0
    return cfg.min_lr + coeff * (cfg.lr - cfg.min_lr)


def plan_epochs(
    cfg: TrainConfig, done: int, first: int, planned: int, per_epoch: float, elapsed: float
) -> int:
    """How many epochs the time budget allows, after ``done`` epochs (the run started at ``first``).

    Planned after the run's first epoch and planned again after its second
    (the first one carries start-up costs), from the last epoch's
    ``per_epoch`` seconds with a 5 % margin; never fewer than ``done``,
    never more than ``cfg.epochs``. Any other time: ``planned`` unchanged.
    """
    if not cfg.time_budget or done not in (first + 1, first + 2) or done >= cfg.epochs:
        return planned
    fit = int((cfg.time_budget - elapsed) // (1.05 * per_epoch))
    return min(cfg.epochs, max(done, done + fit))


# ---------------------------------------------------------------- one epoch


@dataclass
class Step:
    """What one optimisation step needs besides the model."""

    criterion: Criterion
    opt: torch.optim.Optimizer
    params: list[nn.Parameter]
    augment: Augment
    views: int  # 2 for the two-view objectives
    amp: bool
    iters_per_epoch: int
    batch_size: int


def train_epoch(
    model: Model,
    step: Step,
    cfg: TrainConfig,
    prep: Prepared,
    epoch: int,
    it: int,
    max_iters: int,
    bar=None,
) -> tuple[float, int, float | None]:
    """One pass over the training images in the epoch's seeded order, from iteration ``it``.

    Returns the epoch's mean loss, the iteration reached and, when the epoch
    holds the run's first iteration, that batch's loss (else None).
    """
    gen = torch.Generator().manual_seed(cfg.seed * 100_003 + epoch)
    order = torch.randperm(len(prep.train_pixels), generator=gen)
    bs = step.batch_size
    running, count, first_loss = 0.0, 0, None
    for b in range(step.iters_per_epoch):
        lr = get_lr(it, cfg, max_iters)
        for group in step.opt.param_groups:
            group["lr"] = lr
        idx = order[b * bs : (b + 1) * bs]
        y = prep.train_targets[idx]
        x = model_inputs(prep, prep.train_pixels[idx], step.augment, step.views, gen)
        with autocast(step.amp):
            feats = encode(model.encoder, prep, x)  # (V*B, F)
        z = model.head(feats.float())  # (V*B, D) float64
        # one-view objectives with two views (auxiliary terms): both views labelled
        yy = y if cfg.objective.two_views or step.views == 1 else y.repeat(step.views)
        loss = step.criterion(z, yy)
        if model.aux is not None:
            logits = model.aux(feats.float())
            loss = loss + cfg.aux * nn.functional.cross_entropy(logits, yy)
        if model.extra is not None:
            loss = loss + model.extra.loss(x, feats, z, y, autocast(step.amp))[0]
        step.opt.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.grad_clip > 0:
            nn.utils.clip_grad_norm_(step.params, cfg.grad_clip)
        step.opt.step()
        if model.extra is not None:
            model.extra.after_step(model.encoder)
        if it == 0:
            first_loss = float(loss.detach())
        running += float(loss.detach())
        count += 1
        it += 1
        if bar is not None:
            bar.update(1)
            bar.set_postfix(
                epoch=epoch + 1, loss=f"{running / count:.4f}", lr=f"{lr:.1e}", refresh=False
            )
    return running / max(count, 1), it, first_loss


# ---------------------------------------------------------------- the run


def train(
    cfg: TrainConfig,
    labels: LabelEmbedding,
    *,
    progress: bool = True,
    checkpoint_path: str | os.PathLike | None = None,
    resume: bool = True,
    data: ImageSet | None = None,
    max_seconds: float | None = None,
) -> ImageModel:
    """Train an image model against ``labels``; returns it (not saved: see :meth:`ImageModel.save`).

    With ``checkpoint_path`` the run state (model, optimiser, epoch) is written
    there after every epoch, and a matching unfinished run found there is
    resumed. ``max_seconds`` stops after the epoch that crosses the budget.
    """
    cfg.validate()
    cfg = cfg.resolved()
    cap = not cfg.unsupervised and label_cone_spec(labels)["family"] == "cap"
    cfg = cfg.with_placement(cap)
    threads_before = torch.get_num_threads()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    try:
        return _train(cfg, labels, progress, checkpoint_path, resume, data, max_seconds)
    finally:
        torch.set_num_threads(threads_before)


def _progress_bar(total: int, initial: int):
    from tqdm import tqdm

    return tqdm(
        total=total, initial=initial, desc="train", unit="it", dynamic_ncols=True, leave=False
    )


def _train(cfg, labels, progress, checkpoint_path, resume, data, max_seconds) -> ImageModel:
    t0 = time.perf_counter()
    prep = prepare_data(cfg, None if cfg.unsupervised else labels, data, progress=progress)
    model = build_model(cfg, labels, prep)
    opt, params = build_optimizer(cfg, model)
    objective = cfg.objective
    n = len(prep.train_pixels)
    bs = min(cfg.batch_size, n)
    iters_per_epoch = n // bs  # drop the last partial batch (batch norm, pair losses)
    two_views = objective.two_views
    extra_views = model.extra is not None and model.extra.two_views
    strength = cfg.augment
    if extra_views and cfg.augment in ("none", "flip", "light", "strong"):
        strength = "ssl"  # the contrastive / SSL view pipeline
    elif two_views and cfg.augment in ("none", "flip", "light"):
        strength = "strong"
    two_views = two_views or extra_views
    step = Step(
        criterion=build_criterion(cfg, model.space, model.protos),
        opt=opt,
        params=params,
        augment=Augment(strength, flip=cfg.flip),
        views=2 if two_views else 1,
        amp=cfg.amp and amp_supported(),
        iters_per_epoch=iters_per_epoch,
        batch_size=bs,
    )

    def image_model(metrics: dict) -> ImageModel:
        if cfg.learn_curvature:
            model.head.sync_curvature()  # the saved model's curvature is the learned one
        return ImageModel(
            model.encoder_cfg,
            model.head_cfg,
            prep.preprocess,
            labels,
            prep.classes,
            holdout=list(cfg.holdout),
            config=dataclasses.asdict(cfg),
            metrics=metrics,
            encoder=model.encoder,
            head=model.head,
        )

    # resume an unfinished run
    history: list[dict] = []
    epoch0 = 0
    ckpt = Path(checkpoint_path) if checkpoint_path else None
    if ckpt is not None and resume and ckpt.exists():
        state = resume_run(ckpt, cfg, labels, model.modules(), opt)
        epoch0, history = state.epoch, state.history
        t0 -= state.seconds

    planned = cfg.epochs
    max_iters = planned * iters_per_epoch
    it = epoch0 * iters_per_epoch
    bar = _progress_bar(max_iters, it) if progress else None
    model.train()
    first_loss = None
    epoch = epoch0
    while epoch < planned:
        t_epoch = time.perf_counter()
        if cfg.unsupervised:
            recluster(model, prep, cfg, epoch, step.amp)
        loss, it, first = train_epoch(model, step, cfg, prep, epoch, it, max_iters, bar)
        first_loss = first if first is not None else first_loss
        val = validate(model, prep, step.amp)
        history.append(
            {"epoch": epoch + 1, "loss": loss, **val, "seconds": time.perf_counter() - t0}
        )
        if bar is not None:
            bar.set_postfix(
                epoch=epoch + 1, loss=f"{loss:.4f}", **{k: f"{v:.4f}" for k, v in val.items()}
            )
        if ckpt is not None:
            save_run(
                ckpt,
                image_model({}),
                opt,
                model.aux,
                cfg,
                extra=model.extra,
                epoch=epoch + 1,
                history=history,
                seconds=time.perf_counter() - t0,
            )
        if max_seconds is not None and time.perf_counter() - t0 > max_seconds:
            break
        epoch += 1
        per_epoch = time.perf_counter() - t_epoch
        new_plan = plan_epochs(cfg, epoch, epoch0, planned, per_epoch, time.perf_counter() - t0)
        if new_plan != planned:
            planned = new_plan
            max_iters = planned * iters_per_epoch
            if bar is not None:
                bar.total = max_iters
                bar.write(  # stderr: stdout is --json's
                    f"time budget {cfg.time_budget:.0f} s: {planned} of {cfg.epochs} epochs fit",
                    file=sys.stderr,
                )
    if bar is not None:
        bar.close()

    model.train(False)
    metrics: dict[str, Any] = {
        "train_seconds": time.perf_counter() - t0,
        "epochs": len(history),
        "epochs_requested": cfg.epochs,
        "iterations": it,
        "train_images": n,
        "val_images": len(prep.val_pixels),
        "threads": torch.get_num_threads(),
        "bf16": step.amp,
        "history": history,
        "first_loss": first_loss,  # loss of the first batch (None for a resumed run)
    }
    if prep.feature_cache is not None:
        metrics["features"] = prep.feature_cache  # the pretrained backbone's cached outputs
    if history:
        metrics["loss"] = history[-1]["loss"]
        metrics |= {k: v for k, v in history[-1].items() if k.startswith("val_")}
    out = image_model(metrics)
    if cfg.placement == "cones":
        calibrate_placement(out, model, prep, cfg)
        fit_novelty(out, model, prep, cfg)
    if cfg.unsupervised:
        from .clusters import attach_clusters

        recluster(model, prep, cfg, epoch + 1, step.amp)
        attach_clusters(
            out, model.extra.cluster_tree, replace_labels=labels_are_placeholder(labels)
        )
    return out


def labels_are_placeholder(labels: LabelEmbedding) -> bool:
    """Whether ``labels`` is the stand-in of an unsupervised run without label embeddings."""
    return bool(labels.config.get("placeholder"))


@torch.no_grad()
def recluster(model: Model, prep: Prepared, cfg: TrainConfig, epoch: int, amp: bool) -> None:
    """The unsupervised term's clusters from ``cluster_sample`` training images (seeded by
    the epoch), embedded by the current model in eval mode."""
    gen = torch.Generator().manual_seed(cfg.seed * 100_019 + epoch)
    n = len(prep.train_pixels)
    pick = torch.randperm(n, generator=gen)[: min(cfg.cluster_sample, n)]
    pre = prep.preprocess
    model.train(False)
    zs = []
    for s in range(0, len(pick), 512):
        x = normalize(
            prep.train_pixels[pick[s : s + 512]].to(torch.float32) / 255, pre.mean, pre.std
        )
        with autocast(amp):
            f = model.encoder(x.contiguous(memory_format=torch.channels_last))
        zs.append(model.head(f.float()))
    model.train()
    model.extra.recluster(torch.cat(zs))
