"""The ``hypsearch train`` options of the auxiliary objectives, the product head and the
unsupervised mode (:mod:`models.training.objectives`, :mod:`models.training.clusters`), kept beside
:mod:`service.cli.training` so that module only wires them in."""

from __future__ import annotations

import argparse
from pathlib import Path

from .argtypes import nonneg_float, nonneg_int
from .errors import CliError

#: options that are TrainConfig fields of the same name (None: the config's default)
FIELDS = (
    "classifier",
    "hier_weight",
    "contrastive",
    "contrastive_weight",
    "ssl",
    "ssl_weight",
    "negative_sample",
    "space",
)


def _negative_sample(text: str) -> int | str:
    """``auto`` or an integer >= 0."""
    return "auto" if text == "auto" else nonneg_int(text)


def _curvature(text: str) -> tuple[float | None, bool]:
    """``C``, ``learn`` (from 1) or ``learn:C`` (from C) -> (curvature, learned)."""
    learn = text == "learn" or text.startswith("learn:")
    value = text.split(":", 1)[1] if text.startswith("learn:") else (None if learn else text)
    if value is None:
        return None, True
    try:
        c = float(value)
    except ValueError:
        c = float("nan")
    if not c > 0 or c == float("inf"):
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected a positive curvature, 'learn' or 'learn:C'"
        )
    return c, learn


def _levels(text: str) -> list[int]:
    try:
        levels = [int(p) for p in text.split(",") if p.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected cluster counts like 4,16,64"
        ) from None
    if not levels or any(k < 2 for k in levels) or levels != sorted(levels):
        raise argparse.ArgumentTypeError(f"{text!r}: growing cluster counts, each >= 2")
    return levels


def add_arguments(tn: argparse.ArgumentParser) -> None:
    g = tn.add_argument_group("auxiliary objectives, heads and the unsupervised mode")
    g.add_argument(
        "--classifier",
        choices=["linear", "hmlr"],
        default=None,
        help="auxiliary classifier: linear on the encoder's features (default) or hyperbolic "
        "multinomial logistic regression on the embeddings (Ganea et al. 2018)",
    )
    g.add_argument(
        "--hier-weight",
        type=nonneg_float,
        default=None,
        help="weight of HIER (Kim et al. 2023): learnable hierarchical proxies, a triplet loss "
        "on the lowest common ancestors of pairs (default 0: off)",
    )
    g.add_argument(
        "--contrastive",
        choices=["none", "hyperbolic", "euclidean"],
        default=None,
        help="an NT-Xent term on two augmented views: similarity -d/tau of the model's space "
        "(hyperbolic, Yue et al. 2023) or cosine (euclidean, SimCLR)",
    )
    g.add_argument("--contrastive-weight", type=nonneg_float, default=None, help="default 0.5")
    g.add_argument(
        "--ssl",
        choices=["none", "byol", "barlow"],
        default=None,
        help="a self-supervised term on the encoder's features: BYOL or Barlow Twins",
    )
    g.add_argument("--ssl-weight", type=nonneg_float, default=None, help="default 0.5")
    g.add_argument(
        "--negative-sample",
        type=_negative_sample,
        default=None,
        help="prototype loss over the trained classes and N sampled other taxonomy nodes per "
        "step (0: every node; default auto: every node up to 4,096 nodes, else 2,048 sampled)",
    )
    g.add_argument(
        "--space",
        default=None,
        help="a mixed-curvature product head, e.g. poincare:8,sphere:4,euclidean:4 "
        "(with --loss circle, pairwise or ntxent)",
    )
    g.add_argument(
        "--curvature",
        type=_curvature,
        default=None,
        help="the model's curvature for label-free objectives (default: the labels'); "
        "'learn' or 'learn:C' trains it (from that default, or from C)",
    )
    g.add_argument(
        "--unsupervised",
        action="store_true",
        help="no labels: NT-Xent plus the log-ratio loss on a hierarchical clustering of the "
        "embeddings redone each epoch (Yan et al. 2021); writes OUT.clusters.tsv; --labels "
        "optional (without it the cluster tree becomes the model's taxonomy)",
    )
    g.add_argument(
        "--cluster-levels",
        type=_levels,
        default=None,
        help="cluster counts of the levels, coarsest first (default 4,16,64)",
    )


def overrides(args: argparse.Namespace) -> dict:
    """The TrainConfig fields these options set."""
    out = {n: getattr(args, n) for n in FIELDS if getattr(args, n, None) is not None}
    if args.curvature is not None:
        c, learn = args.curvature
        if c is not None:
            out["curvature"] = c
        if learn:
            out["learn_curvature"] = True
    if args.unsupervised:
        out["unsupervised"] = True
        if args.loss is None:
            out["loss"] = "ntxent"
    if args.cluster_levels is not None:
        out["cluster_levels"] = args.cluster_levels
    return out


def labels_for(args: argparse.Namespace, load):
    """The label embedding: ``load(--labels)``, or for ``--unsupervised`` without it the
    placeholder that the cluster tree replaces."""
    if args.labels is not None:
        return load(args.labels)
    if not args.unsupervised:
        raise CliError("--labels is required (except with --unsupervised)")
    from models.geometry.product import ProductSpace
    from models.training.clusters import placeholder_labels

    try:
        dim = args.dim or (ProductSpace.parse(args.space).dim if args.space else 10)
    except ValueError as e:
        raise CliError(f"--space {args.space}: {e}") from None
    return placeholder_labels(dim, (args.curvature or (None,))[0] or 1.0)


def after_save(model, out: Path) -> str | None:
    """Write ``OUT.clusters.tsv`` for an unsupervised model; its path, or None."""
    from models.training.clusters import write_cluster_tsv

    path = out.with_name(out.name + ".clusters.tsv")
    return str(path) if write_cluster_tsv(model, path) else None
