"""The app factory: ``create_app(settings)`` -> FastAPI.

The lifespan sets torch's thread count, then loads the model (or labels) and
opens the index in a background thread, so ``/healthz`` answers at once and
``/readyz`` turns 200 when loading is done (503 before, and routes that need
the artifacts answer 503 meanwhile). Tests pass ``runtime=`` to serve a small
index they built themselves.

Run it with ``hypsearch serve`` or ``uvicorn --factory service.app:create_app``
(settings from ``HYPSEARCH_*`` variables).
"""

from __future__ import annotations

import gc
import logging
import sys
import threading
from contextlib import asynccontextmanager
from pathlib import Path

import numpy as np
from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

from indexing.filters import FilterLimits

from . import searching
from .batching import MicroBatcher
from .collections import Collections, Served
from .deps import Services
from .errors import ApiError
from .fastpath import ITEM_ROUTE, SearchFastPath, route_of
from .imaging import EncodedPicture
from .jobs import JobManager
from .lane import Lane
from .observability import Metrics, RequestMiddleware, setup_logging
from .routes import collections, items, jobs, labels, ops, page, points, search, snapshots
from .routes.errors import install_error_handlers
from .runtime import Runtime, StartupError, open_runtime
from .settings import Settings, get_settings

log = logging.getLogger("service")

STATIC = Path(__file__).parent / "static"

DESCRIPTION = """\
Hierarchical image retrieval in hyperbolic space: items and label prototypes are
points of one Poincaré ball. Search by vector, label name, item id or picture, in
`nearest` mode (k nearest by geodesic distance) or `hierarchical` mode (same label
first, then siblings, cousins, ...). Errors are 4xx with `{"detail": ...}`. Writes
need `Authorization: Bearer <key>` when `HYPSEARCH_API_KEY` is set.
"""

MULTIPART_SLACK = 64 * 1024  # bytes of multipart framing allowed on top of the upload limit


def _embedder(runtime: Runtime):
    """One forward pass for a micro-batch, and each picture's nearest label (batched too).
    Items are pixel arrays, or small uploads still encoded (:class:`EncodedPicture`:
    decoded here, off the event loop; one that does not decode gets its ApiError)."""
    model = runtime.model

    def embed(items: list) -> list:
        out: list = [None] * len(items)
        images, rows = [], []
        for j, item in enumerate(items):
            if isinstance(item, EncodedPicture):
                try:
                    item = item.decode()
                except ApiError as e:
                    out[j] = e
                    continue
            images.append(item)
            rows.append(j)
        if images:
            same = all(im.shape == images[0].shape for im in images)
            z = model.embed(np.stack(images) if same else images).numpy().astype(np.float64)
            labels = runtime.nearest_used_labels(z)
            for j, zj, lab in zip(rows, z, labels, strict=True):
                out[j] = (zj, lab)
        return out

    return embed


def _local_swagger_ui() -> str | None:
    """The folder of Swagger UI's files when the ``swagger-ui-bundle`` package is
    installed (else FastAPI's /docs, which loads them from a CDN)."""
    try:
        import swagger_ui_bundle
    except ImportError:
        return None
    path = Path(swagger_ui_bundle.swagger_ui_path)
    return str(path) if (path / "swagger-ui-bundle.js").exists() else None


def _served(services: Services, runtime: Runtime, owned: bool = True) -> Served:
    """The workers of a runtime: searches, and image embeddings when it has a model.
    The runtime gets the settings' bounds on filters and picture paths here (every
    runtime served passes through: the default one, collections, restores)."""
    s = services.settings
    _apply_limits(runtime, s)
    # searches: whatever queued while the worker was busy is answered in one batch
    searcher = MicroBatcher(
        lambda queries: searching.search_many(runtime, queries),
        max_size=s.search_batch_max_size,
        max_wait=0.0,
        on_batch=services.metrics.observe_search_batch,
        name="search-batcher",
        workers=s.search_batch_workers or 1,
    )
    batcher = None
    if runtime.model is not None:
        batcher = MicroBatcher(
            _embedder(runtime),
            max_size=s.batch_max_size,
            max_wait=s.batch_max_wait_ms / 1000.0,
            on_batch=services.metrics.observe_batch,
        )
    return Served(runtime, searcher, batcher, owned=owned)


def _apply_limits(runtime: Runtime, s: Settings) -> None:
    """The bounds of issue 32 on one runtime (docs/operations.md, "Limits")."""
    runtime.filter_limits = FilterLimits(
        conditions=s.max_filter_conditions,
        payload_keys=s.max_filter_keys,
        conditions_note=" (HYPSEARCH_MAX_FILTER_CONDITIONS)",
        keys_note=" (HYPSEARCH_MAX_FILTER_KEYS)",
    )
    runtime.pictures.roots = tuple(s.data_roots)
    limit = getattr(runtime.index, "limit_filter_cache", None)
    if limit is not None:
        limit(s.filter_cache_columns, s.filter_cache_bytes)


def _items(slot) -> int:
    """The default collection's items (the metric ``hypsearch_items``)."""
    served = slot.served
    return 0 if served is None else len(served.runtime)


def _load_collections(services: Services) -> None:
    """Open the named collections, once the default one is loaded (or failed)."""
    services.slot.wait_settled()
    services.collections.load()


def _start(services: Services, runtime: Runtime, owned: bool = True) -> None:
    """Serve ``runtime`` as the default collection (its slot ends loading)."""
    services.slot.set(_served(services, runtime, owned))
    services.metrics.ready.set(1)
    if services.announce:
        print(services.announce, file=sys.stderr, flush=True)


