"""ANN benchmark of hypsearch's index backends on hierarchical clouds in the Poincaré ball.

    .venv/bin/python benchmarks/ann.py                      # 200k x 16-d, 1,000 queries
    .venv/bin/python benchmarks/ann.py --n 20000 --dim 8
    .venv/bin/python benchmarks/ann.py --write-readme       # also put the table in README.md

Data: :class:`indexing.synthetic.HierarchicalCloud` (c = 1 by default; most
norms in [0.9, 0.999], 5% beyond 0.999) and 1,000 fresh queries from the same
cloud.  Truth: exact float64 top-10 (``models.geometry.poincare.dist`` on the
float32-proxy top-256 of a full scan, checked against a plain float64
brute force over every item on a sample of queries).

For every backend the script reports build time (``index.add`` of all items into
a fresh in-memory index, store included), memory per vector (growth of the
process RSS during the build, and the index's own accounting), and for each
search setting recall@10 and queries/s with 1 and 2 client threads (each
thread searches batches of ``--batch`` queries; hnswlib uses one thread per
call).  Rows: the exact scan, hnsw with the default re-centred search over an ef
sweep (re-centred search, default passes), and hnsw as a plain "l2 top-ef +
exact re-rank" (passes = 1).

The table goes to stdout; with ``--write-readme`` it also replaces the text
between ``<!-- ann-bench:start -->`` and ``<!-- ann-bench:end -->`` in README.md
(the markers are appended at the end of README.md if missing).
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from indexing import HyperbolicIndex  # noqa: E402
from indexing.backends.base import rerank  # noqa: E402
from indexing.geometry import PoincareSpace, torch_threads  # noqa: E402
from indexing.synthetic import hierarchical_cloud  # noqa: E402
from indexing.table import ItemTable  # noqa: E402

START = "<!-- ann-bench:start -->"
END = "<!-- ann-bench:end -->"


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def exact_truth(x: np.ndarray, q: np.ndarray, k: int, c: float, pool: int = 256):
    """Exact float64 top-k: float32-proxy top-``pool`` of a full scan, re-ranked by
    models.geometry."""
    import torch

    space = PoincareSpace(x.shape[1], c)
    table = ItemTable(x.shape[1], capacity=len(x))
    table.upsert([str(i) for i in range(len(x))], x, [None] * len(x), [None] * len(x))
    prepared = space.proxy_prepare(x)
    out_s = np.empty((len(q), k), dtype=np.int64)
    out_d = np.empty((len(q), k))
    step = max(1, (1 << 24) // len(x))
    for a in range(0, len(q), step):
        keys = space.proxy_keys(q[a : a + step], prepared)
        with torch_threads():
            cand = torch.topk(torch.from_numpy(keys), min(pool, len(x)), dim=1, largest=False)[
                1
            ].numpy()
        s, d = rerank(space, table, q[a : a + step], cand, k)
        out_s[a : a + step], out_d[a : a + step] = s, d
    return out_s, out_d


def brute_force_check(x, q, truth_s, truth_d, c, n_check):
    """Plain float64 brute force (models.geometry.poincare.dist over every item)."""
    import torch

    from models.geometry import poincare

    xt = torch.from_numpy(x)
    worst = 0
    for i in range(min(n_check, len(q))):
        with torch_threads():
            d = poincare.dist(torch.from_numpy(q[i])[None, :], xt, c=c).numpy()
        order = np.argsort(d, kind="stable")[: truth_s.shape[1]]
        if not np.array_equal(order, truth_s[i]) or not np.array_equal(d[order], truth_d[i]):
            worst += 1
    return worst


def recall(found: np.ndarray, truth: np.ndarray) -> float:
    return float(
        np.mean(
            [
                len(set(a.tolist()) & set(b.tolist())) / truth.shape[1]
                for a, b in zip(found, truth, strict=True)
            ]
        )
    )


def timed_search(ix: HyperbolicIndex, q: np.ndarray, k: int, threads: int, batch: int, **kw):
    chunks = [q[a : a + batch] for a in range(0, len(q), batch)]
    t0 = time.perf_counter()
    if threads == 1:
        res = [ix.search(c, k=k, **kw) for c in chunks]
    else:
        with ThreadPoolExecutor(threads) as ex:
            res = list(ex.map(lambda c: ix.search(c, k=k, **kw), chunks))
    el = time.perf_counter() - t0
    ids = np.concatenate([r[0] for r in res])
    return ids, len(q) / el


def to_index(ids: np.ndarray) -> np.ndarray:
    return np.vectorize(lambda s: int(s[1:]), otypes=[np.int64])(ids)


def build(x, ids, c, backend, **params):
    gc.collect()
    before = rss_bytes()
    t0 = time.perf_counter()
    ix = HyperbolicIndex(x.shape[1], c, backend=backend, **params)
    ix.add(x, ids)
    el = time.perf_counter() - t0
    gc.collect()
    grown = rss_bytes() - before
    return ix, el, grown, ix.stats()["memory_bytes"]


def worker(args) -> int:
    """One backend in a fresh process: build (time, RSS growth), then the searches."""
    import json

    threads = [int(t) for t in args.threads.split(",")]
    k, c = args.k, args.curvature
    x, q = hierarchical_cloud(args.n, args.dim, curvature=c, seed=args.seed, n_queries=args.queries)
    truth = np.load(args.truth)
    ids = [f"i{j}" for j in range(len(x))]
    name = args.worker
    params = {"M": args.M, "ef_construction": args.ef_construction} if name == "hnsw" else {}
    ix, el, grown, acct = build(x, ids, c, name, **params)
    label = (
        name if name == "exact" else f"hnsw (M={args.M}, ef_construction={args.ef_construction})"
    )
    print(json.dumps({"build": [label, el, grown / len(x), acct / len(x)]}), flush=True)

    def run(setting, **kw):
        ix.search(q[: args.batch], k=k, **kw)  # warm-up
        qps, found = [], None
        for t in threads:
            found, r = timed_search(ix, q, k, t, args.batch, **kw)
            qps.append(r)
        print(json.dumps({"row": [name, setting, recall(to_index(found), truth), qps]}), flush=True)

    if name == "exact":
        run("full scan")
    else:
        backend = ix._backend
        default_ef, passes = backend.params["ef"], backend.params["passes"]
        for ef in [int(e) for e in args.ef.split(",") if e]:
            run(f"ef={ef}, passes={passes}" + (" (default)" if ef == default_ef else ""), ef=ef)
        backend._p["passes"] = 1
        for ef in [int(e) for e in args.plain_ef.split(",") if e]:
            run(f"ef={ef}, passes=1 (plain l2)", ef=ef)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=200_000)
    ap.add_argument("--dim", type=int, default=16)
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--curvature", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ef", default="32,64,128,256,512", help="hnsw ef sweep (comma separated)")
    ap.add_argument("--plain-ef", default="64,128,256,512", help="ef sweep of hnsw with passes=1")
    ap.add_argument("--M", type=int, default=16)
    ap.add_argument("--ef-construction", type=int, default=200)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--batch", type=int, default=100, help="queries per search call")
    ap.add_argument(
        "--check", type=int, default=30, help="queries checked against plain brute force"
    )
    ap.add_argument("--write-readme", action="store_true")
    ap.add_argument("--readme", default=str(ROOT / "README.md"))
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--truth", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return worker(args)
    threads = [int(t) for t in args.threads.split(",")]
    k, c = args.k, args.curvature

    def say(*a):
        print(*a, file=sys.stderr, flush=True)

    load0 = os.getloadavg()[0]
    say(f"data: {args.n} x {args.dim}-d hierarchical cloud, {args.queries} queries, c={c}")
    x, q = hierarchical_cloud(args.n, args.dim, curvature=c, seed=args.seed, n_queries=args.queries)
    norms = np.linalg.norm(x, axis=1) * np.sqrt(c)
    [f"i{j}" for j in range(len(x))]
    t0 = time.perf_counter()
    truth_s, truth_d = exact_truth(x, q, k, c)
    say(f"truth: {time.perf_counter() - t0:.1f} s")
    bad = brute_force_check(x, q, truth_s, truth_d, c, args.check)
    say(f"truth vs plain brute force on {min(args.check, len(q))} queries: {bad} differ")

    import json
    import subprocess
    import tempfile

    rows = []  # (backend, setting, recall, qps per thread count)
    builds = []  # (backend, build s, rss B/vec, accounted B/vec)
    with tempfile.TemporaryDirectory() as tmp:
        tpath = os.path.join(tmp, "truth.npy")
        np.save(tpath, truth_s)
        base = [sys.executable, os.path.abspath(__file__), "--truth", tpath]
        for opt in (
            "n",
            "dim",
            "queries",
            "k",
            "curvature",
            "seed",
            "ef",
            "plain_ef",
            "M",
            "ef_construction",
            "threads",
            "batch",
        ):
            base += [f"--{opt.replace('_', '-')}", str(getattr(args, opt))]
        for name in ("exact", "hnsw"):
            proc = subprocess.Popen(base + ["--worker", name], stdout=subprocess.PIPE, text=True)
            for line in proc.stdout:
                rec = json.loads(line)
                if "build" in rec:
                    builds.append(tuple(rec["build"]))
                    say(
                        f"{rec['build'][0]}: build {rec['build'][1]:.1f} s, "
                        f"RSS +{rec['build'][2]:,.0f} B/vector"
                    )
                else:
                    n_, setting, rcl, qps = rec["row"]
                    rows.append((n_, setting, rcl, qps))
                    say(
                        f"{n_:6s} {setting:30s} recall@{k} {rcl:.4f}  "
                        + "  ".join(f"{t}t {v:,.0f} q/s" for t, v in zip(threads, qps, strict=True))
                    )
            if proc.wait() != 0:
                say(f"worker {name} failed ({proc.returncode})")
                return 1

    head = (
        "| backend | search setting | recall@10 | "
        + " | ".join(f"q/s, {t} thread{'s' if t > 1 else ''}" for t in threads)
        + " |"
    )
    lines = [
        f"ANN benchmark (`benchmarks/ann.py --n {args.n} --dim {args.dim}`): hierarchical cloud of "
        f"{args.n:,} points in the {args.dim}-d Poincaré ball (c = {c:g}; "
        f"{np.mean((norms >= 0.9) & (norms <= 0.999)):.0%} of norms in [0.9, 0.999], "
        f"{np.mean(norms > 0.999):.0%} beyond), {len(q):,} fresh queries, "
        f"truth = exact float64 top-{k}. Batches of {args.batch} queries per call; "
        f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}; "
        f"load average {load0:.1f} at the start, {os.getloadavg()[0]:.1f} at the end "
        "(other processes share the CPUs).",
        "",
        head,
        "|" + "---|" * (3 + len(threads)),
    ]
    for name, setting, rec, qps in rows:
        lines.append(
            f"| {name} | {setting} | {rec:.4f} | " + " | ".join(f"{v:,.0f}" for v in qps) + " |"
        )
    lines += [
        "",
        "| backend | build time | memory / vector (RSS growth) "
        "| memory / vector (index accounting) |",
        "|---|---|---|---|",
    ]
    for name, el, g, a in builds:
        lines.append(f"| {name} | {el:.1f} s | {g:,.0f} B | {a:,.0f} B |")
    table = "\n".join(lines)
    print(table)

    if args.write_readme:
        readme = Path(args.readme)
        if not readme.exists():
            say(f"{readme} does not exist: not writing the table")
            return 1
        text = readme.read_text()
        block = f"{START}\n{table}\n{END}"
        if START in text and END in text and text.index(START) < text.index(END):
            text = text[: text.index(START)] + block + text[text.index(END) + len(END) :]
        else:
            text = text.rstrip("\n") + "\n\n" + block + "\n"
        readme.write_text(text)
        say(f"table written to {readme}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
