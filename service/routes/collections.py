"""Collections and aliases: create, list, describe, drop; point an alias at a collection.

:func:`collection_routes` also builds the copies of the item, search, label and
stats routes under ``/v1/collections/{collection}/...`` (the dependencies of
:mod:`service.deps` resolve the collection from the path).
"""

from __future__ import annotations

import inspect
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.routing import APIRoute
from pydantic import BaseModel, ConfigDict, Field

from ..collections import NAME_PATTERN, Collections
from ..errors import ApiError
from ..schemas import INVALID, errors
from .declare import Routes

router = APIRouter(tags=["collections"], responses=INVALID)

CollectionName = Annotated[
    str, Path(pattern=NAME_PATTERN, max_length=64, description="a collection or an alias")
]
AliasName = Annotated[str, Path(pattern=NAME_PATTERN, max_length=64)]

#: paths under /v1 that are not copied under a collection (the server's own)
NOT_PER_COLLECTION = ("/v1/collections", "/v1/aliases", "/v1/index/")
PREFIX = "/v1/collections/{collection}"
COLLECTION_404 = errors({404: "no such collection, or not found"})


class CollectionIn(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"name": "shoes", "space": "poincare:10@1.0"}]},
    )

    name: str = Field(pattern=NAME_PATTERN, max_length=64, description="letters, digits, _ and -")
    space: str = Field(
        max_length=200,
        description="poincare:D or poincare:D@c (dimension D >= 2, curvature c), or a "
        "product such as poincare:8,sphere:4,euclidean:4 (vectors and payloads only: no "
        "labels, model or hierarchical mode)",
    )
    model: str | None = Field(
        default=None,
        max_length=4096,
        description="'default' (the default collection's model) or a model checkpoint "
        "under HYPSEARCH_DATA_ROOTS; its dimension and curvature are the space's",
    )
    taxonomy: str | list[list[str]] | None = Field(
        default=None,
        description="a taxonomy TSV or label checkpoint under HYPSEARCH_DATA_ROOTS, or inline "
        "[[child, parent], ...]; default: the default collection's taxonomy (placed in "
        "this space by the cap construction when the dimension or curvature differ)",
        max_length=100_000,
    )


class CollectionOut(BaseModel):
    name: str
    space: str
    dim: int | None
    curvature: float | None
    items: int | None
    labels: int | None = Field(description="nodes of its taxonomy")
    model: str | None
    taxonomy: str | None
    created: str | None
    aliases: list[str]


class DroppedOut(BaseModel):
    name: str
    dropped: bool


class AliasIn(BaseModel):
    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"examples": [{"collection": "shoes"}]}
    )

    collection: str = Field(pattern=NAME_PATTERN, max_length=64)


class AliasOut(BaseModel):
    alias: str
    collection: str
    previous: str | None = None


class AliasDeletedOut(BaseModel):
    alias: str
    deleted: bool


ERRORS = errors(
    401,
    {404: "no such collection or alias", 409: "conflicts with another collection or alias"},
    503,
)


async def get_collections(request: Request) -> Collections:
    services = request.app.state.services  # no lease: a restore must not wait on itself
    if services.collections is None:  # pragma: no cover - set by the lifespan
        raise ApiError(503, "the service is starting")
    return services.collections


CollectionsDep = Annotated[Collections, Depends(get_collections)]


routes = Routes(router, ERRORS)


@routes.read(
    "get",
    "/v1/collections",
    list[CollectionOut],
    "Every collection (default first), its space, size and aliases",
)
def list_collections(colls: CollectionsDep) -> list[dict[str, Any]]:
    return colls.list()


@routes.write(
    "post",
    "/v1/collections",
    CollectionOut,
    "Create a collection with its own space, labels and (optionally) model",
    status_code=201,
    errors=errors({403: "path outside the data roots"}),
)
async def create_collection(body: CollectionIn, colls: CollectionsDep) -> dict[str, Any]:
    """Every item, search, label, scroll and count route then exists under
    `/v1/collections/{name}/...` too. Kept over restarts."""
    return await run_in_threadpool(colls.create, body.name, body.space, body.model, body.taxonomy)


@routes.read(
    "get",
    "/v1/collections/{collection}",
    CollectionOut,
    "One collection (an alias gives its collection)",
)
def get_collection(collection: CollectionName, colls: CollectionsDep) -> dict[str, Any]:
    return colls.describe(collection)


@routes.write(
    "delete",
    "/v1/collections/{collection}",
    DroppedOut,
    "Drop a collection and its data (not default, nor the target of an alias)",
)
def drop_collection(collection: CollectionName, colls: CollectionsDep) -> dict[str, Any]:
    """Requests already using it finish first; then its folder is removed."""
    return colls.drop(collection)


@routes.read("get", "/v1/aliases", dict[str, str], "Every alias and the collection it names")
def list_aliases(colls: CollectionsDep) -> dict[str, str]:
    return colls.aliases()


@routes.write(
    "put",
    "/v1/aliases/{alias}",
    AliasOut,
    "Point an alias at a collection (atomically: a request sees the old or the new one)",
    errors=errors(422),
)
def put_alias(alias: AliasName, body: AliasIn, colls: CollectionsDep) -> dict[str, Any]:
    return colls.set_alias(alias, body.collection)


@routes.write(
    "delete", "/v1/aliases/{alias}", AliasDeletedOut, "Delete an alias (its collection stays)"
)
def delete_alias(alias: AliasName, colls: CollectionsDep) -> dict[str, Any]:
    return colls.drop_alias(alias)


async def _collection_param(collection: CollectionName) -> str:
    """Declares and checks the path's collection name (the deps resolve it)."""
    return collection


def collection_routes(routers) -> APIRouter:
    """Copies of the ``/v1/...`` routes of ``routers`` under
    ``/v1/collections/{collection}/...`` (not the collections, aliases and jobs
    routes), with the collection a declared path parameter."""
    out = APIRouter()
    params = set(inspect.signature(APIRouter.add_api_route).parameters) - {
        "self",
        "path",
        "endpoint",
        "dependencies",
        "responses",
        "operation_id",
        "generate_unique_id_function",
    }
    for router_ in routers:
        for r in router_.routes:
            if not isinstance(r, APIRoute) or not r.path.startswith("/v1/"):
                continue
            if r.path.startswith(NOT_PER_COLLECTION):
                continue
            kw = {k: getattr(r, k) for k in params if hasattr(r, k)}
            out.add_api_route(
                PREFIX + r.path[len("/v1") :],
                r.endpoint,
                dependencies=[Depends(_collection_param), *r.dependencies],
                responses={**INVALID, **(r.responses or {}), **COLLECTION_404},
                **kw,
            )
    return out
