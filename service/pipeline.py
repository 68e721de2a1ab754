"""One search, from its validated request to its answer's bytes: the functions the
search routes (:mod:`service.routes.search`) and the fast path
(:mod:`service.fastpath`) both call, so that both give the same answers.

* :func:`search_request`: a validated :class:`SearchIn` -> :class:`Answer`.
* :func:`search_picture`: validated :class:`ImageSearchParams` and an upload's
  bytes -> :class:`Answer`.
* :func:`embed_upload`: an upload (its bytes, or pixels already decoded) -> its
  point (checked) and nearest label among the labels in use, through the
  embedding micro-batcher; also used by ``/v1/embed`` and item pictures.
* :func:`answer_json`: an :class:`Answer` -> the response body.

Errors are :class:`service.errors.ApiError` (the batchers shutting down: 503).
Nothing here touches FastAPI; everything awaits on the event loop and hands the
work to the batchers' worker threads.
"""

from __future__ import annotations

import concurrent.futures

import numpy as np
from pydantic_core import to_json

from . import searching
from .batching import BatcherClosed, MicroBatcher
from .disk import layout
from .errors import ApiError
from .imaging import EncodedPicture, announced_pixels, decode_image, decode_off_loop
from .jsontext import loads_bounded
from .runtime import Runtime
from .schemas import GroupOut, HitOut, ImageSearchParams, QueryOut, SearchIn, SearchOut
from .searching import Answer, Query

#: pictures announcing at most this many pixels are decoded by the embedding worker,
#: with its batch (a small PNG takes a fraction of a millisecond); larger ones in
#: the thread pool, so a big photo never holds up the batch
WORKER_DECODE_PIXELS = 512 * 512


async def _run(batcher: MicroBatcher, item):
    """The batcher's result for ``item``; 503 while the service shuts down."""
    try:
        return await batcher.run(item)
    except (BatcherClosed, concurrent.futures.CancelledError):
        raise ApiError(503, "the service is shutting down") from None


def check_upload_size(data: bytes, settings) -> None:
    """413 for an upload over ``settings.max_upload_bytes``."""
    if len(data) > settings.max_upload_bytes:
        raise ApiError(
            413,
            f"file: over the limit of {settings.max_upload_bytes:,} bytes "
            "(HYPSEARCH_MAX_UPLOAD_BYTES)",
        )


async def embed_upload(
    rt: Runtime, settings, batcher: MicroBatcher, upload: bytes | np.ndarray
) -> tuple[np.ndarray, str]:
    """The point of an uploaded picture (checked as a point of the ball, errors
    naming ``file``) and its nearest label among the labels in use. ``upload``:
    the file's bytes (size-checked, then decoded by the embedding worker when
    small, in the thread pool otherwise, never on the event loop), or pixels the
    caller decoded already."""
    if isinstance(upload, np.ndarray):
        item = upload
    else:
        check_upload_size(upload, settings)
        n = announced_pixels(upload)
        if n is not None and n <= WORKER_DECODE_PIXELS:
            item = EncodedPicture(upload, settings.max_image_pixels)
        else:
            item = await decode_off_loop(
                settings.max_concurrent_decodes,
                decode_image,
                upload,
                max_pixels=settings.max_image_pixels,
            )
    z, label = await _run(batcher, item)
    return searching.check_vector(rt, z, "file"), label


async def search_request(settings, searcher: MicroBatcher, request: SearchIn) -> Answer:
    """The answer to ``POST /v1/search`` (by the search batcher)."""
    return await _run(searcher, searching.query_of(request, settings))


def form_filter(text: str | None, settings) -> dict | None:
    """The ``filter`` form field of ``POST /v1/search/image`` (a JSON text): the
    filter expression of a :class:`SearchIn` body, or a 413/422 naming ``filter``
    (parsed under ``HYPSEARCH_MAX_JSON_BYTES`` and ``HYPSEARCH_MAX_JSON_DEPTH``)."""
    if text is None or not text.strip():
        return None
    expr = loads_bounded(
        text, "filter", max_bytes=settings.max_json_bytes, max_depth=settings.max_json_depth
    )
    if expr is None:
        return None
    if not isinstance(expr, dict):
        raise ApiError(422, f"filter: expected a JSON object, got {type(expr).__name__}")
    return expr


