"""The test tree's own rules: tests mirror the code (tests/models, tests/indexing,
tests/service), no test module imports another (shared helpers live in
tests/support and conftest.py), every test_* module holds tests, and the ``slow``
lists of tests/conftest.py name tests that exist."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import SLOW_MODULES, SLOW_TESTS

TESTS = Path(__file__).resolve().parent
TOP_LEVEL = {"test_docs.py", "test_layout.py"}  # about the project as a whole


def _modules() -> list[Path]:
    return sorted(TESTS.rglob("test_*.py"))


def _imported(tree: ast.Module) -> list[str]:
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = "." * node.level + (node.module or "")
            out.append(base)
            out += [f"{base}.{a.name}" for a in node.names]
    return out


def test_test_modules_sit_beside_the_package_they_test():
    for path in _modules():
        rel = path.relative_to(TESTS)
        assert rel.parts[0] in ("models", "indexing", "service") or rel.as_posix() in TOP_LEVEL, rel


def test_no_test_module_imports_another_and_each_holds_tests():
    for path in _modules():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for name in _imported(tree):
            last = name.rsplit(".", 1)[-1]
            assert not last.startswith("test_"), f"{path.relative_to(TESTS)} imports {name}"
        tests = [
            n.name
            for n in tree.body
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name.startswith("test_")
        ]
        assert tests, f"{path.relative_to(TESTS)} is named test_* but holds no test"
    for path in sorted((TESTS / "support").glob("*.py")):
        assert not path.name.startswith("test_"), path


def test_the_slow_lists_name_tests_that_exist():
    for rel in SLOW_MODULES:
        assert (TESTS / rel).is_file(), rel
    for node in SLOW_TESTS:
        rel, name = node.split("::")
        tree = ast.parse((TESTS / rel).read_text(encoding="utf-8"))
        names = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
        assert name in names, node


def test_ci_fails_the_ray_tests_it_cannot_run(monkeypatch):
    """CI (.ci/run) says it is CI, and there a test that needs a Ray cluster it cannot
    start fails instead of skipping (tests/support/ray_cluster.py)."""
    import pytest

    from tests.support.ray_cluster import cannot_run

    run = (TESTS.parent / ".ci" / "run").read_text()
    assert "export CI=true" in run.split("\nmake test")[0]
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="no Ray cluster"):
        cannot_run("no namespace")
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception):
        cannot_run("no namespace")
