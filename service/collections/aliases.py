"""Aliases: a name that points at a collection, swapped in one registry write."""

from __future__ import annotations

from typing import Any

from ..errors import ApiError
from .names import check_name


class AliasesMixin:
    """Aliases of :class:`service.collections.Collections`."""

    def set_alias(self, alias: str, collection: str) -> dict[str, Any]:
        check_name(alias, "alias")
        check_name(collection, "collection")
        with self._lock:
            if alias in self._entries or alias in self._pending:
                raise ApiError(409, f"alias: {alias!r} is the name of a collection")
            if collection in self._aliases:
                raise ApiError(
                    422, f"collection: {collection!r} is an alias (aliases name collections)"
                )
            if collection not in self._entries:
                raise ApiError(404, f"collection: no collection {collection!r}")
            aliases = {**self._aliases, alias: collection}
            self._write_registry(self._entries, aliases)
            previous = self._aliases.get(alias)
            self._aliases = aliases  # one assignment: a request sees the old or the new map
        return {"alias": alias, "collection": collection, "previous": previous}

    def drop_alias(self, alias: str) -> dict[str, Any]:
        check_name(alias, "alias")
        with self._lock:
            if alias not in self._aliases:
                raise ApiError(404, f"alias: no alias {alias!r}")
            aliases = {a: c for a, c in self._aliases.items() if a != alias}
            self._write_registry(self._entries, aliases)
            self._aliases = aliases
        return {"alias": alias, "deleted": True}
