"""ANN benchmark: hypsearch's index against its peers, each at its best, in one run.

    .venv/bin/python benchmarks/ann.py                      # every dataset below
    .venv/bin/python benchmarks/ann.py --quick              # small sizes, for development
    .venv/bin/python benchmarks/ann.py --datasets cloud:200000:16 --approaches hypsearch,usearch
    .venv/bin/python benchmarks/ann.py --write-results      # also write benchmarks/results/ann.md

Datasets (``--datasets``, comma separated):

* ``cloud:N:D`` -- :func:`indexing.synthetic.hierarchical_cloud` (the project's
  generator: a fixed 6-way tree of directions, c = 1, norms mostly 0.9..0.999);
* ``other:N:D`` -- a generator of another shape (:func:`other_cloud`): a
  random recursive tree grown by preferential attachment (heavy-tailed
  branching: a few hubs with thousands of children, most nodes leaves), nodes
  placed by Möbius steps of random hyperbolic length, curvature c = 0.5;
* ``nouns`` -- the label embeddings of the WordNet noun closure (82,115 x 10,
  the cap construction of ``labels train``: ``--nouns-labels``, default
  ``$HYPSEARCH_HOME/bench/noun-closure-cap.labels``, ``./var`` when unset),
  queries = random nouns moved by a small tangent step;
* ``mixed:N`` -- ``poincare:8,sphere:4,euclidean:4`` (the ball factor a
  hierarchical cloud).

Truth: the exact top-10 of a brute-force scan with the compiled float64
distance of :mod:`models.geometry.kernels` (checked against the torch
reference on ``--check`` queries).

Approaches (``--approaches``), all in this process, every peer as its own
documentation recommends, all queries of a dataset in ONE search call:

* ``hypsearch``: ``HyperbolicIndex(space)`` with its defaults (the ``auto``
  backend), after a warm-up call; threads set with
  :func:`indexing.backends.graph.set_search_threads`; an ``ef`` sweep is
  reported for information;
* ``exact``: hypsearch's exact scan (reference; small datasets only);
* ``hnswlib`` and ``hnswlib-recentred``: as hypsearch's own ``hnsw`` backend
  runs hnswlib (:mod:`indexing.backends.hnsw`): ``l2`` on the coordinates
  (M=16, ef_construction=200, the hnswlib README's recommended values), the
  candidates re-ranked by the exact float64 distance, ``ef`` swept; one pass
  around the query (``hnswlib``, fastest where ``l2`` neighbours are the
  hyperbolic ones), or with the backend's default second pass around the
  Euclidean centre of the hyperbolic ball the first pass reached
  (``hnswlib-recentred``: plain ``l2`` stalls below 0.99 on hierarchical
  clouds however large ``ef``); the faster of the two at the target is
  hnswlib's best;
* ``usearch``: a numba ``cfunc`` Poincaré distance as a ``CompiledMetric``,
  usearch's default connectivity and expansion_add, ``expansion_search`` swept,
  ``threads=`` per call;
* ``pynndescent``: a numba Poincaré distance, default parameters, ``epsilon`` swept.

Exact float64 distances for every approach, that time included: usearch and
pynndescent already rank with an exact Poincaré metric, so only the ``k`` they
return get the compiled float64 distance (``k`` per query, no extra
candidates); hnswlib ranks by ``l2``, so its pooled candidates are re-ranked by
the exact distance (inside the ``hnsw`` backend).
Timing: the settings of every approach that reach recall@10 >= 0.99 (the two
cheapest) are timed in ``--repeats`` rounds, the approaches interleaved within
a round, best round kept, with 1 and 2 threads.  Builds use 2 threads.
"""

from __future__ import annotations

import argparse
import functools
import gc
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
from _common import ROOT, add_results_flag, command_line, cpu_model, report_each

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from indexing import HyperbolicIndex  # noqa: E402
from indexing.backends import graph as graph_backend  # noqa: E402
from indexing.geometry import make_index_space, torch_threads  # noqa: E402
from indexing.synthetic import hierarchical_cloud  # noqa: E402
from models.geometry import kernels  # noqa: E402

