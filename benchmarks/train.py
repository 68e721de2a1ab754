"""Benchmark of image training: the default configuration, its Euclidean twin and a zero-shot run.

Runs the real commands (so the times are those a user sees)::

    hypsearch train --dataset fashion-mnist --labels LABELS --out MODEL                # default
    hypsearch train --dataset fashion-mnist --labels LABELS --out TWIN --geometry euclidean   # twin
    hypsearch train --dataset fashion-mnist --labels LABELS --out ZSL \
        --holdout sandal.n.01,shirt.n.01
    hypsearch eval --model M --dataset fashion-mnist --split test --json                      # each

then prints a markdown table; ``--write-results [NAME]`` also writes it to
``benchmarks/results/NAME.md`` (without a NAME: ``train.md``, ``train-seeds.md``
with ``--seeds``, ``train-objectives.md`` with ``--objectives --epochs N`` and
``train-objectives-budget.md`` with ``--objectives`` under a time budget).
LABELS defaults to
``$HYPSEARCH_HOME/labels.safetensors`` (trained on the default WordNet
taxonomy with the default label configuration when missing).

    python benchmarks/train.py [--threads N] [--jobs N] [--write-results] [--reuse]

With ``--objectives`` it trains instead the rows of :data:`OBJECTIVES` (the
default and its twin, then each auxiliary objective, head, curvature and
taxonomy; ``--only a,b`` picks rows) one at a time under
``--budget`` seconds each, evaluates each on the test split and prints one table.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _common import ROOT, add_results_flag, command_line, cpu_model, report

HOLDOUT = "sandal.n.01,shirt.n.01"


def _results_name(args, mode: str) -> str | None:
    """Where ``--write-results`` writes: the NAME given, else the mode's own file
    (``train``, ``train-seeds``, ``train-objectives`` or ``train-objectives-budget``)."""
    if args.write_results is None:
        return None
    return mode if args.write_results == "train" else args.write_results


#: the seeds table: name, key in `hypsearch eval --json`, whether higher is better
SEED_ROWS = [
    ("Recall@1", "recall@1", True),
    ("mAP@R", "map@r", True),
    ("hop-2 mAP@50 (siblings)", "hop_map@50.2", True),
    ("hop-4 mAP@50 (cousins)", "hop_map@50.4", True),
    ("hierarchical Hit@1 (all nodes)", "hier_hit@1", True),
    ("nearest-label accuracy", "nearest_label_acc", True),
    ("mistake severity (hops; lower is better)", "mistakes.severity", False),
    ("mistakes: rate (lower is better)", "mistakes.rate", False),
    ("mean hops per image, avg hops@1 (lower is better)", "mistakes.avg_hops@1", False),
    ("back-off prediction: hierarchical Hit@1", "backoff.hier_hit@1", True),
]

#: the rows of the objectives table: name -> (labels: default, c027 or artifact; extra flags)
OBJECTIVES: dict[str, tuple[str, list[str]]] = {
    "default": ("default", []),
    "twin (--geometry euclidean)": ("default", ["--geometry", "euclidean"]),
    "--hop-weight 0 (the default before 2026-12-02)": ("default", ["--hop-weight", "0"]),
    "twin, --hop-weight 0": ("default", ["--geometry", "euclidean", "--hop-weight", "0"]),
    "--prototype-logits busemann": ("default", ["--prototype-logits", "busemann"]),
    "twin, --prototype-logits busemann": (
        "default",
        ["--geometry", "euclidean", "--prototype-logits", "busemann"],
    ),
    "--placement cones": ("default", ["--placement", "cones"]),
    "--hier-weight 1": ("default", ["--hier-weight", "1"]),
    "--classifier hmlr": ("default", ["--classifier", "hmlr"]),
    "--contrastive hyperbolic": ("default", ["--contrastive", "hyperbolic"]),
    "--contrastive euclidean": ("default", ["--contrastive", "euclidean"]),
    "--ssl byol": ("default", ["--ssl", "byol"]),
    "--ssl barlow": ("default", ["--ssl", "barlow"]),
    "--space poincare:8,sphere:4,euclidean:4 --loss circle": (
        "default",
        ["--space", "poincare:8,sphere:4,euclidean:4", "--loss", "circle"],
    ),
    "--unsupervised": ("default", ["--unsupervised"]),
    "--loss circle (ball, c = 1)": ("default", ["--loss", "circle", "--curvature", "1"]),
    "twin, --loss circle": ("default", ["--loss", "circle", "--geometry", "euclidean"]),
    "--loss circle, c = 0.27": ("default", ["--loss", "circle", "--curvature", "0.27"]),
    "--loss circle, --curvature learn": ("default", ["--loss", "circle", "--curvature", "learn"]),
    "labels at c = 0.27": ("c027", []),
    "artifact.n.01 labels": ("artifact", []),
    "artifact.n.01 labels, --negative-sample 256": ("artifact", ["--negative-sample", "256"]),
    "--negative-sample 256": ("default", ["--negative-sample", "256"]),
}

#: columns of the objectives table: header, key in `hypsearch eval --json`
OBJ_COLUMNS = [
    ("Recall@1", "recall@1"),
    ("mAP@R", "map@r"),
    ("hop-2 mAP@50", "hop_map@50.2"),
    ("hop-4 mAP@50", "hop_map@50.4"),
    ("hier. Hit@1", "hier_hit@1"),
    ("nearest-label acc.", "nearest_label_acc"),
    ("back-off Hit@1", "backoff.hier_hit@1"),
]


def _hypsearch() -> list[str]:
    return [sys.executable, "-m", "service.cli"]


def _run(cmd: list[str], env: dict) -> tuple[dict, float]:
    print("$ " + " ".join(cmd[3:] if cmd[:3] == _hypsearch() else cmd), file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    p = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"command failed ({p.returncode}): {' '.join(cmd)}")
    return json.loads(p.stdout), wall


def _train_cmd(labels: Path, out: Path, threads: int, *extra: str) -> list[str]:
    """``hypsearch train`` on Fashion-MNIST from scratch (``--restart``), answering JSON."""
    cmd = [*_hypsearch(), "train", "--dataset", "fashion-mnist", "--labels", str(labels)]
    return cmd + ["--out", str(out), "--threads", str(threads), "--restart", "--json", *extra]


def _labels(path: Path, env: dict) -> Path:
    if path.exists():
        return path
    from models.taxonomy.defaults import default_taxonomy

    tax_path = path.with_name("taxonomy.tsv")
    if not tax_path.exists():
        default_taxonomy().to_tsv(tax_path)
    _run(
        [
            *_hypsearch(),
            "labels",
            "train",
            "--taxonomy",
            str(tax_path),
            "--out",
            str(path),
            "--json",
        ],
        env,
    )
    return path


#: the rows of the main table: metric, its key in `hypsearch eval --json` (dots go down), target
ROWS = [
    ("Recall@1", "recall@1", "≥ 0.92"),
    ("Recall@5", "recall@5", ""),
    ("Recall@10", "recall@10", ""),
    ("mAP@R", "map@r", "≥ 0.85"),
    ("hop mAP@50, 0 hops (class)", "hop_map@50.0", "≥ twin"),
    ("hop mAP@50, 2 hops (siblings)", "hop_map@50.2", "≥ 0.95, ≥ twin"),
    ("hop mAP@50, 4 hops (cousins)", "hop_map@50.4", "≥ twin"),
    ("hierarchical Hit@1 (all nodes)", "hier_hit@1", "≥ twin"),
    ("hierarchical Hit@5 (all nodes)", "hier_hit@5", "≥ twin"),
    ("nearest-label accuracy (all nodes)", "nearest_label_acc", "≥ twin"),
    ("mistakes (nearest trained class): rate", "mistakes.rate", ""),
    ("mistake severity: mean hops of a mistake (lower is better)", "mistakes.severity", "≤ twin"),
    ("back-off prediction: hierarchical Hit@1", "backoff.hier_hit@1", "≥ twin"),
    ("back-off prediction: exact class", "backoff.acc", "≥ twin"),
    ("back-off prediction: share backed off", "backoff.backed_off", ""),
    ("OOD AUROC, distance to origin", "ood.auroc_radius", "reported"),
    ("OOD AUROC, distance to head base point", "ood.auroc_base", "reported"),
    ("OOD AUROC, max softmax prob.", "ood.auroc_msp", "reported"),
    ("δ_rel of encoder features", "features_delta.delta_rel", "reported"),
    ("curvature suggested by δ_rel", "features_delta.suggested_curvature", "reported"),
]


def _at(ev: dict, key: str):
    """``ev["a"]["b"]`` for the key ``"a.b"``; None where a part is missing."""
    for part in key.split("."):
        ev = ev.get(part) if isinstance(ev, dict) else None
    return ev


def _f(v, digits=3) -> str:
    return "–" if v is None else f"{v:.{digits}f}"


def seeds_table(evals: dict[str, list[dict]], seeds: list[int], trains: dict) -> str:
    """Mean and range over the seeds of each run and of the twin, and whether each run's
    difference to the twin is larger than the spread (the ranges do not overlap)."""
    when = dt.datetime.now().strftime("%Y-%m-%d")
    runs = [r for r in evals if r != "euclidean"]
    epochs = ", ".join(f"{_SEED_NAMES[r]} {[t.get('epochs') for t in trains[r]]}" for r in evals)
    lines = [
        f"#### Seeds ({when}; {os.cpu_count()} CPUs, {cpu_model()}, torch threads 1, 2 runs at "
        f"a time; seeds {', '.join(map(str, seeds))}; the 570 s budget of the table above; "
        f"epochs: {epochs})",
        "",
        "| metric | "
        + " | ".join(f"{_SEED_NAMES[r]}: mean (min–max) | vs twin" for r in runs)
        + " | twin: mean (min–max) |",
        "| --- |" + " --- | --- |" * len(runs) + " --- |",
    ]

    def cell(v: list[float]) -> str:
        return f"{statistics.mean(v):.3f} ({min(v):.3f}–{max(v):.3f})"

    for name, key, higher in SEED_ROWS:
        t = [_at(e, key) for e in evals["euclidean"]]
        if any(v is None for v in t):
            continue
        row = [name]
        for r in runs:
            h = [_at(e, key) for e in evals[r]]
            if any(v is None for v in h):
                row += ["–", ""]
                continue
            diff = statistics.mean(h) - statistics.mean(t)
            good, bad = (min(h) > max(t), max(h) < min(t))
            if not higher:
                good, bad = bad, good
            verdict = "**ahead**" if good else "behind" if bad else "overlap"
            row += [cell(h), f"{diff:+.3f} {verdict}"]
        lines.append("| " + " | ".join(row + [cell(t)]) + " |")
    lines.append("")
    lines.append(
        "'ahead': every seed of the run better than every seed of the twin (the ranges do not "
        "overlap: the difference is larger than the spread); 'overlap': not. Reproduce: "
        "`python benchmarks/train.py --threads 1 --jobs 2` (seed 0), then the same with "
        "`--seeds 1,2` (seeds 1 and 2, and this table)."
    )
    return "\n".join(lines)


_SEED_NAMES = {
    "hyperbolic": "hyperbolic, head output (`--placement none`)",
    "placed": "hyperbolic (default: `--placement cones`)",
    "euclidean": "twin",
}


def head_output_of(placed: Path, out: Path, env: dict) -> None:
    """``out``: the weights of the model ``placed`` (trained with the cone placement) with
    the placement off, i.e. what ``hypsearch train --placement none`` with the same seed
    trains (the placement is applied after training, to the outputs only), without
    training it again (a third fewer runs)."""
    code = (
        "import sys; from models.vision.image_model import ImageModel\n"
        "m = ImageModel.load(sys.argv[1]); m.config['placement'] = 'none'\n"
        "m.classifier = None; m.novelty = None; m.save(sys.argv[2])"
    )
    cmd = [sys.executable, "-c", code, str(placed), str(out)]
    subprocess.run(cmd, cwd=ROOT, env=env, check=True)


def run_seeds(args, labels: Path, env: dict) -> int:
    """``--seeds``: the default and its twin again at other seeds, beside seed 0's models of
    a plain run in the same ``--out-dir``; writes the seeds table."""
    from concurrent.futures import ThreadPoolExecutor

    seeds = [int(x) for x in args.seeds.split(",") if x.strip()]
    flags = {
        "hyperbolic": ["--placement", "none"],
        "placed": ["--placement", "cones"],  # the default with the default's cap labels
        "euclidean": ["--geometry", "euclidean"],
    }
    jobs = [(name, s) for s in seeds for name in flags if name != "hyperbolic"]

    def path(name: str, seed: int) -> Path:
        return args.out_dir / (name if seed == 0 else f"{name}-s{seed}")

    def train_one(job) -> dict:
        name, seed = job
        base = path(name, seed)
        info_path = base.with_suffix(".train.json")
        if (args.reuse or seed == 0) and info_path.exists():
            return json.loads(info_path.read_text())
        if name == "hyperbolic":  # the placed model's weights (trained first), placement off
            placed = path("placed", seed)
            head_output_of(Path(f"{placed}.safetensors"), Path(f"{base}.safetensors"), env)
            info = json.loads(placed.with_suffix(".train.json").read_text())
            info_path.write_text(json.dumps(info | {"weights_of": placed.name}, indent=1))
            return info
        extra = [*flags[name], "--seed", str(seed), "--quiet"]
        info, wall = _run(_train_cmd(labels, Path(f"{base}.safetensors"), 1, *extra), env)
        info["wall_seconds"] = wall
        info_path.write_text(json.dumps(info, indent=1))
        return info

    def eval_one(job) -> dict:
        name, seed = job
        base = path(name, seed)
        ev_path = Path(f"{base}.seeds-eval.json")  # beside a plain run's own eval.json
        cmd = [*_hypsearch(), "eval", "--model", f"{base}.safetensors", "--dataset"]
        cmd += ["fashion-mnist", "--split", "test", "--threads", "1", "--json", "--quiet"]
        ev, _ = _run(cmd + ["--no-ood", "--no-delta"], env)
        ev_path.write_text(json.dumps(ev, indent=1))
        return ev

    trained = [name for name in flags if name != "hyperbolic"]
    all_jobs = [(name, 0) for name in trained] + jobs if 0 not in seeds else jobs
    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        infos = dict(zip(all_jobs, pool.map(train_one, all_jobs), strict=True))
    heads = [("hyperbolic", s) for _, s in all_jobs if _ == "placed"]
    infos |= {job: train_one(job) for job in heads}  # after their placed models
    all_jobs += heads
    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        evals = dict(zip(all_jobs, pool.map(eval_one, all_jobs), strict=True))
    used = sorted({s for _, s in all_jobs})
    by = {name: [evals[(name, s)] for s in used] for name in flags}
    trains = {name: [infos[(name, s)] for s in used] for name in flags}
    report(
        seeds_table(by, used, trains),
        _results_name(args, "train-seeds"),
        command=command_line("train.py"),
    )
    return 0


def table(res: dict) -> str:
    h, e, z = res["hyperbolic"]["eval"], res["euclidean"]["eval"], res["zero_shot"]["eval"]
    ht, et, zt = res["hyperbolic"]["train"], res["euclidean"]["train"], res["zero_shot"]["train"]
    pe = res.get("placed", {}).get("eval")  # the same default with --placement cones
    pt = res.get("placed", {}).get("train", {})
    rows = [
        (name, _at(h, key), _at(pe or {}, key), _at(e, key), target) for name, key, target in ROWS
    ]
    rows += [
        (
            "training time (s)",
            ht["wall_seconds"],
            pt.get("wall_seconds"),
            et["wall_seconds"],
            "≤ 600",
        ),
        ("epochs", ht["epochs"], pt.get("epochs"), et["epochs"], ""),
    ]
    when = dt.datetime.now().strftime("%Y-%m-%d")
    head = (
        f"#### Image training benchmark ({when}; {os.cpu_count()} CPUs, {cpu_model()}, "
        f"torch threads {res['threads']}"
        f"{', ' + str(res['jobs']) + ' runs at a time' if res.get('jobs', 1) > 1 else ''})\n\n"
        f"`hypsearch train --dataset fashion-mnist --labels LABELS --out MODEL` (defaults, Conv-4, "
        f"dim {h['dim']}, c = {h['curvature']:g}) and its Euclidean twin "
        f"(`--geometry euclidean`: same "
        f"encoder, loss and budget; prototypes are the label points' tangent vectors at the head's "
        f"base point), each evaluated with `hypsearch eval --json` on the 10,000 test images. "
        "The twin gets no cone placement: the head-output column against the twin is the "
        "like-for-like comparison; the placed column's lead on the label metrics is the "
        "placement's.\n\n"
    )
    placed = pe is not None
    lines = [
        "| metric | hyperbolic, head output (`--placement none`) |"
        + (" hyperbolic (default: `--placement cones`) |" if placed else "")
        + " Euclidean twin | target |",
        "| --- | --- |" + (" --- |" if placed else "") + " --- | --- |",
    ]
    for name, a, p, b, target in rows:
        digits = 0 if "time" in name or name == "epochs" else 3
        mid = f" {_f(p, digits)} |" if placed else ""
        lines.append(f"| {name} | {_f(a, digits)} |{mid} {_f(b, digits)} | {target} |")
    zs = z["zero_shot"]
    lines += [
        "",
        f"Zero-shot (`--holdout {HOLDOUT} --placement none`: one footwear and one clothing "
        f"class never seen in training; {zt['wall_seconds']:.0f} s). Hierarchical Hit@1 "
        "(target ≥ 0.6): the prediction is the class or its parent. 'Nearest node': the "
        "nearest taxonomy node among all but the trained classes; 'back-off': the most "
        f"specific node among those that holds at least {zt_threshold(z)} of the posterior "
        "over the trained classes "
        "(`models.training.evaluate.backoff_predict`, the same rule as for the trained classes "
        "above); "
        "'all nodes' also counts the trained classes as candidates. Name search: precision of "
        "the 50 test images nearest to the class's label point.",
        "",
        "| held-out class | images | Hit@1, nearest node | Hit@1, back-off "
        "| nearest node, all nodes | back-off, all nodes | name search precision@50 |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for node, v in zs["classes"].items():
        lines.append(
            f"| {node} | {v['images']} | {_f(v['hier_hit@1'])} | {_f(v['backoff_hier_hit@1'])} | "
            f"{_f(v['hier_hit@1_all_nodes'])} | {_f(v['backoff_hier_hit@1_all_nodes'])} | "
            f"{_f(v['name_precision@50'])} |"
        )
    lines.append(
        f"| both | {sum(v['images'] for v in zs['classes'].values())} | {_f(zs['hier_hit@1'])} | "
        f"{_f(zs['backoff_hier_hit@1'])} | | | {_f(zs['name_precision@50'])} |"
    )
    lines.append("")
    lines.append(
        f"Same run, all test images: Recall@1 {_f(z['recall@1'])}, mAP@R {_f(z['map@r'])}."
    )
    if "speed" in res:
        s1, s2 = res["speed"][1], res["speed"][2]
        lines.append(
            f"Speed: one epoch of 12,160 training images took {s1:.0f} s with 1 torch thread and "
            f"{s2:.0f} s with 2 (a full epoch is 57,000 images)."
        )
    la = res["loadavg"]
    lines.append(
        f"Load average at the end of the run: {la[0]:.1f} / {la[1]:.1f} / {la[2]:.1f} (other work "
        f"shared the machine). Reproduce: `python benchmarks/train.py --threads {res['threads']}"
        f"{' --jobs ' + str(res['jobs']) if res.get('jobs', 1) > 1 else ''}`."
    )
    return head + "\n".join(lines) + "\n"


def zt_threshold(ev: dict) -> str:
    return f"{ev['backoff']['threshold']:g}"


def _objective_labels(kind: str, home: Path, default: Path, env: dict) -> Path:
    """The label checkpoint of a row: the default labels, the default taxonomy's at c = 0.27,
    or the whole ``artifact.n.01`` subtree's (``taxonomy wordnet`` then ``labels train``)."""
    if kind == "default":
        return default
    out = home / f"labels-{kind}.safetensors"
    if out.exists():
        return out
    if kind == "c027":
        tax, extra = default.with_name("taxonomy.tsv"), ["--curvature", "0.27"]
    else:
        tax, extra = home / "artifact.tsv", []
        if not tax.exists():
            cmd = [*_hypsearch(), "taxonomy", "wordnet", "--root", "artifact.n.01"]
            _run([*cmd, "--out", str(tax), "--json"], env)
    cmd = [*_hypsearch(), "labels", "train", "--taxonomy", str(tax), "--out", str(out)]
    _run([*cmd, "--json", "--quiet", *extra], env)
    return out


