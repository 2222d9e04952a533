"""Issue 14 item 4: an empty or all-skipped run cannot pass the CI gate by accident. An ingest
that keeps no event of a file says so, and `check` fails (exit 3) when a requested check has
no data, unless --allow-skipped."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reliability.conftest import good_trace
from reliability.harness import ok, run, snapshot, unchanged


def _empty_run(root: Path, how: str) -> Path:
    runs = root / "run"
    runs.mkdir()
    for r in (0, 1):
        doc = json.loads(good_trace(r).dumps())
        if how == "no-events":
            doc["traceEvents"] = []
        else:  # every event without `ph`
            for e in doc["traceEvents"]:
                e.pop("ph", None)
        (runs / f"rank{r}.json").write_text(json.dumps(doc))
    return runs


@pytest.mark.parametrize("how", ["no-events", "no-ph"])
def test_empty_run_warns(tmp_path: Path, how: str, decoder_env: dict[str, str]) -> None:
    """Both decoders keep the files and warn, at ingest and in every later report."""
    runs = _empty_run(tmp_path, how)
    before = snapshot(runs)
    db = tmp_path / "o.duckdb"
    ing = run(["ingest", runs, "-o", db], tmp_path, env=decoder_env)
    ok(ing)
    for r in (0, 1):
        line = next(ln for ln in ing.err.splitlines() if f"rank{r}.json" in ln)
        assert line.startswith("warning:") and "no timed event was kept" in line, ing.err
    unchanged(before, snapshot(runs))
    rep = run(["report", db], tmp_path)
    ok(rep)
    assert "no timed event was kept" in rep.out


@pytest.mark.parametrize("how", ["no-events", "no-ph"])
def test_empty_run_fails_the_gate(tmp_path: Path, how: str) -> None:
    """Its database and its traces alike: the checks cannot be evaluated (decoded the same by
    both decoders: test_empty_run_warns)."""
    runs = _empty_run(tmp_path, how)
    db = tmp_path / "o.duckdb"
    ok(run(["ingest", runs, "-o", db], tmp_path))
    for source in (db, runs):
        res = run(["check", source, "--max-idle", "0.5", "--min-overlap", "0.1"], tmp_path)
        assert res.rc == 3 and "Traceback" not in res.text, res.text
        assert "could not be evaluated" in res.out and "--allow-skipped" in res.out
        js = json.loads(run(["check", source, "--max-idle", "0.5", "-f", "json"], tmp_path).out)
        assert js["status"] == "fail"
        allowed = run(["check", source, "--max-idle", "0.5", "--allow-skipped"], tmp_path)
        assert allowed.rc == 0 and "SKIPPED" in allowed.out, allowed.text


def test_partly_evaluable_check_fails_only_without_allow(tmp_path: Path) -> None:
    """A metric that exists passes; one the run has no data for (no pipeline) fails the gate."""
    runs = tmp_path / "run"
    runs.mkdir()
    for r in (0, 1):
        good_trace(r).write(runs / f"rank{r}.json")
    args = ["check", runs, "--max-idle", "0.99", "--max-bubble", "0.5"]
    strict = run(args, tmp_path)
    assert strict.rc == 3 and "max_bubble" in strict.out and "Traceback" not in strict.text
    ok(run([*args, "--allow-skipped"], tmp_path))
