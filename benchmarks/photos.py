"""Photos without training: where ``pretrained:efficientnet-lite0`` places shipped photos,
and how fast it embeds them.

The photo set: every picture that scikit-image ships in ``skimage/data`` that is
a photograph or a picture of something (24, textures and microscopy included),
scikit-learn's two sample photos, and three renders of each of 8 real photos
(mirrored, the left two thirds, the centre two thirds): 50 images. For each
placement of :class:`models.vision.pretrained.PretrainedModel` it grades each image's
nearest label (geodesic distance, over all 1,860 label nodes) against what the
photo is known to show (:data:`KINDS`: the WordNet synset of what the package's
documentation calls it -- ``skimage.data.chelsea``: "Chelsea the cat";
sklearn's ``china.jpg`` and ``flower.jpg``: a building and a flower), graded at
the most specific node of the label taxonomy at or above that synset: *right*
when the label is the kind or below it (for a kind the taxonomy lacks: that
node itself, the nodes below it being other kinds), *vague* when it is one of
the node's ancestors (a true but less specific answer), and the mean depth of
the labels.  The backbone's own top-1 ImageNet class is graded the same way.

Throughput: ``model.embed`` on decoded photos of their own sizes (centre crop
and resize to 224 px included), for each torch thread count and batch size.

    python benchmarks/photos.py --threads 1 2 --batch-sizes 1 8 16 32
    python benchmarks/photos.py --write-results

Prints markdown tables; ``--write-results [NAME]`` also writes them to
``benchmarks/results/NAME.md`` (``photos.md`` without a NAME).

Several photos show no ImageNet kind (textures, microscopy, a page of text);
their known kind is graded at its nearest ancestor in the label taxonomy
(``gravel``: ``material``-level nodes), where only a vague label can be right.

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

from models.images.decode import decode  # noqa: E402
from models.prototypes import nearest_rows  # noqa: E402
from models.vision.image_model import load_model  # noqa: E402

SKIMAGE = [
    "astronaut.png", "brick.png", "camera.png", "cell.png", "chelsea.png", "clock_motion.png",
    "coffee.png", "coins.png", "color.png", "grass.png", "gravel.png", "horse.png",
    "hubble_deep_field.jpg", "ihc.png", "logo.png", "microaneurysms.png", "moon.png",
    "motorcycle_left.png", "motorcycle_right.png", "page.png", "retina.jpg", "rocket.jpg",
    "text.png", "chessboard_RGB.png",
]  # fmt: skip
SKLEARN = ["china.jpg", "flower.jpg"]
#: what each photo shows, as a WordNet noun synset: the title of its loader in
#: ``skimage.data`` (``astronaut``: "Color image of the astronaut Eileen Collins",
#: ``camera``: the "cameraman" photograph, a photographer at a camera on a tripod,
#: ``color.png``: ``colorwheel``, "Color Wheel", ``rocket``: "Launch photo of DSCOVR
#: on Falcon 9", ...) or sklearn's ``load_sample_image`` (``china.jpg``: a
#: pagoda-roofed building, ``flower.jpg``: a flower)
KINDS = {
    "astronaut.png": "astronaut.n.01", "brick.png": "wall.n.01",
    "camera.png": "photographer.n.01", "cell.png": "cell.n.02",
    "chelsea.png": "domestic_cat.n.01", "clock_motion.png": "clock.n.01",
    "coffee.png": "coffee.n.01", "coins.png": "coin.n.01", "color.png": "color_circle.n.01",
    "grass.png": "grass.n.01", "gravel.png": "gravel.n.01", "horse.png": "horse.n.01",
    "hubble_deep_field.jpg": "galaxy.n.01", "ihc.png": "tissue.n.01", "logo.png": "logo.n.01",
    "microaneurysms.png": "retina.n.01", "moon.png": "moon.n.01",
    "motorcycle_left.png": "motorcycle.n.01", "motorcycle_right.png": "motorcycle.n.01",
    "page.png": "page.n.01", "retina.jpg": "retina.n.01", "rocket.jpg": "rocket.n.01",
    "text.png": "text.n.01", "chessboard_RGB.png": "chessboard.n.01",
    "china.jpg": "building.n.01", "flower.jpg": "flower.n.01",
}  # fmt: skip
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


def known_kinds(names: list[str], tax) -> list[tuple[str, str]]:
    """For each photo (rendered ones by their source), its known kind (:data:`KINDS`)
    and the node of the label taxonomy ``tax`` it is graded at: the kind itself when
    ``tax`` has it, else its deepest WordNet ancestor that ``tax`` has."""
    from models.taxonomy.graph import Taxonomy

    wordnet = None
    out = []
    for n in names:
        kind = KINDS[n.split(" (")[0]]
        if kind in tax.names:
            out.append((kind, kind))
            continue
        wordnet = wordnet or Taxonomy.from_wordnet()
        held = [a for a in wordnet.ancestors(kind) if a in tax.names]
        out.append((kind, max(held, key=tax.depth)))
    return out


def grade(label: str, kind: str, node: str, tax) -> str:
    """``right`` (``label`` is ``node`` or, when ``node`` is the known ``kind`` itself,
    below it), ``vague`` (an ancestor of ``node``) or ``wrong``.  A kind the taxonomy
    lacks is graded at its deepest ancestor there, and the nodes below that one are
    other kinds than the photo's: wrong."""
    if label == node or (node == kind and node in tax.ancestors(label)):
        return "right"
    return "vague" if label in tax.ancestors(node) else "wrong"


