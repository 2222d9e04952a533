"""The per-stage bubble fraction has one definition (pipeline_stage_bubble): the report's stage
table and `check --max-bubble` must give the same numbers, and steps without micro-batch blocks
must not count their bubble against no work."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest
from ranklens.analysis import check, pipeline
from ranklens.analysis._sql import sql_text
from ranklens.ingest import load_traces

SAMPLE = Path(__file__).resolve().parents[2] / "sample_traces" / "pp4_1f1b_m8" / "raw"


@pytest.fixture(scope="module")
def con(tmp_path_factory: pytest.TempPathFactory) -> duckdb.DuckDBPyConnection:
    db = tmp_path_factory.mktemp("pp4") / "run.duckdb"
    load_traces([SAMPLE], db)
    return duckdb.connect(str(db), read_only=True)


def test_report_and_check_agree(con: duckdb.DuckDBPyConnection) -> None:
    stages = pipeline.run(con).tables["stages"]
    rows = check.metric_rows(con, "max_bubble")
    assert rows is not None and rows.height == stages.height == 4
    got = {r["subject"]: r["value"] for r in rows.iter_rows(named=True)}
    for r in stages.iter_rows(named=True):
        assert 0 < r["bubble_fraction"] < 1
        assert got[f"stage {r['stage']} (rank {r['rank']})"] == pytest.approx(r["bubble_fraction"])


def test_steps_without_blocks_leave_the_fraction_alone() -> None:
    """Stage 0: a step with blocks (bubble 1, work 3) and one without (bubble 5, no work):
    1 / 4, not 6 / 9. Stage 1: no step with blocks: NULL. Stage 2: nothing at all: NULL."""
    con = duckdb.connect()
    con.execute(
        "CREATE TABLE pipeline_by_step AS SELECT * FROM (VALUES "
        "(0, 'pp', 0, 0, 1, 3), (0, 'pp', 0, 1, 5, NULL), (1, 'pp', 1, 0, 7, NULL), "
        "(2, 'pp', 2, 0, 0, 0)) t(rank, pp_group, stage, step, bubble_ns, work_ns)"
    )
    text = sql_text("pipeline_steps")
    start = text.index("CREATE OR REPLACE TEMP VIEW pipeline_stage_bubble")
    view = text[start : text.index(";", start)]
    con.execute(view)
    got = dict(con.execute("SELECT rank, bubble_fraction FROM pipeline_stage_bubble").fetchall())
    assert got[0] == 0.25 and got.get(1) is None and got[2] is None
