"""A lean path for the hottest requests: ``POST /v1/search`` with a JSON body,
``POST /v1/search/image`` with a small multipart upload, ``PUT /v1/items/{id}``
with a JSON body (a single upsert), and the same under
``/v1/collections/{collection}/`` (a collection or an alias).

FastAPI's machinery around one search (routing over every route, the
exception and exit-stack middleware, solving the dependency graph, reading and
validating the parameters) cost about as much CPU as the search itself
(under load; solving the dependencies the largest part). :class:`SearchFastPath` sits inside
:class:`service.observability.RequestMiddleware` (request id, access log,
latency metrics and the body cap still apply) and answers a well-formed search
itself, with what the routes call: the same request models
(:class:`service.schemas.SearchIn`; for pictures
:class:`service.schemas.ImageSearchParams`, the route's query parameters) and
then the same functions of :mod:`service.pipeline` (the query, the upload
limits and decoding, the micro-batched embedding and batched search, the
response body).

Anything else goes to the app unchanged, with the body replayed: another path
or method, a body that is not a small JSON or multipart one, parameters that do
not validate, a search or a picture that raises an error, ``disk: true``, or a
service still loading. So every error answer is the route's own (the route runs
the request again; searches have no side effects), and the fast path only ever
answers 200s the route would have given. A collection's name that is not valid
or names nothing, or a collection that is loading or failed, goes to the route
too (its 404, 422 or 503). An upsert goes to the route unless it carries the API
key (when one is set) and its body and point check out before anything is
written; once written, the answer is the route's (an upsert of the same item
again, should the route ever have to answer it). ``HYPSEARCH_SEARCH_FAST_PATH=0``
turns it off.
"""

from __future__ import annotations

from functools import partial
from urllib.parse import parse_qsl

from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile
from starlette.requests import Request

from . import searching
from .collections.names import valid_name
from .errors import ApiError
from .observability import has_api_key
from .pipeline import answer_json, search_picture, search_request
from .schemas import ImageSearchParams, ItemIn, SearchIn

PATH = "/v1/search"
IMAGE_PATH = "/v1/search/image"
#: the scope key the lane (service.lane) sets on a request it tried and leaves to the
#: route: this middleware does not try it again
TRIED = "hypsearch.fast_path_tried"
#: ``PUT`` of one item (service.routes.items.put_item)
ITEMS = "/v1/items/"
ITEM_ROUTE = "/v1/items/{item_id:path}"
#: the collection routes' prefix (service.routes.collections.PREFIX), as paths start
COLLECTIONS = "/v1/collections/"
COLLECTION_ROUTE = "/v1/collections/{collection}"
#: bodies up to this size take the fast path (a 4096-dimensional vector fits, and
#: the pictures the model reads; larger uploads take the route, which decodes them
#: in the thread pool)
MAX_BODY = 256 * 1024


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


def route_of(path: str) -> tuple[str, str | None] | None:
    """``(route template, collection name or None)`` of a search path: ``/v1/search``,
    ``/v1/search/image`` or either under ``/v1/collections/{name}/`` (the name as
    given: checked when its slot is looked up); ``None`` for any other path."""
    if path in (PATH, IMAGE_PATH):
        return path, None
    if not path.startswith(COLLECTIONS):
        return None
    name, sep, rest = path[len(COLLECTIONS) :].partition("/")
    tail = "/" + rest
    if not sep or not name or tail not in (PATH[3:], IMAGE_PATH[3:]):
        return None
    return COLLECTION_ROUTE + tail, name


