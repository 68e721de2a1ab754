"""The error the service's request handling raises: :class:`ApiError`, a status
and a one-line ``detail`` naming the input (``vector: expected 10 numbers ...``,
``label: unknown label 'snekaer'``). The layers below raise their own domain
errors; :mod:`service.routes.errors` maps both to the answers.
"""

from __future__ import annotations

from typing import Any

from models.taxonomy.graph import UnknownLabelError


class ApiError(Exception):
    """An error answered as ``status`` with ``detail`` (and optional extra fields)."""

    def __init__(self, status: int, detail: str, **extra: Any) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.extra = extra
        self.headers: dict[str, str] | None = None


def bad_input(detail: str) -> ApiError:
    return ApiError(422, detail)


def not_found(detail: str, suggestions: list[str] | None = None) -> ApiError:
    extra = {"suggestions": suggestions} if suggestions is not None else {}
    return ApiError(404, detail, **extra)


def unknown_label(field: str, e: UnknownLabelError, status: int = 422) -> ApiError:
    """An unknown label: 422 in a body or query, 404 when the path names it."""
    return ApiError(status, f"{field}: {e}", suggestions=list(e.suggestions))
