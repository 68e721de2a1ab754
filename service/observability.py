"""Metrics (Prometheus), structured logs with a request id, and the ASGI
middleware that ties them to every request (and caps request bodies).

Metrics live in a registry per app (tests build many apps in one process):

* ``hypsearch_request_seconds{route,method,status}``: latency histogram by route template
* ``hypsearch_index_items``: live items
* ``hypsearch_embed_batch_size`` and ``hypsearch_embed_batch_seconds``: micro-batches
* ``hypsearch_search_batch_size`` and ``hypsearch_search_batch_seconds``: search batches
* ``hypsearch_job_progress{job}``, ``hypsearch_job_images_total{outcome}``: index jobs

Logs are one JSON object a line on stderr (``HYPSEARCH_LOG_JSON=0`` for plain
text) with ``request_id`` on every line written while a request runs; the id
comes from the ``X-Request-ID`` header or is made up, and is sent back in it.
"""

from __future__ import annotations

import contextvars
import hmac
import itertools
import json
import logging
import re
import sys
import time
import uuid

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from starlette.exceptions import HTTPException

request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("request_id", default=None)

_LATENCY_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.0075,
    0.01,
    0.015,
    0.025,
    0.05,
    0.075,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
)
_REQUEST_ID_OK = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
# made-up request ids: a random prefix per process and a counter (uuid4 per request
# showed up at 3 % of the server's time under load)
_ID_PREFIX = uuid.uuid4().hex[:16]
_ID_COUNTER = itertools.count(1)


def _batch_histograms(registry, kind: str, size_help: str, seconds_help: str):
    """``hypsearch_<kind>_batch_size`` and ``hypsearch_<kind>_batch_seconds``."""
    size = Histogram(
        f"hypsearch_{kind}_batch_size",
        size_help,
        buckets=(1, 2, 4, 8, 16, 32, 64, 128),
        registry=registry,
    )
    seconds = Histogram(
        f"hypsearch_{kind}_batch_seconds", seconds_help, buckets=_LATENCY_BUCKETS, registry=registry
    )
    return size, seconds


class Metrics:
    """The app's Prometheus collectors, in their own registry."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Histogram(
            "hypsearch_request_seconds",
            "Request latency by route",
            ["route", "method", "status"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.items = Gauge("hypsearch_index_items", "Live items in the index", registry=r)
        self.batch_size, self.batch_seconds = _batch_histograms(
            r, "embed", "Images per embedding micro-batch", "Forward time of one micro-batch"
        )
        self.search_batch_size, self.search_batch_seconds = _batch_histograms(
            r, "search", "Searches answered per batch", "Time of one search batch"
        )
        self.job_progress = Gauge(
            "hypsearch_job_progress", "Progress of index jobs (0..1)", ["job"], registry=r
        )
        self.job_images = Counter(
            "hypsearch_job_images_total", "Images read by index jobs", ["outcome"], registry=r
        )
        self.ready = Gauge("hypsearch_ready", "1 once model and index are loaded", registry=r)

    def observe_batch(self, n: int, seconds: float) -> None:
        self.batch_size.observe(n)
        self.batch_seconds.observe(seconds)

    def observe_search_batch(self, n: int, seconds: float) -> None:
        self.search_batch_size.observe(n)
        self.search_batch_seconds.observe(seconds)


# ---------------------------------------------------------------- logs


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        rid = getattr(record, "request_id", None) or request_id.get()
        if rid:
            out["request_id"] = rid
        for key in ("method", "path", "route", "status", "ms", "job"):
            v = getattr(record, key, None)
            if v is not None:
                out[key] = v
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


class _PlainFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        rid = getattr(record, "request_id", None) or request_id.get()
        s = super().format(record)
        return f"{s} [{rid}]" if rid else s


def setup_logging(level: str = "INFO", as_json: bool = True) -> None:
    """Send the service's, the index's and the models' logs to stderr (idempotent)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        JsonFormatter() if as_json else _PlainFormatter("%(levelname)s %(name)s: %(message)s")
    )
    handler._hypsearch = True  # type: ignore[attr-defined]
    for name in ("service", "indexing", "models", "service.access"):
        lg = logging.getLogger(name)
        lg.handlers = [h for h in lg.handlers if not getattr(h, "_hypsearch", False)]
        if name != "service.access":
            lg.addHandler(handler)
        lg.setLevel(level)
    logging.getLogger("service.access").propagate = True


