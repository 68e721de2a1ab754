"""Every error the API answers: 4xx with ``{"detail": "<what is wrong>"}``.

``detail`` is one line naming the input (``vector: expected 10 numbers ...``,
``label: unknown label 'snekaer'``). Validation errors also carry ``errors``
(``[{"loc", "msg"}]``) and unknown labels ``suggestions`` (close matches).
Nothing a client sends gets a 500: anything unexpected is logged with the
request id and answered 500 with a generic detail.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from indexing import IndexInputError
from indexing.sharded import ShardUnavailableError
from models.taxonomy import UnknownLabelError

log = logging.getLogger("service")


class ApiError(Exception):
    """An error answered as ``status`` with ``detail`` (and optional extra fields)."""

    def __init__(self, status: int, detail: str, **extra: Any) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.extra = extra
        self.headers: dict[str, str] | None = None


def bad_input(detail: str) -> ApiError:
    return ApiError(422, detail)


def not_found(detail: str, suggestions: list[str] | None = None) -> ApiError:
    extra = {"suggestions": suggestions} if suggestions is not None else {}
    return ApiError(404, detail, **extra)


def unknown_label(field: str, e: UnknownLabelError, status: int = 422) -> ApiError:
    """An unknown label: 422 in a body or query, 404 when the path names it."""
    return ApiError(status, f"{field}: {e}", suggestions=list(e.suggestions))


def _where(loc: tuple) -> str:
    """``("body", "vector", 3)`` -> ``vector[3]``; ``("query", "k")`` -> ``k``."""
    out = ""
    for p in loc[1:] if len(loc) > 1 and loc[0] in ("body", "query", "path", "header") else loc:
        if isinstance(p, int):
            out += f"[{p}]"
        else:
            out += f".{p}" if out else str(p)
    return out or "body"


def _validation_detail(errors: list[dict]) -> tuple[str, list[dict]]:
    """One readable line for ``detail`` and a plain ``[{"loc", "msg"}]`` list."""
    lines: list[str] = []
    simple = []
    for e in errors:
        msg = str(e.get("msg", "invalid"))
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, ") :]
        loc = tuple(e.get("loc", ()))
        where = _where(loc)
        simple.append({"loc": [str(p) for p in loc], "msg": msg})
        line = msg if where == "body" or msg.startswith(f"{where}:") else f"{where}: {msg}"
        if line not in lines:
            lines.append(line)
    more = f" (and {len(lines) - 5} more)" if len(lines) > 5 else ""
    return "; ".join(lines[:5]) + more, simple


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(
            {"detail": exc.detail, **exc.extra}, status_code=exc.status, headers=exc.headers
        )

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        detail, errors = _validation_detail(list(exc.errors()))
        return JSONResponse({"detail": detail, "errors": errors}, status_code=422)

    @app.exception_handler(IndexInputError)
    async def _index_input(request: Request, exc: IndexInputError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=422)

    @app.exception_handler(ShardUnavailableError)
    async def _shard_down(request: Request, exc: ShardUnavailableError) -> JSONResponse:
        # a shard restarting: never a partial answer, a retryable 503
        return JSONResponse({"detail": str(exc)}, status_code=503, headers={"Retry-After": "5"})

    @app.exception_handler(UnknownLabelError)
    async def _unknown_label(request: Request, exc: UnknownLabelError) -> JSONResponse:
        return JSONResponse({"detail": str(exc), "suggestions": exc.suggestions}, status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        detail, status = exc.detail, exc.status_code
        if status == 400:
            # FastAPI's and Starlette's answers to a body that does not parse (not UTF-8,
            # malformed multipart): a bad input like any other
            if detail == "There was an error parsing the body":
                detail = "not valid JSON (or not UTF-8 text)"
            detail, status = f"body: {detail}", 422
        elif status == 404 and detail == "Not Found":
            detail = f"no such path {request.url.path}"
        elif exc.status_code == 405:
            detail = f"method {request.method} is not allowed on {request.url.path}"
        return JSONResponse(
            {"detail": detail}, status_code=status, headers=getattr(exc, "headers", None)
        )

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error on %s %s", request.method, request.url.path)
        return JSONResponse({"detail": "internal error (logged)"}, status_code=500)