async def search_picture(
    rt: Runtime,
    settings,
    batcher: MicroBatcher,
    searcher: MicroBatcher,
    params: ImageSearchParams,
    data: bytes,
    filter: str | None = None,  # noqa: A002 - the form field's name
) -> Answer:
    """The answer to ``POST /v1/search/image`` with the file's bytes ``data`` and the
    ``filter`` form field (a JSON text; checked before the picture is embedded, then
    run by the search worker as a :class:`SearchIn` body's filter is)."""
    query: Query = searching.query_of(params, settings)  # the window first: no work if bad
    query.filter = form_filter(filter, settings)
    if query.filter is not None:
        searching.parse_where(rt, query.filter)  # a bad filter: 422 before any work
    query.point, query.point_label = await embed_upload(rt, settings, batcher, data)
    return await _run(searcher, query)


#: the fields of a searching.Hit that an answer's hit carries (with its extra fields)
_HIT_FIELDS = ("id", "score", "distance", "label", "level", "via")
#: the extra fields a hit may carry (with_vector, with_payload), in HitOut's order
_HIT_EXTRAS = ("vector", "payload")


def _hits_out(hits) -> list[HitOut]:
    return [HitOut(**{f: getattr(h, f) for f in _HIT_FIELDS}, **(h.extra or {})) for h in hits]


def answer_model(rt: Runtime, ans: Answer, disk: bool = False) -> SearchOut:
    """The answer as the validated :class:`SearchOut` (``disk`` adds the 2-D layout,
    which reads every result from the store: not on the event loop)."""
    query = QueryOut(
        label=ans.query_label,
        vector=ans.query_vector.tolist(),
        distance_to_origin=ans.query_radius,
        mode=ans.mode,
    )
    if ans.groups is not None:
        out = SearchOut(
            query=query,
            groups=[
                GroupOut(label=g.label, count=g.count, results=_hits_out(g.hits))
                for g in ans.groups
            ],
        )
    else:
        out = SearchOut(query=query, results=_hits_out(ans.hits))
    if disk:
        out.disk = layout(rt, ans)
    return out


def _hit_dict(h) -> dict:
    out = {
        "id": h.id,
        "score": float(h.score),
        "distance": float(h.distance),
        "label": h.label,
        "level": None if h.level is None else int(h.level),
        "via": h.via,
    }
    if h.extra:
        out.update((f, h.extra[f]) for f in _HIT_EXTRAS if f in h.extra)
    return out


def _scores_valid(hits) -> bool:
    return all(0.0 <= h.score <= 1.0 for h in hits)  # False for NaN too


def answer_json(rt: Runtime, ans: Answer, disk: bool = False) -> bytes:
    """The answer's JSON: the bytes of :func:`answer_model`'s
    ``model_dump_json(exclude_unset=True)`` (what ``response_model`` with
    ``response_model_exclude_unset`` sends), written from plain dicts by the same
    serializer (``pydantic_core.to_json``): building and validating the models
    cost a search's answer more than the search (tests check the bytes are the
    same). An answer the models would refuse (a score outside [0, 1]), or with
    ``disk``, goes through the models."""
    hits = ans.hits if ans.groups is None else [h for g in ans.groups for h in g.hits]
    if disk or not _scores_valid(hits):
        return answer_model(rt, ans, disk).model_dump_json(exclude_unset=True).encode()
    body: dict = {
        "query": {
            "label": ans.query_label,
            "vector": ans.query_vector.tolist(),
            "distance_to_origin": float(ans.query_radius),
            "mode": ans.mode,
        }
    }
    if ans.groups is not None:
        body["groups"] = [
            {"label": g.label, "count": int(g.count), "results": [_hit_dict(h) for h in g.hits]}
            for g in ans.groups
        ]
    else:
        body["results"] = [_hit_dict(h) for h in ans.hits]
    return to_json(body)
