"""Answers that follow the hierarchy: label queries judged by the items' true classes.

The demo's artifacts (``$HYPSEARCH_HOME``: ``labels.safetensors``,
``model.safetensors``; ``make run`` builds them) and a fresh index of the
Fashion-MNIST test split embedded by that model (the code of today, so the
placement is the current one), queried in process through the service's own
search code (:mod:`service.searching`, what ``POST /v1/search`` runs):

* **label precision**: for each of the ten class synsets and every taxonomy
  label above two to six of them, precision@k (an item is right when its true
  class is the label or below it in the taxonomy) in each mode, and whether
  every class under the label is among the k;
* **level purity**: for each class synset, ``mode: hierarchical`` paged
  through levels 0 to 3 (pages of 100, at most ``--max-results``); a result
  of level ``i`` is pure when its true class is under the level's ``via`` and
  not under the previous level's;
* **latency**: the same label queries in ``entailment`` and ``hierarchical``
  mode (k 10), one thread, ``--repeat`` rounds, per-query mean and p99.

    python benchmarks/hierarchy.py [--home var] [--k 50] [--write-results]

``--write-results`` writes ``benchmarks/results/hierarchy.md``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import ROOT, write_results  # noqa: E402

MODES = ("auto", "nearest", "hierarchical")


def open_runtime(home: Path, folder: Path, model_path: Path | None = None):
    """A runtime over a fresh index of the test split built by the demo's model (or
    the checkpoint ``model_path``)."""
    import torch

    from indexing import HyperbolicIndex
    from models.vision.image_model import load_model
    from service.ingest.build import build_index
    from service.ingest.plans import plan_dataset
    from service.runtime import runtime_for

    torch.set_num_threads(1)
    model = load_model(model_path or home / "model.safetensors")
    index = HyperbolicIndex(dim=model.dim, curvature=model.curvature, path=folder)
    from models.images.datasets import DEFAULT_FASHION_MNIST_DIR

    plan = plan_dataset("fashion-mnist", "test", DEFAULT_FASHION_MNIST_DIR)
    build_index(model, index, plan, workers=0)
    return runtime_for(index, model.labels, model)


def truth_of(rt) -> dict[str, str]:
    from models.images.datasets import FASHION_MNIST_CLASSES, load_fashion_mnist

    ds = load_fashion_mnist("test")
    return {
        f"fashion-mnist-test-{i}": FASHION_MNIST_CLASSES[t][1]
        for i, t in enumerate(ds.targets.tolist())
    }


def search(rt, label: str, mode: str, k: int, offset: int = 0, per_level: int | None = None):
    from service import searching

    x, lab, _ = searching.query_point(rt, label=label)
    mode = searching.resolve_mode(mode, True)
    return searching.search(rt, x, lab, k=k, offset=offset, mode=mode, per_level=per_level)


def paged_levels(rt, label: str, max_results: int, page: int = 100) -> list:
    """``(hit, chain)`` for every ``mode: hierarchical`` result of ``label`` at levels 0
    to 3, paged through (pages of ``page``, at most ``max_results`` results asked)."""
    out = []
    offset = 0
    while offset < max_results:
        ans = search(rt, label, "hierarchical", page, offset)
        if not ans.hits:
            break
        for h in ans.hits:
            if h.level > 3:
                return out
            out.append((h, ans.chain))
        offset += page
    return out


def pure(tax, chain, hit, truth) -> bool:
    """The hit's true class is under its level's chain label and not the one before."""
    t = truth[hit.id]
    ok = t == chain[hit.level] or chain[hit.level] in tax.ancestors(t)
    if hit.level:
        prev = chain[hit.level - 1]
        ok = ok and not (t == prev or prev in tax.ancestors(t))
    return ok


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--home", type=Path, default=Path(os.environ.get("HYPSEARCH_HOME", ROOT / "var"))
    )
    ap.add_argument("--k", type=int, default=50)
    ap.add_argument("--max-results", type=int, default=3000)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--write-results", action="store_true")
    args = ap.parse_args()
    from models.images.datasets import FASHION_MNIST_CLASSES

    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        rt = open_runtime(args.home, Path(tmp) / "index")
        build_s = time.perf_counter() - t0
        truth = truth_of(rt)
        tax = rt.taxonomy
        classes = [c for _, c in FASHION_MNIST_CLASSES]
        under = {n: {c for c in classes if c == n or n in tax.ancestors(c)} for n in tax.names}
        general = sorted(n for n in tax.names if 2 <= len(under[n]) <= 6)
        labels = classes + general

        lines = [
            f"Index: the {len(truth):,} test images embedded by the demo's `model.safetensors` "
            f"({build_s:.0f} s to embed and index). Precision@{args.k}: share of the first "
            f"{args.k} results whose true class is the label or below it; all: every class "
            "under the label is among them.",
            "",
            "| label | classes under it | "
            + " | ".join(f"{m} P@{args.k} | {m} all" for m in ("auto", "nearest"))
            + " |",
            "| --- | --- | " + " | ".join("---: | ---" for _ in range(2)) + " |",
        ]
        prec: dict[str, dict[str, float]] = {m: {} for m in ("auto", "nearest")}
        for lab in labels:
            cells = []
            for m in ("auto", "nearest"):
                ans = search(rt, lab, m, args.k)
                got = [truth[h.id] for h in ans.hits]
                p = float(np.mean([g in under[lab] for g in got]))
                prec[m][lab] = p
                cells += [f"{p:.2f}", "yes" if under[lab] <= set(got) else "no"]
            lines.append(f"| {lab} | {len(under[lab])} | " + " | ".join(cells) + " |")
        for m in ("auto", "nearest"):
            cl = [prec[m][c] for c in classes]
            gen = [prec[m][g] for g in general]
            lines.append(
                f"| **{m}: mean over the classes** | | {np.mean(cl):.3f} (min {min(cl):.2f}); "
                f"general labels min {min(gen):.2f} | | | |"
            )
        lines += [
            "",
            "Level purity, `mode: hierarchical`, levels 0 to 3: every result paged through "
            f"(pages of 100, at most {args.max_results:,} a label), and the first page of "
            f"each level as the page shows it (`per_level` {args.k}):",
            "",
        ]
        lines += [
            "| label | results | level 0 | level 1 | level 2 | level 3 | pure | "
            f"pure, first {args.k} a level |"
        ]
        lines += ["| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        pure_all = n_all = first_pure = first_n = 0
        for lab in classes:
            counts = [0, 0, 0, 0]
            n_pure = 0
            few = search(rt, lab, "hierarchical", 1000, per_level=args.k)
            top = [h for h in few.hits if h.level <= 3]
            p_first = sum(pure(tax, few.chain, h, truth) for h in top)
            first_pure += p_first
            first_n += len(top)
            for h, chain in paged_levels(rt, lab, args.max_results):
                counts[h.level] += 1
                n_pure += pure(tax, chain, h, truth)
            n = sum(counts)
            pure_all += n_pure
            n_all += n
            lines.append(
                f"| {lab} | {n} | "
                + " | ".join(str(c) for c in counts)
                + f" | {n_pure / n:.3f} | {p_first / len(top):.3f} |"
            )
        lines.append(
            f"| **all** | {n_all} | | | | | **{pure_all / n_all:.3f}** | "
            f"**{first_pure / first_n:.3f}** |"
        )

        lines += ["", "Latency per label query (k 10, in process, one thread):", ""]
        lines += ["| mode | mean ms | p99 ms |", "| --- | ---: | ---: |"]
        for m in ("entailment", "hierarchical", "nearest"):
            times = []
            for _ in range(args.repeat):
                for lab in labels:
                    t = time.perf_counter()
                    search(rt, lab, m, 10)
                    times.append((time.perf_counter() - t) * 1e3)
            lines.append(f"| {m} | {np.mean(times):.2f} | {np.percentile(times, 99):.2f} |")
        rt.close()
    body = "\n".join(lines)
    print(body)
    if args.write_results:
        path = write_results(
            "hierarchy",
            body,
            command="python benchmarks/hierarchy.py --write-results",
            title="Answers that follow the hierarchy (label precision, level purity, latency)",
        )
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
