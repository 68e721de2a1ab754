"""Property-based run of every endpoint from the OpenAPI schema (schemathesis).

A real uvicorn server on 127.0.0.1 (in a thread of this process, around a small
real index); every operation gets a bounded number of generated requests,
valid and invalid. No response may be a 5xx, every response must match the
schema (status code documented, content type, body shape), and every 4xx must
carry a one-line ``detail`` (issue 32). ``HYPSEARCH_FUZZ_EXAMPLES`` raises the
budget for a longer run (benchmarks, by hand).
"""

from __future__ import annotations

import os
import threading
import time

import pytest
import torch

from tests.support.server import artifacts, free_port, make_runtime, needs_data

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, settings  # noqa: E402
from schemathesis.checks import (  # noqa: E402
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

pytestmark = needs_data


def error_has_detail(ctx, response, case) -> None:
    """Every 4xx answer is JSON with a non-empty string ``detail``."""
    if 400 <= response.status_code < 500:
        try:
            body = response.json()
        except ValueError:
            raise AssertionError(f"{response.status_code} without a JSON body") from None
        detail = body.get("detail") if isinstance(body, dict) else None
        if not isinstance(detail, str) or not detail:
            raise AssertionError(f"{response.status_code} without detail: {str(body)[:200]}")


CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    error_has_detail,
]
MAX_EXAMPLES = int(os.environ.get("HYPSEARCH_FUZZ_EXAMPLES", "50"))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    import uvicorn

    from service.app import create_app
    from service.lane import uvicorn_config
    from service.settings import Settings

    torch.set_num_threads(1)
    art = artifacts(tmp_path_factory)
    folder = tmp_path_factory.mktemp("schemathesis")
    rt = make_runtime(art, folder, n=300)
    (folder / "data").mkdir()
    s = Settings(
        home=folder / "home",  # collections the run creates live there
        index=rt.index.path,
        data_roots=str(folder / "data"),
        log_json=False,
        log_level="ERROR",
        max_upload_bytes=256 * 1024,
        job_workers=0,
    )
    app = create_app(s, runtime=rt, owns_runtime=True)
    port = free_port()
    srv = uvicorn.Server(  # the protocol `hypsearch serve` runs (service.lane)
        uvicorn_config(app, host="127.0.0.1", port=port, log_level="error", lifespan="on")
    )
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not srv.started:
        assert time.monotonic() < deadline and thread.is_alive(), "server did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    srv.should_exit = True
    thread.join(30)


def test_every_endpoint(server):
    """Positive and negative cases of every operation; all failures listed at the end."""
    from hypothesis import given
    from hypothesis.errors import Unsatisfiable
    from schemathesis.generation import GenerationMode

    api = schemathesis.openapi.from_url(server + "/openapi.json")
    failures: list[str] = []
    operations = 0
    labels = set()
    for result in api.get_all_operations():
        op = result.ok()
        operations += 1
        labels.add(op.label)
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            @given(case=op.as_strategy(generation_mode=mode))
            @settings(
                max_examples=MAX_EXAMPLES,
                deadline=None,
                derandomize=True,
                database=None,
                suppress_health_check=list(HealthCheck),
            )
            def run(case):
                case.call_and_validate(base_url=server, checks=CHECKS, timeout=30)

            try:
                run()
            except Unsatisfiable:  # no parameters: nothing to make invalid
                assert mode == GenerationMode.NEGATIVE, op.label
            except (Exception, BaseExceptionGroup) as e:  # noqa: BLE001 - reported together
                failures.append(f"{op.label} ({mode.value}): {type(e).__name__}: {str(e)[:1500]}")
    assert operations >= 21
    # collections, aliases, snapshots and the per-collection copies are in the run
    for label in (
        "POST /v1/collections",
        "DELETE /v1/collections/{collection}",
        "PUT /v1/aliases/{alias}",
        "POST /v1/collections/{collection}/snapshots/upload",
        "POST /v1/collections/{collection}/snapshots/{snapshot}/restore",
        "POST /v1/collections/{collection}/search",
        "PUT /v1/collections/{collection}/items/{item_id}",
    ):
        assert label in labels, label
    assert not failures, "\n\n".join(failures)
