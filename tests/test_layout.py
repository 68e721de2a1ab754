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


# What indexing/ may import from models/: the geometry it ranks with, the
# nearest-prototype rule and atomic file writes -- vectors and payloads, never
# images, image models or training (those sit above, in service/ingest/).
INDEXING_MAY_IMPORT = ("models.geometry", "models.prototypes", "models.fileio")


def _models_imports(path: Path, package: str) -> set[str]:
    """The models.* modules a module imports (relative imports resolved)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join(parts + ([base] if base else []))
            names = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        out |= {n for n in names if n == "models" or n.startswith("models.")}
    return out


def _allowed(name: str) -> bool:
    # "models" alone: `from models import geometry` (the package's docstring only)
    return name == "models" or any(
        name == m or name.startswith(m + ".") for m in INDEXING_MAY_IMPORT
    )


def test_indexing_imports_no_image_or_training_code():
    root = TESTS.parent
    seen: dict[str, str] = {}  # models module -> the indexing module that first needs it
    todo = []
    for path in sorted((root / "indexing").rglob("*.py")):
        package = ".".join(path.relative_to(root).with_suffix("").parts[:-1])
        for name in _models_imports(path, package):
            assert _allowed(name), f"{path.relative_to(root)} imports {name}"
            todo.append((name, str(path.relative_to(root))))
    # and what those modules import in turn stays inside the allowed set
    while todo:
        name, why = todo.pop()
        if name in seen:
            continue
        seen[name] = why
        mod = root / Path(*name.split("."))
        path = mod / "__init__.py" if mod.is_dir() else mod.with_suffix(".py")
        if not path.is_file():  # a name imported from a module, not a module
            continue
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        for sub in _models_imports(path, package):
            assert _allowed(sub), f"{name} (imported by {why}) imports {sub}"
            todo.append((sub, why))
    assert seen, "indexing imports nothing from models: the list above is stale"


def _module_file(root: Path, name: str) -> Path | None:
    path = root / Path(*name.split("."))
    for f in (path.with_suffix(".py"), path / "__init__.py"):
        if f.is_file():
            return f
    return None


def _top_level_names(path: Path) -> set[str] | None:
    """The names a module defines at its top level (inside top-level ``if`` and ``try``
    too); None when it may answer any name (a module ``__getattr__``, a star import)."""
    names: set[str] = set()
    body = list(ast.parse(path.read_text(encoding="utf-8")).body)
    while body:
        node = body.pop()
        if isinstance(node, ast.If | ast.Try):
            body += node.body + node.orelse + getattr(node, "finalbody", [])
            body += [s for h in getattr(node, "handlers", []) for s in h.body]
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            if node.name == "__getattr__":
                return None
            names.add(node.name)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            if any(a.name == "*" for a in node.names):
                return None  # a star import: not followed here
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for tg in targets for n in ast.walk(tg) if isinstance(n, ast.Name)}
    return names


def test_every_import_of_a_project_module_names_one_that_exists():
    """Modules move (models/ in subpackages, the ingest in service/): an import of an
    old path fails here, also in benchmarks/, which no test imports."""
    root = TESTS.parent
    missing = []
    defined: dict[Path, set[str] | None] = {}
    for folder in ("models", "indexing", "service", "benchmarks", "tests"):
        for path in sorted((root / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    wanted = [(a.name, None) for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    wanted = [(node.module, a.name) for a in node.names]
                else:
                    continue
                for module, name in wanted:
                    if module.split(".")[0] not in ("models", "indexing", "service"):
                        continue
                    where = f"{path.relative_to(root)}:{node.lineno}"
                    file = _module_file(root, module)
                    if file is None:
                        missing.append(f"{where} imports {module}")
                        continue
                    if name is None or name == "*" or _module_file(root, f"{module}.{name}"):
                        continue
                    if file not in defined:
                        defined[file] = _top_level_names(file)
                    if defined[file] is not None and name not in defined[file]:
                        missing.append(f"{where} imports {name} from {module}")
    assert not missing, "\n".join(missing)
