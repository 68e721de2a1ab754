"""The documentation stays true: docs/api.md against the served OpenAPI, the
README's length, and no link out of the repository.

docs/api.md has one ``### METHOD /path`` section per route; a section names
every request field of its route (JSON body, form, query and path) in
backticks. A route under ``/v1/collections/{collection}/`` whose section says
``As `METHOD /v1/...``` shares the fields of that route's section.
"""

from __future__ import annotations

import re
import subprocess
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
API_MD = ROOT / "docs" / "api.md"
HEADING = re.compile(r"^### (GET|PUT|POST|DELETE|PATCH|HEAD) (/\S*)\s*$")
METHODS = {"get", "put", "post", "delete", "patch", "head"}
PREFIX = "/v1/collections/{collection}"


@cache
def openapi() -> dict:
    from service.app import create_app
    from service.settings import get_settings

    return create_app(get_settings()).openapi()


def _fields(schema: dict, components: dict, seen: frozenset = frozenset()) -> set[str]:
    """The top-level property names of a request schema (through $ref, anyOf, allOf)."""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        if name in seen:
            return set()
        return _fields(components[name], components, seen | {name})
    out = set(schema.get("properties", {}))
    for key in ("anyOf", "oneOf", "allOf"):
        for alt in schema.get(key, []):
            out |= _fields(alt, components, seen)
    return out


def routes() -> dict[tuple[str, str], set[str]]:
    """(METHOD, path) -> the request field names of every operation the app serves."""
    spec = openapi()
    components = spec.get("components", {}).get("schemas", {})
    out = {}
    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            if method not in METHODS:
                continue
            names = {p["name"] for p in op.get("parameters", []) if p["in"] in ("query", "path")}
            for content in op.get("requestBody", {}).get("content", {}).values():
                names |= _fields(content.get("schema", {}), components)
            out[(method.upper(), path)] = names
    return out


def sections(text: str) -> dict[tuple[str, str], str]:
    """(METHOD, path) -> the text of its ``###`` section (up to the next heading)."""
    out: dict[tuple[str, str], str] = {}
    key, lines = None, []
    for line in text.splitlines():
        m = HEADING.match(line)
        if m or line.startswith("## ") or line.startswith("### "):
            if key is not None:
                out[key] = "\n".join(lines)
            key, lines = ((m.group(1), m.group(2)) if m else None), []
            if m and (m.group(1), m.group(2)) in out:
                raise AssertionError(f"docs/api.md: two sections for {m.group(1)} {m.group(2)}")
            continue
        lines.append(line)
    if key is not None:
        out[key] = "\n".join(lines)
    return out


def documented(section: str, field: str) -> bool:
    return f"`{field}`" in section or f"`items[].{field}`" in section


def test_sections_parse():
    """The parser finds the headings (so the checks below are not vacuous)."""
    doc = sections(
        "## A\n\n### GET /x\n\n| `a` |\n\n### POST /y/{z}\n\n`z` `b`\n\n## B\n\ntext `c`\n"
    )
    assert doc == {("GET", "/x"): "\n| `a` |\n", ("POST", "/y/{z}"): "\n`z` `b`\n"}
    assert len(sections(API_MD.read_text(encoding="utf-8"))) >= 40


def test_every_route_is_documented():
    doc = sections(API_MD.read_text(encoding="utf-8"))
    missing = sorted(f"{m} {p}" for m, p in routes() if (m, p) not in doc)
    assert not missing, f"docs/api.md has no section for: {missing}"


def test_no_documented_route_the_app_lacks():
    doc = sections(API_MD.read_text(encoding="utf-8"))
    served = routes()
    extra = sorted(f"{m} {p}" for m, p in doc if (m, p) not in served)
    assert not extra, f"docs/api.md documents routes the app does not serve: {extra}"


def test_every_request_field_is_in_its_section():
    doc = sections(API_MD.read_text(encoding="utf-8"))
    missing = []
    for (method, path), names in sorted(routes().items()):
        section = doc.get((method, path), "")
        twin = None
        if path.startswith(PREFIX + "/"):
            m = re.search(r"As `(GET|PUT|POST|DELETE) (/\S+?)`", section)
            if m and m.group(2) == "/v1" + path[len(PREFIX) :] and m.group(1) == method:
                twin = doc.get((m.group(1), m.group(2)), "")
        for name in sorted(names):
            if documented(section, name):
                continue
            if twin is not None and (name == "collection" or documented(twin, name)):
                continue
            missing.append(f"{method} {path}: {name}")
    assert not missing, f"request fields missing from their docs/api.md section: {missing}"


def test_modes_and_new_fields_are_documented():
    text = API_MD.read_text(encoding="utf-8")
    for word in ("`auto`", "`entailment`", "`nearest`", "`hierarchical`", "`score`"):
        assert word in text
    assert '"group_by": "children"' in text
    assert "`facet`" in text and "`facets" in text


def test_readme_is_a_front_door():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines (at most 250)"
    assert "docs/api.md" in "\n".join(lines)


def _tracked(*paths: str) -> list[Path]:
    try:
        out = subprocess.run(
            ["git", "-C", str(ROOT), "ls-files", "--", *paths],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [ROOT / p for p in out if (ROOT / p).is_file()]


OUTSIDE = re.compile("|".join([re.escape("../" + "shared"), re.escape("/" + "work/")]))
TEMP = re.compile(re.escape("/" + "tmp/"))


def test_nothing_points_outside_the_repository():
    """No link to the shared folder beside the checkout or to a machine-local
    folder; tests may name a temporary folder (Ray's socket paths need a short
    one), nothing else may."""
    bad = []
    for path in _tracked(
        "README.md", "docs", "models", "indexing", "service", "benchmarks", "tests"
    ):
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        rel = path.relative_to(ROOT).as_posix()
        for n, line in enumerate(text.splitlines(), 1):
            if OUTSIDE.search(line) or (not rel.startswith("tests/") and TEMP.search(line)):
                bad.append(f"{rel}:{n}: {line.strip()[:100]}")
    assert not bad, "links out of the repository:\n" + "\n".join(bad)


def test_docs_links_resolve():
    """Every relative link of README.md, docs/*.md and service/README.md names a file."""
    bad = []
    for md in [ROOT / "README.md", ROOT / "service" / "README.md", *sorted(ROOT.glob("docs/*.md"))]:
        if not md.exists():
            continue
        for target in re.findall(r"\]\(([^)\s]+)\)", md.read_text(encoding="utf-8")):
            if re.match(r"[a-z]+:", target):
                continue
            if target.startswith("#"):
                target = md.name + target
            file, _, anchor = target.partition("#")
            dest = md.parent / file
            if not dest.exists():
                bad.append(f"{md.relative_to(ROOT)}: {target}")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                bad.append(f"{md.relative_to(ROOT)}: {target} (no such heading)")
    assert not bad, f"broken links: {bad}"


def anchors(md: Path) -> set[str]:
    """The heading anchors of a markdown file, as GitHub makes them."""
    out = set()
    for line in md.read_text(encoding="utf-8").splitlines():
        m = re.match(r"#{1,6} (.+)", line)
        if m:
            out.add(re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-"))
    return out


def test_anchors():
    assert anchors(API_MD) >= {"post-v1count", "filters", "conventions"}
