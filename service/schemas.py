"""Request and response shapes of the REST API (pydantic), with OpenAPI examples."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

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


# ---------------------------------------------------------------- items


#: an item's label and payload, as ``PUT /v1/items/{id}`` and the batch items take them
ItemLabel = Annotated[
    str | None,
    Field(
        min_length=1,
        max_length=300,
        description="synset or word; default: the nearest prototype among labels in use",
    ),
]
ItemPayload = Annotated[
    dict[str, Any] | None,
    Field(
        description="a JSON object kept with the item ('image' and 'label_source' are the "
        "service's own keys)",
    ),
]


class ItemIn(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"vector": _EXAMPLE_VECTOR, "label": "sneaker"}]},
    )

    vector: list[Finite] = Field(
        min_length=1, max_length=MAX_DIM, description="a point of the ball"
    )
    label: ItemLabel = None
    payload: ItemPayload = None


class ItemOut(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "id": "fashion-mnist-test-9",
                    "label": "gym_shoe.n.01",
                    "vector": _EXAMPLE_VECTOR,
                    "distance_to_origin": 4.2,
                    "holder": "gym_shoe.n.01",
                    "payload": {"image": {"dataset": "fashion-mnist", "split": "test", "row": 9}},
                    "label_source": "given",
                    "image": "/v1/items/fashion-mnist-test-9/image",
                }
            ]
        }
    )

    id: str
    label: str | None
    vector: list[float]
    distance_to_origin: float
    holder: str | None = Field(
        default=None,
        description="the deepest label whose cone holds the item's point (null: no cone holds it)",
    )
    payload: dict | None = Field(default=None, description="the item's payload (a JSON object)")
    label_source: Literal["given", "predicted"] | None = Field(
        default=None, description="whether the label was given or predicted (nearest prototype)"
    )
    image: str | None = Field(
        default=None, description="URL of the item's picture, when it has one"
    )


class DeletedOut(BaseModel):
    id: str
    deleted: bool


# ---------------------------------------------------------------- jobs


class JobIn(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"path": "/data/shoes"}, {"path": "/data/catalog.csv"}]},
    )

    path: str = Field(
        min_length=1,
        max_length=4096,
        description="a folder DIR/<class>/<images> or a CSV manifest id,path[,label] "
        "under a data root",
    )
    class_map: dict[str, str] | None = Field(
        default=None, description="class name -> taxonomy node (default: the name resolves itself)"
    )


class SkippedOut(BaseModel):
    source: str
    reason: str


class JobOut(BaseModel):
    id: str
    state: Literal["queued", "running", "succeeded", "failed", "cancelled"]
    path: str
    total: int | None = Field(description="images found (null while scanning)")
    done: int = Field(description="images read so far (embedded or skipped)")
    indexed: int = Field(description="items written (visible once the job succeeds)")
    skipped: int
    progress: float = Field(description="done / total, 0..1")
    images_per_second: float | None
    skipped_reasons: dict[str, int]
    skipped_examples: list[SkippedOut] = Field(description="the first skipped sources")
    error: str | None
    created_at: float
    started_at: float | None
    finished_at: float | None


# ---------------------------------------------------------------- batches, scroll, count


class SearchBatchIn(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "searches": [
                        {"label": "sneaker", "k": 3},
                        {"id": "fashion-mnist-test-42", "k": 3, "with_payload": True},
                    ]
                }
            ]
        },
    )

    searches: list[SearchIn] = Field(
        min_length=1,
        max_length=10_000,
        description="searches, answered in order (at most HYPSEARCH_MAX_BATCH_SEARCHES; "
        "the body at most HYPSEARCH_MAX_SEARCH_BATCH_BYTES)",
    )


class SearchBatchOut(BaseModel):
    answers: list[SearchOut]


class BatchItemIn(BaseModel):
    """Exactly one of ``vector`` and ``image``."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"oneOf": [{"required": ["vector"]}, {"required": ["image"]}]},
    )

    id: str = Field(min_length=1, max_length=2000)
    vector: list[Finite] | None = Field(
        default=None, min_length=1, max_length=MAX_DIM, description="a point of the ball"
    )
    image: str | None = Field(
        default=None, min_length=1, description="a picture (PNG, JPEG, ...) in base64"
    )
    label: ItemLabel = None
    payload: ItemPayload = None

    @model_validator(mode="after")
    def _one_point(self) -> BatchItemIn:
        if (self.vector is None) == (self.image is None):
            raise ValueError("give exactly one of vector, image")
        return self


