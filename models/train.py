"""Training of the image encoder: images -> points of the Poincaré ball next to their labels.

Reads top to bottom: a :class:`TrainConfig`, a pure :func:`get_lr`, the data
(:func:`prepare_data`), the model, the optimiser, then :func:`train`'s loop
(views, forward, objective, backward, clipping, step; an evaluation on the
validation split and a resumable checkpoint after every epoch).

The default objective (``loss="prototype"``): softmax cross-entropy over
:math:`-d(z, p)/\tau` against the label points of every taxonomy node (the
image's class is the target; its ancestors are neither target nor negative;
held-out classes and their subtrees are left out entirely), plus ``pull``
times :math:`d(z, p_{class})`, which gathers each class around its label
point. The head works around a base point, the Einstein midpoint of the
trained classes' label points (see :class:`models.heads.HyperbolicHead`): the
label points of a deep WordNet subtree sit in a thin cone far from the
origin (the ten Fashion-MNIST classes point in directions with cosines above
0.99), and seen from their midpoint they spread in every direction. The
Euclidean twin (``geometry="euclidean"``) trains the same encoder and loss
against the tangent vectors of the same label points at that base point.

With ``aux`` > 0 a linear softmax classifier on the encoder's features adds
its cross-entropy (times ``aux``) for the labelled losses: deep supervision
of the encoder, dropped after training. Distances to fixed label points far
from the base point make slow logits (for far prototypes :math:`-d` varies
like :math:`-2\log\sin(\theta/2)` in the angle to the prototype), and
on Fashion-MNIST the encoder learned markedly faster with the plain
classifier beside them (see the README's measurements). The default encoder
is Conv-4 with pool-first blocks (conv, max pool, batch norm, ReLU: the same
function class; forward and backward of 256 images on one CPU thread
measured 0.20 s instead of 0.24 s) and no augmentation: in the
eight or so epochs the 570 s budget allows on 2 cores, the model underfits,
and crops or shifts cost more accuracy than they gained.

Optimisation is Riemannian Adam (geoopt): Euclidean parameters get plain
Adam, parameters that live on the ball (the bias of the optional Möbius
layer; the base point with ``learn_base``) are updated along the manifold.
Warm-up then cosine decay (:func:`get_lr`), gradient-norm clipping, and a
time budget that fits the schedule to the epochs that fit it, planned after
the first epoch and again after the second (the first carries start-up
costs; never beyond the requested epochs). The encoder runs under bfloat16 autocast on
CPUs that support it (about 2x faster) in channels-last layout, with one
torch thread by default (on the shared 2-core machine one thread measured
about 4x faster than two); heads, distances and losses are float64.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from . import losses
from .checkpoint import CheckpointError, load_checkpoint
from .data import (
    DEFAULT_FASHION_MNIST_DIR,
    Augment,
    ImageSet,
    Preprocess,
    load_dataset,
    normalize,
    split_indices,
)
from .encoders import EncoderConfig, build_encoder, load_backbone
from .geometry import poincare
from .heads import HeadConfig, build_head, make_space
from .image_model import KIND, ImageModel
from .labels import LabelEmbedding

__all__ = ["TrainConfig", "TrainError", "get_lr", "prepare_data", "train"]


class TrainError(ValueError):
    """A training request that cannot work (unknown class, wrong dimension, …); one line."""


@dataclass
class TrainConfig:
    """Every option of image training; the defaults are the benchmarked configuration."""

    # data
    dataset: str | None = "fashion-mnist"  # or None with `images`
    data_dir: str = DEFAULT_FASHION_MNIST_DIR
    images: str | None = None  # a folder DIR/<class>/<images> or a CSV manifest id,path[,label]
    class_map: dict[str, str] | None = None  # class name -> taxonomy node (user images)
    holdout: list[str] = field(default_factory=list)  # taxonomy nodes kept out of training
    limit: int | None = None  # use only this many training images (stratified; quick runs, tests)
    val_fraction: float = 0.05  # stratified validation split of the training images
    input_size: int | None = (
        None  # None: the images' own size (Fashion-MNIST 28), 64 for user images
    )
    # model
    encoder: str = "conv4"
    widths: list[int] = field(default_factory=lambda: [32, 64, 128, 128])
    depth: int = 1  # conv4: 3x3 convolutions per block
    pool_first: bool = True  # conv4: conv -> pool -> BN -> ReLU (False: the original order)
    dropout: float = 0.0  # on the encoder's pooled features
    backbone: str | None = None  # a user's pretrained backbone state dict (local file)
    geometry: str = "poincare"  # "euclidean": the Euclidean twin
    dim: int | None = None  # None: the label embedding's dimension
    clip_r: float | None = None  # None: reach the farthest class prototype (radius / 2 + 0.5)
    mobius: bool = False
    centre: bool = (
        True  # head around the Einstein midpoint of the class prototypes (else the origin)
    )
    learn_base: bool = False  # train that base point too (Riemannian Adam on the ball)
    # objective
    loss: str = "prototype"  # prototype, margin, pairwise, circle, ntxent
    negatives: str = "taxonomy"  # prototype losses: "classes" (the trained classes) or "taxonomy"
    # (every taxonomy node except the class's ancestors and the held-out subtrees)
    tau: float = 1.0  # temperature of prototype / pairwise / ntxent logits -d/tau
    pull: float = 0.3  # prototype loss: weight of the mean distance to the class prototype
    margin: float = 1.0  # margin rank loss
    aux: float = 1.0  # weight of an auxiliary softmax classifier on the encoder's features
    # (labelled losses; the classifier is dropped after training)
    augment: str = "none"  # none, shift, light, strong (two-view objectives use strong)
    flip: bool = True
    # optimisation
    epochs: int = 12
    batch_size: int = 256
    lr: float = 4e-3
    min_lr: float = 4e-5
    warmup_iters: int = 100
    weight_decay: float = 5e-4
    grad_clip: float = 5.0
    amp: bool = True  # bfloat16 autocast of the encoder where the CPU supports it
    threads: int | None = 1  # torch threads while training (None: leave torch's setting);
    # on a shared 2-core machine one thread measured 4x faster than two
    time_budget: float | None = 570.0  # seconds; after epoch 1, fewer epochs if they would not fit
    seed: int = 0

    def validate(self) -> None:
        if self.loss not in losses.LOSSES:
            raise TrainError(f"unknown loss {self.loss!r} (one of {', '.join(losses.LOSSES)})")
        if self.geometry not in ("poincare", "euclidean"):
            raise TrainError(f"unknown geometry {self.geometry!r} (poincare or euclidean)")
        if self.augment not in ("none", "shift", "light", "strong"):
            raise TrainError(
                f"unknown augmentation {self.augment!r} (none, shift, light or strong)"
            )
        if self.epochs < 0 or self.batch_size < 2:
            raise TrainError("epochs must be >= 0 and batch size >= 2")
        if self.negatives not in ("classes", "taxonomy"):
            raise TrainError(f"unknown negatives {self.negatives!r} (classes or taxonomy)")
        if not (0 <= self.val_fraction < 1):
            raise TrainError(f"val fraction must be in [0, 1), got {self.val_fraction}")
        for name in ("lr", "tau", "margin"):
            if not getattr(self, name) > 0:
                raise TrainError(f"{name} must be positive")


def get_lr(it: int, cfg: TrainConfig, max_iters: int) -> float:
    """Linear warm-up for ``warmup_iters``, then cosine decay to ``min_lr`` at ``max_iters``."""
    if it < cfg.warmup_iters:
        return cfg.lr * (it + 1) / cfg.warmup_iters
    if it >= max_iters:
        return cfg.min_lr
    ratio = (it - cfg.warmup_iters) / max(1, max_iters - cfg.warmup_iters)
    coeff = 0.5 * (1.0 + math.cos(math.pi * ratio))  # 1 -> 0
    return cfg.min_lr + coeff * (cfg.lr - cfg.min_lr)


# ---------------------------------------------------------------- data


@dataclass
class Prepared:
    """Training and validation pixels (uint8, model input size) with class indices."""

    train_pixels: torch.Tensor  # (n, C, S, S) uint8
    train_targets: torch.Tensor  # (n,) int64 index into `classes`, -1 unlabelled
    val_pixels: torch.Tensor
    val_targets: torch.Tensor
    classes: list[tuple[str, str]]  # every class of the data: (name, taxonomy node)
    seen: list[int]  # class indices used in training (not held out)
    preprocess: Preprocess


def _resolve_holdout(names: list[str], classes: list[tuple[str, str]]) -> list[str]:
    out = []
    for h in names:
        hits = [node for name, node in classes if h in (node, name)]
        if not hits:
            raise TrainError(
                f"--holdout {h}: not a class of the data "
                f"(classes: {', '.join(n for _, n in classes)})"
            )
        out.append(hits[0])
    return out


def prepare_data(
    cfg: TrainConfig, labels: LabelEmbedding | None, data: ImageSet | None = None
) -> Prepared:
    """Load the training images, check their classes against the labels, split, preprocess once."""
    if data is None:
        data = load_dataset(
            cfg.dataset if cfg.images is None else None,
            split="train",
            data_dir=cfg.data_dir,
            images=cfg.images,
            class_map=cfg.class_map,
            taxonomy=labels.taxonomy if labels is not None else None,
        )
    classes = [tuple(c) for c in data.classes]
    if labels is not None:
        for name, node in classes:
            if node not in labels.taxonomy:
                raise TrainError(
                    f"class {name!r} maps to {node!r}, which the label embedding does not contain"
                )
    holdout = _resolve_holdout(cfg.holdout, classes)
    cfg.holdout = holdout
    seen = [i for i, (_, node) in enumerate(classes) if node not in holdout]
    targets = np.asarray(data.targets)
    needs_labels = losses.LOSSES[cfg.loss][2]
    keep = np.isin(targets, seen) | ((targets < 0) & (not needs_labels))
    if needs_labels and not seen:
        raise TrainError("every class is held out: nothing to train on")
    idx = np.flatnonzero(keep)
    if needs_labels and (targets[idx] < 0).any():
        raise TrainError(f"loss {cfg.loss!r} needs labels, but some images have none")
    if cfg.limit is not None and cfg.limit < len(idx):
        sub, _ = split_indices(targets[idx], 1 - cfg.limit / len(idx), cfg.seed)
        idx = idx[sub]
    tr, va = split_indices(targets[idx], cfg.val_fraction, cfg.seed)
    tr, va = idx[tr], idx[va]
    if len(tr) < 2:
        raise TrainError(f"only {len(tr)} training images")

    images = data.images
    shape0 = images[0].shape if len(images) else (28, 28)
    size = cfg.input_size or (shape0[0] if cfg.images is None else 64)
    channels = 1 if len(shape0) == 2 else 3
    fmnist = cfg.images is None and cfg.dataset == "fashion-mnist"
    pre = Preprocess(
        size=size,
        channels=channels,
        mean=(0.0,) * channels,
        std=(1.0,) * channels,
        background="dark" if fmnist else "any",
    )

    def pixels(rows: np.ndarray) -> torch.Tensor:
        if isinstance(images, np.ndarray):
            sel = images[rows]
        else:
            sel = [images[i] for i in rows]
        out = []
        for s in range(0, len(rows), 4096):
            chunk = sel[s : s + 4096]
            p = pre.pixels(chunk) if len(chunk) else torch.zeros(0, channels, size, size)
            out.append((p * 255).round().to(torch.uint8))
        return torch.cat(out) if out else torch.zeros(0, channels, size, size, dtype=torch.uint8)

    train_pixels = pixels(tr)
    x = train_pixels.to(torch.float32) / 255
    pre.mean = tuple(float(v) for v in x.mean(dim=(0, 2, 3)))
    pre.std = tuple(float(v) for v in x.std(dim=(0, 2, 3)).clamp_min(1e-3))
    # class indices -> positions among the seen classes (what the prototypes are indexed by)
    pos = np.full(len(classes) + 1, -1)
    pos[seen] = np.arange(len(seen))
    remap = lambda t: torch.from_numpy(np.where(t >= 0, pos[t], -1).astype(np.int64))  # noqa: E731
    return Prepared(
        train_pixels=train_pixels,
        train_targets=remap(targets[tr]),
        val_pixels=pixels(va),
        val_targets=remap(targets[va]),
        classes=classes,
        seen=seen,
        preprocess=pre,
    )


# ---------------------------------------------------------------- checkpoints of a run


def _optimizer_tensors(opt: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict]:
    sd = opt.state_dict()
    tensors, scalars = {}, {}
    for i, st in sd["state"].items():
        for k, v in st.items():
            if torch.is_tensor(v):
                tensors[f"optim.{i}.{k}"] = v.reshape(-1) if v.dim() == 0 else v
                if v.dim() == 0:
                    scalars[f"{i}.{k}.0d"] = True
            else:
                scalars[f"{i}.{k}"] = v
    groups = [
        {k: (list(v) if isinstance(v, tuple) else v) for k, v in g.items()}
        for g in sd["param_groups"]
    ]
    return tensors, {"scalars": scalars, "param_groups": groups}


def _load_optimizer(opt: torch.optim.Optimizer, tensors: dict, meta: dict) -> None:
    state: dict[int, dict] = {}
    for name, v in tensors.items():
        if name.startswith("optim."):
            _, i, k = name.split(".", 2)
            state.setdefault(int(i), {})[k] = v
    for key, v in meta["scalars"].items():
        i, k = key.split(".", 1)
        if k.endswith(".0d"):
            state[int(i)][k[:-3]] = state[int(i)][k[:-3]].reshape(())
        else:
            state.setdefault(int(i), {})[k] = v
    groups = [
        {k: (tuple(v) if k == "betas" else v) for k, v in g.items()} for g in meta["param_groups"]
    ]
    opt.load_state_dict({"state": state, "param_groups": groups})


def _config_key(cfg: TrainConfig) -> dict:
    d = dataclasses.asdict(cfg)
    return {k: v for k, v in d.items() if k not in ("epochs",)}


# ---------------------------------------------------------------- evaluation during training


@torch.no_grad()
def _validate(encoder, head, space, protos, pixels, targets, pre, amp, batch_size=1024) -> dict:
    """Validation loss-free metrics: nearest-prototype accuracy (or view-free Recall@1)."""
    if len(pixels) == 0:
        return {}
    encoder.eval()
    head.eval()
    zs = []
    for s in range(0, len(pixels), batch_size):
        x = normalize(pixels[s : s + batch_size].to(torch.float32) / 255, pre.mean, pre.std)
        x = x.contiguous(memory_format=torch.channels_last)
        with _autocast(amp):
            f = encoder(x)
        zs.append(head(f.float()))
    z = torch.cat(zs)
    out = {}
    if protos is not None and (targets >= 0).any():
        pred = space.pairwise(z, protos).argmin(1)
        ok = targets >= 0
        out["val_acc"] = float((pred[ok] == targets[ok]).double().mean())
    elif (targets >= 0).sum() > 1:
        d = space.pairwise(z, z)
        d.fill_diagonal_(float("inf"))
        nn_ = d.argmin(1)
        out["val_r1"] = float((targets[nn_] == targets).double().mean())
    encoder.train()
    head.train()
    return out


def _amp_supported() -> bool:
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except Exception:
        return False


def _autocast(enabled: bool):
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=enabled)


# ---------------------------------------------------------------- training


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
    threads_before = torch.get_num_threads()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    try:
        return _train(cfg, labels, progress, checkpoint_path, resume, data, max_seconds)
    finally:
        torch.set_num_threads(threads_before)


def _train(cfg, labels, progress, checkpoint_path, resume, data, max_seconds) -> ImageModel:
    t0 = time.perf_counter()
    needs_protos, two_views, _ = losses.LOSSES[cfg.loss]
    prep = prepare_data(cfg, labels, data)
    seen_nodes = [prep.classes[i][1] for i in prep.seen]

    # the model
    torch.manual_seed(cfg.seed)
    dim = cfg.dim or labels.dim
    if needs_protos and dim != labels.dim:
        raise TrainError(
            f"--dim {dim}: the {cfg.loss} loss needs the label embedding's dimension {labels.dim}"
        )
    c = labels.curvature
    # the head's base point: the Einstein midpoint of the trained classes' label points
    base = torch.zeros(dim, dtype=torch.float64)
    class_points = labels.embeddings[[labels.taxonomy.index(n) for n in seen_nodes]]
    if needs_protos and cfg.centre:
        base = poincare.einstein_midpoint(class_points, c=c)
    space = make_space(cfg.geometry, c, base=base)
    protos, loss_protos, loss_target, exclude = None, None, None, None
    if needs_protos:
        tax = labels.taxonomy
        protos = space.from_ball(class_points)  # (K, D): the trained classes (validation)
        loss_protos, loss_target = protos, torch.arange(len(seen_nodes))
        if (
            cfg.negatives == "taxonomy"
        ):  # every node but held-out subtrees; ancestors excluded per class
            banned = set(cfg.holdout).union(*(tax.descendants(h) for h in cfg.holdout)) - set(
                seen_nodes
            )
            nodes = [name for name in labels.names if name not in banned]
            pos = {name: i for i, name in enumerate(nodes)}
            loss_protos = space.from_ball(labels.embeddings[[tax.index(n) for n in nodes]])
            loss_target = torch.tensor([pos[n] for n in seen_nodes])
            exclude = torch.zeros(len(seen_nodes), len(nodes), dtype=torch.bool)
            for k, node in enumerate(seen_nodes):
                exclude[k, [pos[a] for a in tax.ancestors(node) if a in pos]] = True
    clip_r = cfg.clip_r
    if clip_r is None:  # reach the farthest class from the base point: d <= 2r/sqrt(c)
        if needs_protos:
            far = float(poincare.dist(base.expand_as(class_points), class_points, c=c).max())
            clip_r = far * math.sqrt(c) / 2 + 0.5
        else:
            clip_r = 2.3  # Hyp-ViT
    enc_cfg = EncoderConfig(
        name=cfg.encoder,
        in_channels=prep.preprocess.channels,
        input_size=prep.preprocess.size,
        widths=list(cfg.widths),
        depth=cfg.depth,
        pool_first=cfg.pool_first,
        dropout=cfg.dropout,
    )
    encoder = build_encoder(enc_cfg)
    if cfg.backbone:
        try:
            load_backbone(encoder, cfg.backbone)
        except ValueError as e:
            raise TrainError(str(e)) from None
    head_cfg = HeadConfig(
        in_features=encoder.out_features,
        dim=dim,
        geometry=cfg.geometry,
        curvature=labels.curvature,
        clip_r=clip_r,
        mobius=cfg.mobius,
    )
    head = build_head(head_cfg)
    with torch.no_grad():
        head.base.copy_(base)
    head.base.requires_grad_(cfg.learn_base and cfg.geometry == "poincare")
    encoder = encoder.to(memory_format=torch.channels_last)
    # auxiliary classifier over the trained classes (deep supervision of the encoder)
    aux = None
    if cfg.aux > 0 and losses.LOSSES[cfg.loss][2]:
        aux = torch.nn.Linear(encoder.out_features, len(seen_nodes))

    # the optimiser: weight decay on matrices and kernels only
    import geoopt

    modules = (encoder, head) if aux is None else (encoder, head, aux)
    params = [p for m in modules for p in m.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2 and not isinstance(p, geoopt.ManifoldParameter)]
    no_decay = [
        p for p in params if not (p.dim() >= 2 and not isinstance(p, geoopt.ManifoldParameter))
    ]
    opt = geoopt.optim.RiemannianAdam(
        [
            {"params": decay, "weight_decay": cfg.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=cfg.lr,
    )
    amp = cfg.amp and _amp_supported()

    n = len(prep.train_pixels)
    bs = min(cfg.batch_size, n)
    iters_per_epoch = n // bs  # drop the last partial batch (batch norm, pair losses)
    max_iters = cfg.epochs * iters_per_epoch
    history: list[dict] = []
    epoch0 = 0
    first_loss = None

    # resume an unfinished run
    ckpt = Path(checkpoint_path) if checkpoint_path else None
    if ckpt is not None and resume and ckpt.exists():
        tensors, meta, _ = load_checkpoint(ckpt, kind=KIND)
        if (
            meta.get("run", {}).get("config_key") != _config_key(cfg)
            or meta.get("labels_version") != labels.version
        ):
            raise TrainError(
                f"{ckpt}: unfinished run of another configuration or labels (use --restart)"
            )
        parts = [("encoder.", encoder), ("head.", head)]
        if aux is not None:
            parts.append(("aux.", aux))
        for prefix, module in parts:
            state = {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}
            for k, v in module.state_dict().items():
                if v.dim() == 0 and k in state:
                    state[k] = state[k].reshape(())
            module.load_state_dict(state)
        _load_optimizer(opt, tensors, meta["run"]["optim"])
        epoch0 = int(meta["run"]["epoch"])
        history = list(meta["run"]["history"])
        t0 -= float(meta["run"]["seconds"])

    def model_now(metrics: dict) -> ImageModel:
        return ImageModel(
            enc_cfg,
            head_cfg,
            prep.preprocess,
            labels,
            prep.classes,
            holdout=list(cfg.holdout),
            config=dataclasses.asdict(cfg),
            metrics=metrics,
            encoder=encoder,
            head=head,
        )

    augment = Augment(
        "strong" if two_views and cfg.augment in ("none", "light") else cfg.augment, flip=cfg.flip
    )
    pre = prep.preprocess
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(
            total=max_iters,
            initial=epoch0 * iters_per_epoch,
            desc="train",
            unit="it",
            dynamic_ncols=True,
            leave=False,
        )
    encoder.train()
    head.train()
    it = epoch0 * iters_per_epoch
    planned = cfg.epochs
    epoch = epoch0
    while epoch < planned:
        t_epoch = time.perf_counter()
        gen = torch.Generator().manual_seed(cfg.seed * 100_003 + epoch)
        order = torch.randperm(n, generator=gen)
        running, count = 0.0, 0
        for b in range(iters_per_epoch):
            lr = get_lr(it, cfg, max_iters)
            for group in opt.param_groups:
                group["lr"] = lr
            idx = order[b * bs : (b + 1) * bs]
            pixels = prep.train_pixels[idx].to(torch.float32) / 255  # (B, C, S, S)
            y = prep.train_targets[idx]
            views = [augment(pixels, gen) for _ in range(2 if two_views else 1)]
            x = torch.cat([normalize(v, pre.mean, pre.std) for v in views])
            x = x.contiguous(memory_format=torch.channels_last)
            with _autocast(amp):
                feats = encoder(x)  # (V*B, F)
            z = head(feats.float())  # (V*B, D) float64
            if cfg.loss == "prototype":
                loss = losses.prototype_ce(
                    z,
                    loss_protos,
                    loss_target[y],
                    space,
                    cfg.tau,
                    cfg.pull,
                    exclude=None if exclude is None else exclude[y],
                )
            elif cfg.loss == "margin":
                loss = losses.margin_rank(
                    z, protos, y, space, cfg.margin
                )  # over the trained classes
            elif cfg.loss == "circle":
                loss = losses.circle_loss(z, y, space)
            elif cfg.loss == "pairwise":
                z1, z2 = z.chunk(2)
                loss = losses.pairwise_ce(z1, z2, space, cfg.tau, y if (y >= 0).all() else None)
            else:  # ntxent
                z1, z2 = z.chunk(2)
                loss = losses.nt_xent(z1, z2, space, cfg.tau)
            if aux is not None:
                logits = aux(feats.float())
                loss = loss + cfg.aux * torch.nn.functional.cross_entropy(logits, y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if cfg.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
            opt.step()
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
        val = _validate(encoder, head, space, protos, prep.val_pixels, prep.val_targets, pre, amp)
        history.append(
            {
                "epoch": epoch + 1,
                "loss": running / max(count, 1),
                **val,
                "seconds": time.perf_counter() - t0,
            }
        )
        if bar is not None:
            bar.set_postfix(
                epoch=epoch + 1,
                loss=f"{running / max(count, 1):.4f}",
                **{k: f"{v:.4f}" for k, v in val.items()},
            )
        if ckpt is not None:
            ot, om = _optimizer_tensors(opt)
            if aux is not None:
                ot |= {f"aux.{k}": v.detach() for k, v in aux.state_dict().items()}
            run = {
                "config_key": _config_key(cfg),
                "optim": om,
                "epoch": epoch + 1,
                "history": history,
                "seconds": time.perf_counter() - t0,
            }
            model_now({}).save(ckpt, extra_tensors=ot, extra_meta={"run": run, "partial": True})
        if max_seconds is not None and time.perf_counter() - t0 > max_seconds:
            break
        epoch += 1
        if cfg.time_budget and epoch in (epoch0 + 1, epoch0 + 2) and epoch < cfg.epochs:
            # the schedule fits the budget, planned on the first epoch and planned again on
            # the second (the first one carries start-up costs), never beyond cfg.epochs
            per_epoch = time.perf_counter() - t_epoch
            fit = int((cfg.time_budget - (time.perf_counter() - t0)) // (1.05 * per_epoch))
            new_plan = min(cfg.epochs, max(epoch, epoch + fit))
            if new_plan != planned:
                planned = new_plan
                max_iters = planned * iters_per_epoch
                if bar is not None:
                    bar.total = max_iters
                    bar.write(
                        f"time budget {cfg.time_budget:.0f} s: {planned} of {cfg.epochs} epochs fit"
                    )
    if bar is not None:
        bar.close()

    encoder.eval()
    head.eval()
    metrics: dict[str, Any] = {
        "train_seconds": time.perf_counter() - t0,
        "epochs": len(history),
        "epochs_requested": cfg.epochs,
        "iterations": it,
        "train_images": n,
        "val_images": len(prep.val_pixels),
        "threads": torch.get_num_threads(),
        "bf16": amp,
        "history": history,
        "first_loss": first_loss,  # loss of the first batch (None for a resumed run)
    }
    if history:
        metrics["loss"] = history[-1]["loss"]
        metrics |= {k: v for k, v in history[-1].items() if k.startswith("val_")}
    return model_now(metrics)


def load_partial_config(path: str | os.PathLike) -> dict | None:
    """The training config of an unfinished run at ``path`` (None when there is none)."""
    try:
        _, meta, _ = load_checkpoint(path, kind=KIND)
    except CheckpointError:
        return None
    return meta.get("config") if meta.get("partial") else None
