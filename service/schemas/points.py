"""Schemas of batches (searches, upserts, deletes, gets), scroll and count."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .common import (
    _EXAMPLE_VECTOR,
    MAX_DIM,
    WITH_PAYLOAD_DOC,
    WITH_VECTOR_DOC,
    FilterField,
    Finite,
    GroupBy,
)
from .items import (
    ItemLabel,
    ItemPayload,
)
from .search import (
    SearchIn,
    SearchOut,
)

__all__ = [
    "BatchItemIn",
    "CountIn",
    "CountOut",
    "DeletedCountOut",
    "FacetOut",
    "ItemsBatchIn",
    "ItemsDeleteIn",
    "ItemsGetIn",
    "PointOut",
    "PointsOut",
    "ScrollIn",
    "ScrollOut",
    "SearchBatchIn",
    "SearchBatchOut",
    "UpsertedOut",
]

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
