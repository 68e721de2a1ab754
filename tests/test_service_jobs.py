"""Background index jobs through the API: data roots, progress, cancel, one at a time."""

from __future__ import annotations

import os
import time

import pytest
import torch

from tests.test_build_index import write_folder
from tests.test_service_support import artifacts, make_runtime, needs_data

pytestmark = [
    needs_data,
    pytest.mark.filterwarnings("ignore:Using `httpx` with `starlette.testclient`"),
]


@pytest.fixture
def env(tmp_path, tmp_path_factory):
    torch.set_num_threads(1)
    art = artifacts(tmp_path_factory)
    rt = make_runtime(art, tmp_path / "svc", n=200)
    root = tmp_path / "data"
    root.mkdir()
    yield rt, root
    rt.close()


def _client(rt, root, **kw):
    from fastapi.testclient import TestClient

    from service.app import create_app
    from service.settings import Settings

    kw.setdefault("data_roots", str(root))
    s = Settings(index=rt.index.path, log_json=False, log_level="WARNING", **kw)
    return TestClient(create_app(s, runtime=rt))


def _wait(c, job_id: str, timeout: float = 120) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        j = c.get(f"/v1/index/jobs/{job_id}").json()
        if j["state"] not in ("queued", "running"):
            return j
        time.sleep(0.05)
    raise AssertionError(f"job {job_id} still running: {j}")


def test_job_indexes_a_folder(env):
    rt, root = env
    write_folder(root / "shop")
    before = len(rt.index)
    with _client(rt, root, job_workers=1, job_batch_size=4) as c:
        r = c.post("/v1/index/jobs", json={"path": str(root / "shop")})
        assert r.status_code == 202, r.text
        job = r.json()
        assert job["state"] in ("queued", "running") and job["path"] == str(root / "shop")
        # the service keeps answering while the job runs
        assert c.post("/v1/search", json={"label": "coat", "k": 3}).status_code == 200
        done = _wait(c, job["id"])
        assert done["state"] == "succeeded", done
        assert done["indexed"] == 8 and done["total"] == 13 and done["progress"] == 1.0
        assert done["skipped"] == 5
        reasons = done["skipped_reasons"]
        assert reasons["class 'unicorn' is not in the taxonomy"] == 4
        assert any(e["source"].endswith("broken.png") for e in done["skipped_examples"])
        assert len(rt.index) == before + 8
        item = c.get("/v1/items/sneaker/001.png").json()
        assert item["label"] == "gym_shoe.n.01"
        assert c.get("/v1/items/sneaker/001.png/image").status_code == 200
        assert c.get("/v1/labels/sneaker").json()["items"] == rt.items_under("gym_shoe.n.01")
        assert [j["id"] for j in c.get("/v1/index/jobs").json()][0] == job["id"]
        assert 'hypsearch_job_progress{job="' in c.get("/metrics").text


def test_manifest_job_and_class_map(env):
    rt, root = env
    write_folder(root / "pics", per_class=2)
    (root / "list.csv").write_text(
        "id,path,label\nm1,pics/sneaker/000.png,trainers\nm2,pics/coat/001.png,\n"
    )
    with _client(rt, root, job_workers=0) as c:
        r = c.post(
            "/v1/index/jobs",
            json={"path": str(root / "list.csv"), "class_map": {"trainers": "gym_shoe.n.01"}},
        )
        done = _wait(c, r.json()["id"])
        assert done["state"] == "succeeded" and done["indexed"] == 2
        assert c.get("/v1/items/m1").json()["label"] == "gym_shoe.n.01"
        assert c.get("/v1/items/m2").json()["label_source"] == "predicted"


def test_paths_outside_the_roots_are_refused(env, tmp_path):
    rt, root = env
    outside = tmp_path / "outside"
    write_folder(outside, per_class=1)
    (root / "inside").mkdir()
    os.symlink(outside, root / "link")
    with _client(rt, root, job_workers=0) as c:
        cases = [
            (str(outside), 403, "outside the data roots"),
            (str(root / "link"), 403, "outside the data roots"),
            (str(root / "inside" / ".." / ".." / "outside"), 422, ".."),
            ("relative/path", 422, "absolute"),
            (str(root / "missing"), 404, "does not exist"),
        ]
        for path, status, words in cases:
            r = c.post("/v1/index/jobs", json={"path": path})
            assert r.status_code == status and words in r.json()["detail"], (path, r.text)
        # a link inside a folder that leads out is skipped, not read
        shop = root / "shop"
        write_folder(shop, per_class=1)
        os.symlink(outside / "coat" / "000.png", shop / "coat" / "escape.png")
        done = _wait(c, c.post("/v1/index/jobs", json={"path": str(shop)}).json()["id"])
        assert done["state"] == "succeeded"
        assert done["skipped_reasons"].get("outside the data roots") == 1
        assert c.get("/v1/items/coat/escape.png").status_code == 404
    with _client(rt, root, data_roots="") as c:  # no roots: no jobs
        r = c.post("/v1/index/jobs", json={"path": str(root)})
        assert r.status_code == 403 and "no data roots" in r.json()["detail"]


def test_one_job_at_a_time_and_cancel(env):
    rt, root = env
    write_folder(root / "pics", per_class=3)
    rows = "\n".join(f"big-{i},pics/sneaker/{i % 3:03d}.png,sneaker" for i in range(3000))
    (root / "big.csv").write_text("id,path,label\n" + rows + "\n")
    before = len(rt.index)
    with _client(rt, root, job_workers=0, job_batch_size=16) as c:
        first = c.post("/v1/index/jobs", json={"path": str(root / "big.csv")}).json()
        r = c.post("/v1/index/jobs", json={"path": str(root / "pics")})
        assert r.status_code == 409 and first["id"] in r.json()["detail"]
        time.sleep(0.3)
        assert c.delete(f"/v1/index/jobs/{first['id']}").status_code == 200
        done = _wait(c, first["id"])
        assert done["state"] == "cancelled" and done["indexed"] == 0
        assert len(rt.index) == before  # nothing of a cancelled job is written
        assert c.get("/v1/items/big-0").status_code == 404
        # the next job may start
        nxt = c.post("/v1/index/jobs", json={"path": str(root / "pics")})
        assert nxt.status_code == 202
        assert _wait(c, nxt.json()["id"])["state"] == "succeeded"
        assert c.get("/v1/index/jobs/nope").status_code == 404
