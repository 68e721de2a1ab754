"""Snapshots of a collection over REST: create, list, download, delete, restore.

A snapshot is a tar of the index's store, snapshot file and manifest, with
``checksums.json`` (the sha256 of every file); a download carries the tar's own
sha256 in the ``X-Checksum-Sha256`` header. A restore (of a kept snapshot or of
an uploaded one) verifies every checksum and opens the index in a new folder
before the collection is switched to it: a corrupt upload is answered 422 and
leaves the collection as it was. The default collection is restored in place,
at its ``HYPSEARCH_INDEX`` folder (:meth:`service.collections.Collections._restore_default`:
requests wait for it, index jobs are refused while it runs, a crash midway is
finished at the next start by :func:`indexing.swap.recover`).
"""

from __future__ import annotations

import shutil
import tempfile
import uuid
from pathlib import Path as FsPath
from typing import Annotated, Any

from fastapi import APIRouter, File, Path, Query, UploadFile
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import FileResponse
from pydantic import BaseModel, Field

from ..collections import SNAPSHOT_PATTERN
from ..deps import SettingsDep
from ..schemas import INVALID, errors
from .collections import ERRORS, CollectionName, CollectionsDep
from .declare import Routes

router = APIRouter(
    prefix="/v1/collections/{collection}/snapshots", tags=["snapshots"], responses=INVALID
)

routes = Routes(router, ERRORS)

SnapshotId = Annotated[str, Path(pattern=SNAPSHOT_PATTERN, max_length=40)]
CHECKSUM_HEADER = "X-Checksum-Sha256"


class SnapshotCreated(BaseModel):
    snapshot: str


class SnapshotOut(BaseModel):
    snapshot: str
    collection: str
    space: str | None
    items: int | None
    created: str | None
    bytes: int
    sha256: str = Field(description="sha256 of the tar (the download's X-Checksum-Sha256)")
    uploaded: str | None = None


class RestoredOut(BaseModel):
    collection: str
    snapshot: str
    restored: bool
    items: int


class SnapshotDeletedOut(BaseModel):
    snapshot: str
    deleted: bool


RESTORE = errors(
    {
        409: "the default collection: an index job or another restore is running",
        413: "its files are over HYPSEARCH_MAX_SNAPSHOT_BYTES",
        422: "not a snapshot, corrupt, or another space",
        503: "requests still used the old index after 60 s",
    }
)


@routes.write("post", "", SnapshotCreated, "Snapshot the collection (checksummed)", status_code=201)
async def create_snapshot(collection: CollectionName, colls: CollectionsDep) -> dict[str, Any]:
    info = await run_in_threadpool(colls.create_snapshot, collection)
    return {"snapshot": info["snapshot"]}


@routes.read("get", "", list[SnapshotOut], "The collection's snapshots, oldest first")
def list_snapshots(collection: CollectionName, colls: CollectionsDep) -> list[dict[str, Any]]:
    return colls.snapshots(collection)


@Routes(router).write(
    "get",
    "/{snapshot}",
    None,
    "Download a snapshot (a tar; its sha256 in X-Checksum-Sha256)",
    response_class=FileResponse,
    errors={200: {"content": {"application/x-tar": {}}, "description": "the snapshot"}, **ERRORS},
)
def download_snapshot(
    collection: CollectionName, snapshot: SnapshotId, colls: CollectionsDep
) -> FileResponse:
    """Needs the API key when one is set (a snapshot holds every item)."""
    tar, meta = colls.snapshot_file(collection, snapshot)
    return FileResponse(
        tar,
        media_type="application/x-tar",
        filename=f"{meta['collection']}-{snapshot}.tar",
        headers={CHECKSUM_HEADER: meta["sha256"]},
    )


@routes.write("delete", "/{snapshot}", SnapshotDeletedOut, "Delete a kept snapshot")
def delete_snapshot(
    collection: CollectionName, snapshot: SnapshotId, colls: CollectionsDep
) -> dict[str, Any]:
    return colls.delete_snapshot(collection, snapshot)


@routes.write(
    "post",
    "/{snapshot}/restore",
    RestoredOut,
    "Restore a kept snapshot into the collection (atomically)",
    errors=RESTORE,
)
async def restore_snapshot(
    collection: CollectionName, snapshot: SnapshotId, colls: CollectionsDep
) -> dict[str, Any]:
    """Every checksum is verified and the index opened before the collection
    switches to it; searches meanwhile are answered by the old state. `default`
    is restored in place: its requests wait for the swap (then see the restored
    state), and it is refused (409) while an index job runs."""
    return await run_in_threadpool(colls.restore, collection, snapshot)


@routes.write(
    "post",
    "/upload",
    RestoredOut,
    "Restore an uploaded snapshot tar into the collection (kept as a snapshot)",
    errors={**RESTORE, **errors({413: "over HYPSEARCH_MAX_UPLOAD_BYTES"})},
)
async def upload_snapshot(
    collection: CollectionName,
    colls: CollectionsDep,
    settings: SettingsDep,
    file: Annotated[UploadFile, File(description="a snapshot tar, as downloaded")],
    sha256: Annotated[
        str | None,
        Query(pattern=r"^[0-9a-fA-F]{64}$", description="the tar's sha256, checked when given"),
    ] = None,
) -> dict[str, Any]:
    colls.resolve(collection)  # 404 before the upload is copied
    tmp_dir = FsPath(settings.home) / "collections"
    tmp_dir.mkdir(parents=True, exist_ok=True)

    def save() -> FsPath:
        fd, name = tempfile.mkstemp(prefix=f".upload-{uuid.uuid4().hex[:8]}-", dir=tmp_dir)
        with open(fd, "wb") as out:
            shutil.copyfileobj(file.file, out, 1 << 20)
        return FsPath(name)

    path = await run_in_threadpool(save)
    try:
        return await run_in_threadpool(colls.restore_upload, collection, path, sha256)
    finally:
        path.unlink(missing_ok=True)
