"""The Python floor (requires-python >= 3.10) holds for what can be checked on a newer Python:
the syntax, and no import of a module 3.10 lacks outside the one place that has a fallback."""

from __future__ import annotations

import ast
from pathlib import Path

from ranklens.ingest.tomlfile import load_toml

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("ingest", "analysis", "cli", "dashboards", "sample_traces", "capture", "ranklens")
NEW_IN_311 = {"tomllib"}  # stdlib modules 3.10 does not have (with a 3.10 fallback somewhere)


def _sources() -> list[Path]:
    return [p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))]


def _imports(tree: ast.AST) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


def test_floor_declared_and_tomli_for_it() -> None:
    project = load_toml(ROOT / "pyproject.toml")["project"]
    assert project["requires-python"] == ">=3.10"
    assert any(
        d.replace(" ", "").startswith("tomli") and "<'3.11'" in d.replace(" ", "")
        for d in project["dependencies"]
    )


def test_sources_parse_as_python_310() -> None:
    bad = []
    for path in _sources():
        try:
            ast.parse(path.read_text(), str(path), feature_version=(3, 10))
        except SyntaxError as exc:
            bad.append(f"{path.relative_to(ROOT)}:{exc.lineno}: {exc.msg}")
    assert not bad, bad


def test_modules_new_in_311_only_behind_the_fallback() -> None:
    found = {
        str(p.relative_to(ROOT)): _imports(ast.parse(p.read_text())) & NEW_IN_311
        for p in _sources()
    }
    users = {path for path, names in found.items() if names}
    assert users == {"ingest/tomlfile.py"}, users
