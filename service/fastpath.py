"""A lean path for the hottest requests: ``POST /v1/search`` with a JSON body and
``POST /v1/search/image`` with a small multipart upload.

FastAPI's machinery around one search (routing over every route, the
exception and exit-stack middleware, solving the dependency graph, reading and
validating the parameters) cost about as much CPU as the search itself
(measured under load, profiled: ``solve_dependencies`` alone was a third of the
event loop's time). :class:`SearchFastPath` sits inside
:class:`service.observability.RequestMiddleware` (request id, access log,
latency metrics and the body cap still apply) and answers a well-formed search
itself, with what the routes use: the same validation
(:class:`service.schemas.SearchIn`; for pictures :class:`ImageSearchParams`,
the route's query parameters, and the same upload limits and decoding), the
same micro-batched embedding and batched search (the app's batchers,
:func:`service.searching.search_many`), the same response model and
serialisation (:func:`service.routes.search.answer_json`).

Anything else goes to the app unchanged, with the body replayed: another path
or method, a body that is not a small JSON or multipart one, parameters that do
not validate, a search or a picture that raises an error, ``disk: true``, or a
service still loading. So every error answer is the route's own (the route runs
the request again; searches have no side effects), and the fast path only ever
answers 200s the route would have given. ``HYPSEARCH_SEARCH_FAST_PATH=0`` turns
it off.
"""

from __future__ import annotations

from typing import Annotated
from urllib.parse import parse_qsl

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from . import searching
from .schemas import Mode, SearchIn

PATH = "/v1/search"
IMAGE_PATH = "/v1/search/image"
#: bodies up to this size take the fast path (a 4096-dimensional vector fits, and
#: the pictures the model reads; larger uploads take the route, which decodes them
#: in the thread pool)
MAX_BODY = 256 * 1024


class ImageSearchParams(BaseModel):
    """The query parameters of ``POST /v1/search/image`` (as the route declares them;
    unknown parameters are ignored, as FastAPI does)."""

    model_config = ConfigDict(extra="ignore")

    k: Annotated[int, Field(ge=1, le=1000)] = 10
    mode: Mode = "nearest"
    offset: Annotated[int, Field(ge=0, le=9999)] = 0
    under: Annotated[str | None, Field(min_length=1, max_length=300)] = None
    per_level: Annotated[int | None, Field(ge=1, le=1000)] = None
    disk: bool = False


def single_file_part(content_type: bytes, body: bytes) -> bytes | None:
    """The content of the only part of a ``multipart/form-data`` body when that part
    is a file named ``file`` (what clients send to ``/v1/search/image``), or
    ``None`` for any other shape (a preamble, more parts, other headers, no
    filename, ...), which the general parser then reads. A strict subset of the
    format: for these bodies the general parser gives the same bytes."""
    from python_multipart.multipart import parse_options_header

    _, params = parse_options_header(content_type)
    boundary = params.get(b"boundary")
    if not boundary:
        return None
    delim = b"--" + boundary
    if not body.startswith(delim + b"\r\n"):
        return None
    close = b"\r\n" + delim + b"--"
    end = body.rfind(close)
    if end < 0 or body[end + len(close) :] not in (b"", b"\r\n"):
        return None
    part = body[len(delim) + 2 : end]
    if b"\r\n" + delim in part:  # more than one part
        return None
    head_end = part.find(b"\r\n\r\n")
    if head_end < 0:
        return None
    disposition = None
    for line in part[:head_end].split(b"\r\n"):
        name, sep, value = line.partition(b":")
        name = name.strip().lower()
        if not sep or name not in (b"content-disposition", b"content-type"):
            return None
        if name == b"content-disposition":
            if disposition is not None:
                return None
            disposition = value.strip()
    if disposition is None:
        return None
    kind, opts = parse_options_header(disposition)
    if kind != b"form-data" or opts.get(b"name") != b"file" or not opts.get(b"filename"):
        return None
    return part[head_end + 4 :]


