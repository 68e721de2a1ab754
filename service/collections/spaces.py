"""A collection's space (checked within the settings' bounds), its inline taxonomy,
and label points placed by the cap construction."""

from __future__ import annotations

import math
import re

from indexing import IndexInputError
from indexing.geometry import IndexSpace, PoincareIndexSpace, make_index_space

from ..errors import ApiError

#: the cone family of label points placed by the cap construction
CAP_SPEC = {"theta0": 2.5, "beta": 0.5}


def space_name(sp: IndexSpace) -> str:
    """``poincare:D@c`` for the ball, the product's own string otherwise."""
    return f"poincare:{sp.dim}@{sp.c:g}" if isinstance(sp, PoincareIndexSpace) else sp.spec


#: one factor of a space string: kind, dimension (7 digits at most), curvature
_FACTOR = re.compile(r"^\s*([a-z]+)\s*:\s*([0-9]{1,7})\s*(?:@\s*([^\s,@]{1,32})\s*)?$")
#: curvatures a space may have
CURVATURE_RANGE = (1e-6, 1e6)


def _space_bounds(space: str, max_dim: int, max_factors: int) -> None:
    """422 for a space string past the bounds, before anything is built for it:
    ``HYPSEARCH_MAX_SPACE_DIM`` dimensions in all, ``HYPSEARCH_MAX_SPACE_FACTORS``
    factors, curvatures in :data:`CURVATURE_RANGE`."""
    if not isinstance(space, str) or len(space) > 200:
        raise ApiError(422, "space: expected a space string of at most 200 characters")
    parts = space.split(",")
    if len(parts) > max_factors:
        raise ApiError(
            422,
            f"space: {len(parts)} factors, at most {max_factors} (HYPSEARCH_MAX_SPACE_FACTORS)",
        )
    total = 0
    for part in parts:
        m = _FACTOR.match(part)
        if m is None:
            raise ApiError(
                422,
                f"space: {part.strip()[:60]!r} is not kind:D or kind:D@c "
                "(e.g. poincare:10@1.0; D at most 7 digits)",
            )
        total += int(m.group(2))
        if m.group(3) is not None:
            try:
                c = float(m.group(3))
            except ValueError:
                raise ApiError(422, f"space: bad curvature {m.group(3)!r}") from None
            lo, hi = CURVATURE_RANGE
            if not (math.isfinite(c) and lo <= c <= hi):
                raise ApiError(422, f"space: curvature {m.group(3)} is outside [{lo:g}, {hi:g}]")
    if total > max_dim:
        raise ApiError(
            422,
            f"space: {total:,} dimensions, at most {max_dim:,} (HYPSEARCH_MAX_SPACE_DIM; "
            "vectors are at most 4,096 numbers)",
        )


def check_space(space: str, settings=None) -> IndexSpace:
    """A collection's space: the Poincaré ball ``poincare:D[@c]`` (D >= 2) or a product
    (``poincare:8,sphere:4,euclidean:4``: vectors only, no labels or model), within
    the settings' bounds (:func:`_space_bounds`) when ``settings`` are given."""
    if settings is not None:
        _space_bounds(space, settings.max_space_dim, settings.max_space_factors)
    try:
        sp = make_index_space(None, 1.0, space)
    except (IndexInputError, ValueError, OverflowError) as e:
        raise ApiError(422, f"space: {str(e)[:300]}") from None
    if sp.dim < 2:
        raise ApiError(422, f"space: {space!r}: the dimension must be at least 2")
    return sp


def inline_taxonomy(edges: list):
    from models.taxonomy.graph import Taxonomy

    pairs = []
    for i, e in enumerate(edges):
        if (
            not isinstance(e, list | tuple)
            or len(e) != 2
            or not all(isinstance(s, str) and s.strip() for s in e)
        ):
            raise ApiError(422, f"taxonomy[{i}]: expected [child, parent], two non-empty names")
        pairs.append((e[0].strip(), e[1].strip()))
    if not pairs:
        raise ApiError(422, "taxonomy: no edges")
    try:
        return Taxonomy.from_edges(pairs)
    except ValueError as e:
        raise ApiError(422, f"taxonomy: {e}") from None


def cap_labels(tax, sp: PoincareIndexSpace):
    """The taxonomy's nodes placed in the ball by the cap construction (no training)."""
    from models.geometry import cones as mcones
    from models.labels import LabelEmbedding
    from models.labels.construct import cap_construction

    spec = mcones.cone_spec("cap", **CAP_SPEC)
    placed = cap_construction(tax, sp.dim, curvature=sp.c, seed=0, **CAP_SPEC)
    emb = LabelEmbedding(
        tax,
        placed.points,
        sp.c,
        config={"init": "cap", "cone_theta0": CAP_SPEC["theta0"], "cone_beta": CAP_SPEC["beta"]},
    )
    emb.cone = dict(spec)
    return emb
