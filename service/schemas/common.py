"""Shared types and documentation strings of the REST schemas, the error answer
and the operations routes' answers."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

__all__ = [
    "ErrorOut",
    "FILTER_DOC",
    "FilterField",
    "Finite",
    "GroupBy",
    "HealthOut",
    "INVALID",
    "Levels",
    "MAX_DIM",
    "MODE_DOC",
    "Mode",
    "StatsOut",
    "WITH_PAYLOAD_DOC",
    "WITH_VECTOR_DOC",
    "errors",
]

Finite = Annotated[float, Field(allow_inf_nan=False)]
Mode = Literal["auto", "entailment", "nearest", "hierarchical"]
MODE_DOC = (
    "auto (the default): entailment for a label query, nearest otherwise; entailment: the "
    "items the label's cone holds, firmest first, spread over the label's child branches, "
    "then every other item, least far outside the cone first; nearest: the k nearest by "
    "geodesic distance (from a label's point: general items first); hierarchical: by level "
    "(0 the label's cone, 1 what only its parent's cone adds, ...), then by firmness"
)
GroupBy = Literal["children"]
Levels = Literal["cone", "taxonomy"]
_LEVELS_DOC = (
    "hierarchical mode: levels by cone membership of each item's point ('cone') or by "
    "the items' labels along the taxonomy chain ('taxonomy'); default 'cone' when the "
    "loaded labels' cones hold their taxonomy, else 'taxonomy'"
)

MAX_DIM = 4096
_EXAMPLE_VECTOR = [0.12, -0.05, 0.31, 0.02, -0.44, 0.08, 0.15, -0.21, 0.03, 0.09]

#: a filter expression F (checked by indexing.filters; see service/README.md)
_FILTER_EXAMPLE = {
    "must": [{"under": "footwear"}, {"key": "payload.price", "range": {"lt": 50}}],
    "should": [
        {"key": "payload.color", "match": "red"},
        {"key": "payload.tags", "in": ["sale", "new"]},
    ],
    "must_not": [{"key": "label", "match": "sandal.n.01"}],
}
FILTER_DOC = (
    'a filter: {"must": [C...], "should": [C...], "must_not": [C...]}; a condition C is '
    '{"key": K, "match": V}, {"key": K, "in": [V...]}, {"key": K, "range": {"gt"|"gte"|"lt"|'
    '"lte": number}}, {"under": "<label>"} or a nested filter; K is label, id or '
    "payload.<field>[.<field>...]"
)
FilterField = Annotated[
    dict[str, Any] | None,
    Field(default=None, description=FILTER_DOC, examples=[_FILTER_EXAMPLE]),
]
WITH_VECTOR_DOC = "add each item's vector"
WITH_PAYLOAD_DOC = "add each item's payload (the stored JSON object)"


# ---------------------------------------------------------------- errors


class ErrorOut(BaseModel):
    detail: str = Field(description="what is wrong, naming the input")
    errors: list[dict] | None = Field(default=None, description="validation errors: loc and msg")
    suggestions: list[str] | None = Field(
        default=None, description="close matches of an unknown label"
    )


#: The 422 every router documents (invalid input; ``detail`` says what is wrong).
INVALID: dict = {
    422: {"model": ErrorOut, "description": "invalid input; detail says what is wrong"}
}
#: what a status code means wherever a route answers it without saying more
_MEANS = {401: "API key missing or wrong"}


def errors(*codes: int | dict[int, str]) -> dict[int, dict]:
    """A route's ``responses``: each status code answered with :class:`ErrorOut`
    (a 401 with :data:`_MEANS`); a ``{code: description}`` describes its codes."""
    out: dict[int, dict] = {}
    for c in codes:
        for code, text in c.items() if isinstance(c, dict) else [(c, _MEANS.get(c))]:
            out[code] = {"model": ErrorOut, **({} if text is None else {"description": text})}
    return out


# ---------------------------------------------------------------- ops


class HealthOut(BaseModel):
    status: str = Field(examples=["ok"])


class StatsOut(BaseModel):
    items: int = Field(description="live items in the index")
    dim: int
    curvature: float
    model: str | None = Field(description="version id of the image model (null: labels only)")
    labels: int = Field(description="distinct labels carried by items")
    taxonomy: int = Field(description="nodes of the loaded taxonomy")
    backend: str = Field(description="index backend in use (exact, graph or hnsw)")
    space: str | None = Field(
        None,
        description="the space: poincare:D@c, or a product such as poincare:8,sphere:4,euclidean:4",
    )
