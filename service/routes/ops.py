"""Health, readiness, statistics and Prometheus metrics."""

from __future__ import annotations

from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from ..collections import SEE_THE_LOG
from ..deps import AppServicesDep, RuntimeDep
from ..errors import ApiError
from ..schemas import HealthOut, StatsOut, errors
from .declare import Routes

router = APIRouter(tags=["ops"])
routes = Routes(router)


@routes.read("get", "/healthz", HealthOut, "200 while the process runs")
def healthz() -> HealthOut:
    return HealthOut(status="ok")


@routes.read(
    "get",
    "/readyz",
    HealthOut,
    "200 once model and index are loaded, 503 before",
    errors=errors({503: "still loading, or loading failed"}),
)
def readyz(services: AppServicesDep) -> HealthOut:
    if services.slot.served is None:
        if services.load_error:
            raise ApiError(503, f"loading failed ({SEE_THE_LOG})")
        raise ApiError(503, "loading the model and the index")
    return HealthOut(status="ready")


@routes.read(
    "get",
    "/v1/stats",
    StatsOut,
    "Size and space of the index, and the model's version",
    errors=errors(503),
)
def stats(rt: RuntimeDep) -> StatsOut:
    return StatsOut(
        items=len(rt),
        dim=rt.dim,
        curvature=rt.curvature,
        model=rt.model_version,
        labels=len(rt.used_labels()),
        taxonomy=len(rt.taxonomy),
        backend=rt.index.backend,
        space=rt.space_name,
    )


@routes.read(
    "get",
    "/metrics",
    None,
    "Prometheus metrics (text format)",
    response_class=Response,
    errors={200: {"content": {"text/plain": {}}, "description": "Prometheus text format"}},
)
def metrics(services: AppServicesDep) -> Response:
    return Response(generate_latest(services.metrics.registry), media_type=CONTENT_TYPE_LATEST)
