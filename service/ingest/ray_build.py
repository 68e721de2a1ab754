"""The batch build of :mod:`service.ingest.build` with the embedding on Ray Data::

    ray.init(address)                                   # the caller connects
    plan = plan_dataset("fashion-mnist", "train", data_dir)   # or plan_folder / plan_manifest
    index = open_index(path, dim=model.dim, curvature=model.curvature)   # or a ShardedIndex
    report = ray_build_index("model.safetensors", model, index, plan, workers=2)

The same plan, the same decoding, labels and payloads as the local build
(:func:`service.ingest.build.embed_plan` runs inside each actor on its block of
sources), so the result is the same index, item for item:

* The sources still to embed (ids not in the index when the build starts) are
  cut into blocks of ``batch_size`` in the plan's order -- the local build's
  batches -- and become a Ray dataset (``ray.data.from_numpy``: one block per
  batch, their positions in the list).
* ``map_batches`` over a pool of ``workers`` actors (:class:`_Embedder`): each
  loads the model once (``models.vision.image_model.load_model``), pins torch to
  ``threads`` threads, and embeds one block per call. The pictures of a
  built-in split travel once through the object store; files (folders,
  manifests) are read by the actors, so they must be readable on every node
  (a shared file system).
* The driver -- this process -- writes the embedded blocks in order, each one
  durable (``index.add``) before the next is taken; the embedding runs ahead
  of the writes by at most Ray Data's back-pressure. A cancelled or failed
  build keeps its written blocks and the next run resumes after them, as the
  local build does.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Unpack

import numpy as np

from indexing.batches import (
    Batch,
    BuildReport,
    default_write,
    index_labels,
    present,
    tracked,
    write_batches,
)

from .build import BuildOptions, build_options, embed_plan, pending_sources
from .plans import Plan

__all__ = ["ray_build_index"]


class _Embedder:
    """One actor of the pool: the model, loaded once; one block of sources a call."""

    def __init__(
        self, model_spec, sources, images, plan_name, payload, labels, threads, max_pix, size
    ):
        import ray
        import torch

        from models.vision.image_model import load_model

        torch.set_num_threads(threads)
        self.model = load_model(model_spec)
        self.sources = ray.get(sources)  # once per actor, through the object store
        self.images = None if images is None else ray.get(images)
        self.plan_name = plan_name
        self.payload = payload
        self.labels = labels
        self.max_pixels = max_pix
        self.batch_size = size  # the local build's batches: the same inputs to the model

    def __call__(self, block: dict) -> dict:
        pos = block["data"].tolist()
        sub = Plan(self.plan_name, [self.sources[p] for p in pos], self.images, self.payload)
        report = BuildReport(self.plan_name)
        ids, vectors, labels, payloads = [], [], [], []
        for b in embed_plan(
            self.model,
            sub,
            batch_size=self.batch_size,
            workers=0,
            report=report,
            labels_in_use=lambda: self.labels,
        ):
            ids += b.ids
            vectors.append(b.vectors)
            labels += b.labels
            payloads += [json.dumps(p) for p in b.payloads]
        skipped = [(s, r) for s, r in report.examples]
        dim = self.model.dim
        z = np.concatenate(vectors) if vectors else np.zeros((0, dim))
        z = np.concatenate([z, np.full((len(skipped), dim), np.nan)])
        return {
            "id": np.array(ids + [s for s, _ in skipped], dtype=object),
            "vector": z,
            "label": np.array(labels + [None] * len(skipped), dtype=object),
            "payload": np.array(payloads + [None] * len(skipped), dtype=object),
            "skip": np.array([""] * len(ids) + [r for _, r in skipped], dtype=object),
        }


def ray_build_index(
    model_spec: str,
    model,
    index,
    plan: Plan,
    *,
    threads: int = 1,
    cpus_per_worker: float = 0.5,
    **options: Unpack[BuildOptions],
) -> BuildReport:
    """:func:`service.ingest.build.build_index` with the embedding on the connected Ray
    cluster (see the module docstring). ``model_spec``: what each actor loads
    (a checkpoint path readable on every node, or ``pretrained:NAME``);
    ``model``: the same model, loaded here (its labels and dimension);
    ``threads``: torch threads per actor; ``cpus_per_worker``: the CPUs each
    actor asks Ray for. The other options are :func:`build_index`'s."""
    import ray

    from models.prototypes import prediction_labels

    o = build_options(options)
    batch_size, cancel = o["batch_size"], o["cancel"]
    report = o["report"] if o["report"] is not None else BuildReport(plan.name)
    total = len(plan.sources) + len(plan.skipped)
    with tracked(
        report, total, "index (ray)", progress=o["progress"], on_progress=o["on_progress"]
    ) as advance:
        skip = None
        if o["resume"]:
            skip = present(index, [s.id for s in plan.sources]).__contains__
        todo, already = pending_sources(plan, skip, report)
        if already or plan.skipped:
            advance(already + len(plan.skipped))
        if not todo:
            return report
        labels: list[str] = []
        if any(s.label is None for s in todo):  # what embed_plan predicts among
            in_use = set(o["labels_in_use"]() if o["labels_in_use"] else index_labels(index))
            in_use |= {s.label for s in plan.sources if s.label is not None}
            labels = sorted(prediction_labels(in_use, model.labels.taxonomy.names))
        ctx = ray.data.DataContext.get_current()
        ctx.execution_options.preserve_order = True
        ctx.enable_progress_bars = False
        blocks = [
            np.arange(a, min(a + batch_size, len(todo))) for a in range(0, len(todo), batch_size)
        ]
        ds = ray.data.from_numpy(blocks).map_batches(
            _Embedder,
            fn_constructor_args=(
                model_spec,
                ray.put(todo),
                None if plan.images is None else ray.put(plan.images),
                plan.name,
                plan.payload,
                labels,
                threads,
                o["max_pixels"],
                batch_size,
            ),
            batch_size=None,
            batch_format="numpy",
            compute=ray.data.ActorPoolStrategy(size=o["workers"]),
            num_cpus=cpus_per_worker,
        )
        outputs = ds.iter_batches(batch_size=None, batch_format="numpy")
        batches = _batches(outputs, report, cancel, advance)
        write_batches(batches, o["write"] or default_write(index), report)
    return report


def _batches(outputs, report: BuildReport, cancel, advance) -> Iterator[Batch]:
    """The actors' blocks, in order, as batches to write; their skipped sources go to
    ``report``; ``advance`` counts a block once it is written."""
    for out in outputs:
        if cancel is not None and cancel.is_set():
            report.cancelled = True
            return
        ok = out["skip"] == ""
        for s, r in zip(out["id"][~ok].tolist(), out["skip"][~ok].tolist(), strict=True):
            report.skip(s, r)
        if ok.any():
            yield Batch(
                out["id"][ok].tolist(),
                np.asarray(out["vector"][ok], dtype=np.float64),
                out["label"][ok].tolist(),
                [json.loads(p) for p in out["payload"][ok].tolist()],
            )
        advance(len(out["id"]))
