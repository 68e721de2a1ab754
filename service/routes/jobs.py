"""Batch index jobs from a server-side folder or manifest (one at a time)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path

from ..deps import JobsDep, WriteAccess
from ..schemas import INVALID, JobIn, JobOut, errors
from .declare import Routes

# jobs name server-side paths: every route needs the key, when one is set (reads too)
router = APIRouter(
    prefix="/v1/index/jobs",
    tags=["jobs"],
    dependencies=[WriteAccess],
    responses={**INVALID, **errors(401, 503)},
)
#: the router's dependency asks for the key: a route is declared "read" not to repeat it
routes = Routes(router)
JobId = Annotated[str, Path(max_length=64)]


@routes.read(
    "post",
    "",
    JobOut,
    "Start indexing a folder DIR/<class>/<images> or a CSV manifest id,path[,label]",
    status_code=202,
    errors=errors(
        {
            403: "the path is outside the data roots (or none are set)",
            404: "the path does not exist",
            409: "another job is running",
        },
        422,
    ),
)
def start_job(body: JobIn, jobs: JobsDep) -> JobOut:
    """The path must lie under one of `HYPSEARCH_DATA_ROOTS` (absolute, no `..`,
    no symlink leading out). The job runs in the background; poll
    `GET /v1/index/jobs/{job}`. Every batch of items is durable and searchable
    once written (a job run again over the same path resumes after them);
    unreadable pictures are skipped and listed, not fatal."""
    return JobOut(**jobs.submit(body.path, body.class_map).as_dict())


@routes.read("get", "", list[JobOut], "Recent jobs, newest first")
def list_jobs(jobs: JobsDep) -> list[JobOut]:
    return [JobOut(**j.as_dict()) for j in jobs.all()]


@routes.read("get", "/{job}", JobOut, "State and progress of a job", errors=errors(404))
def get_job(job: JobId, jobs: JobsDep) -> JobOut:
    return JobOut(**jobs.get(job).as_dict())


@routes.read(
    "delete",
    "/{job}",
    JobOut,
    "Cancel a queued or running job (the batches it already wrote stay)",
    errors=errors(404),
)
def cancel_job(job: JobId, jobs: JobsDep) -> JobOut:
    return JobOut(**jobs.cancel(job).as_dict())
