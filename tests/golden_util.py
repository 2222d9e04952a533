"""Golden files: analysis tables sorted and rounded, compared as CSV text.

Goldens come from a reviewed run (`pytest --update-goldens` rewrites them; review the diff).
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path

import duckdb
import polars as pl
from ranklens.analysis import REGISTRY


def normalized(df: pl.DataFrame) -> pl.DataFrame:
    """Stable form: floats rounded to 6 decimals, rows sorted by every column."""
    out = df.with_columns(pl.col(pl.Float64, pl.Float32).round(6))
    return out.sort(out.columns, nulls_last=True)


def golden_tables(con: duckdb.DuckDBPyConnection) -> dict[str, str]:
    """CSV text per analysis main table plus the findings as JSON."""
    files: dict[str, str] = {}
    findings = []
    for mod in REGISTRY:
        res = mod.run(con)
        files[f"{mod.NAME}.csv"] = normalized(res.table).write_csv()
        findings += [
            {"code": f.code, "severity": f.severity.value, "ranks": list(f.ranks)}
            for f in res.findings
        ]
    files["findings.json"] = json.dumps(findings, indent=1) + "\n"
    return files


def check_goldens(con: duckdb.DuckDBPyConnection, folder: Path, update: bool) -> None:
    """Compare (or, with update, rewrite) the golden files in `folder`."""
    actual = golden_tables(con)
    if update:
        folder.mkdir(parents=True, exist_ok=True)
        for name, text in actual.items():
            (folder / name).write_text(text)
        return
    for name, text in actual.items():
        path = folder / name
        assert path.exists(), f"missing golden {path}; run pytest --update-goldens and review"
        want = path.read_text()
        assert want == text, f"{path} differs from this run (review, then update):\n" + diff(
            want, text, str(path)
        )


def diff(want: str, got: str, name: str, most: int = 60) -> str:
    """A unified diff of a golden against this run, cut to `most` lines: the failure shows
    which rows changed instead of only that the file did."""
    lines = list(
        difflib.unified_diff(
            want.splitlines(), got.splitlines(), f"{name} (golden)", "this run", lineterm=""
        )
    )
    more = f"\n... {len(lines) - most} more diff lines" if len(lines) > most else ""
    return "\n".join(lines[:most]) + more
