"""Dependencies of the routes, as ``Annotated`` aliases (``RuntimeDep``, ``IndexDep``, ...).

Dependencies are ``async def``: they only read app state, and FastAPI would run a
plain ``def`` dependency in the thread pool (one hop per dependency per request).
Everything comes from ``app.state.services`` (:class:`Services`), filled by the
lifespan; tests build an app around their own small index with
``create_app(settings, runtime=...)`` or override these with
``app.dependency_overrides``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Annotated, Any

from fastapi import Depends, Request

from indexing import Index

from .batching import MicroBatcher
from .collections import (
    DEFAULT,
    RESTORING,
    SWAP_WAIT_SECONDS,
    Collections,
    DefaultSlot,
    Served,
    check_name,
)
from .errors import ApiError
from .jobs import JobManager
from .observability import Metrics
from .runtime import Runtime
from .settings import Settings

#: how often a request waiting for an in-place restore looks again
SWAP_POLL_SECONDS = 0.01
NO_MODEL = "no image model is loaded (start the service with --model / HYPSEARCH_MODEL)"
#: HTTP answers say only this of why loading failed: the error names artifact
#: paths, so it goes to the log (and to ``hypsearch serve``'s exit message) only
SEE_THE_LOG = "the service log says why"


@dataclass
class Services:
    """What the app holds while it runs."""

    settings: Settings
    metrics: Metrics
    jobs: JobManager | None = None
    runtime: Runtime | None = None
    batcher: MicroBatcher | None = None  # image embeddings
    searcher: MicroBatcher | None = None  # searches (searching.search_many)
    #: why loading failed, in full (paths included): logged, never answered
    load_error: str | None = None
    owns_runtime: bool = True
    ready: threading.Event = field(default_factory=threading.Event)
    #: printed on stderr once the service is ready (``hypsearch serve``'s banner)
    announce: str | None = None
    #: called with :attr:`load_error` when loading fails (``hypsearch serve`` stops)
    on_load_error: Callable[[str], None] | None = None
    #: the thread loading the artifacts, while the app loads its own
    loader: threading.Thread | None = None
    #: the named collections and aliases (service.collections)
    collections: Collections | None = None
    #: the default collection's runtime and workers, leased by each request
    #: (:attr:`runtime`, :attr:`searcher` and :attr:`batcher` are its current ones)
    slot: DefaultSlot = field(default_factory=DefaultSlot)


async def get_services(request: Request) -> AsyncIterator[Services]:
    """The app's :class:`Services`; under ``/v1/collections/{collection}/...`` the
    same with that collection's runtime and workers (aliases resolved; 404 for
    unknown names), leased until the request is answered."""
    services = request.app.state.services
    name = request.path_params.get("collection")
    if (
        name is None
        or services.collections is None
        or services.collections.resolve(check_name(name, "collection")) == DEFAULT
    ):
        served = await lease_default(services)
        if served is None:  # still loading (or failed): the routes answer their 503
            yield services
            return
        try:
            yield _served_services(services, served)
        finally:
            served.release()
        return
    served = services.collections.acquire(name)
    try:
        yield _served_services(services, served, jobs=None)
    finally:
        served.release()


async def lease_default(services: Services) -> Served | None:
    """A lease on the default collection's :class:`Served`; during an in-place
    restore, waits (without blocking the event loop) for the restored one, at most
    :data:`SWAP_WAIT_SECONDS` (then 503). ``None`` while nothing is loaded."""
    slot = services.slot
    served = slot.try_acquire()
    if served is not None or not slot.swapping:
        return served
    deadline = time.monotonic() + SWAP_WAIT_SECONDS
    while slot.swapping:
        if time.monotonic() > deadline:
            raise ApiError(503, RESTORING)
        await asyncio.sleep(SWAP_POLL_SECONDS)
    return await lease_default(services)


ServicesDep = Annotated[Services, Depends(get_services)]


async def get_settings_dep(request: Request) -> Settings:
    return request.app.state.services.settings  # no lease: the settings never change


SettingsDep = Annotated[Settings, Depends(get_settings_dep)]


async def get_runtime(services: ServicesDep) -> Runtime:
    rt = services.runtime
    if rt is None:
        if services.load_error:
            raise ApiError(503, f"the service could not load its artifacts ({SEE_THE_LOG})")
        raise ApiError(503, "the model and the index are still loading; retry shortly")
    return rt


RuntimeDep = Annotated[Runtime, Depends(get_runtime)]


async def get_index(rt: RuntimeDep) -> Index:
    return rt.index


IndexDep = Annotated[Index, Depends(get_index)]


async def get_model(rt: RuntimeDep):
    if rt.model is None:
        raise no_model(rt)
    return rt.model


def no_model(rt: Runtime | None) -> ApiError:
    """The answer to a picture for a runtime without a model: 503 (the service was
    started without one), or 422 for a product-space collection, which has none."""
    if rt is not None and rt.product:
        return ApiError(
            422,
            f"model: this collection has the product space {rt.space_name} and no model: "
            "pictures are embedded in a Poincaré-ball collection with a model (search this "
            "one by vector or by id)",
        )
    return ApiError(503, NO_MODEL)


ModelDep = Annotated[Any, Depends(get_model)]


async def get_batcher(services: ServicesDep, _model: ModelDep) -> MicroBatcher:
    if services.batcher is None:  # pragma: no cover - set whenever a model is loaded
        raise ApiError(503, "the embedding worker is not running")
    return services.batcher


BatcherDep = Annotated[MicroBatcher, Depends(get_batcher)]


async def get_searcher(services: ServicesDep, _rt: RuntimeDep) -> MicroBatcher:
    if services.searcher is None:  # pragma: no cover - set whenever the runtime is
        raise ApiError(503, "the search worker is not running")
    return services.searcher


SearcherDep = Annotated[MicroBatcher, Depends(get_searcher)]


async def get_jobs(request: Request) -> JobManager:
    """The index jobs, without a lease on the default collection: a job's thread
    writes through :meth:`JobManager.hold`'s guard instead, so during an in-place
    restore a new job is refused at once (409) rather than waiting for it."""
    services = request.app.state.services
    await get_runtime(services)  # 503 while loading
    assert services.jobs is not None
    return services.jobs


JobsDep = Annotated[JobManager, Depends(get_jobs)]


async def require_api_key(request: Request, settings: SettingsDep) -> None:
    """Writes need ``Authorization: Bearer <HYPSEARCH_API_KEY>`` when a key is set."""
    if settings.api_key is None:
        return
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token:
        err = ApiError(401, "authorization: this write needs 'Authorization: Bearer <API key>'")
    elif not hmac.compare_digest(
        token.strip().encode(), settings.api_key.get_secret_value().encode()
    ):
        err = ApiError(401, "authorization: wrong API key")
    else:
        return
    err.headers = {"WWW-Authenticate": "Bearer"}
    raise err


WriteAccess = Depends(require_api_key)


def _served_services(services: Services, served, **extra) -> Services:
    """``services`` with a leased collection's runtime, searcher and batcher."""
    return dataclasses.replace(
        services,
        runtime=served.runtime,
        searcher=served.searcher,
        batcher=served.batcher,
        **extra,
    )
