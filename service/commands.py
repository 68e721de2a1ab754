"""The service's subcommands of ``hypsearch``: ``serve``, ``index build``, ``demo``.

:mod:`service.cli` owns the parser; :func:`add_service_commands` adds these
subcommands to it. Bad input raises :class:`service.cli.CliError` (exit 2,
one line on stderr).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def _cli():
    """The running ``service.cli`` module: under ``python -m service.cli`` that is
    ``__main__`` (whose ``CliError`` its ``main`` catches), not a second import."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name == "service.cli":
        return main
    from . import cli

    return cli


# ---------------------------------------------------------------- serve


def serve(settings, *, runtime=None, announce: str | None = None) -> int:
    """Run uvicorn on ``settings.host:port`` until interrupted; 2 when loading fails."""
    import uvicorn

    from .app import create_app

    _check_port(settings.host, settings.port)
    app = create_app(settings, runtime=runtime, owns_runtime=True)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level="warning",
        access_log=False,  # the service writes its own access log (with request ids)
        lifespan="on",
        timeout_graceful_shutdown=10,
    )
    server = uvicorn.Server(config)
    services = app.state.services

    def failed(_message: str) -> None:
        server.should_exit = True

    services.extra["on_load_error"] = failed
    if announce:
        services.extra["announce"] = announce
    try:
        server.run()
    except SystemExit:  # uvicorn exits this way when it cannot start
        pass
    loader = services.extra.get("loader")
    if loader is not None:  # never leave the interpreter while torch is loading
        loader.join(60)
    if services.load_error:
        raise _cli().CliError(services.load_error)
    if not server.started:
        raise _cli().CliError(f"could not listen on {settings.host}:{settings.port}")
    return 0


def _check_port(host: str, port: int) -> None:
    """Refuse a port already in use before anything starts (exit 2, one line)."""
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            msg = f"--port {port}: cannot listen on {host} ({e.strerror})"
            raise _cli().CliError(msg) from None


def cmd_serve(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from .settings import get_settings

    CliError = _cli().CliError
    if args.model is not None and not Path(args.model).is_file():
        raise CliError(f"--model {args.model}: no such file")
    if args.labels is not None and not Path(args.labels).is_file():
        raise CliError(f"--labels {args.labels}: no such file")
    if args.index is not None:
        p = Path(args.index)
        if p.exists() and not p.is_dir():
            raise CliError(f"--index {args.index}: not a folder")
    try:
        settings = get_settings(
            model=args.model,
            labels=args.labels,
            index=args.index,
            host=args.host,
            port=args.port,
            data_roots=args.data_roots,
            torch_threads=args.threads,
            log_level=args.log_level,
        )
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(p) for p in err.get("loc", ())) or "settings"
        raise CliError(f"{where}: {err.get('msg')}") from None
    if settings.model is None and settings.labels is None:
        raise CliError("give --model MODEL (or --labels LABELS for a service without image search)")
    url = f"http://{_url_host(settings.host)}:{settings.port}"
    return serve(
        settings, announce=f"hypsearch: serving on {url} (page {url}/, API docs {url}/docs)"
    )


def _url_host(host: str) -> str:
    if host in ("0.0.0.0", "::", ""):
        return "127.0.0.1"
    return f"[{host}]" if ":" in host else host


# ---------------------------------------------------------------- index build


def cmd_index_build(args: argparse.Namespace) -> int:
    import torch

    from indexing import IndexInputError, IndexStoreError
    from indexing.build import BuildInputError, build_index, open_index, plan_dataset, plan_path
    from models.data import read_class_map
    from models.image_model import ImageModel

    CliError = _cli().CliError
    torch.set_num_threads(args.threads)
    if not Path(args.model).is_file():
        raise CliError(f"--model {args.model}: no such file")
    if args.images is None and args.dataset is None:
        raise CliError("give --dataset fashion-mnist (with --split) or --images DIR|MANIFEST.csv")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise CliError(f"--out {out}: exists and is not a folder")
    if args.images is not None and not Path(args.images).exists():
        raise CliError(f"--images {args.images}: no such file or folder")
    model = ImageModel.load(args.model)
    if getattr(model, "geometry", "poincare") != "poincare":
        raise CliError(
            f"--model {args.model}: a {model.geometry} model cannot fill a Poincaré index"
        )
    class_map = read_class_map(args.class_map) if args.class_map else None
    try:
        if args.images is not None:
            from .runtime import WordResolver, with_words

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
    try:
        index = open_index(out, dim=model.dim, curvature=model.curvature)
    except (IndexStoreError, IndexInputError) as e:
        raise CliError(f"--out {out}: {e}") from None
    if index.dim != model.dim or abs(index.curvature - model.curvature) > 1e-12:
        index.close()
        raise CliError(
            f"--out {out}: holds an index of dimension {index.dim} and curvature "
            f"{index.curvature:g}; the model embeds into dimension {model.dim}, "
            f"curvature {model.curvature:g}"
        )
    try:
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

    _cli()._emit(args, result, human)
    return 0


