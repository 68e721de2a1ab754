"""Many items at once: batch upsert, delete by ids or by filter, get by ids,
scroll (a stable cursor) and count.

Every route reaches the index through the dependencies (:data:`RuntimeDep`),
never ``app.state``. A batch upsert is checked whole before anything is
written and then written in one store transaction (:meth:`Runtime.upsert`):
all of it or none, answered once durable. Filters are
:mod:`indexing.filters` expressions (:func:`service.searching.parse_where`).

Scroll cursors are opaque to clients: the URL-safe base64 of
``{"after": <last id>, "t": <issued>}`` and its HMAC-SHA256 under the server's
key (``HYPSEARCH_CURSOR_SECRET``, or a key made at start); anything else, and a
cursor older than ``HYPSEARCH_CURSOR_TTL_S``, is a 400 (nothing of a cursor is
parsed before its signature checks). A page lists the items after that id in id order,
so items written while a client scrolls never make it repeat or skip an item
that exists throughout.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hmac
import json
import re
import secrets
import time

import numpy as np
from fastapi import APIRouter
from fastapi.concurrency import run_in_threadpool

from indexing import IndexInputError
from models.geometry import ranking

from .. import searching
from ..deps import RuntimeDep, ServicesDep, SettingsDep, no_model
from ..errors import ApiError
from ..imaging import decode_image, decode_off_loop
from ..pipeline import embed_upload
from ..runtime import Runtime
from ..schemas import (
    INVALID,
    CountIn,
    CountOut,
    DeletedCountOut,
    FacetOut,
    ItemsBatchIn,
    ItemsDeleteIn,
    ItemsGetIn,
    PointOut,
    PointsOut,
    ScrollIn,
    ScrollOut,
    UpsertedOut,
    errors,
)
from .declare import Routes
from .items import check_user_payload, item_payload

router = APIRouter(prefix="/v1", tags=["points"], responses=INVALID)
routes = Routes(router)

_MAX_ITEMS = "HYPSEARCH_MAX_BATCH_ITEMS"

_LOADING = {503: "still loading"}
_READ_ERRORS = errors({413: "more ids than HYPSEARCH_MAX_BATCH_ITEMS"}, _LOADING)
_WRITE_ERRORS = {**_READ_ERRORS, **errors(401)}


def check_batch_size(n: int, limit: int, field: str, setting: str) -> None:
    """413 for a batch of more than ``limit`` entries."""
    if n > limit:
        raise ApiError(413, f"{field}: {n:,} in one request, at most {limit:,} ({setting})")


# ---------------------------------------------------------------- batch upsert

_INDEX_FIELDS = re.compile(r"^(vectors|ids|labels|payloads)\[(\d+)\]")
_FIELD_OF = {"vectors": "vector", "ids": "id", "labels": "label", "payloads": "payload"}


def _item_error(e: IndexInputError) -> ApiError:
    """The index's error on the batch's columns, named as the item's field."""
    msg = str(e)
    m = _INDEX_FIELDS.match(msg)
    if m:
        msg = f"items[{m.group(2)}].{_FIELD_OF[m.group(1)]}{msg[m.end() :]}"
    return ApiError(422, msg)


def _b64(text: str, field: str, max_bytes: int) -> bytes:
    if len(text) * 3 // 4 > max_bytes + 3:
        raise ApiError(
            413, f"{field}: over the limit of {max_bytes:,} bytes (HYPSEARCH_MAX_UPLOAD_BYTES)"
        )
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ApiError(422, f"{field}: not base64 (a picture's bytes, base64-encoded)") from None


