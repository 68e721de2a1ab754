"""Fixtures shared by the test files.

* ``torch_single_thread`` (module scope): torch at one intra-op thread while a
  module runs, the previous setting back afterwards (tiny tensors: torch's
  thread pool only adds latency, and spins on a busy machine).  A module opts
  in with ``pytestmark = pytest.mark.usefixtures("torch_single_thread")``.
* ``geometry_reference``: the 60-digit Poincaré-ball reference
  ``tests/data/geometry_reference.json`` (see ``tests/data/README.md``).
* ``reference_case``: a test with this argument runs once per case of that
  reference; ``interior_reference_case`` once per case whose points all lie
  at a relative gap ``1 - sqrt(c)|p|`` of at least 1e-2 (where float32 is
  checked).

Everything the tests read is inside the repository.
"""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path

import pytest

GEOMETRY_REFERENCE = Path(__file__).resolve().parent / "data" / "geometry_reference.json"

#: smallest relative gap of the cases ``interior_reference_case`` runs on
INTERIOR_GAP = 1e-2


@functools.cache
def _reference() -> dict:
    return json.loads(GEOMETRY_REFERENCE.read_text())


def _min_gap(case: dict) -> float:
    """Smallest ``1 - sqrt(c)|p|`` over the case's points ``x``, ``y`` and ``points``."""
    pts = [case["x"], case["y"], *case["points"]]
    return min(1 - math.sqrt(case["c"]) * math.sqrt(sum(t * t for t in p)) for p in pts)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    cases = None
    for name, interior in (("reference_case", False), ("interior_reference_case", True)):
        if name not in metafunc.fixturenames:
            continue
        cases = _reference()["cases"] if cases is None else cases
        chosen = [
            (i, cs) for i, cs in enumerate(cases) if not interior or _min_gap(cs) >= INTERIOR_GAP
        ]
        metafunc.parametrize(
            name,
            [cs for _, cs in chosen],
            ids=[f"c{cs['c']}-d{cs['dim']}-gap{_min_gap(cs):.0e}-{i}" for i, cs in chosen],
        )


@pytest.fixture(scope="session")
def geometry_reference() -> dict:
    return _reference()


@pytest.fixture(scope="module")
def torch_single_thread():
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
