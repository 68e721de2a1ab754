"""The demo pipeline: the default artifacts under ``$HYPSEARCH_HOME``, built once.

``hypsearch demo`` (what ``make run`` runs) builds these artifacts once and
reuses them afterwards:

* ``taxonomy.tsv``: the default taxonomy (:func:`models.taxonomy.defaults.default_taxonomy`);
* ``labels.safetensors``: its label embeddings;
* ``model.safetensors``: the image model trained on the Fashion-MNIST train
  split against them (within :data:`DEMO_BUDGET` seconds in all);
* ``index/``: the index of the Fashion-MNIST test split, built once by
  :func:`service.ingest.build.build_index` (its ``build.json`` marks it complete);
  afterwards it is only served, so every write acknowledged by the service
  (upserts and deletes) survives restarts.

``hypsearch demo --photos DIR`` (:func:`run_photos_pipeline`) instead indexes
every picture under DIR with the pretrained model (``pretrained:efficientnet-lite0``,
no training; or ``--model``), into ``photos/<digest of DIR>/``, built once and
reused the same way; each photo gets the label the model places it at.
"""

from __future__ import annotations

import json
import os
import time
from contextlib import contextmanager
from pathlib import Path

from models.taxonomy.defaults import default_taxonomy

#: Seconds the first run of the demo may take in all (labels, image model, index).
DEMO_BUDGET = 570.0
#: The model of ``hypsearch demo --photos``.
PHOTOS_MODEL = "pretrained:efficientnet-lite0"


@contextmanager
def torch_threads(n: int | None):
    """torch intra-op threads set to ``n`` inside the block (``None``: unchanged).

    Label training and evaluation are many small operations, which one thread
    runs fastest (two threads on a busy 2-core machine can be many times
    slower); the image model's convolutions use more."""
    import torch

    if n is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def run_default_pipeline(
    home: str | os.PathLike, *, progress: bool = True, threads: int | None = None
) -> dict:
    """Build (or reuse) the default artifacts under ``home``; returns a summary.

    ``threads``: torch threads for the image model's training and the index
    build (label training always uses one)."""
    from models.labels import (
        LabelEmbedding,
        LabelTrainConfig,
        evaluate_reconstruction,
        train_labels,
    )

    home = Path(home)
    home.mkdir(parents=True, exist_ok=True)
    steps = []
    t0 = time.perf_counter()
    tax = default_taxonomy()
    tax_path = home / "taxonomy.tsv"
    if not tax_path.exists():
        tax.to_tsv(tax_path)
        steps.append(f"wrote the default taxonomy ({len(tax)} WordNet nouns) to {tax_path}")
    labels_path = home / "labels.safetensors"
    emb = None
    if labels_path.exists():
        emb = LabelEmbedding.load(labels_path)
        if emb.taxonomy != tax:
            emb = None
        else:
            steps.append(f"reused label embeddings {labels_path}")
    if emb is None:
        with torch_threads(1):
            emb = train_labels(tax, LabelTrainConfig(), progress=progress)
            emb.metrics |= evaluate_reconstruction(emb)
        emb.save(labels_path)
        steps.append(
            f"trained label embeddings of {len(tax)} nodes in {emb.metrics['train_seconds']:.0f} s "
            f"(reconstruction MAP {emb.metrics['map']:.3f}, mean rank "
            f"{emb.metrics['mean_rank']:.2f}) -> {labels_path}"
        )
    with torch_threads(threads):
        model_path, model = _default_model(home, emb, steps, t0, progress, threads)
        index_path, items = _default_index(home, model, model_path, steps, progress)
    summary = {
        "home": str(home),
        "taxonomy": str(tax_path),
        "labels": str(labels_path),
        "model": str(model_path),
        "index": str(index_path),
        "items": items,
        "nodes": len(tax),
        "metrics": {k: emb.metrics.get(k) for k in ("map", "mean_rank")}
        | {
            k: model.metrics.get(k)
            for k in ("val_acc", "epochs", "train_seconds")
            if k in model.metrics
        },
        "seconds": time.perf_counter() - t0,
        "steps": steps,
    }
    summary["message"] = "\n".join(steps)
    return summary


def _default_model(
    home: Path, emb, steps: list[str], t0: float, progress: bool, threads: int | None = None
):
    """The image model of the demo: reused when trained against these labels."""
    from models.checkpoint import CheckpointError
    from models.training.run import TrainConfig, train
    from models.vision.image_model import ImageModel

    path = home / "model.safetensors"
    if path.exists():
        try:
            model = ImageModel.load(path)
        except CheckpointError:
            model = None
        if model is not None and model.labels.version == emb.version:
            steps.append(f"reused image model {path}")
            return path, model
    cfg = TrainConfig()
    if threads and hasattr(cfg, "threads"):
        cfg.threads = threads
    spent = time.perf_counter() - t0
    cfg.time_budget = max(60.0, DEMO_BUDGET - spent - 60.0)  # leave a minute for the index
    partial = path.with_name(path.name + ".partial")
    model = train(cfg, emb, progress=progress, checkpoint_path=partial)
    model.save(path)
    partial.unlink(missing_ok=True)
    m = model.metrics
    steps.append(
        f"trained the image model ({m.get('epochs')} epochs in {m.get('train_seconds', 0):.0f} s, "
        f"validation accuracy {float(m.get('val_acc') or 'nan'):.3f}) -> {path}"
    )
    return path, model


