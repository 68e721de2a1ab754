"""The shipped photos searched by the WordNet nouns above their kinds.

The photo set of ``benchmarks/photos.py`` (50 images that scikit-image and
scikit-learn ship: 26 pictures and three renders of each of 8 photos)
embedded by ``pretrained:efficientnet-lite0`` into a fresh index, queried in
process through the service's own search code (:mod:`service.searching`,
what ``POST /v1/search`` runs). Each photo whose subject is a thing WordNet
names (a cat, a cup of coffee, motorcycles, a rocket, a flower, ...) has its
kind below (the subject as a WordNet synset of the pretrained taxonomy,
chosen by looking at the picture, not by the model); the textures,
microscopy and drawings have none and stay in the index as distractors.

For every noun above a kind (its ancestors of depth 2 or more), a label
query with no ``mode`` (``auto``: entailment) and one in ``nearest`` mode,
k 5: the first result is right when its photo's kind is at or below the
noun. The target: every noun finds such a photo first in the default mode.

    python benchmarks/photo_labels.py [--write-results]

``--write-results`` writes ``benchmarks/results/photo-labels.md``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import add_results_flag, command_line, cpu_model, report  # noqa: E402
from photos import photo_set  # noqa: E402

#: the subject of each photo, by looking at it (a photo with several subjects: each)
KINDS = {
    "chelsea.png": ("domestic_cat.n.01",),
    "coffee.png": ("coffee.n.01",),
    "horse.png": ("horse.n.01",),
    "motorcycle_left.png": ("motorcycle.n.01",),
    "motorcycle_right.png": ("motorcycle.n.01",),
    "rocket.jpg": ("rocket.n.01",),
    "astronaut.png": ("person.n.01",),
    "camera.png": ("person.n.01", "camera.n.01", "tripod.n.01"),
    "china.jpg": ("building.n.01",),
    "flower.jpg": ("flower.n.01",),
    "clock_motion.png": ("clock.n.01",),
}

MIN_DEPTH = 2  # below entity, physical_entity and abstraction


def kinds_of(photo: str) -> tuple[str, ...]:
    """The kinds of a photo of the set (renders keep their original's)."""
    return KINDS.get(photo.split(" (")[0], ())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--k", type=int, default=5)
    add_results_flag(ap, "photo-labels")
    args = ap.parse_args(argv)

    import datetime as dt

    import numpy as np
    import torch

    from indexing import HyperbolicIndex
    from models.vision.image_model import load_model
    from service import searching
    from service.runtime import runtime_for

    torch.set_num_threads(2)
    model = load_model("pretrained:efficientnet-lite0")
    tax = model.labels.taxonomy
    photos = photo_set()
    names = list(photos)
    for n in names:
        for k in kinds_of(n):
            if k not in tax:
                raise SystemExit(f"{n}: kind {k} is not in the pretrained taxonomy")
    z = model.embed([photos[n] for n in names]).numpy()
    with tempfile.TemporaryDirectory() as tmp:
        index = HyperbolicIndex(dim=model.dim, curvature=model.curvature, path=Path(tmp) / "idx")
        index.add(z, names)
        rt = runtime_for(index, model.labels, model)
        nouns = sorted(
            {a for n in names for k in kinds_of(n) for a in tax.ancestors(k)}
            - {a for a in tax.names if tax.depth(a) < MIN_DEPTH},
            key=lambda a: (tax.depth(a), a),
        )

        def right(noun: str, photo: str) -> bool:
            return any(k == noun or noun in tax.ancestors(k) for k in kinds_of(photo))

        rows = []
        for noun in nouns:
            under = {k for n in names for k in kinds_of(n) if right(noun, n)}
            row = {"noun": noun, "kinds": sorted(under)}
            for mode in ("auto", "nearest"):
                x, lab, _ = searching.query_point(rt, label=noun)
                ans = searching.search(
                    rt, x, lab, k=args.k, mode=searching.resolve_mode(mode, True)
                )
                first = ans.hits[0].id if ans.hits else None
                row[mode] = (first, first is not None and right(noun, first))
                row[mode + "_k"] = sum(right(noun, h.id) for h in ans.hits)
            rows.append(row)
        index.close()

    ok = sum(r["auto"][1] for r in rows)
    ok_n = sum(r["nearest"][1] for r in rows)
    when = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    out = [
        f"Measured {when} on {cpu_model()}; model `{model.version}`; {len(names)} photos "
        f"indexed, {sum(bool(kinds_of(n)) for n in names)} of them with a kind; k {args.k}.",
        "",
        f"**Default mode (entailment): {ok}/{len(rows)} nouns find a photo of a kind below "
        f"them first; nearest mode: {ok_n}/{len(rows)}.**",
        "",
        f"| noun | depth | kinds below it | default mode: first result | right of {args.k} "
        f"| nearest: first result | right of {args.k} |",
        "| --- | ---: | --- | --- | ---: | --- | ---: |",
    ]
    for r in rows:
        a, n = r["auto"], r["nearest"]
        mark = lambda t: f"{t[0]} {'yes' if t[1] else '**no**'}"  # noqa: E731
        out.append(
            f"| {r['noun']} | {tax.depth(r['noun'])} | {', '.join(r['kinds'])} | {mark(a)} "
            f"| {r['auto_k']} | {mark(n)} | {r['nearest_k']} |"
        )
    report(
        "\n".join(out),
        args.write_results,
        command=command_line("photo_labels.py", argv),
        title="The shipped photos searched by the WordNet nouns above their kinds",
    )
    return 0 if ok == len(rows) and np.isfinite(z).all() else 1


if __name__ == "__main__":
    sys.exit(main())
