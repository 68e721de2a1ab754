"""Names of collections, aliases and snapshots, and the time stamps of records."""

from __future__ import annotations

import datetime as _dt
import re

from ..errors import ApiError

DEFAULT = "default"
#: collection, alias and snapshot names: letters, digits, '_' and '-', 64 at most
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$"
_NAME = re.compile(NAME_PATTERN)


def utc_now() -> str:
    return _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def valid_name(name: str) -> bool:
    """Whether ``name`` is a valid collection, alias or snapshot name."""
    return isinstance(name, str) and _NAME.match(name) is not None


def check_name(name: str, what: str = "name") -> str:
    if not valid_name(name):
        raise ApiError(
            422, f"{what}: {name!r} is not a valid name (letters, digits, '_', '-'; 64 at most)"
        )
    return name
