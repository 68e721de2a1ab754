"""``hypsearch taxonomy wordnet`` and ``hypsearch labels train|eval|export``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .argtypes import nonneg_float, nonneg_int, positive_float, positive_int
from .common import add_common, command, emit, given, need_path, subcommands
from .errors import CliError

_WORDNET_HELP = "write the transitive closure of the WordNet noun hierarchy"

_WORDNET_DESCRIPTION = (
    "Write the transitive closure of the WordNet noun hypernym graph "
    "(instance hypernyms included) as a child<TAB>ancestor TSV."
)

_LABELS_TRAIN_HELP = "train label embeddings of a taxonomy in the Poincaré ball"

_LABELS_TRAIN_DESCRIPTION = (
    "Train Poincaré embeddings of a taxonomy (Nickel and Kiela 2017) from a "
    "hierarchical start, optionally with an entailment-cone stage (Ganea et al. 2018). "
    "Progress is saved to OUT.partial after every epoch; running the same command again "
    "resumes from there."
)

_LABELS_EVAL_HELP = "reconstruction mean rank / MAP and cone containment F1"

_LABELS_EVAL_DESCRIPTION = (
    "Reconstruction as in Nickel and Kiela 2017: each closure edge (u, v) is "
    "ranked among the distances from u to all nodes that are neither u nor its ancestors. "
    "Also cone containment precision/recall/F1 of the closure pairs."
)

_LABELS_EXPORT_HELP = "write label vectors as TSV (Poincaré-ball coordinates)"


def load_taxonomy(path: str):
    from models.taxonomy.graph import Taxonomy

    need_path("--taxonomy", path)
    return Taxonomy.from_tsv(path)


def cmd_taxonomy_wordnet(args: argparse.Namespace) -> int:
    from models.taxonomy.graph import Taxonomy

    tax = Taxonomy.from_wordnet(args.wordnet_dir, root=args.root)
    tax.to_tsv(args.out, closure=True)
    result = {
        "out": str(args.out),
        "root": args.root,
        "nodes": len(tax),
        "edges": int(len(tax.closure_edges())),
    }
    return emit(
        args,
        result,
        lambda r: f"wrote {r['edges']} closure edges over {r['nodes']} nodes to {r['out']}",
    )


#: ``labels train`` options that are LabelTrainConfig fields of the same name
_LABEL_TRAIN_FIELDS = (
    "dim",
    "curvature",
    "epochs",
    "seed",
    "lr",
    "negatives",
    "batch_size",
    "cone_epochs",
    "cone_weight",
    "leaf_spread",
    "init",
    "cap_outward",
)


_TRAINED = (
    "trained {nodes} labels ({edges} closure edges), dim {dim}, curvature {curvature:g}, "
    "{epochs} epochs in {train_seconds:.1f} s (loss {loss:.4f}); wrote {out}"
)


_BUILT = (
    "built {nodes} labels ({edges} closure edges) by the cap construction, dim {dim}, "
    "curvature {curvature:g}, in {train_seconds:.1f} s; wrote {out}"
)


def cmd_labels_train(args: argparse.Namespace) -> int:
    from models.labels import LabelEmbedding, LabelTrainConfig, train_labels

    tax = load_taxonomy(args.taxonomy)
    # an option not given (epochs, lr) keeps the config's default
    cfg = LabelTrainConfig(cone_K=args.cone_k, **given(args, *_LABEL_TRAIN_FIELDS))
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
    emb = train_labels(tax, cfg, progress=not args.quiet, checkpoint_path=partial, resume=resume)
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

    return emit(
        args,
        result,
        lambda r: _TRAINED.format_map(r) if r["loss"] is not None else _BUILT.format_map(r),
    )


def cmd_labels_eval(args: argparse.Namespace) -> int:
    from models.labels import (
        LabelEmbedding,
        evaluate_cone_protocol,
        evaluate_cones,
        evaluate_reconstruction,
    )

    emb = LabelEmbedding.load(args.labels)
    tax = load_taxonomy(args.taxonomy) if args.taxonomy else emb.taxonomy
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

    def human(r: dict) -> str:
        return " ".join(
            f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items()
        )

    return emit(args, result, human)


def cmd_labels_export(args: argparse.Namespace) -> int:
    from models.labels import LabelEmbedding

    emb = LabelEmbedding.load(args.labels)
    emb.export_tsv(args.out)
    result = {"out": str(args.out), "nodes": len(emb.taxonomy), "dim": emb.dim}
    return emit(
        args, result, lambda r: f"wrote {r['nodes']} label vectors (dim {r['dim']}) to {r['out']}"
    )


def add_commands(sub) -> None:
    """Add ``taxonomy`` and ``labels`` to the ``hypsearch`` subparsers."""
    from models.taxonomy.graph import DEFAULT_WORDNET_DIR

    tx = subcommands(sub, "taxonomy", "build taxonomy files", "taxonomy_command")
    wn = command(tx, "wordnet", cmd_taxonomy_wordnet, _WORDNET_HELP, _WORDNET_DESCRIPTION)
    wn.add_argument(
        "--root", help="only the descendants of this synset (and itself), e.g. mammal.n.01"
    )
    wn.add_argument(
        "--wordnet-dir", default=DEFAULT_WORDNET_DIR, help="WordNet 3.0 database folder"
    )
    wn.add_argument("--out", required=True, help="TSV file to write")
    add_common(wn)

    lb = subcommands(sub, "labels", "label-hierarchy embeddings", "labels_command")
    tr = command(lb, "train", cmd_labels_train, _LABELS_TRAIN_HELP, _LABELS_TRAIN_DESCRIPTION)
    tr.add_argument(
        "--taxonomy", required=True, help="TSV edge list (child<TAB>parent; closure or direct)"
    )
    tr.add_argument("--out", required=True, help="label checkpoint to write")
    tr.add_argument("--dim", type=positive_int, default=10)
    tr.add_argument("--curvature", type=positive_float, default=1.0)
    tr.add_argument(
        "--epochs", type=nonneg_int, default=None, help="default: chosen from the taxonomy size"
    )
    tr.add_argument("--seed", type=int, default=0)
    tr.add_argument(
        "--lr", type=positive_float, default=None, help="Riemannian SGD learning rate (0.1)"
    )
    tr.add_argument("--negatives", type=positive_int, default=50)
    tr.add_argument("--batch-size", type=positive_int, default=1024)
    tr.add_argument(
        "--cone-epochs", type=nonneg_int, default=0, help="epochs of the entailment-cone stage"
    )
    tr.add_argument(
        "--cone-weight", type=nonneg_float, default=0.0, help="cone loss added to each step"
    )
    tr.add_argument("--cone-k", type=positive_float, default=0.1, help="cone aperture constant K")
    tr.add_argument(
        "--outward",
        dest="cap_outward",
        type=nonneg_float,
        default=None,
        help="cap init: widen the subtrees that hold a second parent's ancestor, move the "
        "others outward by up to this radius (0: off, the default; 20 on the WordNet nouns)",
    )
    tr.add_argument(
        "--init",
        choices=["cap", "hierarchical", "random"],
        default="cap",
        help="cap: nested cones by construction; else the start of N&K training",
    )
    tr.add_argument(
        "--leaf-spread",
        type=nonneg_float,
        default=0.0,
        help="weight of leaf spreading (Long et al. 2020)",
    )
    tr.add_argument("--restart", action="store_true", help="ignore an unfinished OUT.partial")
    add_common(tr)

    ev = command(lb, "eval", cmd_labels_eval, _LABELS_EVAL_HELP, _LABELS_EVAL_DESCRIPTION)
    ev.add_argument("labels", help="label checkpoint")
    ev.add_argument(
        "--taxonomy", help="TSV taxonomy to evaluate against (default: the checkpoint's own)"
    )
    ev.add_argument(
        "--sample", type=positive_int, default=None, help="evaluate only this many random nodes"
    )
    ev.add_argument("--no-cones", action="store_true", help="skip the cone containment metrics")
    add_common(ev)

    ex = command(lb, "export", cmd_labels_export, _LABELS_EXPORT_HELP)
    ex.add_argument("labels", help="label checkpoint")
    ex.add_argument("--out", required=True, help="TSV file to write")
    add_common(ex)
