"""JSON texts a client sends inside something else (a form field, a cursor, a
snapshot's ``checksums.json``), parsed under bounds.

Python's parser recurses once per nesting level: 5,000 ``[`` raise
RecursionError (a 500 if nothing catches it), and a large text costs several
times its size in memory. :func:`loads_bounded` checks the size, then the
nesting depth (a vectorised scan of the brackets outside strings, before any
parsing), then parses; every failure is a 422 (413 for the size) naming the
field and, for a limit, its setting.

Request bodies themselves are capped by size in
:class:`service.observability.RequestMiddleware` and parsed by FastAPI, which
answers a body that does not parse (any error, RecursionError included) 422
through :func:`service.routes.errors.install_error_handlers`.
"""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np

from .errors import ApiError

__all__ = ["json_depth", "loads_bounded"]

#: a JSON string (escapes included); unterminated ones are left as they are
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.S)
_OPEN = np.zeros(256, dtype=np.int8)
_OPEN[[ord("["), ord("{")]] = 1
_OPEN[[ord("]"), ord("}")]] = -1


def json_depth(raw: bytes) -> int:
    """The deepest nesting of arrays and objects in a JSON text (brackets inside
    strings do not count; an unterminated string counts its brackets, which only
    over-counts a text that does not parse anyway)."""
    stripped = _STRING.sub(b'""', raw)
    if not stripped:
        return 0
    steps = _OPEN[np.frombuffer(stripped, dtype=np.uint8)]
    if not steps.any():
        return 0
    return int(np.cumsum(steps, dtype=np.int64).max())


def loads_bounded(
    text: str | bytes,
    field: str,
    *,
    max_bytes: int,
    max_depth: int,
    bytes_setting: str = "HYPSEARCH_MAX_JSON_BYTES",
    depth_setting: str = "HYPSEARCH_MAX_JSON_DEPTH",
) -> Any:
    """``text`` parsed as JSON, or an :class:`ApiError` naming ``field``: 413 over
    ``max_bytes``, 422 nested deeper than ``max_depth`` or not JSON."""
    raw = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else bytes(text)
    if len(raw) > max_bytes:
        raise ApiError(
            413, f"{field}: {len(raw):,} bytes, over the limit of {max_bytes:,} ({bytes_setting})"
        )
    depth = json_depth(raw)
    if depth > max_depth:
        raise ApiError(
            422, f"{field}: JSON nested {depth} deep, at most {max_depth} ({depth_setting})"
        )
    try:
        return json.loads(raw)
    except (ValueError, RecursionError, UnicodeDecodeError) as e:
        raise ApiError(422, f"{field}: not a JSON text ({str(e)[:200]})") from None
