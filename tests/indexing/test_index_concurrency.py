"""Searches run in parallel with writes; a batch is seen whole or not at all."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from indexing import HyperbolicIndex
from tests.support.cloud import cloud, make_ids

B = 40  # items per batch
NB = 60  # batches


def _centres(seed: int, dim: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    c = rng.standard_normal((NB, dim))
    return 0.5 * c / np.linalg.norm(c, axis=1, keepdims=True)


@pytest.mark.parametrize("backend", ["exact", "graph", "hnsw"])
def test_readers_never_see_part_of_a_batch(backend):
    dim = 8
    base, _ = cloud(3000, dim=dim, seed=2)
    # hnsw with its default graph parameters: with M=8 hnswlib itself misses
    # parts of these tight isolated clusters, which would read as torn batches
    ix = HyperbolicIndex(dim, backend=backend)
    ix.add(base, make_ids(3000, "base"))
    centres = _centres(5, dim)
    rng = np.random.default_rng(6)
    batches = [centres[b] + 1e-4 * rng.standard_normal((B, dim)) for b in range(NB)]
    done = threading.Event()
    errors: list[BaseException] = []
    seen = {"whole": 0, "none": 0, "searches": 0}
    lock = threading.Lock()

    def writer():
        try:
            for b in range(NB):
                ix.add(batches[b], [f"b{b}_{j}" for j in range(B)], labels=[f"batch{b}"] * B)
                if b >= 3:  # deletes are batches too
                    assert ix.delete([f"b{b - 3}_{j}" for j in range(B)]) == B
                time.sleep(0.002)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
        finally:
            done.set()

    def reader(seed):
        r = np.random.default_rng(seed)
        try:
            while not done.is_set():
                b = int(r.integers(NB))
                ids, dist = ix.search(centres[b][None], k=B)
                n = sum(s.startswith(f"b{b}_") for s in ids[0])
                assert n in (0, B), f"torn read: {n} of batch {b}"
                assert (np.diff(dist[0]) >= 0).all()
                ids2, _ = ix.search(centres[b][None], k=B + 5, labels={f"batch{b}"})
                assert ids2.shape[1] in (0, B), (
                    f"torn read (label filter): {ids2.shape[1]} of batch {b}"
                )
                with lock:
                    seen["searches"] += 1
                    seen["whole" if n else "none"] += 1
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=writer)] + [
        threading.Thread(target=reader, args=(s,)) for s in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    assert not errors, errors[0]
    assert seen["searches"] > 20 and seen["whole"] > 0 and seen["none"] > 0
    assert len(ix) == 3000 + 3 * B


def test_concurrent_writers_are_serialised():
    dim = 4
    ix = HyperbolicIndex(dim, backend="hnsw", M=8, ef_construction=32)
    rng = np.random.default_rng(0)
    errors = []

    def write(w):
        try:
            for b in range(30):
                pts = rng.uniform(-0.4, 0.4, size=(20, dim))
                ix.add(pts, [f"w{w}_{b}_{j}" for j in range(20)])
                if b % 3 == 2:
                    ix.delete([f"w{w}_{b - 1}_{j}" for j in range(20)])
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    def search():
        try:
            for _ in range(100):
                ix.search(rng.uniform(-0.4, 0.4, size=(5, dim)), k=7)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(w,)) for w in range(3)]
    threads += [threading.Thread(target=search) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors[0]
    assert len(ix) == 3 * (30 - 10) * 20
    assert sorted(ix.ids()) == sorted(
        f"w{w}_{b}_{j}" for w in range(3) for b in range(30) if b % 3 != 1 for j in range(20)
    )
