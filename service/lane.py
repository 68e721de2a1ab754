"""The search lane of ``hypsearch serve``: uvicorn's HTTP protocol (httptools) with
the searches of :class:`service.fastpath.SearchFastPath` answered below ASGI.

Under load the layers between the socket and a search cost more than the search:
uvicorn's ASGI cycle (the scope, a task, the receive / send messages, every
header checked against a pattern), then Starlette's and FastAPI's middleware and
:class:`service.observability.RequestMiddleware`, and the answer written in two
system calls (headers, then body).  :class:`LaneProtocol` is uvicorn's
:class:`~uvicorn.protocols.http.httptools_impl.HttpToolsProtocol` (the same
parser, keep-alive, pipelining, limits and shutdown) in which a request that
the fast path claims (``POST`` of a search with a small JSON or multipart body)
is answered by :meth:`SearchFastPath.attempt` and written in one call: status
line, uvicorn's default headers, the answer's, the request id and the security
headers (those of :func:`service.observability.response_headers`), and the body.
It is timed and logged as :class:`RequestMiddleware` does
(:meth:`RequestMiddleware.record`).

Anything else, and any claimed request the fast path leaves to the route (its
body replayed), runs through the ASGI app as before: every error answer is the
route's own.  ``HYPSEARCH_SEARCH_FAST_PATH=0`` turns the lane off with the fast
path.
"""

from __future__ import annotations

import time

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from .fastpath import TRIED, SearchFastPath
from .observability import RequestMiddleware, request_id, request_id_of, response_headers

__all__ = ["Lane", "LaneProtocol", "protocol_class", "uvicorn_config"]


class Lane:
    """What the protocol needs of the app: its fast path and its request middleware
    (limits, metrics and access log), both configured as the app's own."""

    def __init__(self, fast: SearchFastPath, requests: RequestMiddleware) -> None:
        self.fast = fast
        self.requests = requests

    def claim(self, scope):
        """The fast path's claim on a request within the app's body limits, else
        ``None``."""
        claim = self.fast.claim(scope)
        if claim is None:
            return None
        length, limit, _ = self.requests.body_limit(scope)
        if length is None or length > limit:
            return None
        return claim


class LaneProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the search lane (see the module docstring)."""

    lane: Lane | None = None

    def _start_asgi_task(self, cycle, app) -> None:
        lane = self.lane
        claim = lane.claim(cycle.scope) if lane is not None and app is self.app else None
        if claim is None:
            super()._start_asgi_task(cycle, app)
            return
        task = self.loop.create_task(self._answer(cycle, app, lane, claim))
        task.add_done_callback(self.tasks.discard)
        self.tasks.add(task)

    async def _answer(self, cycle, app, lane: Lane, claim) -> None:
        scope = cycle.scope
        rid = request_id_of(scope)
        token = request_id.set(rid)
        t0 = time.perf_counter()
        try:
            payload, body = await lane.fast.attempt(scope, cycle.receive, claim)
        except Exception as exc:  # as uvicorn answers an app's exception
            cycle.logger.error("Exception in the search lane", exc_info=exc)
            if not cycle.response_started and not cycle.disconnected:
                await cycle.send_500_response()
            return
        finally:
            request_id.reset(token)
        if payload is None:
            if body is not None and not cycle.disconnected:  # the route answers it
                scope[TRIED] = True
                cycle.body = bytearray(body)
                cycle.more_body = False
                cycle.message_event.set()
                await cycle.run_asgi(app)
            return
        if cycle.disconnected:
            return
        headers = response_headers(
            [
                *cycle.default_headers,
                (b"content-length", str(len(payload)).encode()),
                (b"content-type", b"application/json"),
            ],
            rid,
        )
        if not cycle.keep_alive:
            headers.append((b"connection", b"close"))
        head = [STATUS_LINE[200]]
        for name, value in headers:
            head += [name, b": ", value, b"\r\n"]
        head += [b"\r\n", payload]
        cycle.response_started = cycle.response_complete = True
        cycle.transport.write(b"".join(head))
        cycle.message_event.set()
        try:
            route = lane.fast.routes.get(claim[0])
            lane.requests.record(scope, getattr(route, "path", None), 200, t0, rid)
        finally:  # the connection goes on (keep-alive, the next pipelined request) whatever
            if not cycle.keep_alive:
                cycle.transport.close()
            cycle.on_response()


def protocol_class(lane: Lane) -> type[LaneProtocol]:
    """The protocol class for ``uvicorn.Config(http=...)`` serving ``lane``."""
    return type("LaneProtocol", (LaneProtocol,), {"lane": lane})


def uvicorn_config(app, **kwargs):
    """``uvicorn.Config(app, **kwargs)`` with the app's lane (``app.state.lane``) as its
    HTTP protocol, when it has one."""
    import uvicorn

    lane = getattr(app.state, "lane", None)
    return uvicorn.Config(app, http="auto" if lane is None else protocol_class(lane), **kwargs)
