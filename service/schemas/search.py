"""Schemas of searches, embeddings and labels."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .common import (
    _EXAMPLE_VECTOR,
    _LEVELS_DOC,
    MAX_DIM,
    MODE_DOC,
    WITH_PAYLOAD_DOC,
    WITH_VECTOR_DOC,
    FilterField,
    Finite,
    GroupBy,
    Levels,
    Mode,
)

__all__ = [
    "DiskOut",
    "DiskPoint",
    "EmbedOut",
    "GroupOut",
    "HitOut",
    "ImageSearchParams",
    "LabelDistance",
    "LabelOut",
    "QueryOut",
    "SCORE_DOC",
    "SearchIn",
    "SearchOut",
]

# ---------------------------------------------------------------- search


class SearchIn(BaseModel):
    """Exactly one of ``vector``, ``label``, ``id``."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "oneOf": [{"required": ["vector"]}, {"required": ["label"]}, {"required": ["id"]}],
            "examples": [
                {"label": "footwear", "k": 10},
                {"label": "sneaker", "k": 10, "mode": "hierarchical"},
                {"label": "sneaker", "k": 10, "mode": "hierarchical", "levels": "taxonomy"},
                {"label": "clothing", "k": 5, "group_by": "children"},
                {"id": "fashion-mnist-test-42", "k": 5},
                {"vector": _EXAMPLE_VECTOR, "k": 10, "offset": 10, "mode": "nearest"},
                {
                    "label": "sneaker",
                    "k": 5,
                    "filter": {"must": [{"key": "payload.color", "match": "red"}]},
                    "with_payload": True,
                    "max_distance": 3.5,
                },
            ],
        },
    )

    k: int = Field(default=10, ge=1, le=1000, description="results to return")
    offset: int = Field(
        default=0, ge=0, le=9999, description="skip this many (offset + k <= 10,000)"
    )
    mode: Mode = Field(default="auto", description=MODE_DOC)
    group_by: GroupBy | None = Field(
        default=None,
        description="label queries: 'children' answers one group per child of the label "
        "whose cone holds items, each ranked by entailment and cut at k",
    )
    vector: list[Finite] | None = Field(
        default=None, min_length=1, max_length=MAX_DIM, description="a point of the ball"
    )
    label: str | None = Field(
        default=None, min_length=1, max_length=300, description="a synset name or a word"
    )
    id: str | None = Field(default=None, min_length=1, max_length=2000, description="an item id")
    under: str | None = Field(
        default=None,
        min_length=1,
        max_length=300,
        description="only items whose label is this taxonomy node (synset or word) or below it",
    )
    per_level: int | None = Field(
        default=None,
        ge=1,
        le=1000,
        description="hierarchical mode: at most this many items of each level (the nearest)",
    )
    levels: Levels | None = Field(default=None, description=_LEVELS_DOC)
    disk: bool = Field(default=False, description="add a 2-D Poincaré-disk layout of the answer")
    filter: FilterField
    with_vector: bool = Field(default=False, description=WITH_VECTOR_DOC)
    with_payload: bool = Field(default=False, description=WITH_PAYLOAD_DOC)
    max_distance: Finite | None = Field(
        default=None, ge=0, description="leave out the hits farther than this from the query"
    )

    @model_validator(mode="after")
    def _one_query(self) -> SearchIn:
        given = [f for f in ("vector", "label", "id") if getattr(self, f) is not None]
        if len(given) != 1:
            got = "none" if not given else ", ".join(given)
            raise ValueError(f"give exactly one of vector, label, id (got {got})")
        if self.offset + self.k > 10_000:
            raise ValueError(f"offset + k must be at most 10000, got {self.offset + self.k}")
        return self


class ImageSearchParams(BaseModel):
    """The query parameters of ``POST /v1/search/image`` (the picture is the body);
    unknown parameters are ignored."""

    model_config = ConfigDict(extra="ignore")

    k: int = Field(default=10, ge=1, le=1000)
    mode: Mode = Field(default="auto", description=MODE_DOC)
    offset: int = Field(default=0, ge=0, le=9999)
    under: str | None = Field(default=None, min_length=1, max_length=300)
    per_level: int | None = Field(default=None, ge=1, le=1000)
    levels: Levels | None = Field(default=None, description=_LEVELS_DOC)
    disk: bool = False
    with_vector: bool = Field(default=False, description=WITH_VECTOR_DOC)
    with_payload: bool = Field(default=False, description=WITH_PAYLOAD_DOC)
    max_distance: Finite | None = Field(default=None, ge=0)


class QueryOut(BaseModel):
    label: str | None = Field(
        description="the label given (resolved), the item's label, or the nearest prototype"
    )
    vector: list[float]
    distance_to_origin: float
    mode: Literal["entailment", "nearest", "hierarchical"] = Field(
        description="the mode that ran: auto resolved to entailment (a label query) or nearest"
    )