def _default_index(
    home: Path, model, model_path: Path, steps: list[str], progress: bool, limit: int | None = None
):
    """The index of the Fashion-MNIST test split: built once (the build of the CLI
    and the jobs, resumed when interrupted), then only served (``limit``: only the
    first rows, for tests)."""
    from models.images.datasets import DEFAULT_FASHION_MNIST_DIR

    from .ingest.plans import plan_dataset

    plan = plan_dataset("fashion-mnist", "test", DEFAULT_FASHION_MNIST_DIR)
    plan.sources = plan.sources[:limit]
    items = _index_once(
        home / "index", model, plan, "fashion-mnist:test", "Fashion-MNIST test images", steps,
        progress,
    )  # fmt: skip
    return home / "index", items


def _index_once(
    path: Path, model, plan, source: str, what: str, steps: list[str], progress: bool
) -> int:
    """The index at ``path`` of ``plan`` by ``model``: reused when its ``build.json``
    names this model and source, else (re)built, an index of another model or source
    kept aside (``<path>.<model>.<time>``); returns its number of items."""
    from indexing.batches import open_index

    from .ingest.build import build_index

    marker = path / "build.json"
    if marker.exists():
        try:
            done = json.loads(marker.read_text())
        except (OSError, ValueError):
            done = {}
        if done.get("model") == model.version and done.get("source", source) == source:
            index = open_index(path, dim=model.dim, curvature=model.curvature)
            items = len(index)
            index.close()
            steps.append(f"reused the index {path} ({items} items)")
            return items
        # built by another model: its vectors are not comparable; keep it aside
        aside = path.with_name(f"{path.name}.{done.get('model', 'old')[:12]}.{int(time.time())}")
        path.rename(aside)
        steps.append(f"the index was built by another model; moved it to {aside}")
    index = open_index(path, dim=model.dim, curvature=model.curvature)
    workers = 0 if plan.images is not None or len(plan.sources) < 200 else 2
    try:
        report = build_index(model, index, plan, progress=progress, workers=workers)
        index.save()
        items = len(index)
    finally:
        index.close()
    marker.write_text(json.dumps({"model": model.version, "source": source, "items": items}))
    steps.append(
        f"indexed {report.indexed} {what} in {report.seconds:.0f} s "
        f"({report.images_per_second:.1f} images/s) -> {path}"
    )
    return items


def run_photos_pipeline(
    home: str | os.PathLike,
    photos: str | os.PathLike,
    *,
    model_spec: str = PHOTOS_MODEL,
    progress: bool = True,
    threads: int | None = None,
) -> dict:
    """Index every picture under ``photos`` with ``model_spec`` (built once under
    ``home/photos/``, then reused); returns a summary like :func:`run_default_pipeline`'s.
    Raises :class:`service.ingest.roots.BuildInputError` for a folder without pictures and
    :class:`models.checkpoint.CheckpointError` for a model that does not load."""
    import hashlib

    from models.vision.image_model import load_model

    from .ingest.plans import plan_photos
    from .ingest.roots import BuildInputError

    t0 = time.perf_counter()
    home = Path(home)
    folder = Path(photos).resolve()
    plan = plan_photos(folder)
    if not plan.sources:
        raise BuildInputError(f"{photos}: no pictures (files ending in .png, .jpg, ...)")
    steps: list[str] = [f"{len(plan.sources)} pictures under {folder}"]
    with torch_threads(threads):
        if model_spec.startswith("pretrained:"):
            model = load_model(model_spec, cache_dir=home / "pretrained")
        else:
            model = load_model(model_spec)
        steps.append(f"model {model.version}")
        path = home / "photos" / hashlib.sha256(str(folder).encode()).hexdigest()[:12]
        path.parent.mkdir(parents=True, exist_ok=True)
        items = _index_once(path, model, plan, f"photos:{folder}", "photos", steps, progress)
    summary = {
        "home": str(home),
        "photos": str(folder),
        "model": model_spec,
        "version": model.version,
        "index": str(path),
        "items": items,
        "seconds": time.perf_counter() - t0,
        "steps": steps,
    }
    summary["message"] = "\n".join(steps)
    return summary


if __name__ == "__main__":  # pragma: no cover
    print(json.dumps(run_default_pipeline(os.environ.get("HYPSEARCH_HOME", "var")), indent=1))