# ---------------------------------------------------------------- middleware


#: paths (suffixes, so that prefixed copies match too) whose JSON bodies are batches
BATCH_PATHS = ("/items/batch", "/search/batch")
#: write routes that take large bodies: with an API key set, a request without the
#: right key is answered 401 before its body is read (nothing of it is parsed)
KEYED_BODY_PATHS = ("/items/batch", "/snapshots/upload")

#: headers sent with every answer: the page loads only its own scripts, styles and
#: pictures, is never framed, and no answer is sniffed as another type
SECURITY_HEADERS = [
    (
        b"content-security-policy",
        b"default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
        b"connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
        b"frame-ancestors 'none'",
    ),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
]
#: /docs (Swagger UI) starts itself with an inline script, and loads from a CDN when
#: the swagger-ui-bundle package is missing
DOCS_CSP = (
    b"default-src 'self'; script-src 'self' 'unsafe-inline' https://cdn.jsdelivr.net; "
    b"style-src 'self' 'unsafe-inline' https://cdn.jsdelivr.net; "
    b"img-src 'self' data: https://fastapi.tiangolo.com; object-src 'none'; "
    b"frame-ancestors 'none'"
)


class RequestMiddleware:
    """Pure ASGI: request id, access log, latency histogram, body size caps (413,
    before anything is parsed: each route's own, sized to what it accepts), the API
    key of large write bodies (401 before they are read) and security headers."""

    def __init__(
        self,
        app,
        *,
        metrics: Metrics,
        max_body: int,
        max_json: int | None = None,
        max_batch_json: int | None = None,
        max_search_batch_json: int | None = None,
        api_key: str | None = None,
    ) -> None:
        self.app = app
        self.metrics = metrics
        self.max_body = max_body
        # a JSON body is parsed whole (several times its size in memory) before
        # any field is checked: it gets its own, smaller cap
        self.max_json = max_body if max_json is None else min(max_json, max_body)
        # the batch routes (BATCH_PATHS) take many items in one body: their own cap
        self.max_batch_json = self.max_json if max_batch_json is None else max_batch_json
        # /search/batch: at most HYPSEARCH_MAX_BATCH_SEARCHES searches, parsed on the loop
        self.max_search_batch_json = (
            self.max_batch_json if max_search_batch_json is None else max_search_batch_json
        )
        self.api_key = api_key.encode() if api_key else None
        self.log = logging.getLogger("service.access")

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = request_id_of(scope)
        token = request_id.set(rid)
        t0 = time.perf_counter()
        status = {"code": 500}

        length, limit, setting = self.body_limit(scope)
        too_big = length is not None and length > limit
        unauthorized = (
            self.api_key is not None
            and scope["method"] in ("POST", "PUT")
            and scope["path"].endswith(KEYED_BODY_PATHS)
            and not has_api_key(scope, self.api_key)
        )
        docs = scope["path"] in ("/docs", "/redoc") or scope["path"].startswith("/static/swagger")

        async def send_wrapper(message):
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
                headers = response_headers(message.get("headers", []), rid, docs)
                message = {**message, "headers": headers}
            await send(message)

        received = {"n": 0}

        async def receive_wrapper():
            message = await receive()
            if message["type"] == "http.request":
                received["n"] += len(message.get("body", b""))
                if received["n"] > limit:
                    raise HTTPException(413, _too_large(limit, setting))
            return message

        try:
            if unauthorized:
                await _drain(receive, DRAIN_FACTOR * self.max_json)
                await _send_json(
                    send_wrapper,
                    401,
                    "authorization: this write needs 'Authorization: Bearer <API key>' "
                    "(missing or wrong)",
                    [(b"www-authenticate", b"Bearer")],
                )
            elif too_big:
                # read (and drop) the body first: once the answer is complete the
                # server stops reading and closes, and the client sees a reset
                await _drain(receive, DRAIN_FACTOR * limit)
                await _send_413(send_wrapper, _too_large(limit, setting))
            else:
                await self.app(scope, receive_wrapper, send_wrapper)
        finally:
            route = scope.get("route")
            self.record(scope, getattr(route, "path", None), status["code"], t0, rid)
            request_id.reset(token)

    def body_limit(self, scope) -> tuple[int | None, int, str]:
        """``(Content-Length or None, the route's cap, the setting naming it)``."""
        length = None
        limit, setting = self.max_body, "HYPSEARCH_MAX_UPLOAD_BYTES"
        for k, v in scope.get("headers", ()):
            if k == b"content-length":
                try:
                    length = int(v)
                except ValueError:
                    length = None
            elif k == b"content-type" and _is_json(v):
                if scope["path"].endswith("/search/batch"):
                    limit = self.max_search_batch_json
                    setting = "HYPSEARCH_MAX_SEARCH_BATCH_BYTES"
                elif scope["path"].endswith(BATCH_PATHS):
                    limit, setting = self.max_batch_json, "HYPSEARCH_MAX_BATCH_BYTES"
                else:
                    limit, setting = self.max_json, "HYPSEARCH_MAX_JSON_BYTES"
        return length, limit, setting

    def record(self, scope, template: str | None, status: int, t0: float, rid: str) -> None:
        """The request's latency in the histogram and its line in the access log."""
        ms = (time.perf_counter() - t0) * 1000
        template = template or "unmatched"
        self.metrics.requests.labels(template, scope["method"], str(status)).observe(ms / 1000)
        self.log.info(
            "%s %s %d %.1fms",
            scope["method"],
            scope["path"],
            status,
            ms,
            extra={
                "method": scope["method"],
                "path": scope["path"],
                "route": template,
                "status": status,
                "ms": round(ms, 2),
                "request_id": rid,
            },
        )


