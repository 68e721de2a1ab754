"""Photos without training: where ``pretrained:efficientnet-lite0`` places shipped photos,
and how fast it embeds them.

The photo set: every picture that scikit-image ships in ``skimage/data`` that is
a photograph or a picture of something (24, textures and microscopy included),
scikit-learn's two sample photos, and three renders of each of 8 real photos
(mirrored, the left two thirds, the centre two thirds): 50 images. For each
placement of :class:`models.pretrained.PretrainedModel` it counts the images
whose nearest label (geodesic distance, over all 1,860 label nodes) is the
top-1 ImageNet class's synset or one of its WordNet ancestors, and the mean
depth of that label (how specific the placement is).

Throughput: ``model.embed`` on decoded photos of their own sizes (centre crop
and resize to 224 px included), for each torch thread count and batch size.

    python benchmarks/photos.py --threads 1 2 --batch-sizes 1 8 16 32
    python benchmarks/photos.py --write-results

Prints markdown tables; ``--write-results [NAME]`` also writes them to
``benchmarks/results/NAME.md`` (``photos.md`` without a NAME).

The grading is against the classifier's own top-1 class, not against a known
kind of each photo: it measures whether the placement agrees with the
backbone's prediction, not whether the prediction is right.

``--fashion-mnist``: instead, a hyperbolic head on the pretrained backbone, with
the real commands (times are what a user sees; LABELS as in
``benchmarks/train.py``: ``$HYPSEARCH_HOME/labels.safetensors``, the default
taxonomy's cap construction when missing)::

    hypsearch train --dataset fashion-mnist --labels LABELS --out MODEL \
        --backbone pretrained:efficientnet-lite0 --input-size 64 --unfreeze 1 --limit N
    hypsearch eval --model MODEL --dataset fashion-mnist --split test --json

    python benchmarks/photos.py --fashion-mnist [--input-size 64] [--unfreeze 1]
        [--limit 20000] [--threads 1] [--write-results]

written to ``benchmarks/results/photos-fashion-mnist.md`` (or NAME.md).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import ROOT, add_results_flag, command_line, cpu_model, report  # noqa: E402

from models.image_model import load_model  # noqa: E402
from models.images.decode import decode  # noqa: E402
from models.prototypes import nearest_rows  # noqa: E402

SKIMAGE = [
    "astronaut.png", "brick.png", "camera.png", "cell.png", "chelsea.png", "clock_motion.png",
    "coffee.png", "coins.png", "color.png", "grass.png", "gravel.png", "horse.png",
    "hubble_deep_field.jpg", "ihc.png", "logo.png", "microaneurysms.png", "moon.png",
    "motorcycle_left.png", "motorcycle_right.png", "page.png", "retina.jpg", "rocket.jpg",
    "text.png", "chessboard_RGB.png",
]  # fmt: skip
SKLEARN = ["china.jpg", "flower.jpg"]
RENDERED = [
    "chelsea.png", "coffee.png", "astronaut.png", "rocket.jpg", "motorcycle_left.png",
    "china.jpg", "flower.jpg", "camera.png",
]  # fmt: skip


def photo_set() -> dict[str, np.ndarray]:
    import skimage
    import sklearn.datasets

    sk = Path(skimage.__file__).parent / "data"
    skl = Path(sklearn.datasets.__file__).parent / "images"
    ims = {n: decode(sk / n) for n in SKIMAGE} | {n: decode(skl / n) for n in SKLEARN}
    out = dict(ims)
    for n in RENDERED:
        a = ims[n]
        h, w = a.shape[:2]
        out[f"{n} (mirrored)"] = np.ascontiguousarray(a[:, ::-1])
        out[f"{n} (left 2/3)"] = np.ascontiguousarray(a[:, : max(h, w * 2 // 3)])
        out[f"{n} (centre 2/3)"] = np.ascontiguousarray(a[h // 6 : h - h // 6, w // 6 : w - w // 6])
    return out


def placements(model, photos: dict[str, np.ndarray]) -> tuple[list[dict], list[dict]]:
    names = list(photos)
    p = model.probabilities([photos[n] for n in names])
    tax = model.labels.taxonomy
    points = model.labels.embeddings.double().numpy()
    top = [model.classes[int(j)][1] for j in p.argmax(-1)]
    rows, detail = [], {}
    for how in ("mass", "top1", "topk", "midpoint"):
        z = model.place(p, how).numpy()
        near = [tax.names[j] for j in nearest_rows(z, points, curvature=model.curvature)]
        ok = [lab == t or lab in tax.ancestors(t) for lab, t in zip(near, top, strict=True)]
        rows.append(
            {
                "placement": how + (f" (k={model.top_k})" if how == "topk" else ""),
                "ok": int(sum(ok)),
                "n": len(ok),
                "depth": float(np.mean([tax.depth(lab) for lab in near])),
            }
        )
        if how == model.placement:
            detail = [
                {"photo": n, "top1": t, "p": float(p[j].max()), "label": lab, "ok": g}
                for j, (n, t, lab, g) in enumerate(zip(names, top, near, ok, strict=True))
            ]
    return rows, detail


def throughput(model, photos, threads: list[int], batches: list[int], n: int) -> list[dict]:
    ims = [photos[k] for k in list(photos)[:26]]
    ims = (ims * (n // len(ims) + 1))[:n]
    rows = []
    before = torch.get_num_threads()
    for t in threads:
        torch.set_num_threads(t)
        for b in batches:
            model.embed(ims[: max(b, 2)], batch_size=b)  # warm-up
            t0 = time.perf_counter()
            model.embed(ims, batch_size=b)
            dt_ = time.perf_counter() - t0
            rows.append({"threads": t, "batch": b, "per_s": len(ims) / dt_})
            print(rows[-1], flush=True)
    torch.set_num_threads(before)
    return rows


def table(rows, detail, speed, when: str, model) -> str:
    out = [
        f"Measured {when} on {cpu_model()} ({os.cpu_count()} cores visible, shared with other "
        f"jobs), `python benchmarks/photos.py`; model `{model.version}`.",
        "",
        "Graded against the classifier's own top-1 class, not against a known kind of each "
        "photo: the share says the placement agrees with the backbone's prediction.",
        "",
        "| placement | nearest label = top-1 class or an ancestor | mean depth of that label |",
        "| --- | --- | --- |",
    ]
    for r in rows:
        out.append(
            f"| {r['placement']} | {r['ok']}/{r['n']} = {r['ok'] / r['n']:.3f} | {r['depth']:.1f} |"
        )
    out += [
        "",
        f"<details><summary>The {len(detail)} photos, placement `{model.placement}`</summary>",
        "",
        "| photo | top-1 class (p) | nearest label | |",
        "| --- | --- | --- | --- |",
    ]
    for d in detail:
        mark = "yes" if d["ok"] else "**no**"
        out.append(f"| {d['photo']} | {d['top1']} ({d['p']:.2f}) | {d['label']} | {mark} |")
    out += ["", "</details>", ""]
    out += [
        "| torch threads | batch | images/s (224 px, crop and resize included) |",
        "| --- | --- | --- |",
    ]
    for r in speed:
        out.append(f"| {r['threads']} | {r['batch']} | {r['per_s']:.1f} |")
    return "\n".join(out)


def fashion_mnist_head(args) -> str:
    """Train the head on the backbone (``hypsearch train``), evaluate it (``hypsearch
    eval``); a markdown table of the metrics of ``benchmarks/train.py``."""
    from train import ROWS, _at, _f, _hypsearch, _labels, _run

    home = Path(os.environ.get("HYPSEARCH_HOME", ROOT / "var"))
    env = {**os.environ, "HYPSEARCH_HOME": str(home), "PYTHONPATH": str(ROOT)}
    labels = _labels(home / "labels.safetensors", env)
    out = home / "bench" / "fmnist-pretrained.safetensors"
    out.parent.mkdir(parents=True, exist_ok=True)
    t = str(args.threads[0])
    cmd = [*_hypsearch(), "train", "--dataset", "fashion-mnist", "--labels", str(labels)]
    cmd += ["--out", str(out), "--backbone", "pretrained:efficientnet-lite0", "--threads", t]
    cmd += ["--input-size", str(args.input_size), "--unfreeze", str(args.unfreeze)]
    cmd += ["--restart", "--json"] + (["--limit", str(args.limit)] if args.limit else [])
    train_wall = None
    if not (args.reuse and out.exists()):
        _, train_wall = _run(cmd, env)
    tr = load_model(out)  # what the run recorded: its metrics, feature cache, version
    m = tr.metrics
    cmd = [*_hypsearch(), "eval", "--model", str(out), "--dataset", "fashion-mnist"]
    ev, eval_wall = _run(cmd + ["--split", "test", "--threads", t, "--json"], env)
    feats = m.get("features") or {}
    when = dt.datetime.now().strftime("%Y-%m-%d %H:%M")
    load = " / ".join(f"{v:.1f}" for v in os.getloadavg())
    lines = [
        f"Measured {when} on {cpu_model()} ({os.cpu_count()} cores, shared with other jobs; "
        f"load average at the end {load}), torch threads {t}: `python benchmarks/photos.py "
        f"--fashion-mnist --input-size {args.input_size} --unfreeze {args.unfreeze} --limit "
        f"{args.limit} --threads {t}`; model `{tr.version[:12]}`.",
        "",
        f"Training: {m['train_images']} training images (a stratified subset of the 60,000; "
        f"{feats.get('images')} with the validation split) at {args.input_size} px, "
        f"features {'reused from the cache' if feats.get('reused') else 'extracted'} "
        f"({_f(feats.get('images_per_second'), 1)} images/s, {_f(feats.get('seconds'), 0)} s), "
        f"{m['epochs']} of {m['epochs_requested']} epochs in the time budget; training "
        f"{m['train_seconds']:.0f} s (extraction included)"
        + (f", `hypsearch train` {train_wall:.0f} s wall" if train_wall else "")
        + f"; `hypsearch eval` on the 10,000 test images {eval_wall:.0f} s.",
        "",
        "| metric | pretrained backbone + hyperbolic head |",
        "| --- | --- |",
    ]
    lines += [f"| {name} | {_f(_at(ev, key))} |" for name, key, _ in ROWS]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fashion-mnist", action="store_true", help="the head on Fashion-MNIST")
    ap.add_argument("--input-size", type=int, default=64, help="--fashion-mnist: pixels")
    ap.add_argument("--unfreeze", type=int, default=1, help="--fashion-mnist: trained blocks")
    ap.add_argument("--limit", type=int, default=20000, help="--fashion-mnist: training images")
    ap.add_argument(
        "--reuse", action="store_true", help="--fashion-mnist: evaluate the model already trained"
    )
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 16, 32])
    ap.add_argument("--images", type=int, default=64, help="images per throughput run")
    add_results_flag(ap, "photos")
    args = ap.parse_args()
    if args.fashion_mnist:
        name = args.write_results
        if name == "photos":
            name = "photos-fashion-mnist"
        report(fashion_mnist_head(args), name, command=command_line("photos.py"))
        return
    torch.set_num_threads(max(args.threads))
    t0 = time.perf_counter()
    model = load_model("pretrained:efficientnet-lite0")
    print(f"model loaded in {time.perf_counter() - t0:.1f} s: {model}", flush=True)
    photos = photo_set()
    rows, detail = placements(model, photos)
    for r in rows:
        print(r, flush=True)
    speed = throughput(model, photos, args.threads, args.batch_sizes, args.images)
    when = dt.date.today().isoformat()
    report(
        table(rows, detail, speed, when, model),
        args.write_results,
        command=command_line("photos.py"),
    )


if __name__ == "__main__":
    main()
