"""Durability: SQLite store, snapshots + manifest, replay, rebuild with warnings."""

from __future__ import annotations

import json
import logging
import sqlite3

import numpy as np
import pytest

from indexing import HyperbolicIndex, IndexInputError, IndexStoreError
from indexing.snapshot import MANIFEST_FILE
from indexing.store import STORE_FILE
from tests.support.cloud import assert_geodesic, brute_force, cloud, make_ids


@pytest.fixture(scope="module")
def data():
    x, q = cloud(1500, 20, dim=8, seed=31)
    return x, q, make_ids(len(x))


def _same_results(a: HyperbolicIndex, b: HyperbolicIndex, q: np.ndarray, **kw) -> None:
    ia, da = a.search(q, k=10, **kw)
    ib, db = b.search(q, k=10, **kw)
    np.testing.assert_array_equal(ia, ib)
    np.testing.assert_array_equal(da, db)


def _warnings(caplog) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and r.name.startswith("indexing")
    ]


@pytest.mark.parametrize("backend", ["exact", "hnsw"])
def test_save_load_round_trip(tmp_path, data, backend, caplog):
    x, q, ids = data
    ix = HyperbolicIndex(8, backend=backend, path=tmp_path / "ix")
    ix.add(
        x,
        ids,
        labels=[f"L{j % 3}" for j in range(len(x))],
        payloads=[{"n": j} for j in range(len(x))],
    )
    ix.delete(ids[:10])
    ix.save()
    man = json.loads((tmp_path / "ix" / MANIFEST_FILE).read_text())
    assert man["backend"] == backend and man["item_count"] == len(x) - 10
    assert man["space"] == "poincare:8" and man["dim"] == 8 and man["curvature"] == 1.0
    assert man["format_version"] == 1 and len(man["sha256"]) == 64
    assert man["last_seq"] == len(x) + 10
    ix.close()
    with caplog.at_level(logging.WARNING, logger="indexing"):
        re = HyperbolicIndex.load(tmp_path / "ix")
    assert not _warnings(caplog)
    assert re.backend == backend and len(re) == len(x) - 10
    ref = HyperbolicIndex(8, backend=backend)
    ref.add(x, ids, labels=[f"L{j % 3}" for j in range(len(x))])
    ref.delete(ids[:10])
    if backend == "exact":
        _same_results(re, ref, q)
    _same_results(re, ref, q, labels={"L1"})
    assert re.get("i500").payload == {"n": 500} and re.get("i500").label == "L2"
    assert re.get("i5") is None and "i5" not in re


def test_snapshot_restores_graph_identically(tmp_path, data):
    x, q, ids = data
    ix = HyperbolicIndex(8, backend="hnsw", path=tmp_path)
    ix.add(x, ids)
    before = ix.search(q, k=10)
    ix.save()
    ix.close()
    re = HyperbolicIndex.open(tmp_path)
    after = re.search(q, k=10)
    np.testing.assert_array_equal(before[0], after[0])
    np.testing.assert_array_equal(before[1], after[1])


def test_in_memory_index_saves_to_folder(tmp_path, data):
    x, q, ids = data
    ix = HyperbolicIndex(8)
    ix.add(x, ids, payloads=[{"j": j} for j in range(len(x))])
    with pytest.raises(IndexInputError, match="path"):
        ix.save()
    ix.save(tmp_path / "copy")
    assert (tmp_path / "copy" / STORE_FILE).exists()
    ix.add(x[:1] * 0.5, ["extra"])  # the in-memory index goes on; the copy does not change
    re = HyperbolicIndex.load(tmp_path / "copy")
    assert len(re) == len(x) and "extra" not in re
    assert re.get("i7").payload == {"j": 7}
    ix.delete(["extra"])
    _same_results(ix, re, q)


