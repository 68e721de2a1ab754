"""ANN benchmark: hypsearch's index backends against peers, in the Poincaré ball.

    .venv/bin/python benchmarks/ann.py                         # every dataset below
    .venv/bin/python benchmarks/ann.py --datasets cloud:20000:8 --approaches graph,exact
    .venv/bin/python benchmarks/ann.py --write-readme          # also put the tables in README.md

Datasets (``--datasets``, comma separated):

* ``cloud:N:D`` -- :func:`indexing.synthetic.hierarchical_cloud` (c = 1; most
  norms in [0.9, 0.999], 5% beyond 0.999), ``N`` points in ``D`` dimensions;
* ``nouns`` -- the label embeddings of the WordNet noun closure (82,115
  points, dim 10: ``models.labels.train_labels`` for ``--nouns-epochs``
  epochs from the hierarchical start; cached under ``var/ann/``), queries = the
  embeddings of 1,000 random nouns moved by a small random tangent step;
* ``mixed:N`` -- ``N`` points of ``poincare:8,sphere:4,euclidean:4`` (the
  Poincaré factor a hierarchical cloud), the mixed-curvature index.

Every dataset has ``--queries`` fresh queries; truth = exact float64 top-10
(float32 proxy top-256 of a full scan re-ranked by ``models.geometry``,
checked against a plain float64 brute force on ``--check`` queries).

Approaches (``--approaches``), each in a fresh process (build time, RSS growth):

* ``exact``: hypsearch's exact backend (full scan);
* ``graph``: hypsearch's graph backend over an ``ef`` sweep;
* ``hnsw``: hypsearch's hnsw backend (re-centred search) over an ``ef`` sweep;
* peers, every candidate list re-ranked in float64 by ``models.geometry`` so
  the recall compares like with like:
  ``hnswlib`` (``l2`` on the Poincaré coordinates, M=16, ef_construction=200,
  top-ef re-ranked), ``usearch`` (connectivity 32, a numba metric
  ``|x-y|^2 w_x w_y`` with ``w = 1/(1-c|x|^2)`` stored as an extra
  coordinate), ``pynndescent`` (numba Poincaré distance, 30 neighbours,
  epsilon sweep).  The peers' metrics are compiled here from the formulas:
  they configure the peers and never produce a distance that is reported.

For each search setting: recall@10 and queries/s with 1 and 2 client threads
(each searching batches of ``--batch`` queries).  The summary table gives, per
dataset and approach, the fastest setting at recall@10 >= 0.99 and the build.
With ``--write-readme`` the tables replace the text between
``<!-- ann-bench:start -->`` and ``<!-- ann-bench:end -->`` in README.md.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from _common import ROOT, report

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from indexing import HyperbolicIndex  # noqa: E402
from indexing.backends.base import rerank  # noqa: E402
from indexing.backends.exact import n_candidates  # noqa: E402
from indexing.geometry import PoincareIndexSpace, make_index_space, torch_threads  # noqa: E402
from indexing.synthetic import hierarchical_cloud  # noqa: E402
from indexing.table import ItemTable  # noqa: E402

START = "<!-- ann-bench:start -->"
END = "<!-- ann-bench:end -->"
MIXED = "poincare:8,sphere:4,euclidean:4"
TARGET = 0.99

SWEEPS = {
    "graph": [16, 24, 32, 48, 64, 96, 128, 192, 256],
    "hnsw": [32, 64, 128, 256, 512],
    "hnswlib": [32, 64, 128, 256, 512],
    "usearch": [16, 32, 64, 128, 256],
    "pynndescent": [0.0, 0.05, 0.1, 0.2, 0.3],
}


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def say(*a) -> None:
    print(*a, file=sys.stderr, flush=True)


# -- data --------------------------------------------------------------------------
def make_data(name: str, n_queries: int, seed: int, nouns_epochs: int):
    """``(x, q, space_string, description)``."""
    kind, *rest = name.split(":")
    if kind == "cloud":
        n, d = int(rest[0]), int(rest[1])
        x, q = hierarchical_cloud(n, d, seed=seed, n_queries=n_queries)
        return x, q, f"poincare:{d}", f"hierarchical cloud, {n:,} x {d}-d"
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
        x = nouns_embeddings(nouns_epochs)
        rng = np.random.default_rng(seed)
        pick = rng.choice(len(x), size=n_queries, replace=False)
        q = _jitter(x[pick], rng)
        return (
            x,
            q,
            f"poincare:{x.shape[1]}",
            f"WordNet noun embeddings, {len(x):,} x {x.shape[1]}-d",
        )
    raise SystemExit(f"--datasets: unknown dataset {name!r}")


def _jitter(p: np.ndarray, rng) -> np.ndarray:
    """Move points by a small tangent step (expmap of models.geometry)."""
    import torch

    from models.geometry import poincare

    v = 0.05 * rng.standard_normal(p.shape)
    with torch_threads():
        out = poincare.expmap(torch.from_numpy(p), torch.from_numpy(v), c=1.0).numpy()
    return np.asarray(out, dtype=np.float64)


def nouns_embeddings(epochs: int) -> np.ndarray:
    cache = ROOT / "var" / "ann" / f"nouns-{epochs}ep.npy"
    if cache.exists():
        return np.load(cache)
    import torch

    from models.labels import LabelTrainConfig, train_labels
    from models.taxonomy import Taxonomy

    torch.set_num_threads(1)
    say(f"training noun label embeddings ({epochs} epochs; cached in {cache})")
    emb = train_labels(Taxonomy.from_wordnet(), LabelTrainConfig(epochs=epochs, seed=0))
    x = emb.embeddings.numpy().astype(np.float64)
    cache.parent.mkdir(parents=True, exist_ok=True)
    np.save(cache, x)
    return x


def exact_truth(x: np.ndarray, q: np.ndarray, spec: str, k: int, pool: int = 256):
    """Exact float64 top-k: proxy top-``pool`` of a full scan, re-ranked by models.geometry."""
    import torch

    space = make_index_space(None, 1.0, spec)
    table = ItemTable(x.shape[1], capacity=len(x))
    table.upsert([str(i) for i in range(len(x))], x, [None] * len(x), [None] * len(x))
    prepared = space.proxy_prepare(x)
    out = np.empty((len(q), k), dtype=np.int64)
    step = max(1, (1 << 23) // len(x))
    for a in range(0, len(q), step):
        keys = space.proxy_keys(q[a : a + step], prepared)
        with torch_threads():
            cand = torch.topk(torch.from_numpy(keys), min(pool, len(x)), dim=1, largest=False)
        s, _ = rerank(space, table, q[a : a + step], cand[1].numpy(), k)
        out[a : a + step] = s
    return out


def brute_force_differs(x, q, truth, spec, n_check) -> int:
    space = make_index_space(None, 1.0, spec)
    bad = 0
    for i in range(min(n_check, len(q))):
        d = space.pairwise(q[i : i + 1], x)[0]
        if not np.array_equal(np.argsort(d, kind="stable")[: truth.shape[1]], truth[i]):
            bad += 1
    return bad


def recall(found: np.ndarray, truth: np.ndarray) -> float:
    k = truth.shape[1]
    return float(
        np.mean(
            [len(set(a.tolist()) & set(b.tolist())) / k for a, b in zip(found, truth, strict=True)]
        )
    )


# -- approaches (in a worker process) -------------------------------------------------
class Approach:
    """``build(x)`` then ``search(q_batch, k, setting) -> int slots``."""

    def __init__(self, x, spec):
        self.x, self.spec = x, spec
        self.space = make_index_space(None, 1.0, spec)
        self.table = ItemTable(x.shape[1], capacity=len(x))
        self.table.upsert([str(i) for i in range(len(x))], x, [None] * len(x), [None] * len(x))

    def rerank(self, q, cand, k):
        return rerank(self.space, self.table, q, cand, k)[0]


class Ours(Approach):
    def __init__(self, x, spec, backend):
        super().__init__(x, spec)
        self.backend = backend

    def build(self):
        self.ix = HyperbolicIndex(space=self.spec, backend=self.backend)
        self.ix.add(self.x, [f"i{j}" for j in range(len(self.x))])
        return self.ix.stats()["memory_bytes"]

    def search(self, q, k, setting):
        ids, _ = self.ix.search(q, k=k, ef=setting)
        return np.vectorize(lambda s: int(s[1:]), otypes=[np.int64])(ids)

    def label(self):
        p = self.ix.stats()["backend_params"]
        if self.backend == "graph":
            return f"hypsearch graph (R={p['R']}, ef_construction={p['ef_construction']})"
        if self.backend == "hnsw":
            return f"hypsearch hnsw (M={p['M']}, re-centred, passes={p['passes']})"
        return "hypsearch exact scan"


class Hnswlib(Approach):
    def build(self):
        import hnswlib

        self.ix = hnswlib.Index(space="l2", dim=self.x.shape[1])
        self.ix.init_index(max_elements=len(self.x), M=16, ef_construction=200, random_seed=100)
        self.ix.add_items(self.x.astype(np.float32), np.arange(len(self.x)), num_threads=2)
        return (2 * 16 + 1) * 4 * len(self.x) + self.x.shape[1] * 4 * len(self.x)

    def search(self, q, k, setting):
        labels, _ = self.ix.knn_query(q.astype(np.float32), k=setting, num_threads=1)
        return self.rerank(q, labels.astype(np.int64), k)

    def label(self):
        return "hnswlib l2 (M=16, ef_construction=200), top-ef re-ranked"


def _usearch_metric(d: int):
    from numba import carray, cfunc, types
    from usearch.index import CompiledMetric, MetricKind, MetricSignature

    sig = types.float32(types.CPointer(types.float32), types.CPointer(types.float32))

    @cfunc(sig)
    def metric(a, b):
        xa = carray(a, d + 1)
        xb = carray(b, d + 1)
        s = np.float32(0.0)
        for i in range(d):
            t = xa[i] - xb[i]
            s += t * t
        return s * xa[d] * xb[d]

    return CompiledMetric(
        pointer=metric.address, kind=MetricKind.L2sq, signature=MetricSignature.ArrayArray
    )


class Usearch(Approach):
    def build(self):
        from usearch.index import Index

        d = self.x.shape[1]
        x32, w = PoincareIndexSpace(d, 1.0).proxy_prepare(self.x)
        self.aug = np.hstack([x32, w[:, None]]).astype(np.float32)
        self.ix = Index(
            ndim=d + 1,
            metric=_usearch_metric(d),
            dtype="f32",
            connectivity=32,
            expansion_add=128,
        )
        self.ix.add(np.arange(len(self.x)), self.aug, threads=2)
        return int(self.ix.memory_usage)

    def search(self, q, k, setting):
        d = self.x.shape[1]
        x32, w = PoincareIndexSpace(d, 1.0).proxy_prepare(q)
        qa = np.hstack([x32, np.ones((len(q), 1), np.float32)])
        m = n_candidates(k, len(self.x))
        self.ix.expansion_search = max(setting, m)
        res = self.ix.search(qa, m, threads=1)
        return self.rerank(q, np.asarray(res.keys, dtype=np.int64), k)

    def label(self):
        return "usearch (connectivity 32, metric \\|x-y\\|² w_x w_y), candidates re-ranked"


def _poincare_numba():
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
        z = 1.0 + 2.0 * s / max((1.0 - nx) * (1.0 - ny), 1e-30)
        return np.log(z + np.sqrt(max(z * z - 1.0, 0.0)))

    return dist


class Pynndescent(Approach):
    def build(self):
        import pynndescent

        self.ix = pynndescent.NNDescent(
            self.x.astype(np.float32),
            metric=_poincare_numba(),
            n_neighbors=30,
            random_state=0,
            n_jobs=2,
        )
        self.ix.prepare()
        return 0

    def search(self, q, k, setting):
        m = n_candidates(k, len(self.x))
        idx, _ = self.ix.query(q.astype(np.float32), k=m, epsilon=setting)
        return self.rerank(q, idx.astype(np.int64), k)

    def label(self):
        return "pynndescent (Poincaré metric, 30 neighbours), candidates re-ranked"


def timed(fn, q, k, threads, batch, setting):
    chunks = [q[a : a + batch] for a in range(0, len(q), batch)]
    t0 = time.perf_counter()
    if threads == 1:
        res = [fn(c, k, setting) for c in chunks]
    else:
        with ThreadPoolExecutor(threads) as ex:
            res = list(ex.map(lambda c: fn(c, k, setting), chunks))
    return np.concatenate(res), len(q) / (time.perf_counter() - t0)


def worker(args) -> int:
    z = np.load(args.data)
    x, q, truth = z["x"], z["q"], z["truth"]
    spec = str(z["spec"])
    name = args.worker
    threads = [int(t) for t in args.threads.split(",")]
    if name in ("exact", "graph", "hnsw"):
        app = Ours(x, spec, name)
    else:
        app = {"hnswlib": Hnswlib, "usearch": Usearch, "pynndescent": Pynndescent}[name](x, spec)
    gc.collect()
    before = rss_bytes()
    t0 = time.perf_counter()
    acct = app.build()
    el = time.perf_counter() - t0
    gc.collect()
    grown = rss_bytes() - before
    print(json.dumps({"build": [app.label(), el, grown / len(x), acct / len(x)]}), flush=True)
    settings = [None] if name == "exact" else SWEEPS[name]
    for setting in settings:
        app.search(q[: args.batch], args.k, setting)  # warm-up (and compilation)
        qps, found = [], None
        for t in threads:
            found, r = timed(app.search, q, args.k, t, args.batch, setting)
            qps.append(r)
        rec = recall(found, truth)
        print(json.dumps({"row": [setting, rec, qps]}), flush=True)
        if name != "exact" and rec >= 0.999:
            break  # the sweep is sorted by cost: nothing faster to find further on
    return 0


# -- driver ---------------------------------------------------------------------------
def run_dataset(args, name, tmp):
    threads = [int(t) for t in args.threads.split(",")]
    x, q, spec, desc = make_data(name, args.queries, args.seed, args.nouns_epochs)
    t0 = time.perf_counter()
    truth = exact_truth(x, q, spec, args.k)
    bad = brute_force_differs(x, q, truth, spec, args.check)
    say(
        f"{desc}: truth in {time.perf_counter() - t0:.1f} s; "
        f"{bad} of {args.check} differ from brute force"
    )
    path = os.path.join(tmp, "data.npz")
    np.savez(path, x=x, q=q, truth=truth, spec=spec)
    approaches = [a for a in args.approaches.split(",") if a]
    if spec == MIXED:  # only the exact backend indexes product spaces
        approaches = [a for a in approaches if a == "exact"]
    out = []
    for app in approaches:
        cmd = [
            sys.executable,
            os.path.abspath(__file__),
            "--worker",
            app,
            "--data",
            path,
            "--threads",
            args.threads,
            "--batch",
            str(args.batch),
            "--k",
            str(args.k),
        ]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        build, rows = None, []
        for line in proc.stdout:
            rec = json.loads(line)
            if "build" in rec:
                build = rec["build"]
                say(f"  {build[0]}: build {build[1]:.1f} s, RSS +{build[2]:,.0f} B/vector")
            else:
                rows.append(rec["row"])
                setting, rcl, qps = rec["row"]
                say(
                    f"    {app} {setting!s:>6} recall {rcl:.4f}  "
                    + "  ".join(f"{t}t {v:,.0f} q/s" for t, v in zip(threads, qps, strict=True))
                )
        if proc.wait() != 0:
            say(f"  worker {app} failed ({proc.returncode})")
            continue
        out.append((app, build, rows))
    return desc, len(x), out


def best_row(rows):
    ok = [r for r in rows if r[1] >= TARGET]
    return max(ok, key=lambda r: r[2][0]) if ok else None


SETTING_NAME = {
    "graph": "ef",
    "hnsw": "ef",
    "hnswlib": "ef",
    "usearch": "expansion",
    "pynndescent": "epsilon",
    "exact": "",
}


def tables(results, args, load0):
    threads = [int(t) for t in args.threads.split(",")]
    head = (
        f"Measured {time.strftime('%Y-%m-%d')} (`python benchmarks/ann.py`): "
        f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}; "
        f"{args.queries:,} queries per dataset, batches of {args.batch} per call, truth = "
        f"exact float64 top-{args.k}; load average {load0:.1f} at the start, "
        f"{os.getloadavg()[0]:.1f} at the end. Every approach runs in its own process; "
        "build = adding every point (2 threads where the library can use them).\n"
    )
    lines = [
        head,
        "Fastest setting at recall@10 ≥ 0.99 (— : never reached in the sweep):",
        "",
        "| dataset | approach | setting | recall@10 | q/s, 1 thread | q/s, 2 threads "
        "| build | memory / vector |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    verdicts = []
    for desc, _n, out in results:
        peers = []
        ours = None
        for app, build, rows in out:
            b = best_row(rows)
            mem = f"{max(build[2], build[3]):,.0f} B"
            if b is None:
                top = max(rows, key=lambda r: r[1])
                lines.append(
                    f"| {desc} | {build[0]} | — (best {SETTING_NAME[app]} {top[0]}: "
                    f"{top[1]:.4f}) | — | — | — | {build[1]:.1f} s | {mem} |"
                )
            else:
                setting = "full scan" if app == "exact" else f"{SETTING_NAME[app]} {b[0]}"
                q2 = f"{b[2][1]:,.0f}" if len(b[2]) > 1 else ""
                lines.append(
                    f"| {desc} | {build[0]} | {setting} | {b[1]:.4f} | {b[2][0]:,.0f} | {q2} "
                    f"| {build[1]:.1f} s | {mem} |"
                )
            if app == "graph":
                ours = (b, build)
            elif app in ("hnswlib", "usearch", "pynndescent"):
                peers.append((app, b, build))
        if ours is not None and ours[0] is not None:
            best_peer = max(
                (p for p in peers if p[1] is not None), key=lambda p: p[1][2][0], default=None
            )
            hl = next((p for p in peers if p[0] == "hnswlib"), None)
            parts = [f"{desc}: graph {ours[0][2][0]:,.0f} q/s"]
            if best_peer:
                ratio = ours[0][2][0] / best_peer[1][2][0]
                parts.append(
                    f"{ratio:.2f}x the best peer ({best_peer[0]}, {best_peer[1][2][0]:,.0f} q/s; "
                    f"target 1.5x: {'met' if ratio >= 1.5 else 'not met'})"
                )
            if hl:
                parts.append(
                    f"build {ours[1][1]:.1f} s vs hnswlib {hl[2][1]:.1f} s "
                    f"({'met' if ours[1][1] <= hl[2][1] else 'not met'})"
                )
            if len(ours[0][2]) > 1:
                parts.append(f"2 threads {ours[0][2][1] / ours[0][2][0]:.2f}x")
            verdicts.append("; ".join(parts))
    lines += ["", "Against the targets:", ""] + [f"- {v}" for v in verdicts]
    lines += ["", "<details><summary>Every setting of every sweep</summary>", ""]
    lines += [
        "| dataset | approach | setting | recall@10 | "
        + " | ".join(f"q/s, {t} thread{'s' if t > 1 else ''}" for t in threads)
        + " |",
        "| --- | --- | --- | ---: |" + " ---: |" * len(threads),
    ]
    for desc, _n, out in results:
        for app, _build, rows in out:
            for setting, rcl, qps in rows:
                st = "full scan" if app == "exact" else f"{SETTING_NAME[app]} {setting}"
                lines.append(
                    f"| {desc} | {app} | {st} | {rcl:.4f} | "
                    + " | ".join(f"{v:,.0f}" for v in qps)
                    + " |"
                )
    lines += ["", "</details>"]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--datasets",
        default="cloud:200000:16,cloud:200000:64,cloud:1000000:16,nouns,mixed:200000",
    )
    ap.add_argument("--approaches", default="exact,graph,hnsw,hnswlib,usearch,pynndescent")
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--nouns-epochs", type=int, default=2)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--batch", type=int, default=100, help="queries per search call")
    ap.add_argument("--check", type=int, default=20, help="queries checked by plain brute force")
    ap.add_argument("--write-readme", action="store_true")
    ap.add_argument("--readme", default=str(ROOT / "README.md"))
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--data", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return worker(args)
    load0 = os.getloadavg()[0]
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in [d for d in args.datasets.split(",") if d]:
            results.append(run_dataset(args, name, tmp))
    readme = report(tables(results, args, load0), START, END, args.write_readme, args.readme)
    if readme is not None:
        say(f"tables written to {readme}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
