"""Cone upkeep: which :class:`~indexing.cones.LabelCones` an index uses.

The cones an index computes holding labels with are persisted in its store
(the ``label_cones`` table and the ``cones_*`` meta keys: fingerprint,
curvature, ``cones_spec`` the cone family as JSON), so that an index
opened without cones keeps the ones it had.  Setting cones with another
fingerprint recomputes the holding label of every item (the index does that,
under its locks); these helpers check the cones against the index and read and
write them.
"""

from __future__ import annotations

import json
import math

from .cones import LabelCones
from .errors import IndexInputError
from .geometry import IndexSpace, PoincareIndexSpace
from .store import Store

__all__ = ["check_cones", "load_cones", "save_cones"]


def check_cones(cones: object, space: IndexSpace, curvature: float) -> LabelCones:
    """``cones`` if they fit an index of ``space`` and ``curvature``."""
    if not isinstance(cones, LabelCones):
        raise IndexInputError(f"cones: expected LabelCones, got {type(cones).__name__}")
    if not isinstance(space, PoincareIndexSpace):
        raise IndexInputError("cones: entailment cones need a poincare space")
    if cones.dim != space.dim:
        raise IndexInputError(f"cones: prototypes have dimension {cones.dim}, index {space.dim}")
    if not math.isclose(cones.curvature, curvature):
        raise IndexInputError(
            f"cones: curvature {cones.curvature} differs from the index's {curvature}"
        )
    return cones


def load_cones(store: Store) -> LabelCones | None:
    """The cones persisted in ``store``, or ``None``."""
    meta = store.meta()
    if not meta.get("cones_fingerprint"):
        return None
    curvature = float(meta["cones_curvature"])
    if meta.get("cones_spec"):
        spec = json.loads(meta["cones_spec"])
        return LabelCones.from_records(store.load_cones(), curvature=curvature, spec=spec)
    # stores from before the cone family: Ganea cones of their K
    return LabelCones.from_records(
        store.load_cones(), curvature=curvature, K=float(meta["cones_K"])
    )


def save_cones(store: Store, cones: LabelCones | None) -> bool:
    """Persist ``cones`` (``None``: no cones) in ``store``; returns whether they
    differ from the ones stored before (by fingerprint)."""
    old = store.meta().get("cones_fingerprint", "")
    new = "" if cones is None else cones.fingerprint()
    if old == new:
        return False
    if cones is None:
        store.save_cones({"cones_fingerprint": ""}, [])
    else:
        meta = {
            "cones_fingerprint": new,
            "cones_spec": cones.spec_json(),
            "cones_K": repr(cones.K),
            "cones_curvature": repr(cones.curvature),
        }
        store.save_cones(meta, cones.records())
    return True