MIXED = "poincare:8,sphere:4,euclidean:4"
TARGET = 0.99
NOUNS = str(
    Path(os.environ.get("HYPSEARCH_HOME") or ROOT / "var") / "bench" / "noun-closure-cap.labels"
)
FULL = "cloud:200000:16,cloud:200000:64,cloud:1000000:16,other:200000:32,nouns,mixed:200000"
QUICK = "cloud:30000:16,cloud:30000:64,other:30000:32,nouns:30000,mixed:30000"

SWEEPS = {
    "hypsearch": [16, 24, 32, 48, 64, 96, 128, 192, 256],
    "hnswlib": [16, 32, 64, 128, 256, 512],  # both hnswlib approaches
    "usearch": [16, 32, 64, 128, 256, 512],
    "pynndescent": [0.0, 0.05, 0.1, 0.2, 0.3],
}


def say(*a) -> None:
    print(*a, file=sys.stderr, flush=True)


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


# -- data ---------------------------------------------------------------------------
def _mobius_add(x, y, c):
    """Möbius addition of models.geometry.poincare (float64)."""
    import torch

    from models.geometry import poincare

    with torch_threads():
        return poincare.mobius_add(torch.from_numpy(x), torch.from_numpy(y), c=c).numpy()


def _step(rng, dirs, length, c):
    """Points at hyperbolic distance ``length`` from the origin along ``dirs``
    (expmap0 of models.geometry.poincare)."""
    import torch

    from models.geometry import poincare

    u = dirs / np.linalg.norm(dirs, axis=1, keepdims=True)
    with torch_threads():
        return poincare.expmap0(torch.from_numpy(u * (length / 2)[:, None]), c=c).numpy()