#: what the objectives tables compare: the hyperbolic rows place their images in cones
#: (the default), the twin rows do not
TWIN_NOTE = (
    "The hyperbolic rows have the default cone placement, the twin rows none: their "
    "hierarchical Hit@1 and nearest-label columns are not like for like (the raw head "
    "outputs beside the twin: train.md and train-seeds.md)."
)


def objectives_table(res: dict, args) -> str:
    when = dt.datetime.now().strftime("%Y-%m-%d")
    cols = " | ".join(h for h, _ in OBJ_COLUMNS)
    lines = [
        f"#### Objectives ({when}; {os.cpu_count()} CPUs, {cpu_model()}, torch "
        f"threads {args.threads}, "
        + ("one run at a time, " if args.jobs <= 1 else f"{args.jobs} runs at a time, ")
        + (
            f"**{args.epochs} epochs per row, no time budget**"
            if args.epochs
            else f"**{args.budget:.0f} s budget per row**"
            + ("" if args.budget == 570 else " instead of the target protocol's 570 s")
        )
        + (f", **{args.limit} training images**" if args.limit else "")
        + ", one seed)",
        "",
        TWIN_NOTE,
        "",
        f"| run | epochs | train s | {cols} |",
        "| --- | ---: | ---: |" + " ---: |" * len(OBJ_COLUMNS),
    ]
    for name, r in res.items():
        ev, tr = r["eval"], r["train"]
        vals = " | ".join(_f(_at(ev, key)) for _, key in OBJ_COLUMNS)
        lines.append(f"| {name} | {tr['epochs']} | {tr['wall_seconds']:.0f} | {vals} |")
    la = os.getloadavg()
    lim = f" --limit {args.limit}" if args.limit else ""
    jobs = f" --jobs {args.jobs}" if args.jobs > 1 else ""
    only = f" --only '{args.only}'" if args.only else ""
    if args.epochs:
        plan, row = f"--epochs {args.epochs}", f"--time-budget 0 --epochs {args.epochs}"
    else:
        plan, row = f"--budget {args.budget:.0f}", f"--time-budget {args.budget:.0f}"
    lines += [
        "",
        f"Load average at the end: {la[0]:.1f} / {la[1]:.1f} / {la[2]:.1f}. Reproduce: "
        f"`python benchmarks/train.py --objectives {plan} --threads "
        f"{args.threads}{lim}{jobs}{only}` (each row: `hypsearch train --dataset "
        "fashion-mnist --labels "
        f"LABELS --out M {row}{lim} --threads {args.threads} "
        "--restart` with the "
        "row's flags, then `hypsearch eval --model M --dataset fashion-mnist --split test "
        "--no-ood --no-delta --json`). '–': not defined for the row (a product model has no "
        "label points).",
    ]
    return "\n".join(lines) + "\n"


