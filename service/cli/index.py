"""``hypsearch index build``: embed a data set split, a folder or a manifest into an index."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .argtypes import nonneg_int, positive_int
from .common import add_common, command, emit, need_model, subcommands
from .errors import CliError

_BUILD_HELP = "embed a data set split, a folder or a manifest into an index (resumable)"

_BUILD_DESCRIPTION = (
    "Embed pictures with the model (multi-worker loader, batched inference) and "
    "add them to the index folder OUT, creating it when missing. Every batch is durable "
    "before the next is read; running the command again skips the ids already indexed. "
    "Unreadable files are skipped and listed, not fatal."
)


def _model_and_plan(args: argparse.Namespace, *, ball_only: bool):
    """The model (``--model``, a checkpoint or ``pretrained:NAME``) and the plan of
    the sources (``--dataset``/``--split`` or ``--images``), first ``--limit``;
    bad input is a :class:`CliError`. Shared by ``index build`` and ``embed``."""
    import torch

    from models.images.datasets import read_class_map
    from models.vision.image_model import load_model

    from ..ingest.plans import plan_dataset, plan_path
    from ..ingest.roots import BuildInputError

    torch.set_num_threads(args.threads)
    need_model("--model", args.model)
    if args.images is None and args.dataset is None:
        raise CliError("give --dataset fashion-mnist (with --split) or --images DIR|MANIFEST.csv")
    if args.images is not None and not Path(args.images).exists():
        raise CliError(f"--images {args.images}: no such file or folder")
    pre = args.model.startswith("pretrained:") and args.wordnet_dir is not None
    model = load_model(args.model, wordnet_dir=args.wordnet_dir) if pre else load_model(args.model)
    if ball_only and getattr(model, "geometry", "poincare") not in ("poincare", "product"):
        raise CliError(
            f"--model {args.model}: a {model.geometry} model cannot fill a Poincaré index"
        )
    class_map = read_class_map(args.class_map) if args.class_map else None
    try:
        if args.images is not None:
            from models.taxonomy.graph import with_words
            from models.taxonomy.wordnet import WordResolver

            words = WordResolver(
                with_words(model.labels.taxonomy, args.wordnet_dir), args.wordnet_dir
            )
            plan = plan_path(args.images, taxonomy=words, class_map=class_map)
            where = args.images
        else:
            plan = plan_dataset(args.dataset, args.split, args.data_dir)
            where = f"{args.dataset} {args.split}"
    except BuildInputError as e:
        raise CliError(str(e)) from None
    if args.limit is not None:
        plan.sources = plan.sources[: args.limit]
    return model, plan, where


def _connect(address: str):
    """``ray`` connected to ``--ray ADDRESS``, or a :class:`CliError` (one line)."""
    from service.ray_serve import RayUnavailable, connect

    try:
        return connect(address)
    except RayUnavailable as e:
        raise CliError(str(e)) from None


def cmd_index_build(args: argparse.Namespace) -> int:
    from indexing import IndexInputError, IndexStoreError
    from indexing.batches import open_index
    from indexing.sharded import is_sharded

    from ..ingest.build import build_index

    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise CliError(f"--out {out}: exists and is not a folder")
    if args.shards is not None and args.ray is None:
        raise CliError("--shards: needs --ray ADDRESS (the shards live in Ray actors)")
    ray = _connect(args.ray) if args.ray is not None else None
    model, plan, where = _model_and_plan(args, ball_only=True)
    product = getattr(model, "geometry", "poincare") == "product"
    if product and any(s.label is None for s in plan.sources):
        raise CliError(
            f"--model {args.model}: a product-space model has no label points to predict "
            "labels with; give labelled sources (a dataset, class folders or a class map)"
        )
    space = {"space": model.head_cfg.space} if product else {}
    try:
        if ray is not None and (args.shards is not None or is_sharded(out)):
            from indexing.sharded import ShardedIndex

            if space:
                raise CliError("--ray: a product-space model cannot be sharded yet")
            index = ShardedIndex(
                out, args.shards, dim=model.dim, curvature=model.curvature, ray=True
            )
        else:
            index = open_index(out, dim=model.dim, curvature=model.curvature, **space)
    except (IndexStoreError, IndexInputError) as e:
        raise CliError(f"--out {out}: {e}") from None
    if product and index.space != model.space.spec:
        index.close()
        raise CliError(
            f"--out {out}: holds an index of space {index.space}, not {model.space.spec}"
        )
    if index.dim != model.dim or abs(index.curvature - model.curvature) > 1e-12:
        index.close()
        raise CliError(
            f"--out {out}: holds an index of dimension {index.dim} and curvature "
            f"{index.curvature:g}; the model embeds into dimension {model.dim}, "
            f"curvature {model.curvature:g}"
        )
    try:
        if ray is not None:
            from ..ingest.ray_build import ray_build_index

            report = ray_build_index(
                args.model,
                model,
                index,
                plan,
                batch_size=args.batch_size,
                workers=max(1, args.workers),
                threads=args.threads,
                progress=not args.quiet,
            )
        else:
            report = build_index(
                model,
                index,
                plan,
                batch_size=args.batch_size,
                workers=args.workers,
                progress=not args.quiet,
                resume=True,
            )
        index.save()
        items = len(index)
    finally:
        index.close()
    result = report.as_dict() | {"out": str(out), "items": items, "model": model.version}

    def human(r: dict) -> str:
        lines = [
            f"indexed {r['indexed']} of {r['total']} images from {where} in {r['seconds']:.1f} s "
            f"({r['images_per_second']:.0f} images/s); {out} holds {r['items']} items"
        ]
        if r["skipped"]:
            lines.append(
                "skipped: " + ", ".join(f"{n} {why}" for why, n in sorted(r["skipped"].items()))
            )
            unread = [e for e in r["skipped_examples"] if e["reason"] != "already indexed"]
            for e in unread[:20]:
                lines.append(f"  {e['source']}: {e['reason']}")
            if len(unread) > 20:
                lines.append(f"  ... ({len(unread) - 20} more listed with --json)")
        return "\n".join(lines)

    return emit(args, result, human)


_EMBED_HELP = "embed a data set split, a folder or a manifest into a .npy file"

_EMBED_DESCRIPTION = (
    "Embed pictures with the model into OUT.npy, an (n, D) float64 array in the "
    "sources' order (a data set's row order, a folder's or manifest's listing order), "
    "and OUT.json beside it: {geometry, curvature, space, ids, model, skipped}. "
    "Unreadable files are skipped (listed in the sidecar), not fatal. Works for "
    "either geometry (the Euclidean twin too), so two models can be compared on "
    "the same images."
)


def cmd_embed(args: argparse.Namespace) -> int:
    import io
    import json

    import numpy as np
    from tqdm import tqdm

    from indexing.batches import BuildReport
    from models.fileio import atomic_write_bytes

    from ..ingest.build import embed_plan

    out = Path(args.out)
    if out.suffix != ".npy":
        raise CliError(f"--out {out}: must end in .npy (the sidecar goes to {out.stem}.json)")
    if out.exists() and out.is_dir():
        raise CliError(f"--out {out}: is a folder")
    if not out.parent.is_dir():
        raise CliError(f"--out {out}: no such folder {out.parent}")
    model, plan, where = _model_and_plan(args, ball_only=False)
    report = BuildReport(plan.name)
    ids: list[str] = []
    parts: list[np.ndarray] = []
    bar = tqdm(
        total=len(plan.sources), desc="embed", unit="img", disable=args.quiet, file=sys.stderr
    )
    try:
        for batch in embed_plan(
            model,
            plan,
            batch_size=args.batch_size,
            workers=args.workers,
            report=report,
            on_progress=bar.update,
        ):
            ids.extend(batch.ids)
            parts.append(np.asarray(batch.vectors, dtype=np.float64))
    finally:
        bar.close()
    z = np.concatenate(parts) if parts else np.zeros((0, model.dim), dtype=np.float64)
    geometry = getattr(model, "geometry", "poincare")
    c = float(model.curvature)
    space = f"poincare:{model.dim}@{c:g}" if geometry == "poincare" else f"euclidean:{model.dim}"
    buf = io.BytesIO()
    np.save(buf, z)
    sidecar = {
        "geometry": geometry,
        "curvature": c,
        "space": space,
        "ids": ids,
        "model": model.version,
        "source": where,
        "skipped": report.as_dict()["skipped_examples"],
    }
    side = out.with_suffix(".json")
    atomic_write_bytes(out, buf.getvalue())
    atomic_write_bytes(side, (json.dumps(sidecar) + "\n").encode())
    result = {
        "out": str(out),
        "sidecar": str(side),
        "n": len(ids),
        "dim": model.dim,
        "geometry": geometry,
        "space": space,
        "skipped": len(sidecar["skipped"]),
    }
    return emit(
        args,
        result,
        lambda r: (
            f"embedded {r['n']} images from {where} into {r['out']} ({r['space']}); "
            f"ids in {r['sidecar']}"
        ),
    )


def _source_arguments(b) -> None:
    from models.images.datasets import DEFAULT_FASHION_MNIST_DIR
    from models.taxonomy.wordnet import DEFAULT_WORDNET_DIR

    b.add_argument("--model", required=True, help="image model checkpoint or pretrained:NAME")
    src = b.add_mutually_exclusive_group()
    src.add_argument("--dataset", choices=["fashion-mnist"], help="a built-in data set")
    src.add_argument(
        "--images", help="a folder DIR/<class>/<images> or a CSV manifest id,path[,label]"
    )
    b.add_argument("--split", default="test", choices=["train", "test"])
    b.add_argument("--data-dir", default=DEFAULT_FASHION_MNIST_DIR)
    b.add_argument("--class-map", help="class<TAB>taxonomy node per line (for --images)")
    b.add_argument(
        "--wordnet-dir", default=DEFAULT_WORDNET_DIR, help="WordNet words for class names (sneaker)"
    )
    b.add_argument("--batch-size", type=positive_int, default=256)
    b.add_argument("--workers", type=nonneg_int, default=2, help="data loader worker processes")
    b.add_argument("--limit", type=positive_int, default=None, help="only the first N pictures")
    b.add_argument("--threads", type=positive_int, default=2, help="torch threads")


def add_commands(sub) -> None:
    """Add ``index build`` and ``embed`` to the ``hypsearch`` subparsers."""
    ix = subcommands(sub, "index", "build indexes", "index_command")
    b = command(ix, "build", cmd_index_build, _BUILD_HELP, _BUILD_DESCRIPTION)
    _source_arguments(b)
    b.add_argument("--out", required=True, help="index folder")
    b.add_argument(
        "--ray",
        metavar="ADDRESS",
        help="embed on the Ray cluster at ADDRESS (auto, HOST:PORT, or local); "
        "--workers actors, one model each",
    )
    b.add_argument(
        "--shards", type=positive_int, help="with --ray: a sharded index of N shards (Ray actors)"
    )
    add_common(b)
    e = command(sub, "embed", cmd_embed, _EMBED_HELP, _EMBED_DESCRIPTION)
    _source_arguments(e)
    e.add_argument("--out", required=True, help="FILE.npy (FILE.json is written beside it)")
    add_common(e)