def other_cloud(n: int, n_queries: int, dim: int, *, c: float = 0.5, seed: int = 0):
    """A random recursive tree grown by preferential attachment (a new node's
    parent is drawn with probability proportional to its children + 1), node
    positions by Möbius steps of hyperbolic length U(0.4, 1.2) from the parent in
    a direction near the parent's, points = nodes moved by a step of length
    U(0, 0.35).  Not the project's generator: another branching law, another
    curvature."""
    rng = np.random.default_rng(seed + 7)
    m = max(2, n // 8)
    parent = np.zeros(m, dtype=np.int64)
    urn = [0]  # node j appears children(j) + 1 times
    for j in range(1, m):
        p = urn[int(rng.integers(len(urn)))]
        parent[j] = p
        urn.append(p)
        urn.append(j)
    depth = np.zeros(m, dtype=np.int64)
    for j in range(1, m):
        depth[j] = depth[parent[j]] + 1
    pos = np.zeros((m, dim))
    dirs = rng.standard_normal((m, dim))
    for d in range(1, int(depth.max()) + 1):
        sel = np.nonzero(depth == d)[0]
        par = parent[sel]
        base = pos[par]
        pdir = np.where(
            (np.linalg.norm(base, axis=1) > 0)[:, None], base, rng.standard_normal(base.shape)
        )
        pdir /= np.linalg.norm(pdir, axis=1, keepdims=True)
        dirs[sel] = pdir + 0.9 * dirs[sel] / np.sqrt(dim)
        steps = _step(rng, dirs[sel], rng.uniform(0.4, 1.2, len(sel)), c)
        pos[sel] = _mobius_add(base, steps, c)

    def sample(k):
        nodes = rng.integers(0, m, size=k)
        jit = _step(rng, rng.standard_normal((k, dim)), rng.uniform(0, 0.35, k), c)
        out = _mobius_add(pos[nodes], jit, c)
        r = np.linalg.norm(out, axis=1, keepdims=True)
        lim = (1 - 1e-7) / np.sqrt(c)
        return np.where(r < lim, out, out / r * lim)

    return sample(n), sample(n_queries)


def nouns_embeddings(path: str) -> np.ndarray:
    if os.path.exists(path):
        from models.labels.embedding import load_labels

        emb = load_labels(path)
        return np.asarray(emb.embeddings, dtype=np.float64)
    raise SystemExit(
        f"--nouns-labels: {path} not found (make it with `labels train` on the noun closure)"
    )


def _jitter(p: np.ndarray, rng) -> np.ndarray:
    """Move points by a small tangent step (expmap of models.geometry)."""
    import torch

    from models.geometry import poincare

    v = 0.05 * rng.standard_normal(p.shape)
    with torch_threads():
        out = poincare.expmap(torch.from_numpy(p), torch.from_numpy(v), c=1.0).numpy()
    return np.asarray(out, dtype=np.float64)


def make_data(name: str, n_queries: int, seed: int, nouns_path: str):
    """``(x, q, space_string, description)``."""
    kind, *rest = name.split(":")
    if kind == "cloud":
        n, d = int(rest[0]), int(rest[1])
        x, q = hierarchical_cloud(n, d, seed=seed, n_queries=n_queries)
        return x, q, f"poincare:{d}", f"hierarchical cloud, {n:,} x {d}-d"
    if kind == "other":
        n, d = int(rest[0]), int(rest[1])
        x, q = other_cloud(n, n_queries, d, c=0.5, seed=seed)
        return x, q, f"poincare:{d}@0.5", f"preferential-attachment tree, c = 0.5, {n:,} x {d}-d"
    if kind == "mixed":
        n = int(rest[0])
        rng = np.random.default_rng(seed)
        hp, hq = hierarchical_cloud(n, 8, seed=seed, n_queries=n_queries)

        def rest_of(m):
            s = rng.standard_normal((m, 4))
            s /= np.linalg.norm(s, axis=1, keepdims=True)
            return np.hstack([s, rng.standard_normal((m, 4))])

        x = np.hstack([hp, rest_of(n)])
        q = np.hstack([hq, rest_of(n_queries)])
        return x, q, MIXED, f"mixed curvature `{MIXED}`, {n:,} points"
    if kind == "nouns":
        x = nouns_embeddings(nouns_path)
        rng = np.random.default_rng(seed)
        if rest:
            x = x[np.sort(rng.choice(len(x), size=min(len(x), int(rest[0])), replace=False))]
        pick = rng.choice(len(x), size=n_queries, replace=False)
        q = _jitter(x[pick], rng)
        return (
            x,
            q,
            f"poincare:{x.shape[1]}",
            f"WordNet noun embeddings, {len(x):,} x {x.shape[1]}-d",
        )
    raise SystemExit(f"--datasets: unknown dataset {name!r}")


def _brute(q, gq, x, gx, kinds, starts, curv, k):
    import numba

    @numba.njit(parallel=True, nogil=True)
    def run(q, gq, x, gx, kinds, starts, curv, k):
        out = np.empty((q.shape[0], k), dtype=np.int64)
        for i in numba.prange(q.shape[0]):
            d = np.empty(x.shape[0])
            for j in range(x.shape[0]):
                d[j] = kernels.dist(q, i, gq, x, j, gx, kinds, starts, curv)
            out[i] = np.argsort(d, kind="mergesort")[:k]
        return out

    return run(q, gq, x, gx, kinds, starts, curv, k)


def exact_truth(x, q, spec, k):
    space = make_index_space(None, 1.0, spec)
    table = space.kernel_table()
    return _brute(q, space.kernel_gaps(q), x, space.kernel_gaps(x), *table, k)


def brute_force_differs(x, q, truth, spec, n_check) -> int:
    space = make_index_space(None, 1.0, spec)
    bad = 0
    for i in range(min(n_check, len(q))):
        d = space.pairwise(q[i : i + 1], x)[0]
        if len(set(np.argsort(d, kind="stable")[: truth.shape[1]].tolist()) ^ set(truth[i])):
            bad += 1
    return bad


def recall(found: np.ndarray, truth: np.ndarray) -> float:
    k = truth.shape[1]
    return float(
        np.mean(
            [len(set(a.tolist()) & set(b.tolist())) / k for a, b in zip(found, truth, strict=True)]
        )
    )


# -- approaches ---------------------------------------------------------------------
class Approach:
    """``build()`` (returns accounted bytes or 0), then ``search(q, k, setting, threads)``
    returning int rows and exact distances."""

    name = ""
    settings: list = [None]

    def __init__(self, x, spec):
        self.x, self.spec = x, spec
        self.space = make_index_space(None, 1.0, spec)
        self.c = getattr(self.space, "c", 1.0)
        self.table = self.space.kernel_table()
        self.gx = self.space.kernel_gaps(x)

    def rerank(self, q, cand, k):
        """Exact float64 re-ranking of candidate rows (compiled, models.geometry.kernels)."""
        cand = np.ascontiguousarray(cand, dtype=np.int64)
        d = np.empty(cand.shape)
        kernels.dist_rows(q, self.space.kernel_gaps(q), self.x, self.gx, cand, *self.table, d)
        order = np.argsort(d, axis=1, kind="stable")[:, :k]
        return np.take_along_axis(cand, order, 1), np.take_along_axis(d, order, 1)


class Hypsearch(Approach):
    name = "hypsearch"

    params: dict = {}

    def __init__(self, x, spec, backend="auto"):
        super().__init__(x, spec)
        self.backend = backend
        self.settings = [None] + (SWEEPS["hypsearch"] if backend == "auto" else [])

    def build(self):
        self.ix = HyperbolicIndex(space=self.spec, backend=self.backend, **self.params)
        self.ix.add(self.x, [str(j) for j in range(len(self.x))])
        self.ix.search(self.x[:64], k=10)  # warm-up (compilation)
        return self.ix.stats()["memory_bytes"]

    def search(self, q, k, setting, threads):
        graph_backend.set_search_threads(threads)
        ids, d = self.ix.search(q, k=k, ef=setting)
        return ids.astype(np.int64), d

    def label(self):
        st = self.ix.stats()
        if st["backend"] == "graph":
            p = st["backend_params"]
            return (
                f"hypsearch defaults (graph R={p['R']}, ef={self.ix._backend.ef}, "
                f"ef_construction={p['ef_construction']})"
            )
        return f"hypsearch {st['backend']}" + (" scan" if st["backend"] == "exact" else "")


class Hnswlib(Hypsearch):
    """hnswlib as hypsearch's own ``hnsw`` backend runs it (:mod:`indexing.backends.hnsw`):
    an ``l2`` graph (M=16, ef_construction=200, the values hnswlib's README recommends),
    the top ``ef`` of one pass around the query re-ranked exactly; ``ef`` swept."""

    name = "hnswlib"
    passes = 1

    def __init__(self, x, spec):
        super().__init__(x, spec, "hnsw")
        self.settings = SWEEPS["hnswlib"]
        self.params = {"M": 16, "ef_construction": 200, "build_threads": 2, "passes": self.passes}

    def search(self, q, k, setting, threads):
        self.ix._backend.set_num_threads(threads)
        ids, d = self.ix.search(q, k=k, ef=setting)
        return ids.astype(np.int64), d

    def label(self):
        p = self.ix._backend.params
        how = "a re-centred second pass" if p["passes"] > 1 else "one pass"
        return (
            f"hnswlib l2 (M={p['M']}, ef_construction={p['ef_construction']}), {how}, "
            "exact re-rank (hypsearch's hnsw backend)"
        )


class HnswlibRecentred(Hnswlib):
    """:class:`Hnswlib` with the ``hnsw`` backend's default second pass: the ``ef``
    Euclidean neighbours of the centre of the hyperbolic ball the first pass reached
    (plain ``l2`` stalls below 0.99 on hierarchical clouds however large ``ef``)."""

    name = "hnswlib-recentred"
    passes = 2


def _usearch_metric(d: int, c: float, wide: bool):
    from numba import carray, cfunc, types
    from usearch.index import CompiledMetric, MetricKind, MetricSignature

    scalar = types.float64 if wide else types.float32
    sig = types.float32(types.CPointer(scalar), types.CPointer(scalar))

    @cfunc(sig)
    def poincare(a, b):
        xa = carray(a, d)
        xb = carray(b, d)
        s = 0.0
        na = 0.0
        nb = 0.0
        for i in range(d):
            t = np.float64(xa[i]) - np.float64(xb[i])
            s += t * t
            na += np.float64(xa[i]) * xa[i]
            nb += np.float64(xb[i]) * xb[i]
        z = 2.0 * c * s / max((1.0 - c * na) * (1.0 - c * nb), 1e-300)
        return np.float32(np.log1p(z + np.sqrt(z * (z + 2.0))))

    return CompiledMetric(
        pointer=poincare.address, kind=MetricKind.L2sq, signature=MetricSignature.ArrayArray
    )


class Usearch(Approach):
    name = "usearch"
    settings = SWEEPS["usearch"]

    def build(self):
        from usearch.index import Index

        d = self.x.shape[1]
        self.wide = bool(self.space.deep(self.x).mean() > 0.01)
        self.dt = np.float64 if self.wide else np.float32
        self.ix = Index(
            ndim=d,
            metric=_usearch_metric(d, self.c, self.wide),
            dtype="f64" if self.wide else "f32",
        )
        self.ix.add(np.arange(len(self.x)), self.x.astype(self.dt), threads=2)
        return int(self.ix.memory_usage)

    def search(self, q, k, setting, threads):
        self.ix.expansion_search = setting
        res = self.ix.search(q.astype(self.dt), k, threads=threads)
        return self.rerank(q, np.asarray(res.keys, dtype=np.int64), k)

    def label(self):
        return (
            f"usearch (numba Poincaré CompiledMetric, {'f64' if self.wide else 'f32'}, "
            f"connectivity {self.ix.connectivity}, expansion_add {self.ix.expansion_add})"
        )


@functools.cache
def _poincare_numba(c: float):
    """One numba metric per curvature (pynndescent compiles its pipeline per metric)."""
    import numba

    @numba.njit(fastmath=True)
    def dist(x, y):
        s = 0.0
        nx = 0.0
        ny = 0.0
        for i in range(x.shape[0]):
            t = x[i] - y[i]
            s += t * t
            nx += x[i] * x[i]
            ny += y[i] * y[i]
        z = 2.0 * c * s / max((1.0 - c * nx) * (1.0 - c * ny), 1e-30)
        return np.log1p(z + np.sqrt(z * (z + 2.0)))

    return dist


class Pynndescent(Approach):
    name = "pynndescent"
    settings = SWEEPS["pynndescent"]

    def build(self):
        import pynndescent

        self.ix = pynndescent.NNDescent(
            self.x.astype(np.float32), metric=_poincare_numba(self.c), random_state=0, n_jobs=2
        )
        self.ix.prepare()
        return 0

    def search(self, q, k, setting, threads):
        import numba

        numba.set_num_threads(threads)
        idx, _ = self.ix.query(q.astype(np.float32), k=k, epsilon=setting)
        numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
        return self.rerank(q, idx.astype(np.int64), k)

    def label(self):
        return "pynndescent (numba Poincaré metric, defaults)"


PEERS = {
    "hnswlib": Hnswlib,
    "hnswlib-recentred": HnswlibRecentred,
    "usearch": Usearch,
    "pynndescent": Pynndescent,
}
SETTING = {
    "hypsearch": "ef",
    "hnswlib": "ef",
    "hnswlib-recentred": "ef",
    "usearch": "expansion",
    "pynndescent": "epsilon",
}


def setting_name(app, s):
    if s is None:
        return "defaults" if app.name == "hypsearch" else "full scan"
    return f"{SETTING.get(app.name, '')} {s}"


# -- one dataset ----------------------------------------------------------------------
def run_dataset(args, name):
    x, q, spec, desc = make_data(name, args.queries, args.seed, args.nouns_labels)
    t0 = time.perf_counter()
    truth = exact_truth(x, q, spec, args.k)
    bad = brute_force_differs(x, q, truth, spec, args.check)
    say(f"{desc}: truth in {time.perf_counter() - t0:.1f} s ({bad} of {args.check} differ)")
    names = [a for a in args.approaches.split(",") if a]
    apps = []
    builds = {}
    for nm_ in names:
        if nm_ in PEERS and spec == MIXED:
            continue  # the peers have no product metric
        if nm_ == "exact" and len(x) > 300_000:
            continue
        app = Hypsearch(x, spec, "exact") if nm_ == "exact" else None
        app = app or (Hypsearch(x, spec) if nm_ == "hypsearch" else PEERS[nm_](x, spec))
        app.name = nm_
        warm = type(app)(x[:2000], spec) if nm_ in PEERS else None
        if nm_ == "hypsearch":  # compile the graph kernels outside the timed build
            warm = HyperbolicIndex(space=spec, backend="graph")
            warm.add(x[:3000], [str(j) for j in range(3000)])
            warm.search(q[:64], k=10)
            warm = None
        if warm is not None:
            warm.build()  # compile the numba metrics outside the timed build
            del warm
        gc.collect()
        r0 = rss_bytes()
        t = time.perf_counter()
        acct = app.build()
        el = time.perf_counter() - t
        gc.collect()
        mem = max(acct, rss_bytes() - r0) / len(x)
        builds[nm_] = (app.label(), el, mem)
        say(f"  {app.label()}: build {el:.1f} s, {mem:,.0f} B/vector")
        apps.append(app)
    # recall of every setting (1 thread), cheapest first
    rows = {a.name: [] for a in apps}
    for app in apps:
        for s in app.settings:
            t = time.perf_counter()
            found, d = app.search(q, args.k, s, 1)
            qps = len(q) / (time.perf_counter() - t)
            assert np.isfinite(d).all() and (np.diff(d, axis=1) >= 0).all()
            rec = recall(found, truth)
            rows[app.name].append([s, rec, qps])
            say(f"    {app.name} {setting_name(app, s)}: recall {rec:.4f}, {qps:,.0f} q/s")
            if s is not None and rec >= 0.999:
                break
    # timing: the cheapest settings at the target, interleaved, best of the rounds
    timed = []
    for app in apps:
        ok = [r[0] for r in rows[app.name] if r[1] >= TARGET]
        pick = [None] if app.name == "hypsearch" else ok[:2]
        if app.name == "exact":
            pick = [None]
        timed += [(app, s) for s in pick]
    best = {}
    for _ in range(args.repeats):
        for app, s in timed:
            for th in (1, 2):
                t = time.perf_counter()
                app.search(q, args.k, s, th)
                v = len(q) / (time.perf_counter() - t)
                key = (app.name, s, th)
                best[key] = max(best.get(key, 0.0), v)
    graph_backend.set_search_threads(0)
    del apps
    gc.collect()
    return desc, builds, rows, best


# -- report ---------------------------------------------------------------------------
def tables(results, args, load0, started):
    head = (
        f"Measured {time.strftime('%Y-%m-%d')} with `{args.command}`: "
        f"{cpu_model()} ({platform.machine()}), {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}; {args.queries:,} queries per dataset in one call, "
        f"truth = brute-force exact float64 top-{args.k}; load average {load0:.1f} at the "
        f"start, {os.getloadavg()[0]:.1f} at the end ({(time.time() - started) / 60:.0f} min); "
        "measured while other jobs shared the 2 cores, so every figure is the best of "
        f"{args.repeats} interleaved rounds. Builds with 2 threads. hnswlib runs as hypsearch's "
        "own `hnsw` backend runs it: `l2` on the coordinates, one pass (`hnswlib`) or a "
        "re-centred second pass (`hnswlib-recentred`), the candidates re-ranked exactly.\n"
    )
    lines = [
        head,
        "Fastest setting at recall@10 ≥ 0.99 (hypsearch: its defaults; — : not reached):",
        "",
        "| dataset | approach | setting | recall@10 | q/s, 1 thread | q/s, 2 threads "
        "| build | memory / vector |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    verdicts = []
    for desc, builds, rows, best in results:
        ours = None
        peer_best = None
        for nm_, (label, el, mem) in builds.items():
            rr = rows[nm_]
            cands = [r for r in rr if (nm_, r[0], 1) in best]
            if nm_ == "hypsearch":
                cands = [rr[0]]
            cands = [r for r in cands if r[1] >= TARGET or nm_ == "hypsearch"]
            if not cands:
                top = max(rr, key=lambda r: r[1])
                lines.append(
                    f"| {desc} | {label} | — (best {SETTING.get(nm_, '')} {top[0]}: "
                    f"{top[1]:.4f}) | — | — | — | {el:.1f} s | {mem:,.0f} B |"
                )
                continue
            r = max(cands, key=lambda r: best[(nm_, r[0], 1)])
            q1, q2 = best[(nm_, r[0], 1)], best[(nm_, r[0], 2)]
            st = (
                "defaults"
                if nm_ == "hypsearch"
                else "full scan"
                if nm_ == "exact"
                else f"{SETTING[nm_]} {r[0]}"
            )
            lines.append(
                f"| {desc} | {label} | {st} | {r[1]:.4f} | {q1:,.0f} | {q2:,.0f} "
                f"| {el:.1f} s | {mem:,.0f} B |"
            )
            if nm_ == "hypsearch":
                ours = (r[1], q1, q2, el)
            elif nm_ in PEERS and (peer_best is None or q1 > peer_best[1]):
                peer_best = (nm_, q1)
        if ours:
            parts = [f"{desc}: hypsearch recall {ours[0]:.4f}, {ours[1]:,.0f} q/s"]
            if peer_best:
                ratio = ours[1] / peer_best[1]
                parts.append(
                    f"{ratio:.2f}x the best peer at ≥ 0.99 ({peer_best[0]}, "
                    f"{peer_best[1]:,.0f} q/s; target 1.5x: "
                    f"{'met' if ratio >= 1.5 and ours[0] >= TARGET else 'not met'})"
                )
            if "hnswlib" in builds:
                hl = builds["hnswlib"][1]
                parts.append(
                    f"build {ours[3]:.1f} s vs hnswlib {hl:.1f} s "
                    f"({'met' if ours[3] <= hl else 'not met'})"
                )
            parts.append(f"2 threads {ours[2] / ours[1]:.2f}x one")
            verdicts.append("; ".join(parts))
    lines += ["", "Against the targets:", ""] + [f"- {v}" for v in verdicts]
    lines += [
        "",
        "<details><summary>Every setting of every sweep (one untimed-round run each, "
        "1 thread)</summary>",
        "",
        "| dataset | approach | setting | recall@10 | q/s, 1 thread |",
        "| --- | --- | --- | ---: | ---: |",
    ]
    for desc, _b, rows, _best in results:
        for nm_, rr in rows.items():
            for s, rcl, qps in rr:
                st = (
                    ("defaults" if nm_ == "hypsearch" else "full scan")
                    if s is None
                    else f"{SETTING.get(nm_, '')} {s}"
                )
                lines.append(f"| {desc} | {nm_} | {st} | {rcl:.4f} | {qps:,.0f} |")
    lines += ["", "</details>"]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--datasets", default=None)
    ap.add_argument("--quick", action="store_true", help=f"small datasets ({QUICK})")
    ap.add_argument(
        "--approaches", default="hypsearch,hnswlib,hnswlib-recentred,usearch,pynndescent"
    )
    ap.add_argument("--queries", type=int, default=None)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--nouns-labels", default=NOUNS)
    ap.add_argument("--check", type=int, default=10, help="queries checked against torch")
    add_results_flag(ap, "ann")
    args = ap.parse_args(argv)
    args.command = command_line("ann.py", sys.argv[1:] if argv is None else argv)
    if args.datasets is None:
        args.datasets = QUICK if args.quick else FULL
    if args.queries is None:
        args.queries = 300 if args.quick else 1000
    import torch

    torch.set_num_threads(1)
    load0 = os.getloadavg()[0]
    started = time.time()
    report_each(
        [n for n in args.datasets.split(",") if n],
        lambda name: run_dataset(args, name),
        lambda results: tables(results, args, load0, started),
        args.write_results,
        command=args.command,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
