"""Schemas of items one by one and of index jobs."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from .common import (
    _EXAMPLE_VECTOR,
    MAX_DIM,
    Finite,
)

__all__ = [
    "DeletedOut",
    "ItemIn",
    "ItemLabel",
    "ItemOut",
    "ItemPayload",
    "JobIn",
    "JobOut",
    "SkippedOut",
]

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
