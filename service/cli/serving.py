"""``hypsearch serve`` and ``hypsearch demo``: the REST service and web page."""

from __future__ import annotations

import argparse
import os
import sys

from .argtypes import nonneg_int, positive_int
from .common import add_common, command, emit, home, need_file, need_model
from .errors import CliError

_SERVE_HELP = "the REST service and web page over a model and an index"

_SERVE_DESCRIPTION = (
    "Serve the REST API (docs at /docs) and the web page (/) over an image model "
    "and an index folder (created empty when missing). Every option can also be set by an "
    "environment variable HYPSEARCH_<OPTION> (HYPSEARCH_API_KEY, HYPSEARCH_DATA_ROOTS, "
    "HYPSEARCH_MAX_UPLOAD_BYTES, HYPSEARCH_BATCH_MAX_SIZE, ...; see docs/operations.md)."
)

_DEMO_HELP = "build the default artifacts under $HYPSEARCH_HOME (reused when present), then serve"

_DEMO_DESCRIPTION = (
    "Train the default label embeddings and image model, build the index of the "
    "Fashion-MNIST test split (each reused from $HYPSEARCH_HOME when present), then serve the "
    "web page and the API on http://HOST:PORT. With --photos DIR: index the pictures under "
    "DIR with the pretrained EfficientNet-Lite0 placed among the WordNet nouns (search by "
    "any noun: feline, vehicle, beverage), then serve that."
)


