"""`ranklens whatif` and the report's savings as a user runs them (the installed command)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from ranklens.sample_traces.gpu_job import GpuJob, write_job

RANKLENS = str(Path(sys.executable).with_name("ranklens"))


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([RANKLENS, *args], capture_output=True, text=True, timeout=600)


def test_whatif_json_and_report_savings(tmp_path: Path) -> None:
    """A 16-rank job whose rank 13 computes 1.3x slower: `whatif --fix straggler:13` predicts
    the step of the same job without the slow rank within 5%, and the report's STRAGGLER_RANK
    finding carries that saving, named as a replay, first in the ranking."""
    job = dict(tp=2, dp=2, pp=4, m=8, steps=2)
    write_job(GpuJob(**job, rank_factor={13: 1.3}), tmp_path / "bad")  # type: ignore[arg-type]
    good = write_job(GpuJob(**job), tmp_path / "good")  # type: ignore[arg-type]
    truth = max(w[2] - w[1] for w in good.windows) * 1000  # µs -> ns, every step equal
    db = tmp_path / "bad.duckdb"
    assert _run("ingest", str(tmp_path / "bad"), "-o", str(db)).returncode == 0
    r = _run("whatif", str(db), "--fix", "straggler:13", "--scale-comm", "pp=2", "-f", "json")
    assert r.returncode == 0, r.stderr
    ans = json.loads(r.stdout)
    assert abs(ans["replayed_step_ns"] / ans["measured_step_ns"] - 1) <= 0.02
    by = {s["name"]: s for s in ans["scenarios"]}
    assert set(by) == {"straggler:13", "scale-comm:pp=2"}
    assert abs(by["straggler:13"]["predicted_step_ns"] / truth - 1) <= 0.05
    assert by["straggler:13"]["saving_ns"] == (
        ans["replayed_step_ns"] - by["straggler:13"]["predicted_step_ns"]
    )
    rep = json.loads(_run("report", str(db), "--format", "json").stdout)
    strag = [f for f in rep["findings"] if f["code"] == "STRAGGLER_RANK"]
    assert len(strag) == 1 and strag[0]["saving_method"] == "replay of straggler:13"
    assert strag[0]["saving_ns"] == by["straggler:13"]["saving_ns"]
    gains = [
        f["saving_ns"] if f["saving_ns"] is not None else f["time_at_stake_ns"]
        for f in rep["findings"]
    ]
    assert gains == sorted(gains, reverse=True)  # ranked by what the fix saves
    assert strag[0]["saving_ns"] == gains[0]
    text = _run("whatif", str(db))
    assert text.returncode == 0 and "straggler" in text.stdout and "stage-balance" in text.stdout


def test_whatif_bad_scenario_is_an_error(tmp_path: Path) -> None:
    write_job(GpuJob(tp=1, dp=1, pp=2, m=2, steps=1), tmp_path / "run")
    r = _run("whatif", str(tmp_path / "run"), "--fix", "faster-please")
    assert r.returncode == 1
    assert "error: unknown scenario 'faster-please'" in r.stderr and "hint:" in r.stderr
    assert "Traceback" not in r.stderr
