"""One line a route: :class:`Routes` declares a router's routes with what they share.

Every route of a module answers the same error responses (the module's
``ERRORS``), and every write needs the API key (``WriteAccess``); a route adds
its own errors and options::

    routes = Routes(router, ERRORS)

    @routes.read("get", "/v1/aliases", dict[str, str], "Every alias and the collection it names")
    def list_aliases(...): ...

    @routes.write("delete", "/v1/aliases/{alias}", AliasDeletedOut, "Delete an alias")
    def delete_alias(...): ...

which is ``router.get(path, response_model=..., summary=..., responses=ERRORS)``
and ``router.delete(..., dependencies=[WriteAccess], responses=ERRORS)``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from fastapi import APIRouter

from ..deps import WriteAccess

__all__ = ["Routes"]


class Routes:
    """The routes of ``router``; ``errors``: the responses every one of them declares
    (a route's own ``errors`` are added after them)."""

    def __init__(self, router: APIRouter, errors: Mapping[int, dict] | None = None) -> None:
        self.router = router
        self.errors = dict(errors or {})

    def read(
        self, method: str, path: str, out: Any, summary: str, **options: Any
    ) -> Callable[[Callable], Callable]:
        """A route that anyone may call (``out``: its response model, or None)."""
        return self._route(method, path, out, summary, [], options)

    def write(
        self, method: str, path: str, out: Any, summary: str, **options: Any
    ) -> Callable[[Callable], Callable]:
        """A route that needs the API key when one is set."""
        return self._route(method, path, out, summary, [WriteAccess], options)

    def _route(self, method, path, out, summary, dependencies, options):
        responses = {**self.errors, **options.pop("errors", {})}
        if out is not None:
            options["response_model"] = out
        if responses:
            options["responses"] = responses
        if dependencies:
            options["dependencies"] = dependencies
        return self.router.api_route(path, methods=[method.upper()], summary=summary, **options)
