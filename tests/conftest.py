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
* The ``slow`` mark (``make test`` runs everything, ``make test-fast`` all but
  ``slow``): the modules of :data:`SLOW_MODULES` (end to end: real server
  processes, crash loops, a browser, the schema fuzzer; or training runs), the
  tests of :data:`SLOW_TESTS`, every test of a Ray cluster (mark ``ray``) and
  every test that trains on the Fashion-MNIST sample (fixture ``fm_cap``).

Shared helpers are in :mod:`tests.support`; no test module imports another.

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

#: test modules marked ``slow`` as a whole (paths relative to tests/)
SLOW_MODULES = frozenset(
    {
        # training runs
        "models/test_finetune.py",
        "models/test_objectives.py",
        "models/test_pretrained.py",
        "models/test_train.py",
        "models/test_train_cli.py",
        # index builds through the command line, kill -9 loops
        "indexing/test_build_index.py",
        "indexing/test_store_crash.py",
        # real servers, a browser, the schema fuzzer, background jobs
        "service/test_collections_client.py",
        "service/test_e2e_server.py",
        "service/test_page_browser.py",
        "service/test_points_crash.py",
        "service/test_restore_default.py",
        "service/test_service_demo.py",
        "service/test_service_hard_inputs.py",
        "service/test_service_jobs.py",
        "service/test_service_rest_backends.py",
        "service/test_service_schemathesis.py",
    }
)
#: single tests marked ``slow`` in otherwise fast modules (node ids without parameters)
SLOW_TESTS = frozenset(
    {
        "indexing/test_index_deep.py::test_deep_points_search_exactly",
        "indexing/test_index_graph.py::test_product_graph_against_the_exact_scan",
        "models/test_labels_closure.py::test_pull_layout_lowers_the_rank_of_second_parents_and_keeps_the_cones",
        "models/test_taxonomy.py::test_with_words_adds_wordnet_words_to_synsets",
        "service/test_cli.py::test_console_script_help",
        "service/test_cli.py::test_labels_train_eval_export",
        "service/test_cli.py::test_labels_train_resumes_from_partial",
        "service/test_cli.py::test_python_m_service_cli_bad_input_exits_2_with_one_line",
    }
)
TESTS = Path(__file__).resolve().parent


def is_slow(item: pytest.Item) -> bool:
    rel = Path(str(item.path)).resolve().relative_to(TESTS).as_posix()
    return (
        rel in SLOW_MODULES
        or f"{rel}::{item.originalname}" in SLOW_TESTS
        or item.get_closest_marker("ray") is not None
        or "fm_cap" in getattr(item, "fixturenames", ())
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if is_slow(item) and item.get_closest_marker("slow") is None:
            item.add_marker(pytest.mark.slow)


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
