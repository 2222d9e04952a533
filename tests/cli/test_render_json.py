"""The JSON report written a piece at a time: the same text as one polars write per table, and
a table written in slices parses to every row (polars' own writer cut a 2.4 GB table short)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import duckdb
import polars as pl
import pytest
from ranklens.analysis.report import build_report
from ranklens.cli import render_json as render
from ranklens.ingest.run import ingest_traces

SAMPLE = Path(__file__).resolve().parents[2] / "sample_traces" / "pp4_1f1b_m8" / "raw"


@pytest.mark.parametrize("rows", [1, 2, 7, 999, 1000, 5000])
def test_a_frame_in_slices_is_the_same_text(rows: int) -> None:
    df = pl.DataFrame(
        {
            "a": list(range(1000)),
            "s": [f'x"\\{i} é' if i % 3 else None for i in range(1000)],
            "f": [float("nan") if i % 7 == 0 else i / 3 for i in range(1000)],
        }
    )
    buf = io.StringIO()
    render.write_frame_json(df, buf, rows)
    assert buf.getvalue() == df.write_json()
    back = json.loads(buf.getvalue())
    assert len(back) == 1000 and back[999]["a"] == 999 and back[0]["f"] is None


def test_an_empty_frame_is_an_empty_list() -> None:
    df = pl.DataFrame({"a": []}, schema={"a": pl.Int64})
    buf = io.StringIO()
    render.write_frame_json(df, buf, 1)
    assert buf.getvalue() == "[]"


def test_the_report_in_small_slices_is_the_same_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "run.duckdb"
    ingest_traces([str(SAMPLE)], db)
    con = duckdb.connect(str(db), read_only=True)
    rep = build_report(con)
    con.close()
    whole = render.report_json(rep)
    monkeypatch.setattr(render, "_JSON_ROWS", 5)  # every table of many rows in slices
    sliced = render.report_json(rep)
    assert sliced == whole
    got = json.loads(sliced)
    path = rep.results["critical_path"].tables["critical_path"]
    assert path.height > 5  # the path really was written in slices
    assert len(got["analyses"]["critical_path"]["critical_path"]) == path.height
    assert [f["code"] for f in got["findings"]] == [f.code for f in rep.findings]