@routes.write(
    "post",
    "/items/batch",
    UpsertedOut,
    "Insert or replace many items in one request: all or none, answered once durable",
    errors={
        **_WRITE_ERRORS,
        **errors(
            {
                413: "too many items, or a picture over the limit",
                415: "a picture in no supported format",
            }
        ),
    },
)
async def upsert_batch(body: ItemsBatchIn, rt: RuntimeDep, svc: ServicesDep) -> UpsertedOut:
    """Each item: `id`, a `vector` or an `image` (base64; embedded by the model),
    optional `label` (synset or word; default: the nearest prototype among the
    labels in use) and `payload` (a JSON object). Every item is checked before
    anything is written; one bad item fails the request (4xx naming
    `items[i]`) and nothing is stored. The items are then written in one
    store transaction, visible to searches all at once."""
    settings = svc.settings
    items = body.items
    check_batch_size(len(items), settings.max_batch_items, "items", _MAX_ITEMS)
    first: dict[str, int] = {}
    for j, it in enumerate(items):
        if it.id in first:
            raise ApiError(
                422, f"items[{j}].id: duplicate id {it.id!r} (also items[{first[it.id]}])"
            )
        first[it.id] = j
        check_user_payload(it.payload, f"items[{j}].payload")
        if it.vector is not None and len(it.vector) != rt.dim:
            raise ApiError(
                422,
                f"items[{j}].vector: expected {rt.dim} numbers (the index's dimension), "
                f"got {len(it.vector)}",
            )
    pics = [j for j, it in enumerate(items) if it.image is not None]
    points: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # item -> (point, pixels)
    if pics:
        if svc.batcher is None:
            raise no_model(rt)
        data = [_b64(items[j].image, f"items[{j}].image", settings.max_upload_bytes) for j in pics]

        def decode_all() -> list[np.ndarray]:
            return [
                decode_image(d, max_pixels=settings.max_image_pixels, field=f"items[{j}].image")
                for j, d in zip(pics, data, strict=True)
            ]

        pixels = await decode_off_loop(settings.max_concurrent_decodes, decode_all)
        got = await asyncio.gather(
            *(embed_upload(rt, settings, svc.batcher, px) for px in pixels), return_exceptions=True
        )
        for j, px, g in zip(pics, pixels, got, strict=True):
            if isinstance(g, ApiError):
                raise ApiError(g.status, f"items[{j}].image: {g.detail}", **g.extra)
            if isinstance(g, BaseException):
                raise g
            points[j] = (g[0], px)
    n = await run_in_threadpool(_write_batch, rt, body, points)
    return UpsertedOut(upserted=n)


def _write_batch(rt: Runtime, body: ItemsBatchIn, points: dict) -> int:
    items = body.items
    zero = [0.0] * rt.dim  # a picture's row until its point is put in
    resolved: dict[str, str] = {}
    labels: list[str | None] = []
    for j, it in enumerate(items):
        if it.label is None:
            labels.append(None)
            continue
        if it.label not in resolved:
            resolved[it.label] = searching.resolve_label(rt, it.label, f"items[{j}].label")
        labels.append(resolved[it.label])
    # one array for the batch (the vectors' lengths were checked by the route)
    x = np.array([zero if it.vector is None else it.vector for it in items], dtype=np.float64)
    for j, (z, _) in points.items():
        x[j] = z
    # a product space: the index checks each factor (its error names the row)
    outside = [] if rt.product else np.nonzero(~ranking.inside_ball(x, rt.curvature))[0]
    if len(outside):
        j = int(outside[0])
        searching.check_vector(rt, x[j], f"items[{j}].vector")  # raises, naming it
    unlabelled = [j for j, lab in enumerate(labels) if lab is None]
    if unlabelled:
        for j, lab in zip(unlabelled, rt.nearest_used_labels(x[unlabelled]), strict=True):
            labels[j] = lab
    payloads = [
        item_payload(
            it.payload,
            "given" if it.label is not None else "predicted",
            rt.pictures.store(points[j][1]) if j in points else None,
        )
        for j, it in enumerate(items)
    ]
    try:
        rt.upsert([it.id for it in items], x, labels, payloads)
    except IndexInputError as e:
        raise _item_error(e) from None
    return len(items)


# ---------------------------------------------------------------- delete, get


@routes.write(
    "post",
    "/items/delete",
    DeletedCountOut,
    "Delete items by ids, or every item passing a filter (one transaction)",
    errors=_WRITE_ERRORS,
)
def delete_items(body: ItemsDeleteIn, rt: RuntimeDep, settings: SettingsDep) -> DeletedCountOut:
    """`{"ids": [...]}` (unknown ids are ignored) or `{"filter": F}`; answered once
    the delete is durable, with how many items it deleted."""
    if body.ids is not None:
        check_batch_size(
            len(body.ids), settings.max_batch_items, "ids", "HYPSEARCH_MAX_BATCH_ITEMS"
        )
        return DeletedCountOut(deleted=rt.delete(body.ids))
    return DeletedCountOut(deleted=rt.delete_where(searching.parse_where(rt, body.filter)))


def _point(it, with_vector: bool, with_payload: bool) -> PointOut:
    extra: dict = {}
    if with_vector:
        extra["vector"] = np.asarray(it.vector, dtype=np.float64).tolist()
    if with_payload:
        extra["payload"] = it.payload if isinstance(it.payload, dict) else None
    return PointOut(id=it.id, label=it.label, holder=it.holder, **extra)