def _freeze_gc() -> None:
    """Move everything loaded (model, taxonomy, words, index: hundreds of thousands of
    objects for the Fashion-MNIST demo) into the garbage collector's permanent
    generation. Without it, every full collection under load scanned them all:
    pauses of the whole process, each one a latency spike for every request in
    flight (service/README.md has the numbers). Done once, after loading, by apps
    that load their own artifacts or own the runtime handed in (``serve --ray``,
    whose process also holds Ray, whose full collections were longer still); tests
    that hand in a runtime are left alone."""
    gc.collect()
    gc.freeze()


def _serve_collection(services: Services, runtime: Runtime) -> Served:
    """The workers of a collection opened, created or restored while the app runs,
    its loaded objects frozen first as the default collection's are (a taxonomy of
    all the WordNet nouns is hundreds of thousands of objects: every full collection
    under load scanned them, pausing every request in flight), unless tests handed
    in the runtime."""
    if services.owns_runtime:
        _freeze_gc()
    return _served(services, runtime)


def _load(services: Services) -> None:
    try:
        rt = open_runtime(services.settings)
    except (StartupError, OSError, ValueError) as e:
        services.slot.fail(str(e))
        log.error("loading failed: %s", e)
    except Exception as e:  # noqa: BLE001 - logged in full, reported by /readyz
        services.slot.fail(f"{type(e).__name__}: {e}")
        log.exception("loading failed")
    else:
        _freeze_gc()  # before /readyz turns 200: the one full collection is not under load
        _start(services, rt)
        log.info("ready: %d items, dim %d, model %s", len(rt), rt.dim, rt.model_version)
        return
    if services.on_load_error is not None:
        services.on_load_error(services.load_error)


def create_app(
    settings: Settings | None = None,
    *,
    runtime: Runtime | None = None,
    owns_runtime: bool | None = None,
) -> FastAPI:
    """The FastAPI app; ``runtime`` serves an already opened index (tests), which
    the app closes at shutdown only with ``owns_runtime``."""
    settings = settings if settings is not None else get_settings()
    metrics = Metrics()
    owns = runtime is None if owns_runtime is None else owns_runtime
    services = Services(settings=settings, metrics=metrics, owns_runtime=owns)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        import torch

        torch.set_num_threads(settings.torch_threads)
        setup_logging(settings.log_level, settings.log_json)
        slot = services.slot  # the default collection's
        services.jobs = JobManager(slot.runtime, settings, metrics)
        services.collections = Collections(
            settings, slot, lambda rt: _serve_collection(services, rt), jobs=services.jobs
        )
        metrics.items.set_function(lambda: _items(slot))
        if runtime is not None:
            if services.owns_runtime:  # the serving process's own (serve --ray): frozen too
                _freeze_gc()
            _start(services, runtime, services.owns_runtime)
        else:
            loader = threading.Thread(target=_load, args=(services,), name="load", daemon=True)
            services.loader = loader
            loader.start()
        threading.Thread(
            target=_load_collections, args=(services,), name="load-collections", daemon=True
        ).start()
        try:
            yield
        finally:
            services.collections.close()  # the default collection too
            services.jobs.close()

    swagger = _local_swagger_ui()
    app = FastAPI(
        title="hypsearch",
        version="0.1.0",
        description=DESCRIPTION,
        lifespan=lifespan,
        docs_url=None if swagger else "/docs",
        # metrics are Prometheus's (/metrics); FastAPI's OpenTelemetry hooks asked
        # for a tracer provider on every request
        telemetry={"tracing": False, "metrics": False, "logs": False},
    )
    if swagger:  # /docs without a CDN: the machine may be offline
        app.mount("/static/swagger", StaticFiles(directory=swagger), name="swagger")

        @app.get("/docs", include_in_schema=False)
        async def docs() -> HTMLResponse:
            return get_swagger_ui_html(
                openapi_url=app.openapi_url,
                title="hypsearch API",
                swagger_js_url="/static/swagger/swagger-ui-bundle.js",
                swagger_css_url="/static/swagger/swagger-ui.css",
                swagger_favicon_url="/static/swagger/favicon-32x32.png",
            )

    app.state.services = services
    install_error_handlers(app)
    modules = (ops, search, labels, points, items, jobs, page)
    for module in modules:
        app.include_router(module.router)
    # the same routes under /v1/collections/{collection}/ (service.collections)
    per_collection = collections.collection_routes([m.router for m in modules])
    app.include_router(per_collection)
    app.include_router(collections.router)
    app.include_router(snapshots.router)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    requests = {
        "metrics": metrics,
        "max_body": settings.max_upload_bytes + MULTIPART_SLACK,
        "max_json": settings.max_json_bytes,
        "max_batch_json": settings.max_batch_bytes,
        "max_search_batch_json": settings.max_search_batch_bytes,
        "api_key": None if settings.api_key is None else settings.api_key.get_secret_value(),
    }
    app.state.lane = None  # service.lane: what `hypsearch serve` answers below ASGI
    if settings.search_fast_path:  # inside RequestMiddleware (added last: outermost)
        fast = {
            "services": services,
            "max_body": settings.max_upload_bytes + MULTIPART_SLACK,
            "routes": {
                r.path: r
                for r in (*search.router.routes, *items.router.routes, *per_collection.routes)
                if ("POST" in r.methods and route_of(r.path) is not None)
                or ("PUT" in r.methods and r.path.endswith(ITEM_ROUTE[3:]))
            },
        }
        app.add_middleware(SearchFastPath, **fast)
        app.state.lane = Lane(SearchFastPath(None, **fast), RequestMiddleware(None, **requests))
    app.add_middleware(RequestMiddleware, **requests)
    return app