SCORE_DOC = (
    "in [0, 1], never increasing down a ranking: nearest 1 / (1 + distance); entailment and "
    "hierarchical the firmness of membership in the label's (hierarchical: via's) cone, its "
    "margin over its aperture (1 on the cone's axis, 0 on its rim and outside), capped by "
    "the score before it"
)


class HitOut(BaseModel):
    id: str
    score: float = Field(ge=0, le=1, description=SCORE_DOC)
    distance: float = Field(description="geodesic distance to the query")
    label: str | None
    level: int | None = Field(description="hierarchical mode: 0 same label, 1 siblings, ...")
    via: str | None = Field(
        description="hierarchical mode: the chain label of the level (levels 'cone': the "
        "label whose cone holds the item)"
    )
    vector: list[float] | None = Field(default=None, description="with_vector: the item's point")
    payload: dict | None = Field(default=None, description="with_payload: the item's payload")


class DiskPoint(BaseModel):
    kind: Literal["query", "result", "label", "origin"]
    name: str = Field(description="item id, label name, or 'query'")
    x: float
    y: float
    label: str | None = None
    level: int | None = None
    parent: str | None = Field(default=None, description="labels: the parent label drawn")


class DiskOut(BaseModel):
    """A 2-D layout: the distance from the centre is the hyperbolic distance to
    the origin (one common scale), angles come from the principal axes of the
    (centred) directions; labels carry their parent for the tree edges."""

    scale: float = Field(description="display radius = tanh(scale * d(0, x) / 2)")
    points: list[DiskPoint]


class GroupOut(BaseModel):
    label: str = Field(description="a child of the query's label (its cone's child)")
    count: int = Field(description="items that child's cone holds (filters applied)")
    results: list[HitOut] = Field(description="its firmest items, at most k")


class SearchOut(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "query": {
                        "label": "gym_shoe.n.01",
                        "vector": _EXAMPLE_VECTOR,
                        "distance_to_origin": 4.2,
                    },
                    "results": [
                        {
                            "id": "fashion-mnist-test-9",
                            "score": 0.93,
                            "distance": 0.31,
                            "label": "gym_shoe.n.01",
                            "level": 0,
                            "via": "gym_shoe.n.01",
                        },
                        {
                            "id": "fashion-mnist-test-12",
                            "score": 0.81,
                            "distance": 1.72,
                            "label": "sandal.n.01",
                            "level": 1,
                            "via": "shoe.n.01",
                        },
                    ],
                }
            ]
        }
    )

    query: QueryOut
    results: list[HitOut] | None = Field(
        default=None, description="the ranking (absent with group_by)"
    )
    groups: list[GroupOut] | None = Field(
        default=None, description="group_by children: one group per child holding items"
    )
    disk: DiskOut | None = None


class LabelDistance(BaseModel):
    label: str
    distance: float


class EmbedOut(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "vector": _EXAMPLE_VECTOR,
                    "distance_to_origin": 4.1,
                    "labels": [
                        {"label": "shoe.n.01", "distance": 2.9},
                        {"label": "sandal.n.01", "distance": 1.8},
                        {"label": "gym_shoe.n.01", "distance": 2.2},
                    ],
                }
            ]
        }
    )

    vector: list[float]
    distance_to_origin: float
    labels: list[LabelDistance] = Field(
        description="first the deepest label whose cone holds the point (when the labels' "
        "cones hold their taxonomy and some cone holds it), then the nearest nodes of the "
        "whole taxonomy, 5 in all, no label twice"
    )


# ---------------------------------------------------------------- labels


class LabelOut(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "name": "gym_shoe.n.01",
                    "parents": ["shoe.n.01"],
                    "children": [],
                    "ancestors": ["shoe.n.01", "footwear.n.02", "entity.n.01"],
                    "depth": 9,
                    "items": 1000,
                    "words": ["gym_shoe", "sneaker", "tennis_shoe"],
                    "vector": _EXAMPLE_VECTOR,
                    "cone": {"family": "cap", "theta0": 2.5, "beta": 0.5, "aperture": 0.021},
                }
            ]
        }
    )

    name: str
    parents: list[str]
    children: list[str]
    ancestors: list[str]
    depth: int
    items: int = Field(description="indexed items whose label is this node or below it")
    words: list[str] = Field(default_factory=list)
    gloss: str | None = None
    vector: list[float] = Field(description="the label's point")
    cone: dict[str, str | float] = Field(
        description="the label's entailment cone: the family and its parameters "
        "(models.geometry.cones.cone_spec) and 'aperture', the cone's aperture at "
        "this point (ganea: the half-aperture psi; cap: the cap's angular radius theta)"
    )
