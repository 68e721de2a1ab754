"""The ``hypsearch`` command: it parses arguments and calls into models, indexing and service.

Bad input exits 2 with one line on stderr that names the input and what is
wrong; long work shows a progress bar on stderr; ``--json`` prints one JSON
object on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

EXIT_USAGE = 2


class CliError(Exception):
    """A user error: printed as one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (the usage is one ``--help`` away)."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _home() -> Path:
    return Path(os.environ.get("HYPSEARCH_HOME", "var")).resolve()


def _emit(args: argparse.Namespace, result: dict, human: Callable[[dict], str]) -> None:
    if getattr(args, "json", False):
        print(json.dumps(result, sort_keys=True))
    else:
        print(human(result))


def _number(kind: type, *, positive: bool) -> Callable[[str], int | float]:
    """An argparse type: an int or a finite float, > 0 (``positive``) or >= 0."""
    noun = "an integer" if kind is int else "a number"

    def parse(text: str):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {noun}") from None
        if kind is int:
            ok, need = (v >= 1, "must be at least 1") if positive else (v >= 0, "must be at least 0")
        else:
            finite = v != float("inf")
            ok = (v > 0 if positive else v >= 0) and finite
            need = "must be a positive number" if positive else "must be a non-negative number"
        if not ok:
            raise argparse.ArgumentTypeError(f"{text!r} {need}")
        return v

    return parse


_positive_int = _number(int, positive=True)
_nonneg_int = _number(int, positive=False)
_positive_float = _number(float, positive=True)
_nonneg_float = _number(float, positive=False)


def _load_taxonomy(path: str):
    from models.taxonomy import Taxonomy

    if not Path(path).exists():
        raise CliError(f"--taxonomy {path}: no such file")
    return Taxonomy.from_tsv(path)


# ---------------------------------------------------------------- taxonomy


def cmd_taxonomy_wordnet(args: argparse.Namespace) -> int:
    from models.taxonomy import Taxonomy

    tax = Taxonomy.from_wordnet(args.wordnet_dir, root=args.root)
    tax.to_tsv(args.out, closure=True)
    result = {
        "out": str(args.out),
        "root": args.root,
        "nodes": len(tax),
        "edges": int(len(tax.closure_edges())),
    }
    _emit(args, result, lambda r: f"wrote {r['edges']} closure edges over {r['nodes']} nodes to {r['out']}")
    return 0


# ---------------------------------------------------------------- labels


def cmd_labels_train(args: argparse.Namespace) -> int:
    from models.labels import LabelEmbedding, LabelTrainConfig, train_labels

    tax = _load_taxonomy(args.taxonomy)
    cfg = LabelTrainConfig(
        dim=args.dim,
        curvature=args.curvature,
        epochs=args.epochs,
        seed=args.seed,
        lr=args.lr if args.lr is not None else LabelTrainConfig.lr,
        negatives=args.negatives,
        batch_size=args.batch_size,
        cone_epochs=args.cone_epochs,
        cone_weight=args.cone_weight,
        cone_K=args.cone_k,
        leaf_spread=args.leaf_spread,
        init=args.init,
    )
    try:
        cfg.validate()
    except ValueError as e:
        raise CliError(str(e)) from None
    out = Path(args.out)
    partial = out.with_name(out.name + ".partial")
    resume = None
    if partial.exists() and not args.restart:
        resume = LabelEmbedding.load(partial)
        if resume.taxonomy != tax:
            raise CliError(f"{partial}: unfinished run of another taxonomy (use --restart)")
        print(f"resuming {partial} from epoch {resume.epoch}", file=sys.stderr)
    emb = train_labels(
        tax, cfg, progress=not args.quiet, checkpoint_path=partial, resume=resume
    )
    emb.save(out)
    partial.unlink(missing_ok=True)
    result = {
        "out": str(out),
        "nodes": len(tax),
        "edges": int(len(tax.closure_edges())),
        "dim": emb.dim,
        "curvature": emb.curvature,
        "epochs": emb.epoch,
        "loss": emb.metrics.get("loss"),
        "train_seconds": emb.metrics.get("train_seconds"),
        "version": emb.version,
    }
    _emit(
        args,
        result,
        lambda r: (
            f"trained {r['nodes']} labels ({r['edges']} closure edges), dim {r['dim']}, "
            f"curvature {r['curvature']:g}, {r['epochs']} epochs in {r['train_seconds']:.1f} s "
            f"(loss {r['loss'] or 0:.4f}); wrote {r['out']}"
        ),
    )
    return 0


