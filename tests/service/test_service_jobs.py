"""Background index jobs through the API: data roots, progress, cancel, one at a time."""

from __future__ import annotations

import os
import time

import pytest
import torch

from tests.support.server import artifacts, make_runtime, needs_data, write_folder

pytestmark = needs_data


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
            (str(root / "in\x00side"), 422, "NUL byte"),  # realpath would raise
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
        assert done["state"] == "cancelled" and done["indexed"] < 3000
        # the batches a cancelled job wrote are kept (durable), nothing more
        assert len(rt.index) == before + done["indexed"]
        assert c.get("/v1/items/big-2999").status_code == 404
        # the same job again resumes after them
        again = c.post("/v1/index/jobs", json={"path": str(root / "big.csv")}).json()
        rest = _wait(c, again["id"])
        assert rest["state"] == "succeeded" and rest["indexed"] == 3000 - done["indexed"]
        assert rest["skipped_reasons"].get("already indexed", 0) == done["indexed"]
        assert len(rt.index) == before + 3000
        # the next job may start
        nxt = c.post("/v1/index/jobs", json={"path": str(root / "pics")})
        assert nxt.status_code == 202
        assert _wait(c, nxt.json()["id"])["state"] == "succeeded"
        assert c.get("/v1/index/jobs/nope").status_code == 404


def test_an_item_deleted_while_a_job_runs_stays_deleted(env):
    rt, root = env
    write_folder(root / "pics", per_class=1)
    # an item indexed before the job, listed again by it, and many new ones
    rows = ["fashion-mnist-test-5,pics/coat/000.png,coat"]
    rows += [f"big-{i},pics/sneaker/000.png,sneaker" for i in range(1500)]
    (root / "big.csv").write_text("id,path,label\n" + "\n".join(rows) + "\n")
    assert "fashion-mnist-test-5" in rt.index
    with _client(rt, root, job_workers=0, job_batch_size=8) as c:
        job = c.post("/v1/index/jobs", json={"path": str(root / "big.csv")}).json()
        deadline = time.monotonic() + 60
        while c.get("/v1/items/big-0").status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.01)
        # the job runs (its first batch is written): delete the old item and that new one
        assert c.get(f"/v1/index/jobs/{job['id']}").json()["state"] == "running"
        assert c.delete("/v1/items/fashion-mnist-test-5").status_code == 200
        assert c.delete("/v1/items/big-0").status_code == 200
        done = _wait(c, job["id"])
        assert done["state"] == "succeeded", done
        assert done["skipped_reasons"]["already indexed"] == 1 and done["indexed"] == 1500
        assert c.get("/v1/items/fashion-mnist-test-5").status_code == 404
        assert c.get("/v1/items/big-0").status_code == 404
        assert c.get("/v1/items/big-1499").status_code == 200
        assert "fashion-mnist-test-5" not in rt.index and "big-0" not in rt.index


def _transparent_png(path, pixels):
    """An RGBA picture: the garment opaque, the rest transparent over noise colours
    (what is under the transparency must not reach the model)."""
    import numpy as np
    from PIL import Image

    rgb = np.repeat(pixels[..., None], 3, axis=2)
    noise = np.random.default_rng(0).integers(0, 256, size=rgb.shape, dtype=np.uint8)
    alpha = np.where(pixels > 40, 255, 0).astype(np.uint8)
    rgba = np.dstack([np.where(alpha[..., None] == 0, noise, rgb), alpha])
    Image.fromarray(rgba, "RGBA").resize((84, 84), Image.NEAREST).save(path)


def _rotated_jpeg(path, pixels):
    """A JPEG stored sideways with the EXIF orientation that turns it upright."""
    from PIL import Image

    im = Image.fromarray(pixels).resize((84, 84)).transpose(Image.Transpose.ROTATE_90)
    exif = Image.Exif()
    exif[0x0112] = 6  # display rotated 90 degrees clockwise
    im.save(path, "JPEG", quality=95, exif=exif.tobytes())


def test_a_picture_indexed_from_a_folder_finds_itself_as_a_query(env):
    """Builds and queries decode alike (EXIF orientation, transparency onto white):
    the same file, indexed by a job and uploaded as a query, is its own nearest
    item at distance ~0."""
    import numpy as np
    from PIL import Image

    from models.images.decode import decode
    from tests.support.server import fmnist_test_split

    rt, root = env
    data = fmnist_test_split()
    shop = root / "odd"
    (shop / "sneaker").mkdir(parents=True)
    (shop / "trouser").mkdir()
    files = {
        "sneaker/alpha.png": ("image/png", _transparent_png),
        "trouser/sideways.jpg": ("image/jpeg", _rotated_jpeg),
    }
    rows = {"sneaker/alpha.png": 7, "trouser/sideways.jpg": 1}
    for name, (_, write) in files.items():
        write(shop / name, data.images[int(np.flatnonzero(data.targets == rows[name])[3])])
        with Image.open(shop / name) as im:  # the rules change these pixels
            naive = np.asarray(im.convert("RGB"))
        ours = np.asarray(Image.fromarray(decode(shop / name)).convert("RGB"))
        assert naive.shape == ours.shape and np.abs(naive.astype(int) - ours).mean() > 20
    with _client(rt, root, job_workers=0) as c:
        done = _wait(c, c.post("/v1/index/jobs", json={"path": str(shop)}).json()["id"])
        assert done["state"] == "succeeded" and done["indexed"] == 2, done
        for name, (mime, _) in files.items():
            upload = (shop / name).read_bytes()
            r = c.post("/v1/search/image", files={"file": (name, upload, mime)}, params={"k": 3})
            assert r.status_code == 200, r.text
            best = r.json()["results"][0]
            assert best["id"] == name and best["distance"] < 1e-3, (name, r.json()["results"])