def serve(settings, *, runtime=None, announce: str | None = None) -> int:
    """Run uvicorn on ``settings.host:port`` until interrupted; 2 when loading fails."""
    import uvicorn

    from service.app import create_app

    _check_port(settings.host, settings.port)
    from service.lane import uvicorn_config

    app = create_app(settings, runtime=runtime, owns_runtime=True)
    config = uvicorn_config(
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

    services.on_load_error = failed
    if announce:
        services.announce = announce
    try:
        server.run()
    except SystemExit:  # uvicorn exits this way when it cannot start
        pass
    loader = services.loader
    if loader is not None:  # never leave the interpreter while torch is loading
        loader.join(60)
    if services.load_error:
        raise CliError(services.load_error)
    if not server.started:
        raise CliError(f"could not listen on {settings.host}:{settings.port}")
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
            raise CliError(f"--port {port}: cannot listen on {host} ({e.strerror})") from None


def _url_host(host: str) -> str:
    if host in ("0.0.0.0", "::", ""):
        return "127.0.0.1"
    return f"[{host}]" if ":" in host else host


def cmd_serve(args: argparse.Namespace) -> int:
    from pathlib import Path

    from pydantic import ValidationError

    from service.settings import get_settings

    if args.model is not None:
        need_model("--model", args.model)
    if args.labels is not None:
        need_file("--labels", args.labels)
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
    if args.ray is not None or args.shards is not None or args.replicas is not None:
        return _serve_on_ray(args, settings, url)
    return serve(
        settings, announce=f"hypsearch: serving on {url} (page {url}/, API docs {url}/docs)"
    )


def _serve_on_ray(args: argparse.Namespace, settings, url: str) -> int:
    """``serve --ray ADDRESS --shards N [--replicas R]`` (:mod:`service.ray_serve`)."""
    from .index import _connect

    if args.ray is None or args.shards is None:
        raise CliError("--ray ADDRESS and --shards N go together (--replicas R is optional)")
    if settings.index is None:
        raise CliError("--index: a sharded service needs an index folder")
    _check_port(settings.host, settings.port)
    _connect(args.ray)
    from indexing import IndexStoreError
    from models.checkpoint import CheckpointError
    from models.labels import LabelEmbedding
    from service.ray_serve import serve_on_ray

    try:
        if settings.model is not None:
            from models.vision.image_model import load_model

            labels = load_model(str(settings.model)).labels
        else:
            labels = LabelEmbedding.load(settings.labels)
    except CheckpointError as e:
        raise CliError(str(e)) from None
    if args.replicas is None:  # the HTTP ingress in this process, the shards in Ray actors
        from service.ray_serve import open_sharded_runtime
        from service.runtime import StartupError

        try:
            runtime = open_sharded_runtime(
                settings, shards=args.shards, dim=labels.dim, curvature=float(labels.curvature)
            )
        except IndexStoreError as e:
            raise CliError(f"--index {settings.index}: {e}") from None
        except StartupError as e:
            raise CliError(str(e)) from None
        return serve(
            settings,
            runtime=runtime,
            announce=f"hypsearch: serving on {url} ({args.shards} shards on Ray; "
            f"page {url}/, API docs {url}/docs)",
        )
    try:
        return serve_on_ray(
            settings,  # every HYPSEARCH_* setting of this process, the API key included
            shards=args.shards,
            replicas=args.replicas,
            dim=labels.dim,
            curvature=float(labels.curvature),
            announce=f"hypsearch: serving on {url} under Ray Serve ({args.replicas} "
            f"replicas, {args.shards} shards)",
        )
    except IndexStoreError as e:
        raise CliError(f"--index {settings.index}: {e}") from None


def cmd_demo(args: argparse.Namespace) -> int:
    """Default artifacts under $HYPSEARCH_HOME (built once, then reused), then serve."""
    import torch

    from service.demo import run_default_pipeline
    from service.settings import get_settings

    torch.set_num_threads(1)
    where = home()
    if args.photos is not None:
        return _demo_photos(args, where)
    if args.model is not None:
        raise CliError("--model goes with --photos DIR (the default demo trains its own model)")
    summary = run_default_pipeline(where, progress=not args.quiet, threads=args.threads)
    print(summary["message"], file=sys.stderr)
    if args.no_serve:
        return emit(args, summary, lambda r: r["message"])
    settings = get_settings(
        home=where,
        model=summary.get("model"),
        labels=None if summary.get("model") else summary.get("labels"),
        index=summary.get("index"),
        host=args.host,
        port=args.port,
        data_roots=os.environ.get("HYPSEARCH_DATA_ROOTS") or str(where / "data"),
    )
    (where / "data").mkdir(parents=True, exist_ok=True)
    url = f"http://{_url_host(args.host)}:{args.port}"
    return serve(
        settings, announce=f"hypsearch demo: open {url}/ (API docs {url}/docs); Ctrl-C stops"
    )


def _demo_photos(args: argparse.Namespace, where) -> int:
    """``demo --photos DIR``: the folder indexed by the pretrained model, then served."""
    from pathlib import Path

    from models.checkpoint import CheckpointError
    from service.demo import PHOTOS_MODEL, run_photos_pipeline
    from service.settings import get_settings

    from ..ingest.roots import BuildInputError

    photos = Path(args.photos)
    if not photos.is_dir():
        raise CliError(f"--photos {args.photos}: no such folder")
    spec = args.model or PHOTOS_MODEL
    need_model("--model", spec)
    try:
        summary = run_photos_pipeline(
            where, photos, model_spec=spec, progress=not args.quiet, threads=args.threads
        )
    except BuildInputError as e:
        raise CliError(f"--photos {e}") from None
    except CheckpointError as e:
        raise CliError(f"--model {e}") from None
    print(summary["message"], file=sys.stderr)
    if args.no_serve:
        return emit(args, summary, lambda r: r["message"])
    settings = get_settings(
        home=where,
        model=spec,
        labels=None,
        index=summary["index"],
        host=args.host,
        port=args.port,
        data_roots=os.environ.get("HYPSEARCH_DATA_ROOTS") or str(summary["photos"]),
    )
    url = f"http://{_url_host(args.host)}:{args.port}"
    return serve(
        settings,
        announce=f"hypsearch demo: {summary['items']} photos; open {url}/ (API docs "
        f"{url}/docs); Ctrl-C stops",
    )


def add_serve(sub) -> None:
    """Add ``serve`` to the ``hypsearch`` subparsers."""
    sv = command(sub, "serve", cmd_serve, _SERVE_HELP, _SERVE_DESCRIPTION)
    sv.add_argument("--model", help="image model checkpoint (default $HYPSEARCH_MODEL)")
    sv.add_argument(
        "--labels", help="label checkpoint, for a service without a model (no image search)"
    )
    sv.add_argument("--index", help="index folder (default $HYPSEARCH_INDEX or var/index)")
    sv.add_argument("--host", default=None, help="address to listen on (default 127.0.0.1)")
    sv.add_argument("--port", type=nonneg_int, default=None, help="port (default 8000)")
    sv.add_argument(
        "--data-roots", default=None, help="folders index jobs may read (os.pathsep or , separated)"
    )
    sv.add_argument("--threads", type=positive_int, default=None, help="torch threads (default 1)")
    sv.add_argument("--log-level", default=None, help="DEBUG, INFO (default), WARNING, ERROR")
    sv.add_argument(
        "--ray",
        metavar="ADDRESS",
        help="serve on the Ray cluster at ADDRESS (auto, HOST:PORT, local)",
    )
    sv.add_argument("--shards", type=positive_int, help="with --ray: shards of the index")
    sv.add_argument(
        "--replicas",
        type=positive_int,
        help="with --ray: R replicas of the app under Ray Serve (default: none, the app "
        "in this process over the shards' actors)",
    )


def add_demo(sub) -> None:
    """Add ``demo`` to the ``hypsearch`` subparsers."""
    dm = command(sub, "demo", cmd_demo, _DEMO_HELP, _DEMO_DESCRIPTION)
    dm.add_argument("--host", default="127.0.0.1")
    dm.add_argument("--port", type=positive_int, default=8000)
    dm.add_argument(
        "--threads",
        type=positive_int,
        default=None,
        help="torch threads for training the image model and indexing (default: the "
        "training default, 1; label training and serving use 1)",
    )
    dm.add_argument(
        "--photos",
        metavar="DIR",
        help="index every picture under DIR with the pretrained model (no training; built "
        "once under $HYPSEARCH_HOME/photos/, then reused) and serve that instead",
    )
    dm.add_argument(
        "--model",
        help="with --photos: the model (default pretrained:efficientnet-lite0, or a checkpoint "
        "such as one trained by hypsearch train --backbone pretrained:efficientnet-lite0)",
    )
    dm.add_argument("--no-serve", action="store_true", help="build the artifacts, then exit")
    add_common(dm)
