"""Configuration of the REST service: one pydantic-settings class.

Every field is read from an environment variable ``HYPSEARCH_<FIELD>`` (for
example ``HYPSEARCH_API_KEY``, ``HYPSEARCH_DATA_ROOTS``); ``hypsearch serve``
options override them. Nothing is created at import time: call
:func:`get_settings` (or build :class:`Settings` yourself, as tests do).
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Annotated

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

#: Keys that look like placeholders are refused (an API key is a secret).
_PLACEHOLDER_KEYS = {"changeme", "change-me", "secret", "password", "apikey", "api-key", "xxx"}


class Settings(BaseSettings):
    """Everything the service reads from its environment."""

    model_config = SettingsConfigDict(env_prefix="HYPSEARCH_", extra="ignore")

    # artifacts
    home: Path = Field(default=Path("var"), description="cache and generated artifacts")
    model: Path | None = Field(
        default=None, description="image model checkpoint (image search, embed, image upserts)"
    )
    labels: Path | None = Field(
        default=None,
        description="label checkpoint, used when no model is given (vector, label and id search)",
    )
    index: Path = Field(
        default=Path("var/index"), description="index folder (created when missing)"
    )
    image_dir: Path | None = Field(
        default=None, description="where uploaded item images are kept (default INDEX/images)"
    )
    data_dir: Path = Field(
        default=Path("/usr/share/datasets/fashion-mnist"),
        description="Fashion-MNIST IDX files (pictures of fashion-mnist-* items)",
    )
    wordnet_dir: Path | None = Field(
        default=Path("/usr/share/wordnet"),
        description="WordNet database: words (sneaker, bag) for the synsets of the taxonomy",
    )

    # network
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    api_key: SecretStr | None = Field(
        default=None, description="when set, writes need 'Authorization: Bearer <key>'"
    )

    # limits
    max_upload_bytes: int = Field(default=10 * 1024 * 1024, ge=1)
    max_json_bytes: int = Field(
        default=1024 * 1024,
        ge=1,
        description="JSON request bodies above this are refused (413) before they are parsed",
    )
    max_image_pixels: int = Field(
        default=4096 * 4096,
        ge=1,
        description="decoded width x height above which an image is refused (a JPEG "
        "counts its reduced decode; the models read at most 512 pixels a side)",
    )
    max_batch_items: int = Field(
        default=10_000, ge=1, description="items of one batch upsert, delete or get at most"
    )
    max_batch_searches: int = Field(default=100, ge=1, description="searches of one batch at most")
    max_batch_bytes: int = Field(
        default=64 * 1024 * 1024,
        ge=1,
        description="JSON bodies of the batch routes (/items/batch, /search/batch) above this "
        "are refused (413) before they are parsed",
    )
    max_k: int = Field(default=1000, ge=1)
    max_window: int = Field(default=10_000, ge=1, description="offset + k at most")
    # hard inputs (issue 32; docs/operations.md, "Limits")
    max_search_batch_bytes: int = Field(
        default=1024 * 1024,
        ge=1,
        description="JSON body of /search/batch above this: 413 before it is parsed "
        "(100 searches of vectors up to ~500 dimensions)",
    )
    max_json_depth: int = Field(
        default=32, ge=2, description="nesting of a JSON text sent in a form field or a cursor"
    )
    max_filter_conditions: int = Field(
        default=256, ge=1, description="conditions of one filter (nested ones included)"
    )
    max_filter_keys: int = Field(
        default=16, ge=1, description="distinct payload fields one filter names"
    )
    filter_cache_columns: int = Field(
        default=64, ge=1, description="payload-field columns kept per index (least recent out)"
    )
    filter_cache_bytes: int = Field(
        default=256 * 1024 * 1024,
        ge=1,
        description="bytes of payload-field columns kept per index (least recent out)",
    )
    max_concurrent_decodes: int = Field(
        default=2, ge=1, description="large pictures decoded at the same time"
    )
    cursor_secret: SecretStr | None = Field(
        default_factory=lambda: SecretStr(secrets.token_urlsafe(32)),
        description="HMAC key of scroll cursors (default: random at each start, so "
        "cursors do not outlive the process; Ray replicas get the serving process's)",
    )
    cursor_ttl_s: float = Field(
        default=24 * 3600, gt=0, description="seconds a scroll cursor stays valid"
    )
    max_space_dim: int = Field(
        default=4096, ge=2, description="dimension of a collection's space (all factors)"
    )
    max_space_factors: int = Field(default=16, ge=1, description="factors of a product space")
    max_label_work: int = Field(
        default=1_000_000_000,
        ge=1,
        description="labels x dimension^2 a new collection's cap construction may take "
        "(its time grows so: 300 labels at 2,048 dimensions took 24 s on 2 cores)",
    )
    max_snapshot_bytes: int = Field(
        default=16 * 1024 * 1024 * 1024,
        ge=1,
        description="bytes of an index's files in one snapshot tar (sum of the members)",
    )

    # batch jobs
    data_roots: Annotated[list[Path], NoDecode] = Field(
        default_factory=list,
        description="server folders that index jobs may read (colon- or comma-separated)",
    )
    job_workers: int = Field(default=2, ge=0, description="data loader worker processes of a job")
    job_batch_size: int = Field(default=256, ge=1)

    # inference
    batch_max_size: int = Field(
        default=32, ge=1, description="micro-batch: most images per forward"
    )
    batch_max_wait_ms: float = Field(
        default=2.0, ge=0, description="micro-batch: how long the first image waits for company"
    )
    search_batch_max_size: int = Field(
        default=64,
        ge=1,
        description="searches: most queries answered in one batch (those queued meanwhile)",
    )
    search_batch_workers: int | None = Field(
        default=None,
        ge=1,
        le=16,
        description="searches: batches answered at once (default 1; 2 can help a sharded "
        "index whose shards are on other machines, read by Ray calls: one batch waits for "
        "their answers while the next forms)",
    )
    search_fast_path: bool = Field(
        default=True,
        description="answer well-formed JSON searches without FastAPI's routing "
        "(service.fastpath; errors still come from the route)",
    )
    torch_threads: int = Field(default=1, ge=1, description="torch intra-op threads")

    # logs
    log_level: str = "INFO"
    log_json: bool = True

    @field_validator("data_roots", mode="before")
    @classmethod
    def _split_roots(cls, v):
        if isinstance(v, str):
            parts = [p.strip() for chunk in v.split(os.pathsep) for p in chunk.split(",")]
            return [p for p in parts if p]
        return v

    @field_validator("api_key")
    @classmethod
    def _no_placeholder(cls, v: SecretStr | None) -> SecretStr | None:
        if v is None:
            return None
        s = v.get_secret_value()
        if s == "":
            return None
        if s.strip().lower() in _PLACEHOLDER_KEYS or len(s) < 8:
            raise ValueError("api_key: use a real secret of at least 8 characters")
        return v

    @field_validator("cursor_secret")
    @classmethod
    def _cursor_secret(cls, v: SecretStr | None) -> SecretStr:
        if v is None or len(v.get_secret_value()) < 16:
            if v is not None and v.get_secret_value():
                raise ValueError("cursor_secret: use a secret of at least 16 characters")
            return SecretStr(secrets.token_urlsafe(32))  # empty: a random one
        return v

    @field_validator("log_level")
    @classmethod
    def _level(cls, v: str) -> str:
        v = v.upper()
        if v not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
            raise ValueError(f"log_level: unknown level {v!r}")
        return v

    @model_validator(mode="after")
    def _roots_absolute(self) -> Settings:
        self.data_roots = [Path(os.path.realpath(p)) for p in self.data_roots]
        return self

    @property
    def images_folder(self) -> Path:
        return self.image_dir if self.image_dir is not None else self.index / "images"


def get_settings(**overrides) -> Settings:
    """Settings from the environment, with ``overrides`` (CLI options) on top."""
    return Settings(**{k: v for k, v in overrides.items() if v is not None})