@routes.read(
    "post",
    "/items/get",
    PointsOut,
    "Read many items by id",
    response_model_exclude_unset=True,
    errors=_READ_ERRORS,
)
def get_items(body: ItemsGetIn, rt: RuntimeDep, settings: SettingsDep) -> PointsOut:
    """The items in the order of `ids`; absent ids are left out. `vector` and
    `payload` only with `with_vector` / `with_payload`."""
    check_batch_size(len(body.ids), settings.max_batch_items, "ids", _MAX_ITEMS)
    got = rt.index.get_many(body.ids, vectors=body.with_vector)
    return PointsOut(items=[_point(it, body.with_vector, body.with_payload) for it in got])


# ---------------------------------------------------------------- scroll, count


#: a cursor: URL-safe base64 of its JSON, ".", URL-safe base64 of its HMAC-SHA256
_CURSOR = re.compile(r"^([A-Za-z0-9_-]{1,16000})\.([A-Za-z0-9_-]{43})$")
#: the key of cursors when HYPSEARCH_CURSOR_SECRET is not set: this process's own
_PROCESS_SECRET = secrets.token_bytes(32)


def _b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def _cursor_key(settings) -> bytes:
    secret = getattr(settings, "cursor_secret", None)
    return _PROCESS_SECRET if secret is None else secret.get_secret_value().encode()


def _mac(settings, body: str) -> str:
    return _b64url(hmac.new(_cursor_key(settings), body.encode("ascii"), "sha256").digest())


def encode_cursor(after: str, settings) -> str:
    """The cursor of a page that ends at ``after``: signed with the server's key
    (``HYPSEARCH_CURSOR_SECRET``, or one made at start) and stamped with its time."""
    raw = json.dumps({"after": after, "t": int(time.time())}, separators=(",", ":"))
    body = _b64url(raw.encode())
    return f"{body}.{_mac(settings, body)}"


def decode_cursor(cursor: str | None, settings) -> str | None:
    """The id a cursor this service gave out continues after; 400 for anything
    else (checked by shape and signature before any of it is parsed) and for a
    cursor older than ``HYPSEARCH_CURSOR_TTL_S``."""
    if cursor is None:
        return None
    bad = ApiError(400, "cursor: not a cursor this service gave out (pass next_cursor as it came)")
    m = _CURSOR.match(cursor)
    if m is None or not hmac.compare_digest(_mac(settings, m.group(1)), m.group(2)):
        raise bad
    try:
        body = m.group(1)
        obj = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
        after, issued = obj["after"], obj["t"]
    except (binascii.Error, ValueError, UnicodeDecodeError, KeyError, TypeError):
        raise bad from None
    if not isinstance(after, str) or not isinstance(issued, int):
        raise bad
    ttl = settings.cursor_ttl_s
    if time.time() - issued > ttl:
        raise ApiError(
            400,
            f"cursor: expired (cursors last {ttl:g} s, HYPSEARCH_CURSOR_TTL_S); "
            "start the scroll again",
        )
    return after


@routes.read(
    "post",
    "/scroll",
    ScrollOut,
    "List every item (passing a filter) page by page, with a stable cursor",
    response_model_exclude_unset=True,
    errors=errors({400: "a cursor the service did not give, or expired"}, _LOADING),
)
def scroll(body: ScrollIn, rt: RuntimeDep, settings: SettingsDep) -> ScrollOut:
    """Pages in id order; `next_cursor` is null after the last page. Over a full
    scroll every item that exists throughout is listed exactly once, whatever
    is written meanwhile (items written during the scroll may or may not show)."""
    after = decode_cursor(body.cursor, settings)
    where = None if body.filter is None else searching.parse_where(rt, body.filter)
    ids, nxt = rt.index.scroll(where, body.limit, after)
    got = rt.index.get_many(ids, vectors=body.with_vector)  # one deleted meanwhile: left out
    return ScrollOut(
        items=[_point(it, body.with_vector, body.with_payload) for it in got],
        next_cursor=None if nxt is None else encode_cursor(nxt, settings),
    )


@routes.read(
    "post",
    "/count",
    CountOut,
    "How many items pass a filter (all items without one)",
    response_model_exclude_unset=True,
    errors=errors(_LOADING),
)
def count(body: CountIn, rt: RuntimeDep) -> CountOut:
    """With `label`: the items that label's cone holds (and pass the filter);
    `facet: "children"` adds the count under each child of the label whose cone
    holds items (items held by the label and by none of its children are in
    `count` and in no facet)."""
    where = None if body.filter is None else searching.parse_where(rt, body.filter)
    if body.label is None:
        return CountOut(count=rt.index.count(where))
    total, facets = searching.count_held(rt, body.label, where)
    if body.facet is None:
        return CountOut(count=total)
    return CountOut(count=total, facets=[FacetOut(label=b, count=n) for b, n in facets])
