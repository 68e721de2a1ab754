"""Search by vector, label, item id or picture; embed a picture."""

from __future__ import annotations

import concurrent.futures
from typing import Annotated

import numpy as np
from fastapi import APIRouter, File, Query, Response, UploadFile
from starlette.concurrency import run_in_threadpool

from .. import searching
from ..batching import BatcherClosed
from ..deps import BatcherDep, RuntimeDep, SearcherDep, SettingsDep
from ..disk import layout
from ..errors import ApiError
from ..imaging import EncodedPicture, announced_pixels, decode_image
from ..runtime import Runtime
from ..schemas import (
    INVALID,
    EmbedOut,
    ErrorOut,
    HitOut,
    LabelDistance,
    Mode,
    QueryOut,
    SearchIn,
    SearchOut,
)

router = APIRouter(prefix="/v1", tags=["search"], responses=INVALID)

ERRORS = {
    404: {"model": ErrorOut, "description": "no item with that id"},
    422: {
        "model": ErrorOut,
        "description": "invalid request (unknown labels come with suggestions)",
    },
    503: {"model": ErrorOut, "description": "still loading"},
}
UPLOAD_ERRORS = {
    **ERRORS,
    413: {"model": ErrorOut, "description": "upload over the byte limit, or too many pixels"},
    415: {"model": ErrorOut, "description": "not a picture in a supported format"},
}

IMAGE_DESCRIPTION = "a picture: PNG or JPEG (WebP, GIF and BMP are read too)"


def _answer(rt: Runtime, ans: searching.Answer, disk: bool) -> SearchOut:
    """The answer as its response model (validated)."""
    out = SearchOut(
        query=QueryOut(
            label=ans.query_label,
            vector=ans.query_vector.tolist(),
            distance_to_origin=ans.query_radius,
        ),
        results=[
            HitOut(id=h.id, distance=h.distance, label=h.label, level=h.level, via=h.via)
            for h in ans.hits
        ],
    )
    if disk:
        out.disk = layout(rt, ans)
    return out


def answer_json(rt: Runtime, ans: searching.Answer, disk: bool = False) -> bytes:
    """The answer's JSON: validated as :class:`SearchOut` and serialised once by
    pydantic (what ``response_model`` with ``response_model_exclude_unset`` sends,
    without FastAPI validating and encoding it a second time)."""
    return _answer(rt, ans, disk).model_dump_json(exclude_unset=True).encode()


def _json(payload: bytes) -> Response:
    return Response(payload, media_type="application/json")


async def _search(searcher, query: searching.Query) -> searching.Answer:
    try:
        got = await searcher.run(query)
    except (BatcherClosed, concurrent.futures.CancelledError):
        raise ApiError(503, "the service is shutting down") from None
    return got


async def _respond(rt: Runtime, ans: searching.Answer, disk: bool) -> Response:
    if disk:  # the layout reads every result from the store: not on the event loop
        return _json(await run_in_threadpool(answer_json, rt, ans, disk))
    return _json(answer_json(rt, ans))


@router.post(
    "/search",
    response_model=SearchOut,
    response_model_exclude_unset=True,
    summary="Search by vector, label name or item id",
    responses=ERRORS,
)
async def search(
    body: SearchIn, rt: RuntimeDep, settings: SettingsDep, searcher: SearcherDep
) -> SearchOut:
    """`nearest`: the k nearest items by geodesic distance (`level`, `via` null).
    `hierarchical`: ordered by (level, distance); level 0 = items of the query's
    label or below it, level 1 = what its parent adds (siblings), level 2 = its
    grandparent (cousins), ...; `via` is that chain label.
    `query.label`: the label given (a word resolves to its sense with the most
    items), the item's label, or for a vector the nearest label prototype among
    the labels indexed items carry. A search by `id` leaves that item out."""
    # concurrent searches are answered in batches by one worker thread (service.batching)
    searching.check_window(body.k, body.offset, settings)
    query = searching.Query(
        k=body.k,
        offset=body.offset,
        mode=body.mode,
        under=body.under,
        per_level=body.per_level,
        vector=body.vector,
        label=body.label,
        item_id=body.id,
    )
    return await _respond(rt, await _search(searcher, query), body.disk)


