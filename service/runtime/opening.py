"""Opening a collection's runtime: :func:`runtime_for` picks the runtime of an
index's space, :func:`open_runtime` loads the artifacts the settings name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from indexing import Index
from indexing.batches import open_index
from indexing.geometry import PoincareIndexSpace, make_index_space
from models.labels import LabelEmbedding
from models.taxonomy.graph import with_words

from .ball import BallRuntime
from .base import Runtime, StartupError
from .product import ProductRuntime


def runtime_for(
    index: Index, labels: LabelEmbedding | None, model: Any | None = None, **kw: Any
) -> Runtime:
    """The runtime of ``index``: a :class:`BallRuntime` around ``labels`` for a
    Poincaré ball, a :class:`ProductRuntime` for a product space (vectors only:
    ``labels`` and the ball's ``taxonomy`` and ``wordnet_dir`` are not used).
    ``kw``: the runtime's keywords (``image_dir``, ``data_dir``, ...).
    :class:`StartupError` when the artifacts do not fit together."""
    space = make_index_space(index.dim, index.curvature, index.space)
    if not isinstance(space, PoincareIndexSpace):
        folders = {k: kw[k] for k in ("image_dir", "data_dir") if k in kw}
        return ProductRuntime(index, model, **folders)
    if labels is None:
        raise StartupError("labels: only a product-space collection is served without labels")
    return BallRuntime(index, labels, model, **kw)


def open_runtime(settings, index=None) -> Runtime:
    """Load the model (or labels) and open (or create) the index of ``settings``
    (or serve ``index``, e.g. an :class:`indexing.sharded.ShardedIndex`)."""
    from models.checkpoint import CheckpointError

    model = None
    try:
        if settings.model is not None:
            from models.vision.image_model import load_model

            spec = str(settings.model)
            if not spec.startswith("pretrained:") and not Path(spec).is_file():
                raise StartupError(f"model: no such file {settings.model}")
            kw = {"cache_dir": Path(settings.home) / "pretrained"}
            if settings.wordnet_dir is not None:
                kw["wordnet_dir"] = settings.wordnet_dir
            model = load_model(spec, **kw) if spec.startswith("pretrained:") else load_model(spec)
            labels = model.labels
            if getattr(model, "geometry", "poincare") == "product":
                labels = None  # a mixed-curvature model: vectors of its space, no label points
        elif settings.labels is not None:
            if not Path(settings.labels).is_file():
                raise StartupError(f"labels: no such file {settings.labels}")
            labels = LabelEmbedding.load(settings.labels)
        else:
            raise StartupError(
                "give a model (HYPSEARCH_MODEL) or a label checkpoint (HYPSEARCH_LABELS)"
            )
    except CheckpointError as e:
        raise StartupError(str(e)) from None
    if index is None and labels is None:
        try:
            index = open_index(
                settings.index, dim=model.dim, curvature=1.0, space=model.head_cfg.space
            )
        except (ValueError, RuntimeError) as e:  # IndexInputError, IndexStoreError
            raise StartupError(f"index: {e}") from None
    if index is None:
        index = open_index(settings.index, dim=labels.dim, curvature=labels.curvature)
    try:
        return runtime_for(
            index,
            labels,
            model,
            image_dir=settings.images_folder,
            data_dir=settings.data_dir,
            taxonomy=None if labels is None else with_words(labels.taxonomy, settings.wordnet_dir),
            wordnet_dir=settings.wordnet_dir,
        )
    except BaseException:
        index.close()
        raise