def cmd_labels_eval(args: argparse.Namespace) -> int:
    from models.labels import LabelEmbedding, evaluate_cones, evaluate_reconstruction
    from models.labels import evaluate_cone_protocol

    emb = LabelEmbedding.load(args.labels)
    tax = _load_taxonomy(args.taxonomy) if args.taxonomy else emb.taxonomy
    missing = [n for n in tax.names if n not in emb.taxonomy]
    if missing:
        raise CliError(
            f"--taxonomy {args.taxonomy}: {len(missing)} nodes have no embedding in "
            f"{args.labels} (e.g. {missing[0]})"
        )
    result = evaluate_reconstruction(emb, tax, sample=args.sample, progress=not args.quiet)
    if not args.no_cones:
        result |= evaluate_cones(emb, tax, progress=not args.quiet)
        result |= evaluate_cone_protocol(emb, tax)
    _emit(
        args,
        result,
        lambda r: " ".join(
            f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items()
        ),
    )
    return 0


def cmd_labels_export(args: argparse.Namespace) -> int:
    from models.labels import LabelEmbedding

    emb = LabelEmbedding.load(args.labels)
    emb.export_tsv(args.out)
    result = {"out": str(args.out), "nodes": len(emb.taxonomy), "dim": emb.dim}
    _emit(args, result, lambda r: f"wrote {r['nodes']} label vectors (dim {r['dim']}) to {r['out']}")
    return 0


# ---------------------------------------------------------------- hyperbolicity


def _read_vectors(path: str):
    import numpy as np

    p = Path(path)
    if not p.exists():
        raise CliError(f"--vectors {path}: no such file")
    try:
        if p.suffix == ".npy":
            x = np.load(p, allow_pickle=False)
        else:
            x = np.loadtxt(p, comments="#", delimiter=None, ndmin=2)
    except ValueError as e:
        raise CliError(f"--vectors {path}: not a numeric matrix ({e})") from None
    if x.ndim != 2 or x.shape[0] < 4:
        raise CliError(f"--vectors {path}: need a 2-d matrix with at least 4 rows, got shape {x.shape}")
    if not np.isfinite(x).all():
        raise CliError(f"--vectors {path}: contains NaN or infinite values")
    return x.astype(np.float64)


def cmd_hyperbolicity(args: argparse.Namespace) -> int:
    import numpy as np

    from models.geometry.delta import delta_hyperbolicity

    if args.vectors:
        x = _read_vectors(args.vectors)
        source = args.vectors
    else:
        from models.data import load_fashion_mnist

        data = load_fashion_mnist(args.split, args.data_dir)
        x = data.images.reshape(len(data.images), -1).astype(np.float64) / 255.0
        source = f"{args.dataset}:{args.split} (pixels)"
    result = delta_hyperbolicity(x, n_samples=args.samples, seed=args.seed, metric=args.metric)
    result = {k: float(v) for k, v in result.items()} | {"source": source, "points": int(len(x))}
    _emit(
        args,
        result,
        lambda r: (
            f"{r['source']}: delta={r['delta']:.4f} diameter={r['diameter']:.4f} "
            f"delta_rel={r['delta_rel']:.4f} suggested curvature c={r['suggested_curvature']:.4f}"
        ),
    )
    return 0


# ---------------------------------------------------------------- train / eval (images)


def _load_labels(path: str):
    from models.labels import LabelEmbedding

    if not Path(path).exists():
        raise CliError(f"--labels {path}: no such file")
    return LabelEmbedding.load(path)


