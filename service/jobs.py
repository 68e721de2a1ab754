"""Background index jobs: one at a time, with progress and cancel.

A job reads a folder or a manifest under the configured data roots
(:func:`service.ingest.roots.check_under_roots`) and runs the one durable, resumable
build of the CLI and the demo (:func:`service.ingest.build.build_index`:
multi-worker loader, batched inference): the ids to embed are those not in the
index when the job starts, and every batch is written through
:meth:`service.runtime.Runtime.upsert` (durable, tallies kept) before the
next one is read. So an item deleted while a job runs stays deleted; a
cancelled or failed job keeps the batches it wrote, and running it again
resumes after them. Searches keep being answered while a job runs (its
embedding runs in a background thread; each write takes the index's write lock
for one batch).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from indexing.batches import BuildReport

from .errors import ApiError
from .ingest.build import build_index
from .ingest.plans import plan_path
from .ingest.roots import BuildInputError, OutsideRootsError, check_under_roots

log = logging.getLogger("service")

MAX_JOBS_KEPT = 100


@dataclass
class Job:
    id: str
    path: str
    class_map: dict[str, str] | None
    state: str = "queued"
    total: int | None = None
    done: int = 0
    indexed: int = 0
    report: BuildReport | None = None
    error: str | None = None
    created_at: float = field(default_factory=time.time)
    started_at: float | None = None
    finished_at: float | None = None
    cancel: threading.Event = field(default_factory=threading.Event)

    def as_dict(self) -> dict:
        rep = self.report
        skipped = int(sum(rep.skipped.values())) if rep else 0
        end = self.finished_at or time.time()
        rate = None
        if self.started_at is not None and end > self.started_at:
            rate = round(self.done / (end - self.started_at), 1)
        total = self.total
        return {
            "id": self.id,
            "state": self.state,
            "path": self.path,
            "total": total,
            "done": self.done,
            "indexed": self.indexed,
            "skipped": skipped,
            "progress": (1.0 if self.state == "succeeded" else min(1.0, self.done / total))
            if total
            else 0.0,
            "images_per_second": rate,
            "skipped_reasons": dict(rep.skipped) if rep else {},
            "skipped_examples": [
                {"source": s, "reason": r} for s, r in (rep.examples if rep else [])
            ],
            "error": self.error,
            "created_at": self.created_at,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
        }


class JobManager:
    """Runs index jobs in a background thread, one at a time."""

    def __init__(self, runtime_getter, settings, metrics=None) -> None:
        self._runtime = runtime_getter
        self.settings = settings
        self.metrics = metrics
        self._jobs: dict[str, Job] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._current: Job | None = None
        self._held: str | None = None  # why new jobs are refused (hold)

    def get(self, job_id: str) -> Job:
        job = self._jobs.get(job_id)
        if job is None:
            raise ApiError(404, f"job: no job {job_id!r}")
        return job

    def all(self) -> list[Job]:
        return sorted(self._jobs.values(), key=lambda j: j.created_at, reverse=True)

    def submit(self, path: str, class_map: dict[str, str] | None) -> Job:
        roots = self.settings.data_roots
        try:
            real = check_under_roots(path, roots)
        except OutsideRootsError as e:
            raise ApiError(403, str(e)) from None
        except (BuildInputError, ValueError) as e:
            raise ApiError(
                422, str(e) if isinstance(e, BuildInputError) else f"path: {e}"
            ) from None
        if not real.exists():
            raise ApiError(404, f"path: {path} does not exist")
        if not (real.is_dir() or (real.is_file() and real.suffix.lower() == ".csv")):
            raise ApiError(422, f"path: {path} is neither a folder nor a .csv manifest")
        with self._lock:
            if self._held is not None:
                raise ApiError(409, self._held)
            if self._current is not None and self._current.state in ("queued", "running"):
                raise ApiError(
                    409,
                    f"job {self._current.id} is {self._current.state}; one job runs at a time",
                    job=self._current.id,
                )
            job = Job(uuid.uuid4().hex[:12], path, class_map)
            self._jobs[job.id] = job
            self._current = job
            if len(self._jobs) > MAX_JOBS_KEPT:
                for old in sorted(self._jobs.values(), key=lambda j: j.created_at)[:-MAX_JOBS_KEPT]:
                    if old.state not in ("queued", "running"):
                        del self._jobs[old.id]
            self._thread = threading.Thread(
                target=self._run, args=(job, real), name=f"job-{job.id}", daemon=True
            )
            self._thread.start()
        return job

    @contextmanager
    def hold(self, why: str, what: str) -> Iterator[None]:
        """Refuse new jobs (409 with ``why``) while the block runs; refuse the block
        itself (409) while a job is queued or running, since it writes into the index
        that ``what`` would replace."""
        with self._lock:
            cur = self._current
            if cur is not None and cur.state in ("queued", "running"):
                raise ApiError(
                    409,
                    f"job {cur.id} is {cur.state} and writes into the default collection: "
                    f"{what} once it ends (or cancel it: DELETE /v1/index/jobs/{cur.id})",
                    job=cur.id,
                )
            if self._held is not None:
                raise ApiError(409, self._held)
            self._held = why
        try:
            yield
        finally:
            with self._lock:
                self._held = None

    def cancel(self, job_id: str) -> Job:
        job = self.get(job_id)
        if job.state in ("queued", "running"):
            job.cancel.set()
        return job

    def close(self, timeout: float = 30.0) -> None:
        cur = self._current
        if cur is not None:
            cur.cancel.set()
        t = self._thread
        if t is not None:
            t.join(timeout)

    def _progress(self, job: Job, n: int) -> None:
        job.done += n
        if self.metrics is not None and job.total:
            self.metrics.job_progress.labels(job.id).set(min(1.0, job.done / job.total))

    def _run(self, job: Job, real: Path) -> None:
        job.state = "running"
        job.started_at = time.time()
        log.info("index job %s started on %s", job.id, job.path, extra={"job": job.id})
        rt = self._runtime()
        try:
            if rt.model is None:
                raise BuildInputError("no image model is loaded; index jobs need one")
            plan = plan_path(
                real, taxonomy=rt, class_map=job.class_map, roots=self.settings.data_roots
            )
            job.total = len(plan.sources) + len(plan.skipped)
            job.report = BuildReport(plan.name)

            def write(ids, vectors, labels, payloads):
                rt.upsert(ids, vectors, labels, payloads)
                job.indexed += len(ids)
                if self.metrics is not None:
                    self.metrics.items.set(len(rt))
                    self.metrics.job_images.labels("indexed").inc(len(ids))

            build_index(
                rt.model,
                rt.index,
                plan,
                batch_size=self.settings.job_batch_size,
                workers=self.settings.job_workers,
                write=write,
                labels_in_use=rt.used_labels,
                report=job.report,
                cancel=job.cancel,
                on_progress=lambda n: self._progress(job, n),
                mp_context="spawn",
                max_pixels=self.settings.max_image_pixels,
            )
            if self.metrics is not None:
                self.metrics.job_images.labels("skipped").inc(sum(job.report.skipped.values()))
            if job.report.cancelled or job.cancel.is_set():
                job.state = "cancelled"
                return
            job.state = "succeeded"
        except (BuildInputError, ValueError) as e:
            job.state, job.error = "failed", str(e)
        except Exception as e:  # noqa: BLE001 - reported in the job, logged in full
            log.exception("index job %s failed", job.id, extra={"job": job.id})
            job.state, job.error = "failed", f"{type(e).__name__}: {e}"
        finally:
            job.finished_at = time.time()
            log.info("index job %s %s", job.id, job.state, extra={"job": job.id})
