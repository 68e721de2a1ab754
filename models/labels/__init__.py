"""Label-hierarchy embeddings in the Poincaré ball.

One module per job:

* :mod:`.embedding`: the options (:class:`LabelTrainConfig`) and the result
  (:class:`LabelEmbedding`: checkpoint save/load, text export);
* :mod:`.construct`: the cap construction (:func:`cap_construction`), the
  default: caps that nest along the taxonomy, placed rather than trained;
* :mod:`.start`: the hierarchical start (:func:`hierarchical_start`);
* :mod:`.train`: training (:func:`train_labels`: Poincaré embeddings, the
  optional cone stage and leaf spreading, resumable by epoch);
* :mod:`.evaluate`: reconstruction mean rank and MAP, cone containment.

Every public name is importable from ``models.labels``.
"""

from __future__ import annotations

from .construct import cap_construction
from .embedding import KIND, LabelEmbedding, LabelTrainConfig, is_finished, load_labels
from .evaluate import (
    best_cone_threshold,
    evaluate_cone_protocol,
    evaluate_cones,
    evaluate_reconstruction,
)
from .start import hierarchical_start
from .train import get_lr, train_labels

__all__ = [
    "KIND",
    "LabelEmbedding",
    "LabelTrainConfig",
    "best_cone_threshold",
    "cap_construction",
    "evaluate_cone_protocol",
    "evaluate_cones",
    "evaluate_reconstruction",
    "get_lr",
    "hierarchical_start",
    "is_finished",
    "load_labels",
    "train_labels",
]
