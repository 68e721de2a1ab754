"""Every error the API answers: 4xx with ``{"detail": "<what is wrong>"}``.

The one place where errors meet HTTP: :class:`service.errors.ApiError` as it
says, and the domain errors of the layers below (:data:`DOMAIN_ERRORS`: the
runtime's, the index's, the taxonomy's) with their status codes.
``detail`` is one line naming the input (``vector: expected 10 numbers ...``,
``label: unknown label 'snekaer'``). Validation errors also carry ``errors``
(``[{"loc", "msg"}]``) and unknown labels ``suggestions`` (close matches).
Nothing a client sends gets a 500: anything unexpected is logged with the
request id and answered 500 with a generic detail.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from indexing import IndexInputError
from indexing.sharded import ShardUnavailableError
from models.taxonomy.graph import UnknownLabelError

from ..errors import ApiError
from ..pictures import NoPictureFolderError
from ..runtime import LabelsUnsupportedError, RetiredError

log = logging.getLogger("service")

#: the domain errors of the layers below and the status each is answered with
#: (and its headers): the one place they meet HTTP
DOMAIN_ERRORS: dict[type[Exception], tuple[int, dict[str, str] | None]] = {
    IndexInputError: (422, None),
    LabelsUnsupportedError: (422, None),
    RetiredError: (503, {"Retry-After": "1"}),
    # a shard restarting: never a partial answer, a retryable 503
    ShardUnavailableError: (503, {"Retry-After": "5"}),
    NoPictureFolderError: (503, None),
}


def as_api_error(exc: BaseException) -> ApiError | None:
    """The answer to an error: itself for an :class:`ApiError`, the status of
    :data:`DOMAIN_ERRORS` for a domain error (an unknown label: 422 with
    suggestions), ``None`` for anything else (a bug: 500)."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, UnknownLabelError):
        return ApiError(422, str(exc), suggestions=list(exc.suggestions))
    for kind, (status, headers) in DOMAIN_ERRORS.items():
        if isinstance(exc, kind):
            err = ApiError(status, str(exc))
            err.headers = headers
            return err
    return None


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
    async def _answer(request: Request, exc: Exception) -> JSONResponse:
        err = as_api_error(exc)
        return JSONResponse(
            {"detail": err.detail, **err.extra}, status_code=err.status, headers=err.headers
        )

    for kind in (ApiError, UnknownLabelError, *DOMAIN_ERRORS):
        app.add_exception_handler(kind, _answer)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        detail, errors = _validation_detail(list(exc.errors()))
        return JSONResponse({"detail": detail, "errors": errors}, status_code=422)

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
