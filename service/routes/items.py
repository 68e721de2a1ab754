"""Items: read, upsert (a vector or a picture), delete, and an item's picture.

Ids may contain ``/`` (a folder's items are relative paths): the routes take
the rest of the path as the id, and ``GET /v1/items/{id}/image`` is matched
first (an id that itself ends in ``/image`` can still be read with
``POST /v1/search`` ... or renamed).
"""

from __future__ import annotations

from typing import Annotated, Any

import numpy as np
from fastapi import APIRouter, Path, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from starlette.datastructures import UploadFile

from .. import searching
from ..deps import RuntimeDep, ServicesDep, no_model
from ..errors import ApiError
from ..imaging import decode_image, decode_off_loop, encode_png
from ..pipeline import check_upload_size, embed_upload
from ..runtime import Runtime
from ..schemas import INVALID, DeletedOut, ItemIn, ItemOut, errors
from .declare import Routes

#: payload keys the service writes itself: a client's payload may not set them
#: (``image`` names a file the service serves)
RESERVED_KEYS = ("image", "label_source")


def check_user_payload(payload: dict | None, field: str = "payload") -> None:
    if payload:
        for key in RESERVED_KEYS:
            if key in payload:
                raise ApiError(422, f"{field}.{key}: reserved (the service writes this key)")


def item_payload(user: dict | None, source: str, image: dict | None) -> dict[str, Any]:
    """The stored payload: the client's keys, ``label_source`` and the picture's ref."""
    payload: dict[str, Any] = dict(user or {})
    payload["label_source"] = source
    if image is not None:
        payload["image"] = image
    return payload


router = APIRouter(prefix="/v1/items", tags=["items"], responses=INVALID)
routes = Routes(router)

ItemId = Annotated[str, Path(description="item id (may contain '/')", max_length=2000)]

_MULTIPART_SCHEMA = {
    "type": "object",
    "required": ["file"],
    "properties": {
        "file": {"type": "string", "format": "binary", "description": "a picture (PNG or JPEG)"},
        "label": {
            "type": "string",
            "minLength": 1,
            "maxLength": 300,
            "description": "synset or word",
        },
    },
}


def _check_id(item_id: str) -> str:
    if not item_id:
        raise ApiError(422, "id: empty item id")
    return item_id


def _out(rt: Runtime, item_id: str, item) -> ItemOut:
    payload = item.payload if isinstance(item.payload, dict) else {}
    has_image = isinstance(payload.get("image"), dict)
    return ItemOut(
        id=item_id,
        label=item.label,
        vector=np.asarray(item.vector, dtype=np.float64).tolist(),
        distance_to_origin=float(rt.distance_to_origin(item.vector)),
        holder=item.holder,
        payload=item.payload if isinstance(item.payload, dict) else None,
        label_source=payload.get("label_source"),
        image=f"/v1/items/{item_id}/image" if has_image else None,
    )


@routes.read(
    "get",
    "/{item_id:path}/image",
    None,
    "The item's picture as PNG",
    response_class=Response,
    errors={
        200: {"content": {"image/png": {}}, "description": "the picture"},
        **errors({404: "no such item, or it has no picture"}, 503),
    },
)
def get_image(rt: RuntimeDep, item_id: ItemId) -> Response:
    item = rt.index.get(_check_id(item_id))
    if item is None:
        raise ApiError(404, f"id: no item {item_id!r}")
    pixels = rt.pictures.read(item.payload)
    if pixels is None:
        raise ApiError(404, f"id: item {item_id!r} has no picture")
    return Response(
        encode_png(pixels), media_type="image/png", headers={"Cache-Control": "public, max-age=300"}
    )


@routes.read(
    "get",
    "/{item_id:path}",
    ItemOut,
    "One item: label, vector, distance to the origin, holding label, payload",
    errors=errors(404, 422, 503),
)
def get_item(rt: RuntimeDep, item_id: ItemId) -> ItemOut:
    item = rt.index.get(_check_id(item_id))
    if item is None:
        raise ApiError(404, f"id: no item {item_id!r}")
    return _out(rt, item_id, item)


