"""Dependencies of the routes, as ``Annotated`` aliases (``RuntimeDep``, ``IndexDep``, ...).

Dependencies are ``async def``: they only read app state, and FastAPI would run a
plain ``def`` dependency in the thread pool (one hop per dependency per request).
Everything comes from ``app.state.services`` (:class:`Services`), filled by the
lifespan; tests build an app around their own small index with
``create_app(settings, runtime=...)`` or override these with
``app.dependency_overrides``.
"""

from __future__ import annotations

import dataclasses
import hmac
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Annotated, Any

from fastapi import Depends, Request

from indexing import Index

from .batching import MicroBatcher
from .collections import DEFAULT, Collections, Served, Slot, check_name
from .errors import ApiError
from .jobs import JobManager
from .observability import Metrics
from .runtime import Runtime
from .settings import Settings

NO_MODEL = "no image model is loaded (start the service with --model / HYPSEARCH_MODEL)"


@dataclass
class Services:
    """What the app holds while it runs; for each request, the same with the
    collection it names leased (:func:`get_services`: :attr:`runtime`,
    :attr:`searcher` and :attr:`batcher` are that collection's)."""

    settings: Settings
    metrics: Metrics
    jobs: JobManager | None = None
    #: the leased collection's runtime and workers (a request's copy only)
    runtime: Runtime | None = None
    batcher: MicroBatcher | None = None  # image embeddings
    searcher: MicroBatcher | None = None  # searches (searching.search_many)
    #: whether the app closes a runtime handed to it (tests) at shutdown
    owns_runtime: bool = True
    #: printed on stderr once the service is ready (``hypsearch serve``'s banner)
    announce: str | None = None
    #: called with :attr:`load_error` when loading fails (``hypsearch serve`` stops)
    on_load_error: Callable[[str], None] | None = None
    #: the thread loading the artifacts, while the app loads its own
    loader: threading.Thread | None = None
    #: every collection and alias (service.collections), ``default`` included
    collections: Collections | None = None
    #: the default collection's :class:`Slot` (its registry entry's): loading,
    #: serving, or swapping during an in-place restore
    slot: Slot = field(default_factory=lambda: Slot(DEFAULT))

    @property
    def load_error(self) -> str | None:
        """Why loading the default collection failed, in full (paths included):
        logged, never answered."""
        return self.slot.error


async def get_services(request: Request) -> AsyncIterator[Services]:
    """The app's :class:`Services` with the runtime and workers of the collection
    the request names (``/v1/collections/{collection}/...``, aliases resolved, 404
    for unknown names; ``default`` without one), leased until the request is
    answered. While it serves nothing (loading, or it failed): 503; during an
    in-place restore the lease waits for the restored one (:meth:`Slot.lease`)."""
    services = request.app.state.services
    name = request.path_params.get("collection")
    if name is None or services.collections is None:
        slot = services.slot
    else:
        slot = services.collections.slot(check_name(name, "collection"))
    served = await slot.lease()
    try:
        yield _served_services(services, served)
    finally:
        served.release()


ServicesDep = Annotated[Services, Depends(get_services)]


async def get_app_services(request: Request) -> Services:
    """The app's :class:`Services` without a lease on any collection (readiness,
    metrics: they answer while the default collection loads)."""
    return request.app.state.services


AppServicesDep = Annotated[Services, Depends(get_app_services)]


async def get_settings_dep(request: Request) -> Settings:
    return request.app.state.services.settings  # no lease: the settings never change


SettingsDep = Annotated[Settings, Depends(get_settings_dep)]


async def get_runtime(services: ServicesDep) -> Runtime:
    return services.runtime  # set by the lease: get_services answers 503 without one


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
    if services.slot.served is None:  # 503 while loading
        raise services.slot.unavailable()
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


def _served_services(services: Services, served: Served) -> Services:
    """``services`` with a leased collection's runtime, searcher and batcher."""
    return dataclasses.replace(
        services, runtime=served.runtime, searcher=served.searcher, batcher=served.batcher
    )
