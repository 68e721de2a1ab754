"""Checks of what callers hand to :class:`indexing.HyperbolicIndex`.

Each check returns the input in the form the index works with (a list of str,
a set of str, JSON text, an int) or raises :class:`IndexInputError` with a
message that starts with the input's name (``ids[7]: empty id``).  Vectors are
checked by the index space (:meth:`indexing.geometry.IndexSpace.as_points`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from .errors import IndexInputError

__all__ = [
    "check_batch",
    "check_folder",
    "check_ids",
    "check_labels",
    "check_payloads",
    "check_pos_int",
    "check_str_set",
]


def check_ids(ids, name: str = "ids", n: int | None = None) -> list[str]:
    if isinstance(ids, (str, bytes)):
        raise IndexInputError(
            f"{name}: expected a sequence of str, got a single {type(ids).__name__} "
            "(wrap one id in a list)"
        )
    if isinstance(ids, np.ndarray) and ids.ndim != 1:
        raise IndexInputError(f"{name}: expected a 1-d sequence, got shape {ids.shape}")
    try:
        ids = list(ids)
    except TypeError:
        raise IndexInputError(
            f"{name}: expected a sequence of str, got {type(ids).__name__}"
        ) from None
    first: dict[str, int] = {}
    for j, i in enumerate(ids):
        if isinstance(i, np.str_):
            i = ids[j] = str(i)
        if not isinstance(i, str):
            raise IndexInputError(f"{name}[{j}]: expected str, got {type(i).__name__} ({i!r})")
        if not i:
            raise IndexInputError(f"{name}[{j}]: empty id")
        if i in first:
            raise IndexInputError(f"{name}[{j}]: duplicate id {i!r} (also at {name}[{first[i]}])")
        first[i] = j
    if n is not None and len(ids) != n:
        raise IndexInputError(f"{name}: {len(ids)} ids for {n} vectors")
    return ids


def check_labels(labels, n: int, name: str = "labels") -> list[str | None]:
    if labels is None:
        return [None] * n
    if isinstance(labels, (str, bytes)):
        raise IndexInputError(f"{name}: expected a sequence of str or None, got a single str")
    labels = list(labels)
    if len(labels) != n:
        raise IndexInputError(f"{name}: {len(labels)} labels for {n} vectors")
    for j, lab in enumerate(labels):
        if isinstance(lab, np.str_):
            labels[j] = str(lab)
        elif lab is not None and not isinstance(lab, str):
            raise IndexInputError(f"{name}[{j}]: expected str or None, got {type(lab).__name__}")
    return labels


_PAYLOAD_JSON = json.JSONEncoder(allow_nan=False, separators=(",", ":"))


def check_payloads(payloads, n: int) -> list[str | None]:
    if payloads is None:
        return [None] * n
    if isinstance(payloads, (str, bytes, Mapping)):
        raise IndexInputError("payloads: expected a sequence with one JSON value per vector")
    payloads = list(payloads)
    if len(payloads) != n:
        raise IndexInputError(f"payloads: {len(payloads)} payloads for {n} vectors")
    out = []
    encode = _PAYLOAD_JSON.encode  # one encoder for the batch (json.dumps makes one a call)
    for j, p in enumerate(payloads):
        if p is None:
            out.append(None)
            continue
        try:
            out.append(encode(p))
        except (TypeError, ValueError) as exc:
            raise IndexInputError(f"payloads[{j}]: not JSON-serialisable ({exc})") from None
    return out


def check_pos_int(v, name: str, minimum: int = 1) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < minimum:
        raise IndexInputError(f"{name}: must be an integer >= {minimum}, got {v!r}")
    return int(v)


def check_str_set(v, name: str) -> set[str]:
    if isinstance(v, (str, bytes)):
        raise IndexInputError(f"{name}: expected a collection of str, got a single str")
    try:
        out = set(v)
    except TypeError:
        raise IndexInputError(
            f"{name}: expected a collection of str, got {type(v).__name__}"
        ) from None
    for x in out:
        if not isinstance(x, str):
            raise IndexInputError(f"{name}: contains {type(x).__name__} {x!r}, expected str")
    return out


def check_folder(path: str | os.PathLike) -> Path:
    """``path`` as a folder that either does not exist yet or is a directory."""
    folder = Path(path)
    if folder.exists() and not folder.is_dir():
        raise IndexInputError(f"path: {folder} exists and is not a directory")
    return folder


def check_batch(space, vectors, ids, labels, payloads) -> tuple:
    """A batch to upsert, checked as a whole before anything is written: ``(points
    of the space, ids, labels, payloads as JSON text)``, or :class:`IndexInputError`."""
    x = space.as_points(vectors, "vectors")
    n = len(x)
    return x, check_ids(ids, "ids", n), check_labels(labels, n), check_payloads(payloads, n)
