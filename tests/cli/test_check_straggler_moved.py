"""`ranklens check --baseline` on two runs that differ only in which GPU was slow: no regression.

Why: when the straggler changes, the rank that was slow now waits in the collectives, so its
exposed comm and comm share rise past the limit while the new straggler's fall, and the step
is as long as before. Both directions failed the gate (DP exposed comm +12.7% of step, PP
bubble +12.4%), a false alarm on every fleet where a different GPU throttles from run to run.
Generated runs (sample_traces.gpu_job) are exact: rank 0 or rank 1 (DP peers of one stage)
computes 1.3x slower; everything else is the same. A straggler that got slower is still a
regression.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest
from ranklens.analysis import baseline
from ranklens.ingest import load_traces
from ranklens.sample_traces.gpu_job import GpuJob, write_job
from test_check_faster_run import _changes as _page
from test_check_faster_run import _check

SLOW = {"rank0": {0: 1.3}, "rank1": {1: 1.3}, "rank0_slower": {0: 1.6}}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("moved")
    out = {}
    for name, factor in SLOW.items():
        job = GpuJob(pp=2, dp=2, m=4, steps=5, t_fwd_us=1000.0, dp_us=3000.0, rank_factor=factor)
        write_job(job, root / name)
        out[name] = root / f"{name}.duckdb"
        load_traces([str(root / name)], out[name], workers=1)
    return out


def _job_step_ms(db: Path) -> float:
    """The job's step: the median over steps of the longest rank's window."""
    with duckdb.connect(str(db), read_only=True) as con:
        row = con.execute(
            "SELECT median(w) FROM (SELECT step, max(end_ns - start_ns) / 1e6 AS w "
            "FROM steps GROUP BY step)"
        ).fetchone()
    assert row is not None
    return float(row[0])


def _changes(cur: Path, base: Path) -> list[baseline.Change]:
    with (
        duckdb.connect(str(cur), read_only=True) as c,
        duckdb.connect(str(base), read_only=True) as b,
    ):
        return baseline.compare(c, b, 0.05)


@pytest.mark.parametrize(("cur", "base"), [("rank1", "rank0"), ("rank0", "rank1")])
def test_the_straggler_moving_is_not_a_regression(
    runs: dict[str, Path], cur: str, base: str
) -> None:
    # the independent facts: the job's step is the same, and the waiting moved to the rank
    # that was slow, past the limit on that rank alone
    assert _job_step_ms(runs[cur]) == pytest.approx(_job_step_ms(runs[base]), rel=0.005)
    changes = _changes(runs[cur], runs[base])
    was_slow = int(base[-1])
    moved = [c for c in changes if c.offset]
    assert any(c.rank == was_slow and c.key == "DP" and c.delta > 0.05 for c in moved)
    code, doc = _check(runs[cur], runs[base])
    assert code == 0, doc
    assert doc["regressions"] == []
    reg = next(c for c in doc["checks"] if c["name"] == "max_regression")
    assert reg["status"] == "pass" and "who waits changed" in reg["message"]
    assert reg["worst"]["value"] <= 0.05  # the worst it names: not an offset rise
    cmp, page = _page(runs[cur], runs[base])  # the dashboard's compare page agrees, says why
    assert cmp.exit_code == 0 and "check --baseline would pass (exit 0)" in page
    assert "offset by other ranks' falls (who waits changed)" in page


def test_a_slower_straggler_is_still_a_regression(runs: dict[str, Path]) -> None:
    """Rank 0 1.6x instead of 1.3x: the step grew, and its DP peer waits longer (nothing fell
    to offset it)."""
    assert _job_step_ms(runs["rank0_slower"]) > 1.05 * _job_step_ms(runs["rank0"])
    code, doc = _check(runs["rank0_slower"], runs["rank0"])
    assert code == 3, doc
    assert any(r.startswith("step time +") for r in doc["regressions"])
    assert any(r.startswith("DP exposed comm +") for r in doc["regressions"])