def placements(model, photos: dict[str, np.ndarray]) -> tuple[list[dict], list[dict]]:
    names = list(photos)
    p = model.probabilities([photos[n] for n in names])
    tax = model.labels.taxonomy
    points = model.labels.embeddings.double().numpy()
    kinds = known_kinds(names, tax)
    top = [model.classes[int(j)][1] for j in p.argmax(-1)]
    rows, detail = [], {}

    def row(how: str, labels: list[str]) -> dict:
        g = [grade(lab, *kn, tax) for lab, kn in zip(labels, kinds, strict=True)]
        return {
            "placement": how,
            "right": g.count("right"),
            "vague": g.count("vague"),
            "n": len(g),
            "depth": float(np.mean([tax.depth(lab) for lab in labels])),
            "grades": g,
        }

    rows.append(row("(the backbone's top-1 class)", top))
    for how in ("mass", "top1", "topk", "midpoint"):
        z = model.place(p, how).numpy()
        near = [tax.names[j] for j in nearest_rows(z, points, curvature=model.curvature)]
        rows.append(row(how + (f" (k={model.top_k})" if how == "topk" else ""), near))
        if how == model.placement:
            detail = [
                {"photo": n, "kind": kind, "node": node, "top1": t, "p": float(p[j].max()),
                 "top1_grade": rows[0]["grades"][j], "label": lab, "grade": g}
                for j, (n, (kind, node), t, lab, g) in enumerate(
                    zip(names, kinds, top, near, rows[-1]["grades"], strict=True)
                )
            ]  # fmt: skip
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
    load = " / ".join(f"{v:.1f}" for v in os.getloadavg())
    out = [
        f"Measured {when} on {cpu_model()} ({os.cpu_count()} cores visible, shared with other "
        f"jobs; load average at the end {load}), `python benchmarks/photos.py`; model "
        f"`{model.version}`.",
        "",
        "Graded against what each photo is known to show (`KINDS` in benchmarks/photos.py: "
        "the title its package gives it), at the most specific label node at or above that "
        "kind: *right* = the label is the kind or below it (a kind the 1,860 label nodes lack: "
        "the label is that node, since the nodes below it are other kinds), *vague* = one "
        "of its ancestors (true but less specific), else wrong.",
        "",
        "| placement | right | right or vague | mean depth of the label |",
        "| --- | ---: | ---: | ---: |",
    ]
    for r in rows:
        n, ok = r["n"], r["right"] + r["vague"]
        out.append(
            f"| {r['placement']} | {r['right']}/{n} = {r['right'] / n:.3f} "
            f"| {ok}/{n} = {ok / n:.3f} | {r['depth']:.1f} |"
        )
    out += [
        "",
        f"<details><summary>The {len(detail)} photos, placement `{model.placement}`</summary>",
        "",
        "| photo | known kind (graded at) | top-1 class (p) | | nearest label | |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for d in detail:
        at = "" if d["node"] == d["kind"] else f" ({d['node']})"
        out.append(
            f"| {d['photo']} | {d['kind']}{at} | {d['top1']} ({d['p']:.2f}) | {d['top1_grade']} "
            f"| {d['label']} | {d['grade']} |"
        )
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
        print({k: v for k, v in r.items() if k != "grades"}, flush=True)
    speed = throughput(model, photos, args.threads, args.batch_sizes, args.images)
    when = dt.date.today().isoformat()
    report(
        table(rows, detail, speed, when, model),
        args.write_results,
        command=command_line("photos.py"),
    )


if __name__ == "__main__":
    main()
