"""Zero-shot from outside: held-out classes asked of a real server, as a user asks.

For each pair of held-out classes (``--pairs``, default four pairs: each of
the nine clothing and footwear classes but the shirt's T-shirt child once),
a model is trained without their images (the defaults, ``hypsearch train
--dataset fashion-mnist --labels LABELS --holdout A,B --novelty-rate 0.2
--time-budget 0``, all 12 epochs whatever the load:
nothing tells the model or the placement which classes are held out; kept
in ``--models`` and reused when there), the Fashion-MNIST test
split is indexed (``hypsearch index build``), ``hypsearch serve`` starts on
loopback, and every test image of a held-out class, and a sample of the
trained classes' test images, is posted to ``/v1/embed`` as a PNG. Reported
per held-out class:

* **class or parent**: the first label ``/v1/embed`` answers (the deepest
  label whose cone holds the image's point) is the class or a parent of it
  (target: >= 0.6), and how often it is the class itself;
* **name search P@50**: ``POST /v1/search {"label": CLASS, "k": 50}``, the
  share of the 50 results whose label is the class (target >= 0.8);

and for the trained classes' images, how often the first label is their
class (what the zero-shot rule costs them: ``--novelty-rate``).

    python benchmarks/zero_shot.py [--pairs sandal.n.01,shirt.n.01;...] [--jobs 2]
        [--rates 0,0.1,0.2] [--seen 2000] [--write-results]

``--write-results [NAME]`` also writes the table to ``benchmarks/results/NAME.md``
(``zero-shot.md`` without a NAME).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from _common import ROOT, add_results_flag, command_line, cpu_model, report

sys.path.insert(0, str(ROOT))

DEFAULT_PAIRS = (
    "sandal.n.01,shirt.n.01;gym_shoe.n.01,pullover.n.01;trouser.n.01,boot.n.01;dress.n.01,coat.n.01"
)


def _cli() -> list[str]:
    return [sys.executable, "-m", "service.cli"]


def train_model(labels: Path, out: Path, pair: str, extra: list[str], log: Path) -> dict:
    """The default model with ``pair`` held out (reused when ``out`` exists)."""
    meta = out.with_suffix(".json")
    if out.exists() and meta.exists():
        return json.loads(meta.read_text())
    cmd = [*_cli(), "train", "--dataset", "fashion-mnist", "--labels", str(labels)]
    # the novelty statistics fitted (rate 0.2; off by default): each served variant sets
    # its own threshold on the same validation split (variant)
    cmd += ["--out", str(out), "--holdout", pair, "--threads", "1", "--novelty-rate", "0.2"]
    # every epoch of the defaults (no time budget): the model must not depend on the load
    cmd += ["--restart", "--time-budget", "0"]
    cmd += ["--json", "--quiet"]
    print("$ hypsearch " + " ".join(cmd[3:] + extra), file=sys.stderr, flush=True)
    with open(log, "ab") as err:
        p = subprocess.run(cmd + extra, cwd=ROOT, stdout=subprocess.PIPE, stderr=err, text=True)
    if p.returncode != 0:
        raise SystemExit(f"training with --holdout {pair} failed ({p.returncode}); see {log}")
    meta.write_text(p.stdout)
    return json.loads(p.stdout)


def variant(path: Path, rate: float, out: Path) -> Path:
    """The same weights with the novelty threshold set for ``rate`` on the model's own
    validation split (reproduced as ``hypsearch train`` drew it: the stratified split of
    the trained classes' images with the run's seed); rate 0: no novelty rule."""
    from models.images.datasets import load_dataset
    from models.training.data import split_rows
    from models.vision.image_model import load_model

    model = load_model(path)
    cfg = model.config
    if rate == cfg.get("novelty_rate"):
        return path
    model.config = {k: v for k, v in cfg.items() if not k.startswith("novelty_")}
    if rate > 0:
        data = load_dataset("fashion-mnist", split="train")
        targets = np.asarray(data.targets)
        seen = [i for i, (_, node) in enumerate(data.classes) if node not in model.holdout]
        idx = np.flatnonzero(np.isin(targets, seen))
        _, va = split_rows(
            targets, idx, cfg.get("limit"), cfg.get("val_fraction", 0.05), cfg.get("seed", 0)
        )
        threshold = model.novelty.calibrate(model.features(data.images[va]), rate)
        model.config |= {"novelty_rate": rate, "novelty_threshold": threshold}
    else:
        model.novelty = None
    model.save(out)
    return out


def build_index(model: Path, index: Path, log: Path) -> None:
    cmd = [*_cli(), "index", "build", "--model", str(model), "--dataset", "fashion-mnist"]
    cmd += ["--split", "test", "--out", str(index), "--threads", "2", "--quiet", "--json"]
    with open(log, "ab") as err:
        p = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err)
    if p.returncode != 0:
        raise SystemExit(f"index build of {model} failed ({p.returncode}); see {log}")


def ask(url: str, pair: list[str], seen_n: int, seed: int) -> list[dict]:
    """The REST answers for one model: a row per held-out class and one for the trained."""
    import httpx

    from models.images.datasets import load_fashion_mnist
    from models.taxonomy.defaults import default_taxonomy
    from service.imaging import encode_png

    tax = default_taxonomy()
    test = load_fashion_mnist("test")
    nodes = np.array([n for _, n in test.classes])[test.targets]
    rng = np.random.default_rng(seed)
    seen_rows = np.flatnonzero(~np.isin(nodes, pair))
    seen_rows = np.sort(rng.choice(seen_rows, min(seen_n, len(seen_rows)), replace=False))
    rows: list[dict] = []
    with httpx.Client(base_url=url, timeout=60) as client:

        def first_labels(idx: np.ndarray) -> list[str]:
            out = []
            for i in idx.tolist():
                png = encode_png(test.images[i])
                r = client.post("/v1/embed", files={"file": ("x.png", png, "image/png")})
                r.raise_for_status()
                out.append(r.json()["labels"][0]["label"])
            return out

        for h in pair:
            idx = np.flatnonzero(nodes == h)
            got = first_labels(idx)
            parents = tax.parents(h)
            r = client.post("/v1/search", json={"label": h, "k": 50})
            r.raise_for_status()
            res = r.json()["results"]
            rows.append(
                {
                    "class": h,
                    "images": len(idx),
                    "class_or_parent": float(np.mean([g == h or g in parents for g in got])),
                    "the_class": float(np.mean([g == h for g in got])),
                    "name_p50": float(np.mean([x["label"] == h for x in res])) if res else 0.0,
                    "top": _top(got),
                }
            )
        got = first_labels(seen_rows)
        truth = nodes[seen_rows].tolist()
        rows.append(
            {
                "class": "trained classes",
                "images": len(seen_rows),
                "the_class": float(np.mean([g == n for g, n in zip(got, truth, strict=True)])),
            }
        )
    return rows


def _rate(rows: list[dict]) -> str:
    rate = rows[-1].get("novelty_rate")
    return "off" if not rate else f"{rate:g}"


def _top(labels: list[str], k: int = 3) -> str:
    u, c = np.unique(labels, return_counts=True)
    order = np.argsort(-c, kind="stable")[:k]
    return ", ".join(f"{u[j].split('.')[0]} {c[j]}" for j in order)


def table(results: list[tuple[str, dict, list[dict]]], meta: dict) -> str:
    lines = [
        f"Measured {meta['date']} on {meta['machine']}, load average {meta['load0']:.1f} at the "
        f"start and {meta['load1']:.1f} at the end; `python benchmarks/zero_shot.py "
        f"{meta['args']}` (each model: the defaults with the pair held out and the novelty "
        "rule fitted, `hypsearch train --dataset fashion-mnist --labels LABELS --holdout A,B "
        "--novelty-rate 0.2 --time-budget 0`, every epoch; the test "
        "split indexed and served by `hypsearch serve` on loopback; every held-out test image "
        "and a sample of the trained classes' posted to `/v1/embed`).",
        "",
        "| held out | epochs | novelty rate | class | images | first `/v1/embed` label: class "
        "or parent | the class itself | most frequent first labels | name search P@50 |",
        "| --- | ---: | ---: | --- | ---: | ---: | ---: | --- | ---: |",
    ]
    for pair, info, rows in results:
        for r in rows[:-1]:
            lines.append(
                f"| {pair} | {info.get('epochs', '?')} | {_rate(rows)} | {r['class']} | "
                f"{r['images']} | "
                f"{r['class_or_parent']:.3f} | {r['the_class']:.3f} | {r['top']} | "
                f"{r['name_p50']:.2f} |"
            )
    lines += [
        "",
        "| held out | novelty rate | trained classes' images asked | first label is their "
        "class | held-out: class or parent, both classes |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for pair, _, rows in results:
        seen = rows[-1]
        w = np.array([r["images"] for r in rows[:-1]], dtype=float)
        both = float((np.array([r["class_or_parent"] for r in rows[:-1]]) * w).sum() / w.sum())
        lines.append(
            f"| {pair} | {_rate(rows)} | {seen['images']} | {seen['the_class']:.3f} | {both:.3f} |"
        )
    return "\n".join(lines)


def main() -> int:
    sys.path.insert(0, str(Path(__file__).parent))
    from load import start_server
    from train import _labels

    home = Path(os.environ.get("HYPSEARCH_HOME", ROOT / "var"))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--labels", type=Path, default=home / "labels.safetensors")
    ap.add_argument("--pairs", default=DEFAULT_PAIRS, help="pairs A,B separated by ;")
    ap.add_argument("--models", type=Path, default=home / "bench" / "zero-shot")
    ap.add_argument("--jobs", type=int, default=2, help="trainings at once (one thread each)")
    ap.add_argument("--seen", type=int, default=2000, help="trained classes' images to ask")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--train-args", default="", help="extra `hypsearch train` options")
    ap.add_argument(
        "--rates",
        default="0.1",
        help="novelty rates to serve each model with (the same weights, the threshold set on "
        "its validation split; 0: no novelty rule), comma separated",
    )
    add_results_flag(ap, "zero-shot")
    args = ap.parse_args()
    pairs = [p.strip() for p in args.pairs.split(";") if p.strip()]
    if not pairs or any(len(p.split(",")) != 2 for p in pairs):
        ap.error("--pairs: one or more A,B separated by ;")
    try:
        rates = [float(r) for r in args.rates.split(",") if r.strip()]
    except ValueError:
        ap.error(f"--rates {args.rates!r}: numbers in [0, 1), comma separated")
    if not rates or any(not 0 <= r < 1 for r in rates):
        ap.error(f"--rates {args.rates!r}: numbers in [0, 1), comma separated")
    env = dict(os.environ)
    labels = _labels(args.labels, env)
    args.models.mkdir(parents=True, exist_ok=True)
    log = args.models / "log.txt"
    load0 = os.getloadavg()[0]
    extra = args.train_args.split()
    paths = {p: args.models / f"{p.replace(',', '+')}.safetensors" for p in pairs}
    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        infos = dict(
            zip(
                pairs,
                pool.map(lambda p: train_model(labels, paths[p], p, extra, log), pairs),
                strict=True,
            )
        )
    results = []
    for p in pairs:
        for rate in rates:
            with tempfile.TemporaryDirectory(prefix="hypsearch-zsl-") as tmp:
                model = variant(paths[p], rate, Path(tmp) / "model.safetensors")
                index = Path(tmp) / "index"
                t0 = time.perf_counter()
                build_index(model, index, log)
                proc, url = start_server(model, index, log, {})
                try:
                    rows = ask(url, p.split(","), args.seen, args.seed)
                finally:
                    proc.terminate()
                    proc.wait(timeout=60)
                rows[-1]["novelty_rate"] = rate
                print(f"{p} rate {rate:g}: {time.perf_counter() - t0:.0f} s", file=sys.stderr)
            results.append((p, infos[p], rows))
            print(json.dumps({"pair": p, "rate": rate, "rows": rows}), file=sys.stderr)
    meta = {
        "date": dt.date.today().isoformat(),
        "machine": f"{os.uname().nodename} ({cpu_model()}, {os.cpu_count()} cores)",
        "load0": load0,
        "load1": os.getloadavg()[0],
        "args": command_line("zero_shot.py").removeprefix("python benchmarks/zero_shot.py "),
    }
    report(table(results, meta), args.write_results, command=command_line("zero_shot.py"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