def run_objectives(args, labels: Path, home: Path, env: dict) -> int:
    from concurrent.futures import ThreadPoolExecutor

    names = select_rows(list(OBJECTIVES), args.only)
    # every row's labels first (two rows must not build the same checkpoint at once)
    labs = {name: _objective_labels(OBJECTIVES[name][0], home, labels, env) for name in names}

    def one(item: tuple[int, str]) -> dict | None:
        i, name = item
        flags = OBJECTIVES[name][1]
        slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
        model = args.out_dir / f"obj-{slug}.safetensors"  # stable when rows are added
        info_path = model.with_suffix(".train.json")
        ev_path = model.with_suffix(".eval.json")
        if args.reuse and info_path.exists() and ev_path.exists():
            return {
                "train": json.loads(info_path.read_text()),
                "eval": json.loads(ev_path.read_text()),
            }
        budget = ["--time-budget", str(args.budget), "--quiet"]
        if args.epochs:  # the same steps for every row, whatever the load
            budget = ["--time-budget", "0", "--epochs", str(args.epochs), "--quiet"]
        if args.limit:
            budget += ["--limit", str(args.limit)]
        try:
            info, wall = _run(_train_cmd(labs[name], model, args.threads, *budget, *flags), env)
        except SystemExit as e:  # one failed row does not stop the others
            print(f"[{i + 1}/{len(names)}] {name}: {e}", file=sys.stderr)
            return None
        info["wall_seconds"] = wall
        info_path.write_text(json.dumps(info, indent=1))
        ev, _ = _run(
            [*_hypsearch(), "eval", "--model", str(model), "--dataset", "fashion-mnist",
             "--split", "test", "--threads", str(args.threads), "--no-ood", "--no-delta",
             "--json", "--quiet"],
            env,
        )  # fmt: skip
        ev_path.write_text(json.dumps(ev, indent=1))
        print(f"[{i + 1}/{len(names)}] {name}: recall@1 {ev['recall@1']:.3f}", file=sys.stderr)
        return {"train": info, "eval": ev}

    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        rows = list(pool.map(one, enumerate(names)))
    res = {name: r for name, r in zip(names, rows, strict=True) if r is not None}
    mode = "train-objectives" if args.epochs else "train-objectives-budget"
    report(
        objectives_table(res, args),
        _results_name(args, mode),
        command=command_line("train.py"),
    )
    return 0


