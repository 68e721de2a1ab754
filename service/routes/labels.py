"""Label names: autocompletion and one label's place in the taxonomy."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query

from .. import searching
from ..deps import RuntimeDep
from ..schemas import INVALID, LabelOut, errors
from .declare import Routes

router = APIRouter(prefix="/v1/labels", tags=["labels"], responses=INVALID)
routes = Routes(router)


@routes.read(
    "get",
    "",
    list[str],
    "Label names (synsets and words) starting with a prefix, for autocompletion",
    errors=errors(422, 503),
)
def complete(
    rt: RuntimeDep,
    prefix: Annotated[str, Query(max_length=300, description="any case; spaces or _")] = "",
    limit: Annotated[int, Query(ge=1, le=1000)] = 20,
) -> list[str]:
    """Words come as WordNet writes them in lookup form (lowercase, `_` for
    spaces), synsets by name; shorter and more common names first."""
    return rt.taxonomy.complete(prefix, limit=limit)


@routes.read(
    "get",
    "/{name}",
    LabelOut,
    "One label: its place in the taxonomy, items under it, its point and cone",
    errors=errors({404: "unknown label, with close matches"}, 503),
)
def get_label(rt: RuntimeDep, name: Annotated[str, Path(max_length=300)]) -> LabelOut:
    """`name` is a synset (`gym_shoe.n.01`) or a word (`sneaker`: its sense with
    the most items under it). `items` counts the items whose label is this node
    or one of its descendants. `vector` is the label's point; `cone` its
    entailment cone: the family, its parameters and the aperture at that point."""
    node = searching.resolve_label(rt, name, "name", status=404)
    tax = rt.taxonomy
    anc = sorted(tax.ancestors(node), key=lambda n: (-tax.depth(n), n))
    return LabelOut(
        name=node,
        parents=tax.parents(node),
        children=tax.children(node),
        ancestors=anc,
        depth=tax.depth(node),
        items=rt.items_under(node),
        words=tax.words(node),
        gloss=(tax.glosses or {}).get(node),
        vector=rt.label_point(node).tolist(),
        cone={**rt.cone_spec, "aperture": rt.aperture(node)},
    )