def _upsert(
    rt: Runtime,
    item_id: str,
    x: np.ndarray,
    label: str | None,
    image: dict | None,
    user_payload: dict | None = None,
) -> ItemOut:
    if label is not None:
        label = searching.resolve_label(rt, label)
        source = "given"
    else:
        label = rt.nearest_used_labels(x[None])[0]
        source = "predicted"
    payload: dict[str, Any] = item_payload(user_payload, source, image)
    rt.upsert([item_id], x[None], [label], [payload])
    item = rt.index.get(item_id)
    if item is None:  # pragma: no cover - deleted by a concurrent request
        raise ApiError(409, f"id: item {item_id!r} was deleted while being written")
    return _out(rt, item_id, item)


def _picture(rt: Runtime, settings, data: bytes, label: str | None) -> np.ndarray:
    """The upload's pixels; its label checked before any work is kept."""
    check_upload_size(data, settings)
    pixels = decode_image(data, max_pixels=settings.max_image_pixels)
    if label is not None:
        searching.resolve_label(rt, label)
    return pixels


async def _upsert_picture(
    services, rt: Runtime, item_id: str, data: bytes, label: str | None
) -> ItemOut:
    settings, batcher = services.settings, services.batcher
    if batcher is None:
        raise no_model(rt)
    pixels = await decode_off_loop(
        settings.max_concurrent_decodes, _picture, rt, settings, data, label
    )
    x, _ = await embed_upload(rt, settings, batcher, pixels)

    def write() -> ItemOut:
        return _upsert(rt, item_id, x, label, rt.pictures.store(pixels))

    return await run_in_threadpool(write)


_WRITE_ERRORS = errors(401, 422, 503)
_DELETE_ERRORS = errors(401, 422, 503, 404)


@routes.write(
    "put",
    "/{item_id:path}",
    ItemOut,
    "Insert or replace one item (a vector, or a picture to embed)",
    errors={
        **_WRITE_ERRORS,
        **errors(413, {415: "neither JSON nor multipart, or not a picture"}),
    },
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {"schema": ItemIn.model_json_schema()},
                "multipart/form-data": {"schema": _MULTIPART_SCHEMA},
            },
        }
    },
)
async def put_item(request: Request, rt: RuntimeDep, svc: ServicesDep, item_id: ItemId) -> ItemOut:
    """JSON `{"vector": [...], "label": "<synset or word>", "payload": {...}}`, or multipart with a
    picture in `file` (and an optional `label` field). Without a label the item
    gets the nearest label prototype among the labels in use (`label_source`:
    `predicted`). Answered once the write is durable (committed to SQLite)."""
    item_id = _check_id(item_id)
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype == "application/json":
        raw = await request.body()
        try:
            body = ItemIn.model_validate_json(raw)
        except ValidationError as e:
            raise RequestValidationError(
                [
                    {**err, "loc": ("body", *err.get("loc", ()))}
                    for err in e.errors(include_url=False)
                ]
            ) from None
        x = searching.check_vector(rt, body.vector)
        check_user_payload(body.payload)
        return await run_in_threadpool(_upsert, rt, item_id, x, body.label, None, body.payload)
    if ctype == "multipart/form-data":
        try:
            form = await request.form(max_files=1, max_fields=4)
        except Exception as e:  # noqa: BLE001 - malformed multipart of any kind
            if isinstance(e, ApiError) or getattr(e, "status_code", None) == 413:
                raise
            raise ApiError(422, f"body: malformed multipart data ({e})") from None
        try:
            file = form.get("file")
            label = form.get("label")
            if not isinstance(file, UploadFile):
                raise ApiError(422, "file: a picture is required in the multipart field 'file'")
            if label is not None and (not isinstance(label, str) or not label.strip()):
                raise ApiError(422, "label: must be a non-empty text field")
            data = await file.read(svc.settings.max_upload_bytes + 1)
            return await _upsert_picture(svc, rt, item_id, data, label)
        finally:
            await form.close()
    raise ApiError(
        415,
        f"content-type: expected application/json or multipart/form-data, got {ctype or 'none'!r}",
    )


@routes.write("delete", "/{item_id:path}", DeletedOut, "Delete one item", errors=_DELETE_ERRORS)
def delete_item(rt: RuntimeDep, item_id: ItemId) -> DeletedOut:
    """Answered once the delete is durable; 404 when there is no such item."""
    n = rt.delete([_check_id(item_id)])
    if n == 0:
        raise ApiError(404, f"id: no item {item_id!r}")
    return DeletedOut(id=item_id, deleted=True)