def request_id_of(scope) -> str:
    """The request's ``X-Request-ID`` when well formed, else a made-up one."""
    for k, v in scope.get("headers", ()):
        if k == b"x-request-id":
            cand = v.decode("latin-1")
            if _REQUEST_ID_OK.match(cand):
                return cand
            break
    return f"{_ID_PREFIX}{next(_ID_COUNTER):08x}"


def response_headers(headers, rid: str, docs: bool = False) -> list[tuple[bytes, bytes]]:
    """An answer's headers with the request id and the security headers it lacks."""
    out = list(headers)
    out.append((b"x-request-id", rid.encode()))
    have = {k.lower() for k, _ in out}
    for k, v in SECURITY_HEADERS:
        if k not in have:
            out.append((k, DOCS_CSP if docs and k == SECURITY_HEADERS[0][0] else v))
    return out


#: a refused body is read (and dropped) up to this many times the limit, so that
#: clients that send the whole body before reading the answer (Python's urllib,
#: curl without Expect) see the 413 instead of a connection reset; past it the
#: connection is closed.
DRAIN_FACTOR = 8


async def _drain(receive, bound: int) -> None:
    """Read the request body to its end, or until ``bound`` bytes were read."""
    n = 0
    while n <= bound:
        message = await receive()
        if message["type"] != "http.request":
            return
        n += len(message.get("body", b""))
        if not message.get("more_body", False):
            return


def _is_json(content_type: bytes) -> bool:
    mime = content_type.split(b";", 1)[0].strip().lower()
    return mime == b"application/json" or mime.endswith(b"+json")


def _too_large(limit: int, setting: str = "HYPSEARCH_MAX_UPLOAD_BYTES") -> str:
    return f"request body is over the limit of {limit:,} bytes ({setting})"


def has_api_key(scope, key: bytes) -> bool:
    """Whether the request carries ``Authorization: Bearer <key>``."""
    for k, v in scope.get("headers", ()):
        if k == b"authorization":
            scheme, _, token = v.partition(b" ")
            return scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), key)
    return False


async def _send_413(send, detail: str) -> None:
    await _send_json(send, 413, detail)


async def _send_json(send, status: int, detail: str, headers=()) -> None:
    body = json.dumps({"detail": detail}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
