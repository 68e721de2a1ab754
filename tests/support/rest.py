"""Small helpers of the REST tests: a random vector of the ball, an error's detail."""

from __future__ import annotations

import numpy as np


def random_vector(rng, dim: int, r: float = 0.5) -> list[float]:
    """A random direction at Euclidean norm ``r`` (a point of the unit ball), as a list."""
    d = rng.standard_normal(dim)
    return (d / np.linalg.norm(d) * r).tolist()


def detail_of(r) -> str:
    """The non-empty string ``detail`` of an error answer."""
    body = r.json()
    assert isinstance(body.get("detail"), str) and body["detail"], body
    return body["detail"]