def _holdout_list(text: str | None) -> list[str]:
    if not text:
        return []
    names = [h.strip() for h in text.split(",") if h.strip()]
    if not names:
        raise CliError(f"--holdout {text!r}: no class names")
    return names


def cmd_train(args: argparse.Namespace) -> int:
    import torch

    from models.data import DataError, read_class_map
    from models.train import TrainConfig, TrainError, train

    if args.images is None and args.dataset is None:
        raise CliError("give --dataset fashion-mnist or --images DIR|MANIFEST.csv")
    labels = _load_labels(args.labels)
    class_map = read_class_map(args.class_map) if args.class_map else None
    cfg = TrainConfig(
        dataset=args.dataset if args.images is None else None,
        data_dir=args.data_dir,
        images=args.images,
        class_map=class_map,
        holdout=_holdout_list(args.holdout),
        limit=args.limit,
        encoder=args.encoder,
        backbone=args.backbone,
        geometry=args.geometry,
        dim=args.dim,
        mobius=args.mobius,
        loss=args.loss,
        seed=args.seed,
    )
    if args.epochs is not None:
        cfg.epochs = args.epochs
    if args.batch_size is not None:
        cfg.batch_size = args.batch_size
    if args.lr is not None:
        cfg.lr = args.lr
    if args.input_size is not None:
        cfg.input_size = args.input_size
    if args.time_budget is not None:
        cfg.time_budget = args.time_budget or None
    if args.threads is not None:
        cfg.threads = args.threads
    for name in ("negatives", "pull", "tau"):
        if getattr(args, name) is not None:
            setattr(cfg, name, getattr(args, name))
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
    _emit(
        args,
        result,
        lambda r: (
            f"trained {r['encoder']} ({r['geometry']}, dim {r['dim']}) on {r['train_images']} images, "
            f"{r['epochs']} epochs in {r['train_seconds']:.0f} s (loss {r['loss']:.4f}, validation "
            f"{r['val_acc'] if r['val_acc'] is not None else float('nan'):.4f}); wrote {r['out']}"
        ),
    )
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    import torch

    from models.data import load_dataset, read_class_map
    from models.evaluate import evaluate_model
    from models.image_model import ImageModel

    torch.set_num_threads(args.threads)
    if not Path(args.model).exists():
        raise CliError(f"--model {args.model}: no such file")
    model = ImageModel.load(args.model)
    class_map = read_class_map(args.class_map) if args.class_map else None
    if args.images is None and args.dataset is None:
        raise CliError("give --dataset fashion-mnist or --images DIR|MANIFEST.csv")
    data = load_dataset(
        args.dataset if args.images is None else None,
        split=args.split,
        data_dir=args.data_dir,
        images=args.images,
        class_map=class_map,
        taxonomy=model.labels.taxonomy,
    )
    if args.limit is not None and args.limit < len(data.ids):
        from models.data import ImageSet, split_indices

        keep, _ = split_indices(data.targets, 1 - args.limit / len(data.ids), 0)
        imgs = data.images[keep] if hasattr(data.images, "shape") else [data.images[i] for i in keep]
        data = ImageSet(imgs, data.targets[keep], data.classes, [data.ids[i] for i in keep])
    missing = [n for _, n in data.classes if n not in model.labels.taxonomy]
    if missing:
        raise CliError(f"class {missing[0]!r} of the data is not in the model's taxonomy")
    if (data.targets >= 0).sum() < 2:
        raise CliError("need at least 2 labelled images to evaluate")
    result = evaluate_model(model, data, ood=not args.no_ood, delta=not args.no_delta, progress=not args.quiet)
    result |= {"model": str(args.model), "version": model.version, "split": args.split}

    def human(r: dict) -> str:
        parts = [f"recall@{k}={r[f'recall@{k}']:.4f}" for k in (1, 5, 10)]
        parts.append(f"map@r={r['map@r']:.4f}")
        parts += [f"hop{h}_map@50={v:.4f}" for h, v in r["hop_map@50"].items()]
        parts += [f"hier_hit@1={r['hier_hit@1']:.4f}", f"nearest_label_acc={r['nearest_label_acc']:.4f}"]
        if "zero_shot" in r:
            parts.append(f"zero_shot_hier_hit@1={r['zero_shot']['hier_hit@1']:.4f}")
        if "auroc_radius" in r.get("ood", {}):
            parts.append(f"ood_auroc_radius={r['ood']['auroc_radius']:.4f}")
        return " ".join(parts)

    _emit(args, result, human)
    return 0