def read_upload(file: UploadFile, settings) -> bytes:
    data = file.file.read(settings.max_upload_bytes + 1)
    if len(data) > settings.max_upload_bytes:
        raise ApiError(
            413,
            f"file: over the limit of {settings.max_upload_bytes:,} bytes "
            "(HYPSEARCH_MAX_UPLOAD_BYTES)",
        )
    return data


def embed_upload(file: UploadFile, settings, batcher) -> tuple[np.ndarray, str]:
    """The picture's point and its nearest label among the labels in use."""
    pixels = decode_image(read_upload(file, settings), max_pixels=settings.max_image_pixels)
    try:
        return batcher.embed_one(pixels)
    except (BatcherClosed, concurrent.futures.CancelledError):
        raise ApiError(503, "the service is shutting down") from None


#: pictures announcing at most this many pixels are decoded by the embedding worker,
#: with its batch (a Fashion-MNIST PNG takes a tenth of a millisecond); larger ones
#: in the thread pool, so a big photo never holds up the batch
WORKER_DECODE_PIXELS = 512 * 512


async def embed_bytes(data: bytes, settings, batcher) -> tuple[np.ndarray, str]:
    """The point and nearest label of an upload's bytes, for async code: no thread of
    the pool waits on the batcher, and the event loop does not decode."""
    n = announced_pixels(data)
    if n is not None and n <= WORKER_DECODE_PIXELS:
        item = EncodedPicture(data, settings.max_image_pixels)
    else:
        item = await run_in_threadpool(decode_image, data, max_pixels=settings.max_image_pixels)
    try:
        return await batcher.run(item)
    except (BatcherClosed, concurrent.futures.CancelledError):
        raise ApiError(503, "the service is shutting down") from None


async def embed_upload_async(file: UploadFile, settings, batcher) -> tuple[np.ndarray, str]:
    """:func:`embed_upload` for async routes."""
    data = await run_in_threadpool(read_upload, file, settings)
    return await embed_bytes(data, settings, batcher)


@router.post(
    "/search/image",
    response_model=SearchOut,
    response_model_exclude_unset=True,
    summary="Search by an uploaded picture",
    responses=UPLOAD_ERRORS,
)
async def search_image(
    rt: RuntimeDep,
    settings: SettingsDep,
    batcher: BatcherDep,
    searcher: SearcherDep,
    file: Annotated[UploadFile, File(description=IMAGE_DESCRIPTION)],
    k: Annotated[int, Query(ge=1, le=1000)] = 10,
    mode: Mode = "nearest",
    offset: Annotated[int, Query(ge=0, le=9999)] = 0,
    under: Annotated[str | None, Query(min_length=1, max_length=300)] = None,
    per_level: Annotated[int | None, Query(ge=1, le=1000)] = None,
    disk: bool = False,
) -> SearchOut:
    """The picture is embedded by the model (micro-batched with concurrent
    requests); `query.label` is the nearest label prototype among the labels
    that indexed items carry."""
    searching.check_window(k, offset, settings)
    z, qlabel = await embed_upload_async(file, settings, batcher)
    x = searching.check_vector(rt, z, "file")
    query = searching.Query(
        k=k, offset=offset, mode=mode, under=under, per_level=per_level, point=x, point_label=qlabel
    )
    return await _respond(rt, await _search(searcher, query), disk)


@router.post(
    "/embed",
    response_model=EmbedOut,
    summary="Embed a picture: its point, distance to the origin and 5 nearest labels",
    responses=UPLOAD_ERRORS,
)
def embed(
    rt: RuntimeDep,
    settings: SettingsDep,
    batcher: BatcherDep,
    file: Annotated[UploadFile, File(description=IMAGE_DESCRIPTION)],
) -> EmbedOut:
    """`labels` are the 5 nearest nodes of the whole taxonomy (not only the
    labels in use): a coarse answer such as `shoe.n.01` is a right answer for
    an unseen kind of shoe."""
    x = searching.check_vector(rt, embed_upload(file, settings, batcher)[0], "file")
    return EmbedOut(
        vector=x.tolist(),
        distance_to_origin=float(rt.distance_to_origin(x)),
        labels=[LabelDistance(label=n, distance=d) for n, d in rt.nearest_nodes(x, 5)],
    )
