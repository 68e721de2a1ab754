"""What the service holds while it runs, one runtime a collection: the model, the
labels, the index.

A runtime is built by the app's lifespan (or by a test, around a small index)
and injected into the routes (:mod:`service.deps`). :class:`Runtime` is the one
interface the routes and :mod:`service.searching` use; behind it

* :class:`BallRuntime` (:mod:`.ball`): a Poincaré-ball collection, its labels,
  their entailment cones and the hierarchical search;
* :class:`ProductRuntime` (:mod:`.product`): a product-space collection, vectors
  and payloads only (label features raise :class:`LabelsUnsupportedError`).

:func:`runtime_for` picks one for an index, :func:`open_runtime` opens the
artifacts the settings name (:mod:`.opening`). The runtimes raise domain errors
(:class:`StartupError`, :class:`LabelsUnsupportedError`, :class:`RetiredError`);
:mod:`service.routes.errors` answers them. Item pictures are
:mod:`service.pictures`' (``runtime.pictures``).
"""

from .ball import HOLD_SHARE, BallRuntime, label_cones
from .base import LabelsUnsupportedError, RetiredError, Runtime, StartupError
from .opening import open_runtime, runtime_for
from .product import ProductRuntime

__all__ = [
    "HOLD_SHARE",
    "BallRuntime",
    "LabelsUnsupportedError",
    "ProductRuntime",
    "RetiredError",
    "Runtime",
    "StartupError",
    "label_cones",
    "open_runtime",
    "runtime_for",
]
