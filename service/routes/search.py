"""Search by vector, label, item id or picture; embed a picture."""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import APIRouter, Depends, File, Form, Query, Response, UploadFile
from starlette.concurrency import run_in_threadpool

from models.taxonomy.graph import UnknownLabelError

from .. import searching
from ..deps import BatcherDep, RuntimeDep, SearcherDep, SettingsDep
from ..errors import ApiError
from ..pipeline import answer_json, embed_upload, search_picture, search_request
from ..runtime import Runtime
from ..schemas import (
    FILTER_DOC,
    INVALID,
    EmbedOut,
    ImageSearchParams,
    LabelDistance,
    SearchBatchIn,
    SearchBatchOut,
    SearchIn,
    SearchOut,
    errors,
)
from .declare import Routes
from .errors import as_api_error

router = APIRouter(prefix="/v1", tags=["search"], responses=INVALID)

ERRORS = errors(
    {
        404: "no item with that id",
        422: "invalid request (unknown labels come with suggestions)",
        503: "still loading",
    }
)
UPLOAD_ERRORS = errors(
    {
        413: "upload over the byte limit, or too many pixels",
        415: "not a picture in a supported format",
    }
)
#: every route answers ERRORS; the searches answer a SearchOut as
#: :func:`service.pipeline.answer_json` writes it (unset fields left out)
routes = Routes(router, ERRORS)

IMAGE_DESCRIPTION = "a picture: PNG or JPEG (WebP, GIF and BMP are read too)"


async def read_upload(
    file: Annotated[UploadFile, File(description=IMAGE_DESCRIPTION)], settings: SettingsDep
) -> bytes:
    """The uploaded file's bytes, one over the limit at most (the pipeline's
    :func:`service.pipeline.check_upload_size` then answers 413)."""
    return await file.read(settings.max_upload_bytes + 1)


#: the multipart field ``file`` of the upload routes, read
Upload = Annotated[bytes, Depends(read_upload)]


def _json(payload: bytes) -> Response:
    return Response(payload, media_type="application/json")


async def _respond(rt: Runtime, ans: searching.Answer, disk: bool) -> Response:
    if disk:  # the layout reads every result from the store: not on the event loop
        return _json(await run_in_threadpool(answer_json, rt, ans, disk))
    return _json(answer_json(rt, ans))


@routes.read(
    "post",
    "/search",
    SearchOut,
    "Search by vector, label name or item id",
    response_model_exclude_unset=True,
)
async def search(
    body: SearchIn, rt: RuntimeDep, settings: SettingsDep, searcher: SearcherDep
) -> SearchOut:
    """`nearest`: the k nearest items by geodesic distance (`level`, `via` null).
    `hierarchical`: ordered by (level, distance); `levels: "cone"` (the default
    when the labels' cones hold their taxonomy): level 0 = items whose point the
    cone of the query's label holds, level 1 = those only its parent's cone
    holds (siblings), level 2 = its grandparent's (cousins), ...;
    `levels: "taxonomy"`: level 0 = items whose label is the query's label or
    below it, level 1 = what its parent adds, ...; `via` is that chain label.
    `query.label`: the label given (a word resolves to its sense with the most
    items), the item's label, or for a vector the nearest label prototype among
    the labels indexed items carry. A search by `id` leaves that item out."""
    # concurrent searches are answered in batches by one worker thread (service.batching)
    return await _respond(rt, await search_request(settings, searcher, body), body.disk)


def _named(i: int, e: BaseException) -> BaseException:
    """A search's error, its detail naming the search (``searches[i]: ...``)."""
    got = as_api_error(e)
    if got is None:
        return e
    where = "label: " if isinstance(e, UnknownLabelError) else ""
    err = ApiError(got.status, f"searches[{i}].{where}{got.detail}", **got.extra)
    err.headers = got.headers
    return err


@routes.read(
    "post",
    "/search/batch",
    SearchBatchOut,
    "Many searches in one request, answered in order",
    response_model_exclude_unset=True,
    errors=errors({413: "more searches than HYPSEARCH_MAX_BATCH_SEARCHES"}),
)
async def search_batch(
    body: SearchBatchIn, rt: RuntimeDep, settings: SettingsDep, searcher: SearcherDep
) -> SearchBatchOut:
    """Each search is a `POST /v1/search` body; `answers[i]` is what that route
    would answer for `searches[i]`. One bad search fails the request, its error
    naming it (`searches[2].label: ...`). The searches are answered in batches
    with the concurrent ones (service.batching)."""
    n = len(body.searches)
    if n > settings.max_batch_searches:
        raise ApiError(
            413,
            f"searches: {n:,} in one request, at most {settings.max_batch_searches:,} "
            "(HYPSEARCH_MAX_BATCH_SEARCHES)",
        )
    got = await asyncio.gather(
        *(search_request(settings, searcher, s) for s in body.searches), return_exceptions=True
    )
    for i, g in enumerate(got):
        if isinstance(g, BaseException):
            raise _named(i, g)

    def encode() -> bytes:
        parts = [answer_json(rt, a, s.disk) for a, s in zip(got, body.searches, strict=True)]
        return b'{"answers":[' + b",".join(parts) + b"]}"

    if any(s.disk for s in body.searches):
        return _json(await run_in_threadpool(encode))
    return _json(encode())


@routes.read(
    "post",
    "/search/image",
    SearchOut,
    "Search by an uploaded picture",
    response_model_exclude_unset=True,
    errors=UPLOAD_ERRORS,
)
async def search_image(
    rt: RuntimeDep,
    settings: SettingsDep,
    batcher: BatcherDep,
    searcher: SearcherDep,
    data: Upload,
    params: Annotated[ImageSearchParams, Query()],
    filter: Annotated[  # noqa: A002 - the API's name
        str | None,
        Form(
            description="a filter as a JSON text (the `filter` of a `POST /v1/search` body: "
            + FILTER_DOC
            + ")",
            examples=['{"must": [{"key": "payload.color", "match": "red"}]}'],
        ),
    ] = None,
) -> SearchOut:
    """The picture is embedded by the model (micro-batched with concurrent
    requests); `query.label` is the nearest label prototype among the labels
    that indexed items carry. The multipart form field `filter` (a JSON text)
    filters the results as the `filter` of `POST /v1/search` does."""
    ans = await search_picture(rt, settings, batcher, searcher, params, data, filter)
    return await _respond(rt, ans, params.disk)


@routes.read(
    "post",
    "/embed",
    EmbedOut,
    "Embed a picture: its point, distance to the origin and 5 nearest labels",
    errors=UPLOAD_ERRORS,
)
async def embed(
    data: Upload, rt: RuntimeDep, settings: SettingsDep, batcher: BatcherDep
) -> EmbedOut:
    """`labels[0]` is the deepest label whose entailment cone holds the point
    (when the loaded labels' cones hold their taxonomy and some cone holds the
    point; otherwise the nearest node), the zero-shot answer: for an unseen
    kind of shoe, `shoe.n.01`. Then the nearest nodes of the whole taxonomy
    (not only the labels in use), 5 labels in all, none twice."""
    x, _ = await embed_upload(rt, settings, batcher, data)
    return await run_in_threadpool(_embed_out, rt, x)


def _embed_out(rt: Runtime, x) -> EmbedOut:
    return EmbedOut(
        vector=x.tolist(),
        distance_to_origin=float(rt.distance_to_origin(x)),
        labels=[LabelDistance(label=n, distance=d) for n, d in rt.embed_labels(x, 5)],
    )