def test_replay_after_snapshot(tmp_path, data, caplog):
    x, q, ids = data
    ix = HyperbolicIndex(8, backend="hnsw", path=tmp_path)
    ix.add(x[:1000], ids[:1000])
    ix.save()
    # written after the snapshot: adds, an upsert, deletes
    ix.add(x[1000:], ids[1000:])
    ix.add(x[:1] * 0.3, ["i1"])  # upsert i1 to a new place
    ix.delete(ids[100:200])
    ix.close()
    with caplog.at_level(logging.WARNING, logger="indexing"):
        re = HyperbolicIndex.open(tmp_path)
    assert not _warnings(caplog)  # snapshot used, rows replayed
    assert len(re) == len(x) - 100
    assert not any(i in re for i in ids[100:200])
    np.testing.assert_array_equal(re.get("i1").vector, x[0] * 0.3)
    keep = np.array([j for j in range(len(x)) if not 100 <= j < 200])
    xs = x[keep].copy()
    xs[list(keep).index(1)] = x[0] * 0.3
    order, bf = brute_force(xs, q, 10)
    found, dist = re.search(q, k=10, ef=256)
    kept = np.array(ids)[keep]
    hits = np.mean([len(set(a) & set(kept[b])) / 10 for a, b in zip(found, order, strict=True)])
    assert hits >= 0.97
    ids_e, dist_e = HyperbolicIndex.open(tmp_path, backend="exact").search(q, k=10)
    np.testing.assert_array_equal(ids_e, np.array(ids)[keep][order])
    assert_geodesic(dist_e, bf)


def _fresh(tmp_path, data, backend="hnsw"):
    x, q, ids = data
    ix = HyperbolicIndex(8, backend=backend, path=tmp_path)
    ix.add(x, ids)
    ix.delete(ids[:50])
    ix.save()
    ix.close()
    ref = HyperbolicIndex(8, backend="exact")
    ref.add(x[50:], ids[50:])
    return ref


@pytest.mark.parametrize(
    "damage, expect",
    [
        ("flip", "corrupt"),
        ("truncate", "corrupt"),
        ("remove_snapshot", "missing"),
        ("remove_manifest", "no snapshot"),
        ("garbage_manifest", "corrupt"),
        ("stale_seq", "stale"),
        ("other_store", "stale"),
    ],
)
def test_damaged_snapshot_rebuilds_with_warning(tmp_path, data, caplog, damage, expect):
    x, q, ids = data
    ref = _fresh(tmp_path, data)
    man_path = tmp_path / MANIFEST_FILE
    man = json.loads(man_path.read_text())
    snap = tmp_path / man["snapshot"]
    if damage == "flip":
        raw = bytearray(snap.read_bytes())
        raw[len(raw) // 2] ^= 0xFF
        snap.write_bytes(bytes(raw))
    elif damage == "truncate":
        snap.write_bytes(snap.read_bytes()[:1000])
    elif damage == "remove_snapshot":
        snap.unlink()
    elif damage == "remove_manifest":
        man_path.unlink()
    elif damage == "garbage_manifest":
        man_path.write_text("{not json")
    elif damage == "stale_seq":
        man["last_seq"] += 10**6
        man_path.write_text(json.dumps(man))
    elif damage == "other_store":
        man["store_uuid"] = "0" * 32
        man_path.write_text(json.dumps(man))
    with caplog.at_level(logging.WARNING, logger="indexing"):
        re = HyperbolicIndex.load(tmp_path, backend="exact")
    msgs = _warnings(caplog)
    assert len(msgs) == 1 and expect in msgs[0] and "rebuilding" in msgs[0], msgs
    assert len(re) == len(x) - 50
    _same_results(re, ref, q)
    # a new save heals it
    re.save()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="indexing"):
        HyperbolicIndex.load(tmp_path)
    assert not _warnings(caplog)


def test_snapshot_matching_an_older_state_is_corrected_by_replay(tmp_path, data):
    # a snapshot from before a delete must not bring the item back
    x, q, ids = data
    ix = HyperbolicIndex(8, backend="hnsw", path=tmp_path)
    ix.add(x, ids)
    ix.save()
    ix.delete(ids[:300])
    ix.add(x[:5], ids[:5])  # re-added after the delete
    ix.delete(ids[:2])
    ix.close()
    for _ in range(2):
        re = HyperbolicIndex.open(tmp_path)
        assert not any(i in re for i in ids[5:300]) and not any(i in re for i in ids[:2])
        assert all(i in re for i in ids[2:5])
        found, _ = re.search(x[:300], k=3)
        assert not set(found.ravel()) & set(ids[5:300]) - set(ids[2:5])
        re.close()