def item_route_of(path: str) -> tuple[str, str | None, str] | None:
    """``(route template, collection name or None, item id)`` of an item's path
    (``/v1/items/{id}``, or under ``/v1/collections/{name}/``); ``None`` for any
    other path or an empty id."""
    name = None
    if path.startswith(COLLECTIONS):
        name, sep, rest = path[len(COLLECTIONS) :].partition("/")
        if not sep or not name:
            return None
        path = "/v1/" + rest
    if not path.startswith(ITEMS) or len(path) == len(ITEMS):
        return None
    template = ITEM_ROUTE if name is None else COLLECTION_ROUTE + ITEM_ROUTE[3:]
    return template, name, path[len(ITEMS) :]


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
        # route template -> its APIRoute: scope["route"], as the router sets it (the
        # metrics' label)
        self.routes = routes or {}

    async def __call__(self, scope, receive, send):
        tried = scope.get(TRIED, False)  # the lane tried it already and left it to the route
        claim = self.claim(scope) if scope["type"] == "http" and not tried else None
        if claim is None:
            await self.app(scope, receive, send)
            return
        payload, body = await self.attempt(scope, receive, claim)
        if payload is None:
            if body is not None:  # the route answers (None: the client went away)
                await self.app(scope, _replay(body, receive), send)
            return
        route = self.routes.get(claim[0])
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

    def claim(self, scope):
        """``(route template, collection name, answer)`` of a request this path may
        answer (a search of a small JSON or multipart body), else ``None``."""
        method = scope["method"]
        if method == "PUT":
            item = item_route_of(scope["path"])
            if item is None:
                return None
            template, name, item_id = item
            want, answer = b"application/json", partial(self._upsert, item_id=item_id)
        else:
            got = route_of(scope["path"]) if method == "POST" else None
            if got is None:
                return None
            template, name = got
            if template.endswith(PATH[3:]):
                want, answer = b"application/json", self._search
            else:
                want, answer = b"multipart/form-data", self._image_search
        media, length = _headers(scope["headers"])
        if media != want or length is None or length > self.max_body:
            return None
        return template, name, answer

    async def attempt(self, scope, receive, claim) -> tuple[bytes | None, bytes | None]:
        """``(the answer's JSON, the body read)``: the answer ``None`` when the route
        must answer (the body then replayed to it), the body ``None`` when the client
        went away before sending it."""
        template, name, answer = claim
        # a lease on the collection (none while it loads or is being restored: the
        # route waits then)
        served = self._lease(name)
        if served is None:
            return None, await _read_body(receive)
        try:  # the answer under the lease; the route (if it answers) takes its own
            body = await _read_body(receive)
            if body is None:  # the client went away
                return None, None
            try:
                payload = await answer(scope, body, served)
            except Exception:  # noqa: BLE001 - the route runs it again and answers as it does
                payload = None
        finally:
            served.release()
        return payload, body

    def _lease(self, name: str | None):
        """A lease on the default collection (``name`` None) or on the one ``name``
        names (an alias resolved), or ``None``: the route answers (a name that is not
        valid or names nothing, a collection that is loading, failed or restoring)."""
        if name is None:
            return self.services.slot.try_acquire()
        colls = self.services.collections
        if colls is None or not valid_name(name):
            return None
        try:
            slot = colls.slot(name)
        except ApiError:
            return None
        return slot.try_acquire()

    async def _search(self, scope, body: bytes, served) -> bytes | None:
        """The JSON of the answer, or ``None`` to let the route answer; errors raise."""
        try:
            req = SearchIn.model_validate_json(body)
        except (ValidationError, ValueError):
            return None
        if req.disk:
            return None
        ans = await search_request(self.services.settings, served.searcher, req)
        return answer_json(served.runtime, ans)

    async def _upsert(self, scope, body: bytes, served, item_id: str) -> bytes | None:
        """The JSON of the upserted item, answered once durable, or ``None`` (before
        anything is written) to let the route answer; errors raise."""
        from .routes.items import _upsert, check_user_payload

        key = self.services.settings.api_key
        if key is not None and not has_api_key(scope, key.get_secret_value().encode()):
            return None  # the route's 401
        try:
            req = ItemIn.model_validate_json(body)
        except (ValidationError, ValueError):
            return None
        rt = served.runtime
        x = searching.check_vector(rt, req.vector)
        check_user_payload(req.payload)
        out = await run_in_threadpool(_upsert, rt, item_id, x, req.label, None, req.payload)
        return out.model_dump_json().encode()

    async def _image_search(self, scope, body: bytes, served) -> bytes | None:
        settings = self.services.settings
        rt = served.runtime
        if served.batcher is None or rt.model is None:
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
        data, where = single_file_part(content_type, body), None
        if data is None:  # any other shape (a filter field too): the general parser
            async with Request(scope, _replay(body, None)).form() as form:
                files, where = form.getlist("file"), form.getlist("filter")
                if len(files) != 1 or not isinstance(files[0], UploadFile) or len(where) > 1:
                    return None
                if where and not isinstance(where[0], str):
                    return None
                where = where[0] if where else None
                data = await files[0].read()
        ans = await search_picture(
            rt, settings, served.batcher, served.searcher, params, data, where
        )
        return answer_json(rt, ans)


async def _read_body(receive) -> bytes | None:
    """The whole body (small: the cap of RequestMiddleware cannot trigger below it),
    or ``None`` when the client went away."""
    chunks, more = [], True
    while more:
        message = await receive()
        if message["type"] != "http.request":
            return None
        chunks.append(message.get("body", b""))
        more = message.get("more_body", False)
    return b"".join(chunks)


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
