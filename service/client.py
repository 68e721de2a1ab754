"""A Python client of the hypsearch REST API (httpx).

>>> from service.client import Client
>>> with Client("http://127.0.0.1:8000", api_key=None) as hs:
...     hs.search(label="sneaker", mode="hierarchical", k=5)["results"]
...     shoes = hs.collection("shoes")            # the same methods on another collection
...     shoes.put("a", [0.1] * 10, label="sneaker")

Every method answers the API's JSON (dicts and lists, as docs/api.md documents
them) and raises :class:`HypsearchError` (``status``, ``detail``, the whole
``body``) for every answer that is not a 2xx, and for a server that cannot be
reached (``status`` 0). ``collection=`` (or :meth:`Client.collection`) sends the
item, search, label, stats, scroll and count calls to
``/v1/collections/<name>/...``; without it they go to the default collection.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

__all__ = ["CHECKSUM_HEADER", "Client", "HypsearchError"]

CHECKSUM_HEADER = "X-Checksum-Sha256"
Json = dict[str, Any]
#: a picture: its bytes, or the path of its file
Image = bytes | str | os.PathLike


class HypsearchError(Exception):
    """An answer that is not a 2xx: ``status`` and the API's ``detail`` (``body``:
    the whole JSON answer, with ``suggestions`` or ``errors`` where given).
    ``status`` 0: no answer at all (connection refused, timeout)."""

    def __init__(self, status: int, detail: str, body: Any = None) -> None:
        super().__init__(f"{status}: {detail}")
        self.status = status
        self.detail = detail
        self.body = body


def _picture(image: Image) -> bytes:
    if isinstance(image, bytes | bytearray | memoryview):
        return bytes(image)
    return Path(image).read_bytes()


def _drop_none(d: Mapping[str, Any]) -> Json:
    return {k: v for k, v in d.items() if v is not None}


class Client:
    """The API of one server (``url``); ``api_key`` for writes when the server has
    one; ``timeout`` in seconds per request; ``collection`` as in the module docstring."""

    def __init__(
        self,
        url: str = "http://127.0.0.1:8000",
        *,
        api_key: str | None = None,
        timeout: float = 30.0,
        collection: str | None = None,
        http: httpx.Client | None = None,
    ) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._owns = http is None
        self._http = http or httpx.Client(
            base_url=url.rstrip("/"), headers=headers, timeout=timeout
        )
        self.name = collection

    # -- plumbing -----------------------------------------------------------------------
    def collection(self, name: str) -> Client:
        """A view of this client on the collection (or alias) ``name`` (same connection)."""
        return Client(collection=name, http=self._http)

    def close(self) -> None:
        if self._owns:
            self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _path(self, path: str, scoped: bool) -> str:
        if scoped and self.name is not None:
            return f"/v1/collections/{quote(self.name, safe='')}{path[len('/v1') :]}"
        return path

    def _send(self, method: str, path: str, *, scoped: bool = True, **kw) -> httpx.Response:
        try:
            r = self._http.request(method, self._path(path, scoped), **kw)
        except httpx.HTTPError as e:
            raise HypsearchError(0, f"{type(e).__name__}: {e}") from e
        if r.status_code >= 400:
            try:
                body = r.json()
                detail = body.get("detail", r.text) if isinstance(body, dict) else r.text
            except ValueError:
                body, detail = None, r.text or r.reason_phrase
            raise HypsearchError(r.status_code, str(detail), body)
        return r

    def _json(self, method: str, path: str, **kw) -> Any:
        return self._send(method, path, **kw).json()

    def _coll(self, collection: str | None) -> str:
        return quote(collection or self.name or "default", safe="")

    # -- ops ------------------------------------------------------------------------------
    def health(self) -> Json:
        """``GET /healthz``: ``{"status": "ok"}``."""
        return self._json("GET", "/healthz", scoped=False)

    def ready(self) -> bool:
        """``GET /readyz``: whether model and index are loaded."""
        try:
            self._send("GET", "/readyz", scoped=False)
        except HypsearchError as e:
            if e.status == 503:
                return False
            raise
        return True

    def stats(self) -> Json:
        """``GET /v1/stats``: items, dim, curvature, model, ..."""
        return self._json("GET", "/v1/stats")

    def metrics(self) -> str:
        """``GET /metrics``: Prometheus text."""
        return self._send("GET", "/metrics", scoped=False).text

    # -- search ---------------------------------------------------------------------------
    def search(
        self,
        vector: Sequence[float] | None = None,
        *,
        label: str | None = None,
        id: str | None = None,  # noqa: A002 - the API's name
        k: int = 10,
        offset: int = 0,
        mode: str = "auto",
        levels: str | None = None,
        group_by: str | None = None,
        filter: Json | None = None,  # noqa: A002 - the API's name
        with_vector: bool | None = None,
        with_payload: bool | None = None,
        max_distance: float | None = None,
        **extra: Any,
    ) -> Json:
        """``POST /v1/search`` by exactly one of ``vector``, ``label`` or ``id``:
        ``{"query", "results": [{"id", "score", "distance", "label", "level", "via"}, ...]}``;
        ``mode`` ``auto`` (the server's default: ``entailment`` for a label, ``nearest``
        otherwise), ``entailment``, ``nearest`` or ``hierarchical``; ``group_by="children"``
        (a label query): ``{"query", "groups": [{"label", "count", "results"}, ...]}``."""
        return self._json("POST", "/v1/search", json=self._search_body(**locals()))

    @staticmethod
    def _search_body(**kw: Any) -> Json:
        kw.pop("self", None)
        extra = kw.pop("extra", {}) or {}
        if kw.get("vector") is not None:
            kw["vector"] = [float(v) for v in kw["vector"]]
        return {**_drop_none(kw), **extra}

    def search_hierarchical(self, vector: Sequence[float] | None = None, **kw: Any) -> Json:
        """``search(..., mode="hierarchical")``: results ordered by (level, firmness)."""
        return self.search(vector, mode="hierarchical", **kw)

    def search_image(
        self,
        image: Image,
        *,
        k: int = 10,
        mode: str = "auto",
        filter: Json | None = None,  # noqa: A002 - the API's name
        **params,
    ) -> Json:
        """``POST /v1/search/image`` with a PNG or JPEG (bytes or a file's path);
        ``filter``: a filter expression, as :meth:`search`'s (sent as the form field
        ``filter``, a JSON text)."""
        files = {"file": ("query", _picture(image), "application/octet-stream")}
        q = _drop_none({"k": k, "mode": mode, **params})
        form = {"filter": json.dumps(filter)} if filter is not None else None
        return self._json("POST", "/v1/search/image", files=files, data=form, params=q)

    def search_batch(self, searches: Sequence[Json]) -> list[Json]:
        """``POST /v1/search/batch``: the answers of many search bodies, in order."""
        body = {"searches": [self._search_body(**s) for s in searches]}
        return self._json("POST", "/v1/search/batch", json=body)["answers"]

    def embed(self, image: Image) -> Json:
        """``POST /v1/embed``: ``{"vector", "distance_to_origin", "labels"}``."""
        files = {"file": ("image", _picture(image), "application/octet-stream")}
        return self._json("POST", "/v1/embed", files=files)

    # -- labels ---------------------------------------------------------------------------
    def labels(self, prefix: str = "", limit: int = 20) -> list[str]:
        """``GET /v1/labels``: label names starting with ``prefix``."""
        return self._json("GET", "/v1/labels", params={"prefix": prefix, "limit": limit})

    def label(self, name: str) -> Json:
        """``GET /v1/labels/{name}``: parents, children, ancestors, items, vector, cone."""
        return self._json("GET", f"/v1/labels/{quote(name, safe='')}")

    # -- items ----------------------------------------------------------------------------
    @staticmethod
    def _item(item_id: str) -> str:
        return "/v1/items/" + quote(item_id, safe="/")

    def get(self, item_id: str) -> Json:
        """``GET /v1/items/{id}``: label, vector, distance_to_origin, holder, payload."""
        return self._json("GET", self._item(item_id))

    def put(
        self,
        item_id: str,
        vector: Sequence[float] | None = None,
        *,
        label: str | None = None,
        payload: Json | None = None,
        image: Image | None = None,
    ) -> Json:
        """``PUT /v1/items/{id}``: a vector (JSON) or a picture (multipart), durable
        when this returns."""
        if (vector is None) == (image is None):
            raise ValueError("give exactly one of vector and image")
        if image is not None:
            data = _drop_none({"label": label})
            files = {"file": ("image", _picture(image), "application/octet-stream")}
            return self._json("PUT", self._item(item_id), data=data, files=files)
        body = _drop_none(
            {"vector": [float(v) for v in vector], "label": label, "payload": payload}
        )
        return self._json("PUT", self._item(item_id), json=body)

    def delete(self, item_id: str) -> Json:
        """``DELETE /v1/items/{id}`` (404 raised when there is no such item)."""
        return self._json("DELETE", self._item(item_id))

    def image(self, item_id: str) -> bytes:
        """``GET /v1/items/{id}/image``: the item's picture as PNG bytes."""
        return self._send("GET", self._item(item_id) + "/image").content

    def upsert_batch(self, items: Sequence[Json]) -> int:
        """``POST /v1/items/batch``: all or nothing, durable when this returns; the
        number upserted. Items are ``{"id", "vector" | "image" (base64), "label", "payload"}``."""
        return self._json("POST", "/v1/items/batch", json={"items": list(items)})["upserted"]

    def delete_many(self, ids: Sequence[str] | None = None, *, filter: Json | None = None) -> int:  # noqa: A002
        """``POST /v1/items/delete`` by ``ids`` or by ``filter``: how many were deleted."""
        if (ids is None) == (filter is None):
            raise ValueError("give exactly one of ids and filter")
        body = {"ids": list(ids)} if ids is not None else {"filter": filter}
        return self._json("POST", "/v1/items/delete", json=body)["deleted"]

    def get_many(
        self, ids: Sequence[str], *, with_vector: bool = False, with_payload: bool = False
    ) -> list[Json]:
        """``POST /v1/items/get``: the items among ``ids`` that exist."""
        body = {"ids": list(ids), "with_vector": with_vector, "with_payload": with_payload}
        return self._json("POST", "/v1/items/get", json=body)["items"]

    def scroll(
        self,
        filter: Json | None = None,  # noqa: A002
        *,
        limit: int = 100,
        cursor: str | None = None,
        **extra: Any,
    ) -> Json:
        """``POST /v1/scroll``: one page, ``{"items", "next_cursor"}``."""
        body = {"limit": limit, "cursor": cursor, **_drop_none({"filter": filter}), **extra}
        return self._json("POST", "/v1/scroll", json=body)

    def scroll_all(
        self, filter: Json | None = None, *, limit: int = 100, **extra
    ) -> Iterator[Json]:  # noqa: A002
        """Every item passing ``filter``, page after page (each exactly once)."""
        cursor = None
        while True:
            page = self.scroll(filter, limit=limit, cursor=cursor, **extra)
            yield from page["items"]
            cursor = page.get("next_cursor")
            if cursor is None:
                return

    def count(self, filter: Json | None = None, *, label: str | None = None) -> int:  # noqa: A002
        """``POST /v1/count``: how many items pass ``filter`` (all without); with
        ``label``, of the items that label's cone holds."""
        body = _drop_none({"filter": filter, "label": label})
        return self._json("POST", "/v1/count", json=body)["count"]

    def facets(self, label: str, filter: Json | None = None) -> list[Json]:  # noqa: A002
        """``POST /v1/count`` with ``facet: "children"``: ``[{"label", "count"}, ...]``,
        the items under each child of ``label`` whose cone holds some."""
        body = _drop_none({"label": label, "facet": "children", "filter": filter})
        return self._json("POST", "/v1/count", json=body)["facets"]

    # -- index jobs -------------------------------------------------------------------------
    def start_job(self, path: str, class_map: Mapping[str, str] | None = None) -> Json:
        """``POST /v1/index/jobs``: index a server-side folder or manifest (202)."""
        body = _drop_none({"path": path, "class_map": dict(class_map) if class_map else None})
        return self._json("POST", "/v1/index/jobs", json=body, scoped=False)

    def job(self, job_id: str) -> Json:
        return self._json("GET", f"/v1/index/jobs/{quote(job_id, safe='')}", scoped=False)

    def jobs(self) -> list[Json]:
        return self._json("GET", "/v1/index/jobs", scoped=False)

    def cancel_job(self, job_id: str) -> Json:
        return self._json("DELETE", f"/v1/index/jobs/{quote(job_id, safe='')}", scoped=False)

    # -- collections and aliases ---------------------------------------------------------------
    def collections(self) -> list[Json]:
        """``GET /v1/collections``: name, space, dim, curvature, items, aliases, ..."""
        return self._json("GET", "/v1/collections", scoped=False)

    def create_collection(
        self,
        name: str,
        space: str,
        *,
        model: str | None = None,
        taxonomy: str | Sequence[Sequence[str]] | None = None,
    ) -> Json:
        """``POST /v1/collections``; ``taxonomy``: a server path or ``[[child, parent], ...]``."""
        if taxonomy is not None and not isinstance(taxonomy, str):
            taxonomy = [list(e) for e in taxonomy]
        body = _drop_none({"name": name, "space": space, "model": model, "taxonomy": taxonomy})
        return self._json("POST", "/v1/collections", json=body, scoped=False)

    def collection_info(self, name: str | None = None) -> Json:
        return self._json("GET", f"/v1/collections/{self._coll(name)}", scoped=False)

    def drop_collection(self, name: str) -> Json:
        return self._json("DELETE", f"/v1/collections/{quote(name, safe='')}", scoped=False)

    def aliases(self) -> dict[str, str]:
        """``GET /v1/aliases``: alias -> collection."""
        return self._json("GET", "/v1/aliases", scoped=False)

    def set_alias(self, alias: str, collection: str) -> Json:
        """``PUT /v1/aliases/{alias}``: point (or re-point, atomically) an alias."""
        return self._json(
            "PUT",
            f"/v1/aliases/{quote(alias, safe='')}",
            json={"collection": collection},
            scoped=False,
        )

    def delete_alias(self, alias: str) -> Json:
        return self._json("DELETE", f"/v1/aliases/{quote(alias, safe='')}", scoped=False)

    # -- snapshots --------------------------------------------------------------------------------
    def _snaps(self, collection: str | None) -> str:
        return f"/v1/collections/{self._coll(collection)}/snapshots"

    def create_snapshot(self, collection: str | None = None) -> str:
        """``POST .../snapshots``: the new snapshot's id."""
        return self._json("POST", self._snaps(collection), scoped=False)["snapshot"]

    def snapshots(self, collection: str | None = None) -> list[Json]:
        return self._json("GET", self._snaps(collection), scoped=False)

    def download_snapshot(
        self, snapshot: str, dest: str | os.PathLike, collection: str | None = None
    ) -> Path:
        """Download to ``dest`` (streamed); its sha256 checked against the server's
        ``X-Checksum-Sha256`` (a mismatch raises and removes the file)."""
        dest = Path(dest)
        h = hashlib.sha256()
        url = f"{self._snaps(collection)}/{quote(snapshot, safe='')}"
        try:
            with self._http.stream("GET", url) as r:
                if r.status_code >= 400:
                    r.read()
                    try:
                        detail = r.json().get("detail", r.text)
                    except ValueError:
                        detail = r.text
                    raise HypsearchError(r.status_code, str(detail))
                with open(dest, "wb") as f:
                    for chunk in r.iter_bytes():
                        h.update(chunk)
                        f.write(chunk)
                want = r.headers.get(CHECKSUM_HEADER)
        except httpx.HTTPError as e:
            raise HypsearchError(0, f"{type(e).__name__}: {e}") from e
        if want is not None and want != h.hexdigest():
            dest.unlink(missing_ok=True)
            raise HypsearchError(0, f"snapshot {snapshot}: the download does not match its sha256")
        return dest

    def restore_snapshot(self, snapshot: str, collection: str | None = None) -> Json:
        """``POST .../snapshots/{id}/restore``: atomically, checksums verified.

        Without ``collection``, the default collection is restored in place (at its
        ``HYPSEARCH_INDEX`` folder): requests meanwhile wait for it and then see the
        restored items; 409 while an index job runs (it names the job), and new jobs
        get 409 while the restore runs. A crash midway comes back whole (the old
        index or the restored one) at the next start."""
        url = f"{self._snaps(collection)}/{quote(snapshot, safe='')}/restore"
        return self._json("POST", url, scoped=False)

    def upload_snapshot(
        self, path: str | os.PathLike, collection: str | None = None, *, sha256: str | None = None
    ) -> Json:
        """Restore a downloaded snapshot tar into the collection (``POST .../snapshots/upload``);
        the default collection (no ``collection``) in place, as :meth:`restore_snapshot`."""
        with open(path, "rb") as f:
            files = {"file": (Path(path).name, f, "application/x-tar")}
            params = _drop_none({"sha256": sha256})
            return self._json(
                "POST",
                self._snaps(collection) + "/upload",
                files=files,
                params=params,
                scoped=False,
            )

    def delete_snapshot(self, snapshot: str, collection: str | None = None) -> Json:
        url = f"{self._snaps(collection)}/{quote(snapshot, safe='')}"
        return self._json("DELETE", url, scoped=False)