def test_deleted_items_stay_deleted_without_snapshot(tmp_path, data):
    x, q, ids = data
    ix = HyperbolicIndex(8, path=tmp_path)
    ix.add(x[:200], ids[:200])
    ix.delete(ids[:20])
    ix.close()
    re = HyperbolicIndex(8, path=tmp_path)  # constructor with an existing path opens it
    assert len(re) == 180 and not any(i in re for i in ids[:20])
    con = sqlite3.connect(tmp_path / STORE_FILE)
    assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    rows = con.execute("SELECT COUNT(*), SUM(deleted) FROM items").fetchone()
    assert rows == (200, 20)
    meta = dict(con.execute("SELECT key, value FROM meta"))
    assert meta["space"] == "poincare:8" and meta["dim"] == "8" and meta["format_version"] == "1"
    con.close()


def test_every_write_is_committed_before_returning(tmp_path, data):
    x, _, ids = data
    ix = HyperbolicIndex(8, path=tmp_path)
    for j in range(5):
        ix.add(x[j : j + 1], ids[j : j + 1])
        con = sqlite3.connect(tmp_path / STORE_FILE)  # another connection sees it at once
        assert con.execute("SELECT COUNT(*) FROM items WHERE deleted=0").fetchone()[0] == j + 1
        con.close()
    ix.delete(ids[:1])
    con = sqlite3.connect(tmp_path / STORE_FILE)
    assert con.execute("SELECT deleted FROM items WHERE id=?", (ids[0],)).fetchone()[0] == 1
    con.close()


def test_store_meta_mismatch(tmp_path):
    HyperbolicIndex(8, path=tmp_path).close()
    with pytest.raises(
        IndexStoreError,
        match="holds space=.poincare:8., the index was asked for space=.poincare:4.",
    ):
        HyperbolicIndex(4, path=tmp_path)
    with pytest.raises(IndexStoreError, match="curvature"):
        HyperbolicIndex(8, curvature=0.5, path=tmp_path)
    con = sqlite3.connect(tmp_path / STORE_FILE)
    con.execute("UPDATE meta SET value='99' WHERE key='format_version'")
    con.commit()
    con.close()
    with pytest.raises(IndexStoreError, match="format version"):
        HyperbolicIndex.load(tmp_path)
    with pytest.raises(FileNotFoundError):
        HyperbolicIndex.load(tmp_path / "nowhere")


def test_snapshot_keeps_backend_choice(tmp_path, data):
    x, q, ids = data
    ix = HyperbolicIndex(8, backend="auto", auto_threshold=1000, path=tmp_path, ef=200)
    ix.add(x, ids)
    assert ix.backend == "graph"
    ix.save()
    ix.close()
    re = HyperbolicIndex.load(tmp_path)
    assert re.backend_config == "auto" and re.backend == "graph"
    assert re.stats()["backend_params"]["ef"] == 200
    re.delete(ids[:1200])  # below half the threshold: back to exact
    assert re.backend == "exact"
    re.save()
    re.close()
    re = HyperbolicIndex.load(tmp_path)
    assert re.backend == "exact" and len(re) == 300
    only_old = HyperbolicIndex.load(tmp_path, backend="hnsw")
    assert only_old.backend == "hnsw" and len(only_old) == 300


def test_old_snapshot_files_are_removed(tmp_path, data):
    x, _, ids = data
    ix = HyperbolicIndex(8, path=tmp_path)
    for j in range(3):
        ix.add(x[j * 10 : j * 10 + 10], ids[j * 10 : j * 10 + 10])
        ix.save()
    snaps = sorted(p.name for p in tmp_path.glob("snapshot-*.bin"))
    assert snaps == [json.loads((tmp_path / MANIFEST_FILE).read_text())["snapshot"]]
    assert not list(tmp_path.glob(".*.tmp"))


def test_failed_in_memory_apply_is_recovered_from_the_store(tmp_path, data, monkeypatch, caplog):
    x, q, ids = data
    ix = HyperbolicIndex(8, backend="exact", path=tmp_path)
    ix.add(x[:100], ids[:100])
    calls = {"n": 0}
    orig = type(ix._backend).add

    def flaky(self, table, slots):
        calls["n"] += 1
        if calls["n"] == 1:
            raise MemoryError("simulated")
        return orig(self, table, slots)

    monkeypatch.setattr(type(ix._backend), "add", flaky)
    with caplog.at_level(logging.ERROR, logger="indexing"):
        ix.add(x[100:200], ids[100:200])  # committed, then rebuilt from the store
    assert any("rebuilding" in r.getMessage() for r in caplog.records)
    assert len(ix) == 200 and "i150" in ix
    ref = HyperbolicIndex(8, backend="exact")
    ref.add(x[:200], ids[:200])
    _same_results(ix, ref, q)