# ---------------------------------------------------------------- demo


def cmd_demo(args: argparse.Namespace) -> int:
    """Default artifacts under $HYPSEARCH_HOME (built once, then reused), then serve."""
    from service.commands import cmd_demo as run_demo

    return run_demo(args)


# ---------------------------------------------------------------- parser


def build_parser() -> argparse.ArgumentParser:
    from models.data import DEFAULT_FASHION_MNIST_DIR
    from models.taxonomy import DEFAULT_WORDNET_DIR

    p = _Parser(
        prog="hypsearch",
        description="Hierarchical image retrieval in hyperbolic space.",
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True, parser_class=_Parser)

    def common(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--json", action="store_true", help="print one JSON object on stdout")
        sp.add_argument("--quiet", action="store_true", help="no progress bars")

    # taxonomy
    tx = sub.add_parser("taxonomy", help="build taxonomy files").add_subparsers(
        dest="taxonomy_command", metavar="SUBCOMMAND", required=True, parser_class=_Parser
    )
    wn = tx.add_parser(
        "wordnet",
        help="write the transitive closure of the WordNet noun hierarchy",
        description="Write the transitive closure of the WordNet noun hypernym graph "
        "(instance hypernyms included) as a child<TAB>ancestor TSV.",
    )
    wn.add_argument("--root", help="only the descendants of this synset (and itself), e.g. mammal.n.01")
    wn.add_argument("--wordnet-dir", default=DEFAULT_WORDNET_DIR, help="WordNet 3.0 database folder")
    wn.add_argument("--out", required=True, help="TSV file to write")
    common(wn)
    wn.set_defaults(func=cmd_taxonomy_wordnet)

    # labels
    lb = sub.add_parser("labels", help="label-hierarchy embeddings").add_subparsers(
        dest="labels_command", metavar="SUBCOMMAND", required=True, parser_class=_Parser
    )
    tr = lb.add_parser(
        "train",
        help="train label embeddings of a taxonomy in the Poincaré ball",
        description="Train Poincaré embeddings of a taxonomy (Nickel and Kiela 2017) from a "
        "hierarchical start, optionally with an entailment-cone stage (Ganea et al. 2018). "
        "Progress is saved to OUT.partial after every epoch; running the same command again "
        "resumes from there.",
    )
    tr.add_argument("--taxonomy", required=True, help="TSV edge list (child<TAB>parent; closure or direct)")
    tr.add_argument("--out", required=True, help="label checkpoint to write")
    tr.add_argument("--dim", type=_positive_int, default=10)
    tr.add_argument("--curvature", type=_positive_float, default=1.0)
    tr.add_argument("--epochs", type=_nonneg_int, default=None, help="default: chosen from the taxonomy size")
    tr.add_argument("--seed", type=int, default=0)
    tr.add_argument("--lr", type=_positive_float, default=None, help="Riemannian SGD learning rate (0.1)")
    tr.add_argument("--negatives", type=_positive_int, default=50)
    tr.add_argument("--batch-size", type=_positive_int, default=1024)
    tr.add_argument("--cone-epochs", type=_nonneg_int, default=0, help="epochs of the entailment-cone stage")
    tr.add_argument("--cone-weight", type=_nonneg_float, default=0.0, help="cone loss added to each step")
    tr.add_argument("--cone-k", type=_positive_float, default=0.1, help="cone aperture constant K")
    tr.add_argument("--init", choices=["cap", "hierarchical", "random"], default="cap",
                    help="cap: nested cones by construction; else the start of N&K training")
    tr.add_argument("--leaf-spread", type=_nonneg_float, default=0.0, help="weight of leaf spreading (Long et al. 2020)")
    tr.add_argument("--restart", action="store_true", help="ignore an unfinished OUT.partial")
    common(tr)
    tr.set_defaults(func=cmd_labels_train)

    ev = lb.add_parser(
        "eval",
        help="reconstruction mean rank / MAP and cone containment F1",
        description="Reconstruction as in Nickel and Kiela 2017: each closure edge (u, v) is "
        "ranked among the distances from u to all nodes that are neither u nor its ancestors. "
        "Also cone containment precision/recall/F1 of the closure pairs.",
    )
    ev.add_argument("labels", help="label checkpoint")
    ev.add_argument("--taxonomy", help="TSV taxonomy to evaluate against (default: the checkpoint's own)")
    ev.add_argument("--sample", type=_positive_int, default=None, help="evaluate only this many random nodes")
    ev.add_argument("--no-cones", action="store_true", help="skip the cone containment metrics")
    common(ev)
    ev.set_defaults(func=cmd_labels_eval)

    ex = lb.add_parser("export", help="write label vectors as TSV (Poincaré-ball coordinates)")
    ex.add_argument("labels", help="label checkpoint")
    ex.add_argument("--out", required=True, help="TSV file to write")
    common(ex)
    ex.set_defaults(func=cmd_labels_export)

    # hyperbolicity
    hy = sub.add_parser(
        "hyperbolicity",
        help="Gromov delta-hyperbolicity of vectors or a dataset, and the curvature it suggests",
        description="delta, delta_rel = 2 delta / diameter and c = (0.144 / delta_rel)^2 "
        "(Khrulkov et al. 2020) of a sample of points.",
    )
    src = hy.add_mutually_exclusive_group(required=True)
    src.add_argument("--vectors", help=".npy file or whitespace-separated text matrix (one vector a row)")
    src.add_argument("--dataset", choices=["fashion-mnist"], help="a built-in dataset (raw pixels)")
    hy.add_argument("--split", default="test", choices=["train", "test"])
    hy.add_argument("--data-dir", default=DEFAULT_FASHION_MNIST_DIR)
    hy.add_argument("--metric", default="euclidean", choices=["euclidean", "poincare"])
    hy.add_argument("--samples", type=_positive_int, default=1500)
    hy.add_argument("--seed", type=int, default=0)
    common(hy)
    hy.set_defaults(func=cmd_hyperbolicity)

    # train (images)
    tn = sub.add_parser(
        "train",
        help="train the image encoder against label embeddings",
        description="Train an image encoder whose embeddings are points of the Poincare ball next to "
        "the label embeddings of their classes. Progress is saved to OUT.partial after every epoch; "
        "running the same command again resumes from there.",
    )
    tsrc = tn.add_mutually_exclusive_group()
    tsrc.add_argument("--dataset", choices=["fashion-mnist"], help="a built-in dataset (train split)")
    tsrc.add_argument("--images", help="a folder DIR/<class>/<images> or a CSV manifest id,path[,label]")
    tn.add_argument("--labels", required=True, help="label checkpoint (hypsearch labels train)")
    tn.add_argument("--out", required=True, help="model checkpoint to write")
    tn.add_argument("--data-dir", default=DEFAULT_FASHION_MNIST_DIR)
    tn.add_argument("--class-map", help="class<TAB>taxonomy node per line (for --images)")
    tn.add_argument("--dim", type=_positive_int, default=None, help="embedding dimension (default: the labels')")
    tn.add_argument("--epochs", type=_nonneg_int, default=None, help="default 12")
    tn.add_argument("--holdout", help="classes (synset names) kept out of training, comma separated")
    tn.add_argument("--loss", default="prototype", choices=["prototype", "margin", "pairwise", "circle", "ntxent"])
    tn.add_argument("--geometry", default="poincare", choices=["poincare", "euclidean"])
    tn.add_argument("--negatives", choices=["classes", "taxonomy"], default=None,
                    help="prototype losses: softmax over the trained classes or over every taxonomy node")
    tn.add_argument("--pull", type=_nonneg_float, default=None, help="weight of the distance to the class prototype")
    tn.add_argument("--tau", type=_positive_float, default=None, help="temperature of the logits -d/tau")
    tn.add_argument("--encoder", default="conv4", choices=["conv4", "resnet18"])
    tn.add_argument("--backbone", help="pretrained backbone state dict (.safetensors or .pt, weights only)")
    tn.add_argument("--mobius", action="store_true", help="add a Mobius linear layer to the head")
    tn.add_argument("--input-size", type=_positive_int, default=None, help="model input size in pixels")
    tn.add_argument("--batch-size", type=_positive_int, default=None)
    tn.add_argument("--lr", type=_positive_float, default=None)
    tn.add_argument("--limit", type=_positive_int, default=None, help="train on this many images only")
    tn.add_argument("--threads", type=_positive_int, default=None, help="torch threads (default 1)")
    tn.add_argument("--time-budget", type=_nonneg_float, default=None,
                    help="seconds (default 570; 0: none): after the first epoch, train only the "
                    "epochs that fit")
    tn.add_argument("--seed", type=int, default=0)
    tn.add_argument("--restart", action="store_true", help="ignore an unfinished OUT.partial")
    common(tn)
    tn.set_defaults(func=cmd_train)

    # eval (images)
    ev2 = sub.add_parser(
        "eval",
        help="retrieval, hierarchy, zero-shot and OOD metrics of an image model",
        description="Recall@1/5/10 and mAP@R (each image queried against the rest), hop mAP@50 at "
        "0/2/4 hops, hierarchical Hit@k, nearest-label accuracy, zero-shot metrics of held-out "
        "classes, AUROC of distance to the origin against an out-of-distribution set, and the "
        "delta-hyperbolicity of the encoder's features.",
    )
    esrc = ev2.add_mutually_exclusive_group()
    esrc.add_argument("--dataset", choices=["fashion-mnist"])
    esrc.add_argument("--images", help="a folder DIR/<class>/<images> or a CSV manifest id,path,label")
    ev2.add_argument("--model", required=True, help="model checkpoint")
    ev2.add_argument("--split", default="test", choices=["train", "test"])
    ev2.add_argument("--data-dir", default=DEFAULT_FASHION_MNIST_DIR)
    ev2.add_argument("--class-map", help="class<TAB>taxonomy node per line (for --images)")
    ev2.add_argument("--limit", type=_positive_int, default=None, help="evaluate on this many images only")
    ev2.add_argument("--no-ood", action="store_true", help="skip the out-of-distribution AUROC")
    ev2.add_argument("--no-delta", action="store_true", help="skip the delta-hyperbolicity of the features")
    ev2.add_argument("--threads", type=_positive_int, default=1, help="torch threads (default 1)")
    common(ev2)
    ev2.set_defaults(func=cmd_eval)

    # serve, index build (service/commands.py)
    from service.commands import add_demo_options, add_service_commands

    add_service_commands(sub, common)

    # demo
    dm = sub.add_parser(
        "demo",
        help="build the default artifacts under $HYPSEARCH_HOME (reused when present), then serve",
        description="Train the default label embeddings and image model, build the index of the "
        "Fashion-MNIST test split (each reused from $HYPSEARCH_HOME when present), then serve the "
        "web page and the API on http://HOST:PORT.",
    )
    dm.add_argument("--host", default="127.0.0.1")
    dm.add_argument("--port", type=_positive_int, default=8000)
    add_demo_options(dm)
    common(dm)
    dm.set_defaults(func=cmd_demo)
    return p


def _user_errors() -> tuple[type[BaseException], ...]:
    from models.checkpoint import CheckpointError
    from models.data import DataError
    from models.taxonomy import TaxonomyError

    return (CliError, TaxonomyError, CheckpointError, DataError)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    errors = _user_errors()
    try:
        return int(args.func(args) or 0)
    except errors as e:
        print(f"hypsearch: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("hypsearch: interrupted", file=sys.stderr)
        return 130
    except OSError as e:
        where = f"{e.filename}: " if getattr(e, "filename", None) else ""
        print(f"hypsearch: error: {where}{e.strerror or e}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