class ItemsBatchIn(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "items": [
                        {
                            "id": "shoe-1",
                            "vector": _EXAMPLE_VECTOR,
                            "label": "sneaker",
                            "payload": {"color": "red", "price": 39.5},
                        },
                        {"id": "shoe-2", "image": "iVBORw0KGgoAAAANSUhEUgAA...", "label": "sandal"},
                    ]
                }
            ]
        },
    )

    items: list[BatchItemIn] = Field(
        min_length=1, description="items to upsert (at most HYPSEARCH_MAX_BATCH_ITEMS), all or none"
    )


class UpsertedOut(BaseModel):
    upserted: int = Field(description="items written (durable)", examples=[2])


class ItemsDeleteIn(BaseModel):
    """Exactly one of ``ids`` and ``filter``."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "oneOf": [{"required": ["ids"]}, {"required": ["filter"]}],
            "examples": [
                {"ids": ["shoe-1", "shoe-2"]},
                {"filter": {"must": [{"key": "payload.color", "match": "red"}]}},
            ],
        },
    )

    ids: list[Annotated[str, Field(min_length=1, max_length=2000)]] | None = Field(
        default=None, description="ids to delete (unknown ids are ignored)"
    )
    filter: FilterField

    @model_validator(mode="after")
    def _one_way(self) -> ItemsDeleteIn:
        if (self.ids is None) == (self.filter is None):
            raise ValueError("give exactly one of ids, filter")
        return self


class DeletedCountOut(BaseModel):
    deleted: int = Field(description="items deleted (durable)", examples=[2])


class ItemsGetIn(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [{"ids": ["shoe-1", "shoe-2"], "with_payload": True, "with_vector": False}]
        },
    )

    ids: list[Annotated[str, Field(min_length=1, max_length=2000)]] = Field(
        description="ids to read (absent ids are left out of the answer)"
    )
    with_vector: bool = Field(default=False, description=WITH_VECTOR_DOC)
    with_payload: bool = Field(default=False, description=WITH_PAYLOAD_DOC)


class PointOut(BaseModel):
    id: str
    label: str | None
    holder: str | None = Field(
        default=None, description="the deepest label whose cone holds the item's point"
    )
    vector: list[float] | None = Field(default=None, description="with_vector: the item's point")
    payload: dict | None = Field(default=None, description="with_payload: the item's payload")


_POINT_EXAMPLE = {
    "id": "shoe-1",
    "label": "gym_shoe.n.01",
    "holder": "gym_shoe.n.01",
    "payload": {"color": "red", "price": 39.5, "label_source": "given"},
}


class PointsOut(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [{"items": [_POINT_EXAMPLE]}]})

    items: list[PointOut]


class ScrollIn(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {"limit": 100},
                {
                    "filter": {"must": [{"under": "footwear"}]},
                    "limit": 100,
                    "cursor": "eyJhZnRlciI6ICJzaG9lLTEifQ",
                    "with_payload": True,
                },
            ]
        },
    )

    filter: FilterField
    limit: int = Field(default=100, ge=1, le=10_000, description="items per page")
    cursor: str | None = Field(
        default=None,
        max_length=16_100,
        description="null for the first page, then the answer's next_cursor (signed by "
        "the server; valid HYPSEARCH_CURSOR_TTL_S seconds; any other text: 400)",
    )
    with_vector: bool = Field(default=False, description=WITH_VECTOR_DOC)
    with_payload: bool = Field(default=False, description=WITH_PAYLOAD_DOC)


class ScrollOut(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [{"items": [_POINT_EXAMPLE], "next_cursor": "eyJhZnRlciI6ICJzaG9lLTEifQ"}]
        }
    )

    items: list[PointOut] = Field(description="the page, in id order")
    next_cursor: str | None = Field(description="the next page's cursor; null after the last page")


class CountIn(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {"filter": {"must": [{"under": "footwear"}]}},
                {},
                {"label": "footwear", "facet": "children"},
            ]
        },
    )

    filter: FilterField
    label: str | None = Field(
        default=None,
        min_length=1,
        max_length=300,
        description="count the items this label's cone holds (a synset or a word)",
    )
    facet: GroupBy | None = Field(
        default=None, description="with label: 'children' adds the count under each child"
    )

    @model_validator(mode="after")
    def _facet_needs_label(self) -> CountIn:
        if self.facet is not None and self.label is None:
            raise ValueError("facet: counts under the children of a label: give label")
        return self


class FacetOut(BaseModel):
    label: str = Field(description="a child of the label (its cone's child)")
    count: int = Field(description="items that child's cone holds (filters applied)")


class CountOut(BaseModel):
    count: int = Field(examples=[1000])
    facets: list[FacetOut] | None = Field(
        default=None, description="facet children: the count under each child holding items"
    )