# ---------------------------------------------------------------- demo


def cmd_demo(args: argparse.Namespace) -> int:
    import torch

    from .demo import run_default_pipeline
    from .settings import get_settings

    torch.set_num_threads(1)
    home = _cli()._home()
    summary = run_default_pipeline(home, progress=not args.quiet, threads=args.threads)
    print(summary["message"], file=sys.stderr)
    if args.no_serve:
        _cli()._emit(args, summary, lambda r: r["message"])
        return 0
    settings = get_settings(
        home=home,
        model=summary.get("model"),
        labels=None if summary.get("model") else summary.get("labels"),
        index=summary.get("index"),
        host=args.host,
        port=args.port,
        data_roots=os.environ.get("HYPSEARCH_DATA_ROOTS") or str(home / "data"),
    )
    (home / "data").mkdir(parents=True, exist_ok=True)
    url = f"http://{_url_host(args.host)}:{args.port}"
    return serve(
        settings, announce=f"hypsearch demo: open {url}/ (API docs {url}/docs); Ctrl-C stops"
    )


# ---------------------------------------------------------------- parser


def add_service_commands(sub, common) -> None:
    """Add ``serve`` and ``index build`` to the ``hypsearch`` subparsers."""
    from models.data import DEFAULT_FASHION_MNIST_DIR

    cli = _cli()
    sv = sub.add_parser(
        "serve",
        help="the REST service and web page over a model and an index",
        description="Serve the REST API (docs at /docs) and the web page (/) over an image model "
        "and an index folder (created empty when missing). Every option can also be set by an "
        "environment variable HYPSEARCH_<OPTION> (HYPSEARCH_API_KEY, HYPSEARCH_DATA_ROOTS, "
        "HYPSEARCH_MAX_UPLOAD_BYTES, HYPSEARCH_BATCH_MAX_SIZE, ...; see the README).",
    )
    sv.add_argument("--model", help="image model checkpoint (default $HYPSEARCH_MODEL)")
    sv.add_argument(
        "--labels", help="label checkpoint, for a service without a model (no image search)"
    )
    sv.add_argument("--index", help="index folder (default $HYPSEARCH_INDEX or var/index)")
    sv.add_argument("--host", default=None, help="address to listen on (default 127.0.0.1)")
    sv.add_argument("--port", type=cli._nonneg_int, default=None, help="port (default 8000)")
    sv.add_argument(
        "--data-roots", default=None, help="folders index jobs may read (os.pathsep or , separated)"
    )
    sv.add_argument(
        "--threads", type=cli._positive_int, default=None, help="torch threads (default 1)"
    )
    sv.add_argument("--log-level", default=None, help="DEBUG, INFO (default), WARNING, ERROR")
    sv.set_defaults(func=cmd_serve)

    ix = sub.add_parser("index", help="build indexes").add_subparsers(
        dest="index_command", metavar="SUBCOMMAND", required=True, parser_class=cli._Parser
    )
    b = ix.add_parser(
        "build",
        help="embed a data set split, a folder or a manifest into an index (resumable)",
        description="Embed pictures with the model (multi-worker loader, batched inference) and "
        "add them to the index folder OUT, creating it when missing. Every batch is durable "
        "before the next is read; running the command again skips the ids already indexed. "
        "Unreadable files are skipped and listed, not fatal.",
    )
    b.add_argument("--model", required=True, help="image model checkpoint")
    src = b.add_mutually_exclusive_group()
    src.add_argument("--dataset", choices=["fashion-mnist"], help="a built-in data set")
    src.add_argument(
        "--images", help="a folder DIR/<class>/<images> or a CSV manifest id,path[,label]"
    )
    b.add_argument("--split", default="test", choices=["train", "test"])
    b.add_argument("--data-dir", default=DEFAULT_FASHION_MNIST_DIR)
    b.add_argument("--class-map", help="class<TAB>taxonomy node per line (for --images)")
    b.add_argument(
        "--wordnet-dir",
        default="/usr/share/wordnet",
        help="WordNet words for class names (sneaker)",
    )
    b.add_argument("--out", required=True, help="index folder")
    b.add_argument("--batch-size", type=cli._positive_int, default=256)
    b.add_argument(
        "--workers", type=cli._nonneg_int, default=2, help="data loader worker processes"
    )
    b.add_argument(
        "--limit", type=cli._positive_int, default=None, help="index only the first N pictures"
    )
    b.add_argument("--threads", type=cli._positive_int, default=2, help="torch threads")
    common(b)
    b.set_defaults(func=cmd_index_build)


def add_demo_options(dm) -> None:
    cli = _cli()
    dm.add_argument(
        "--threads",
        type=cli._positive_int,
        default=None,
        help="torch threads for training the image model and indexing (default: the "
        "training default, 1; label training and serving use 1)",
    )
    dm.add_argument("--no-serve", action="store_true", help="build the artifacts, then exit")