def _headers(headers) -> tuple[bytes, int | None]:
    """(media type, content length) from the raw headers; no length when chunked."""
    media, length = b"", None
    for k, v in headers:
        if k == b"content-type":
            media = v.split(b";", 1)[0].strip().lower()
        elif k == b"content-length":
            try:
                length = int(v)
            except ValueError:
                return b"", None
        elif k == b"transfer-encoding":
            return b"", None
    return media, length


class SearchFastPath:
    """Pure ASGI middleware; see the module docstring."""

    def __init__(self, app, *, services, max_body: int, routes: dict | None = None) -> None:
        self.app = app
        self.services = services
        self.max_body = min(MAX_BODY, max_body)
        # path -> its APIRoute: scope["route"], as the router sets it (the metrics' label)
        self.routes = routes or {}

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        if path == PATH:
            want, answer = b"application/json", self._search
        elif path == IMAGE_PATH:
            want, answer = b"multipart/form-data", self._image_search
        else:
            await self.app(scope, receive, send)
            return
        services = self.services
        media, length = _headers(scope["headers"])
        small = length is not None and length <= self.max_body
        if services.runtime is None or services.searcher is None or media != want or not small:
            await self.app(scope, receive, send)
            return
        # the whole body (small; the cap of RequestMiddleware cannot trigger below it)
        chunks, more = [], True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        body = b"".join(chunks)
        try:
            payload = await answer(scope, body)
        except Exception:  # noqa: BLE001 - the route runs it again and answers as it does
            payload = None
        if payload is None:
            await self.app(scope, _replay(body, receive), send)
            return
        route = self.routes.get(path)
        if route is not None:
            scope["route"] = route  # RequestMiddleware labels its metrics with it
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-length", str(len(payload)).encode()),
                    (b"content-type", b"application/json"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": payload})

    async def _search(self, scope, body: bytes) -> bytes | None:
        """The JSON of the answer, or ``None`` to let the route answer; errors raise."""
        from .routes.search import answer_json

        try:
            req = SearchIn.model_validate_json(body)
        except (ValidationError, ValueError):
            return None
        if req.disk:
            return None
        rt = self.services.runtime
        searching.check_window(req.k, req.offset, self.services.settings)
        query = searching.Query(
            k=req.k,
            offset=req.offset,
            mode=req.mode,
            under=req.under,
            per_level=req.per_level,
            vector=req.vector,
            label=req.label,
            item_id=req.id,
        )
        return answer_json(rt, await self.services.searcher.run(query))

    async def _image_search(self, scope, body: bytes) -> bytes | None:
        from starlette.datastructures import UploadFile
        from starlette.requests import Request

        from .routes.search import answer_json, embed_bytes

        services = self.services
        rt, settings, batcher = services.runtime, services.settings, services.batcher
        if batcher is None or rt.model is None:
            return None
        try:
            params = ImageSearchParams.model_validate(
                dict(parse_qsl(scope["query_string"].decode("latin-1"), keep_blank_values=True))
            )
        except (ValidationError, ValueError):
            return None
        if params.disk:
            return None
        content_type = next((v for k, v in scope["headers"] if k == b"content-type"), b"")
        data = single_file_part(content_type, body)
        if data is None:  # any other shape: the general parser
            async with Request(scope, _replay(body, None)).form() as form:
                files = form.getlist("file")
                if len(files) != 1 or not isinstance(files[0], UploadFile):
                    return None
                data = await files[0].read()
        if len(data) > settings.max_upload_bytes:
            return None
        searching.check_window(params.k, params.offset, settings)
        z, qlabel = await embed_bytes(data, settings, batcher)
        x = searching.check_vector(rt, z, "file")
        query = searching.Query(
            k=params.k,
            offset=params.offset,
            mode=params.mode,
            under=params.under,
            per_level=params.per_level,
            point=x,
            point_label=qlabel,
        )
        return answer_json(rt, await services.searcher.run(query))


def _replay(body: bytes, receive):
    """A ``receive`` that hands over the body already read, then the real one."""
    sent = False

    async def replay():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        if receive is None:  # pragma: no cover - the form parser stops at the body's end
            return {"type": "http.disconnect"}
        return await receive()

    return replay
