"""The search lane (service.lane): uvicorn's protocol answering the fast path's searches
below ASGI, on a real server on loopback.

What must hold: the lane answers exactly what the ASGI app answers (body, status,
the request id and security headers), leaves every error to the route, keeps a
connection's answers in order (pipelined requests), honours ``Connection: close``,
survives a client that goes away mid-body, and counts its requests in the metrics.
"""

from __future__ import annotations

import json
import socket
import time

import httpx
import pytest
import torch

from tests.support.server import LoopbackServer, artifacts, needs_data, png_bytes

pytestmark = needs_data


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    torch.set_num_threads(1)
    art = artifacts(tmp_path_factory)
    folder = tmp_path_factory.mktemp("lane")
    srv = LoopbackServer(art, folder, n=200)
    lane = srv.app.state.lane
    assert lane is not None
    calls = {"n": 0}
    attempt = lane.fast.attempt

    async def counted(*args, **kwargs):  # the real attempt, counted
        calls["n"] += 1
        return await attempt(*args, **kwargs)

    lane.fast.attempt = counted
    yield srv, calls
    srv.stop()


def _asgi(app, method: str, path: str, **kw) -> httpx.Response:
    """The same request through the ASGI app alone (no lane)."""
    import asyncio

    async def go():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://asgi") as c:
            return await c.request(method, path, **kw)

    return asyncio.run(go())


def _vector(srv) -> list[float]:
    """A stored item's point."""
    with httpx.Client(base_url=srv.url, timeout=30) as c:
        got = c.post("/v1/search", json={"label": "sneaker", "k": 1, "with_vector": True})
        return got.json()["results"][0]["vector"]


def test_the_lane_answers_what_the_app_answers(env):
    srv, calls = env
    vec = _vector(srv)
    bodies = [
        {"vector": vec, "k": 7},
        {"label": "sneaker", "k": 5},
        {"label": "footwear", "k": 8, "mode": "hierarchical"},
        {"vector": vec, "k": 3, "with_payload": True, "with_vector": True},
    ]
    with httpx.Client(base_url=srv.url, timeout=30) as c:
        for body in bodies:
            before = calls["n"]
            got = c.post("/v1/search", json=body, headers={"x-request-id": "lane-test-1"})
            assert calls["n"] == before + 1  # the lane took it
            want = _asgi(srv.app, "POST", "/v1/search", json=body)
            assert got.status_code == want.status_code == 200
            assert got.content == want.content
            assert got.headers["x-request-id"] == "lane-test-1"
            for h in ("content-security-policy", "x-content-type-options", "x-frame-options"):
                assert got.headers[h] == want.headers[h]
            assert got.headers["content-type"] == "application/json"
            assert int(got.headers["content-length"]) == len(got.content)
        # a picture, through the lane too
        import numpy as np

        png = png_bytes(np.full((28, 28), 128, dtype=np.uint8))
        before = calls["n"]
        got = c.post("/v1/search/image?k=4", files={"file": ("x.png", png, "image/png")})
        assert calls["n"] == before + 1 and got.status_code == 200
        assert len(got.json()["results"]) == 4
        metrics = c.get("/metrics").text
    line = [
        ln
        for ln in metrics.splitlines()
        if ln.startswith("hypsearch_request_seconds_count")
        and 'route="/v1/search"' in ln
        and 'status="200"' in ln
    ]
    assert line and float(line[0].rsplit(" ", 1)[1]) >= len(bodies)


def test_errors_are_the_routes_own(env):
    srv, calls = env
    bad = [
        (b'{"label": "snekaer", "k": 5}', None),
        (b'{"vector": [0.1, 0.2], "k": 5}', None),
        (b'{"k": 5', None),  # not JSON
        (b'{"label": "sneaker", "k": 0}', None),
    ]
    with httpx.Client(base_url=srv.url, timeout=30) as c:
        for raw, _ in bad:
            before = calls["n"]
            got = c.post("/v1/search", content=raw, headers={"content-type": "application/json"})
            want = _asgi(
                srv.app,
                "POST",
                "/v1/search",
                content=raw,
                headers={"content-type": "application/json"},
            )
            assert calls["n"] == before + 1  # claimed, then left to the route
            assert 400 <= got.status_code < 500 and got.status_code == want.status_code
            assert got.json() == want.json() and "detail" in got.json()
            assert "x-request-id" in got.headers
        # a body over HYPSEARCH_MAX_JSON_BYTES is never claimed: the app's 413
        before = calls["n"]
        huge = b'{"label": "sneaker", "pad": "' + b"x" * (2 * 1024 * 1024) + b'"}'
        got = c.post("/v1/search", content=huge, headers={"content-type": "application/json"})
        assert got.status_code == 413 and calls["n"] == before


def _read_answers(sock: socket.socket, n: int, timeout: float = 30.0) -> list[tuple[int, bytes]]:
    """``n`` HTTP/1.1 answers (status, body) read off a raw socket, in order."""
    sock.settimeout(timeout)
    buf = b""
    out = []
    while len(out) < n:
        while b"\r\n\r\n" not in buf:
            chunk = sock.recv(65536)
            assert chunk, f"connection closed after {len(out)} answers"
            buf += chunk
        head, buf = buf.split(b"\r\n\r\n", 1)
        lines = head.split(b"\r\n")
        status = int(lines[0].split()[1])
        length = next(
            int(v)
            for k, _, v in (ln.partition(b":") for ln in lines[1:])
            if k.strip().lower() == b"content-length"
        )
        while len(buf) < length:
            chunk = sock.recv(65536)
            assert chunk
            buf += chunk
        out.append((status, buf[:length]))
        buf = buf[length:]
    return out


def _request(path: str, body: dict | None = None, close: bool = False) -> bytes:
    lines = [f"{'POST' if body is not None else 'GET'} {path} HTTP/1.1", "Host: x"]
    data = b""
    if body is not None:
        data = json.dumps(body).encode()
        lines += ["Content-Type: application/json", f"Content-Length: {len(data)}"]
    if close:
        lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + data


def test_pipelined_requests_are_answered_in_order(env):
    srv, _ = env
    port = int(srv.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(
            _request("/v1/search", {"label": "sneaker", "k": 2})
            + _request("/v1/stats")
            + _request("/v1/search", {"label": "snekaer", "k": 2})
            + _request("/v1/search", {"label": "bag", "k": 3})
        )
        got = _read_answers(s, 4)
    want = _asgi(srv.app, "POST", "/v1/search", json={"label": "snekaer", "k": 2})
    assert [g[0] for g in got] == [200, 200, want.status_code, 200]
    assert json.loads(got[2][1]) == want.json()
    assert json.loads(got[0][1])["query"]["label"] == "gym_shoe.n.01"
    assert "items" in json.loads(got[1][1])
    assert len(json.loads(got[3][1])["results"]) == 3


def test_connection_close_and_a_client_gone_mid_body(env):
    srv, _ = env
    port = int(srv.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(_request("/v1/search", {"label": "sneaker", "k": 2}, close=True))
        s.settimeout(30)
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:  # the server closed the connection after its answer
                break
            data += chunk
    assert data.startswith(b"HTTP/1.1 200") and b"connection: close" in data.lower()
    # a body announced and never finished: the server drops the connection, and
    # answers the next client as ever
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(
            b"POST /v1/search HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 400\r\n\r\n" + b'{"label": "sne'
        )
        time.sleep(0.2)
    with httpx.Client(base_url=srv.url, timeout=30) as c:
        assert c.post("/v1/search", json={"label": "sneaker", "k": 2}).status_code == 200