def select_rows(names: list[str], only: str | None) -> list[str]:
    """The rows ``--only`` asks for: entries separated by ``|`` (or by ``,`` when
    there is no ``|``); an entry that is a row's whole name selects that row
    only, any other entry every row whose name contains it."""
    if not only:
        return names
    sep = "|" if "|" in only else ","
    wanted = [w.strip() for w in only.split(sep) if w.strip()]
    exact = {w for w in wanted if w in names}
    parts = [w for w in wanted if w not in exact]
    chosen = [n for n in names if n in exact or any(w in n for w in parts)]
    if not chosen:
        raise SystemExit(f"--only {only!r}: no row of the objectives table matches")
    return chosen


def step_times(nodes=(1770, 10699), samples=(0, 256), batch=256, reps=12) -> str:
    """Median seconds of the prototype loss's forward and backward for one batch, against
    ``nodes`` candidate label points (the default taxonomy's 1,770; ``artifact.n.01``'s
    10,699), with every node (0) or ``--negative-sample`` 256; one torch thread."""
    import torch

    from models.geometry import poincare
    from models.training.config import TrainConfig
    from models.training.losses import Prototypes, build_criterion
    from models.vision.heads import make_space

    torch.set_num_threads(1)
    sp = make_space("poincare", 1.0)
    g = torch.Generator().manual_seed(0)
    lines = ["| taxonomy nodes | --negative-sample | loss forward + backward, ms per step |"]
    lines.append("| ---: | ---: | ---: |")
    for m in nodes:
        pts = poincare.expmap0(torch.randn(m, 10, generator=g, dtype=torch.float64), c=1.0)
        target = torch.arange(10) * (m // 10)
        ex = torch.zeros(10, m, dtype=torch.bool)
        ex[:, 1:8] = True  # a few ancestors
        protos = Prototypes(pts[target], pts, target, ex)
        for s in samples:
            crit = build_criterion(TrainConfig(negative_sample=s).resolved(), sp, protos)
            ts = []
            for _ in range(reps):
                v = torch.randn(batch, 10, generator=g, dtype=torch.float64) * 0.5
                v.requires_grad_()
                t = time.perf_counter()
                crit(poincare.expmap0(v, c=1.0), torch.arange(batch) % 10).backward()
                ts.append(time.perf_counter() - t)
            lines.append(f"| {m} | {s or 'all'} | {1000 * sorted(ts)[reps // 2]:.0f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    home = Path(os.environ.get("HYPSEARCH_HOME", ROOT / "var"))
    ap.add_argument("--labels", type=Path, default=home / "labels.safetensors")
    ap.add_argument("--out-dir", type=Path, default=home / "bench-train")
    ap.add_argument("--threads", type=int, default=2, help="torch threads of every run")
    ap.add_argument("--reuse", action="store_true", help="reuse models already in --out-dir")
    ap.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="runs at a time (2 on 2 cores with --threads 1: the three runs take about "
        "two training budgets instead of three; each run then shares the machine)",
    )
    add_results_flag(ap, "train")
    ap.add_argument(
        "--speed",
        action="store_true",
        help="also time one epoch of 12,160 images at 1 and 2 threads",
    )
    ap.add_argument("--objectives", action="store_true", help="the objectives table instead")
    ap.add_argument("--budget", type=float, default=180.0, help="--objectives: seconds a row")
    ap.add_argument(
        "--only",
        help="--objectives: rows whose name contains one of these (a,b), or whole row "
        "names separated by | ('default|--ssl byol')",
    )
    ap.add_argument(
        "--limit", type=int, default=None, help="--objectives: train on this many images only"
    )
    ap.add_argument(
        "--epochs",
        type=int,
        default=None,
        help="--objectives: this many epochs a row and no time budget (fair under a varying load)",
    )
    ap.add_argument(
        "--step-times", action="store_true", help="time the prototype loss's step and exit"
    )
    ap.add_argument(
        "--seeds",
        help="the default and its twin at these seeds (e.g. 1,2; seed 0: the models of a plain "
        "run in --out-dir), and the table of their spread",
    )
    args = ap.parse_args(argv)
    if args.step_times:
        print(step_times())
        return 0

    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    labels = _labels(args.labels, env)
    if args.objectives:
        return run_objectives(args, labels, home, env)
    if args.seeds:
        return run_seeds(args, labels, env)
    runs = {
        "hyperbolic": [],  # the head's own outputs: the placed model's weights (head_output_of)
        "euclidean": ["--geometry", "euclidean"],
        "zero_shot": ["--holdout", HOLDOUT, "--placement", "none"],  # as in results/train.md
        "placed": ["--placement", "cones"],  # the default with the default's cap labels
    }
    res: dict = {"threads": args.threads, "jobs": args.jobs}
    quiet = ["--quiet"] if args.jobs > 1 else []  # no interleaved progress bars

    def train_one(name: str) -> dict:
        model = args.out_dir / f"{name}.safetensors"
        info_path = args.out_dir / f"{name}.train.json"
        if args.reuse and model.exists() and info_path.exists():
            return json.loads(info_path.read_text())
        if name == "hyperbolic":  # the placed model's weights (trained first), placement off
            head_output_of(args.out_dir / "placed.safetensors", model, env)
            info = json.loads((args.out_dir / "placed.train.json").read_text())
            info_path.write_text(json.dumps(info | {"weights_of": "placed"}, indent=1))
            return info
        info, wall = _run(_train_cmd(labels, model, args.threads, *quiet, *runs[name]), env)
        info["wall_seconds"] = wall
        info_path.write_text(json.dumps(info, indent=1))
        return info

    def eval_one(name: str) -> dict:
        ev, _ = _run(
            [
                *_hypsearch(),
                "eval",
                "--model",
                str(args.out_dir / f"{name}.safetensors"),
                "--dataset",
                "fashion-mnist",
                "--split",
                "test",
                "--threads",
                str(args.threads),
                "--json",
                *quiet,
            ],
            env,
        )
        (args.out_dir / f"{name}.eval.json").write_text(json.dumps(ev, indent=1))
        return ev

    from concurrent.futures import ThreadPoolExecutor

    trained = [name for name in runs if name != "hyperbolic"]
    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        infos = dict(zip(trained, pool.map(train_one, trained), strict=True))
        infos["hyperbolic"] = train_one("hyperbolic")  # after the placed model
        evals = dict(zip(runs, pool.map(eval_one, runs), strict=True))
    for name in runs:
        res[name] = {"train": infos[name], "eval": evals[name]}
    if args.speed:
        res["speed"] = {}
        for threads in (1, 2):
            out = args.out_dir / f"speed{threads}.safetensors"
            limit = ["--epochs", "1", "--limit", "12800", "--time-budget", "0", "--quiet"]
            info, _ = _run(_train_cmd(labels, out, threads, *limit), env)
            res["speed"][threads] = info["train_seconds"]
    res["loadavg"] = os.getloadavg()
    report(table(res), _results_name(args, "train"), command=command_line("train.py"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
