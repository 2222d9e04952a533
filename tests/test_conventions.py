"""The design kept visible: layering, registry documentation, README in sync, file sizes."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from ranklens.analysis import REGISTRY
from ranklens.analysis._sql import sql_text
from ranklens.ingest.schema import markdown

ROOT = Path(__file__).resolve().parents[1]
FACES = {"dash", "plotly", "typer", "rich", "click"}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_layering() -> None:
    """ingest <- analysis <- {cli, dashboards}; the core never imports a face library."""
    for pkg, banned in (
        ("ingest", {"ranklens.analysis", "ranklens.cli", "ranklens.dashboards"}),
        ("analysis", {"ranklens.cli", "ranklens.dashboards"}),
    ):
        for py in (ROOT / pkg).rglob("*.py"):
            for mod in _imports(py):
                top = mod.split(".")[0]
                assert top not in FACES, f"{py} imports {mod}"
                assert not any(mod == b or mod.startswith(b + ".") for b in banned), (py, mod)
                assert not re.search(r"ranklens\.\w+\._", mod) or mod.startswith(
                    f"ranklens.{pkg}."
                ), f"{py} imports another package's private module {mod}"


def test_registry_is_documented() -> None:
    for mod in REGISTRY:
        assert mod.__doc__ and len(mod.__doc__) > 200, mod.NAME
        sql = sql_text(mod.NAME)
        res_cols = set(mod.COLUMNS)
        assert res_cols, mod.NAME
        for obj in re.findall(r"CREATE OR REPLACE TEMP (?:VIEW|MACRO) (\w+)", sql):
            assert obj.startswith((f"{mod.NAME}_", f"_{mod.NAME}_")), (mod.NAME, obj)
        assert not re.search(r"\b(DROP|INSERT|UPDATE|DELETE|COPY|ATTACH)\b", sql, re.I), mod.NAME
        assert "CREATE TABLE" not in sql.upper()


def test_columns_doc_matches_table() -> None:
    import duckdb
    from ranklens.ingest.schema import ddl

    con = duckdb.connect()
    con.execute(ddl())
    for mod in REGISTRY:
        res = mod.run(con)
        assert list(res.table.columns) == list(mod.COLUMNS), mod.NAME


def test_generic_sql_mentions_no_trace_format() -> None:
    text = sql_text("intervals").lower()
    for word in ("nccl", "kineto", "gloo", "kernel", "nsys"):
        assert word not in text


def test_readme_schema_is_generated() -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("<!-- schema:start -->\n", 1)[1].split("<!-- schema:end -->", 1)[0]
    assert section == markdown(), "README schema is stale: run python docs/gen_schema.py"


def test_files_stay_small() -> None:
    for pkg in ("ingest", "analysis", "cli", "dashboards", "ranklens"):
        for py in (ROOT / pkg).rglob("*.py"):
            n = len(py.read_text().splitlines())
            assert n <= 450, f"{py} has {n} lines"


def test_ci_runs_readme_commands() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert "RANKLENS_REQUIRE_SHARED=1" in ci
    assert "README.md" in ci and '"$rc" -eq 5' in ci
