"""The Kineto pool decodes the next small files while it drains the current one, and files are
still claimed, refused and reported in their order (kineto_schedule._run_pool).

Why: with one file in flight the two workers took turns on a run of many small rank files (a
1,024-rank job's main process waited 7 s of 17 for them), and with two they idled while the main
process wrote a batch of small ranks. Starting files early must not change which error a run
stops at, nor let a bad file's rank claim refuse the next good file.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from ranklens.ingest import kineto, kineto_schedule, load_traces, workpool
from ranklens.ingest.errors import TraceFormatError
from test_bad_input import good, with_event
from test_kineto import dump_tables

SAMPLE = Path(__file__).resolve().parents[2] / "sample_traces" / "megatron_tp2_pp2_dp2" / "raw"


def _spied(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """(what, file name) in the order the pool started and drained files."""
    seen: list[tuple[str, str]] = []
    start, drain = kineto_schedule._parallel_file, kineto_schedule._drain

    def started(sink: Any, pool: Any, tid: int, prep: kineto.Prepared, *a: Any) -> Any:
        seen.append(("start", Path(prep.path).name))
        return start(sink, pool, tid, prep, *a)

    def drained(decoding: Any) -> Callable[[], None]:
        seen.append(("drain", ""))
        return drain(decoding)

    monkeypatch.setattr(kineto_schedule, "_parallel_file", started)
    monkeypatch.setattr(kineto_schedule, "_drain", drained)
    monkeypatch.setattr(workpool, "SERIAL_BELOW_BYTES", 0)  # the sample is small: use the pool
    return seen


@pytest.mark.parametrize(
    ("files", "pieces", "order"),
    [
        # all eight small files in flight before the first is drained
        (64, 8, ["start"] * 8 + ["drain"] * 8),
        # at most three in flight
        (3, 8, ["start"] * 3 + ["drain", "start"] * 5 + ["drain"] * 3),
        # no bytes ahead: each file started before the one before it is drained, no more
        (64, 0, ["start"] + ["start", "drain"] * 7 + ["drain"]),
    ],
    ids=["all", "three-files", "no-bytes"],
)
def test_the_next_small_files_are_in_flight_before_one_is_drained(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, files: int, pieces: int, order: list[str]
) -> None:
    seen = _spied(monkeypatch)
    monkeypatch.setattr(kineto_schedule, "AHEAD_FILES", files)
    monkeypatch.setattr(kineto_schedule, "AHEAD_PIECES", pieces)
    serial = load_traces([str(SAMPLE)], tmp_path / "serial.duckdb", workers=1)
    assert seen == []  # workers=1: no pool
    rep = load_traces([str(SAMPLE)], tmp_path / "pool.duckdb", workers=2)
    assert rep.ranks == serial.ranks == list(range(8))
    # the same run as one file at a time in this process: every table, row for row
    assert dump_tables(tmp_path / "pool.duckdb") == dump_tables(tmp_path / "serial.duckdb")
    assert [k for k, _ in seen] == order
    names = [n for k, n in seen if k == "start"]
    assert names == sorted(names, key=lambda n: int(n.split("rank")[1].split(".")[0]))


def _bad_then_good(tmp_path: Path) -> list[Path]:
    """rank0.json says it is rank 1 and holds a kernel of negative duration; rank1.json.gz is a
    good rank 1: the bad file must be refused first, and its claim must not refuse rank 1."""
    bad = tmp_path / "rank0.json"
    bad.write_bytes(with_event(cat="kernel", name="neg_k", pid=0, tid=7, ts=5, dur=-1))
    return [bad] + [good(r).write(tmp_path / f"rank{r}.json.gz") for r in (1, 2, 3)]


def test_the_first_bad_file_is_the_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _spied(monkeypatch)
    with pytest.raises(TraceFormatError, match=r"rank0\.json"):
        load_traces(_bad_then_good(tmp_path), tmp_path / "o.duckdb", workers=2)


def test_a_refused_file_does_not_refuse_the_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = _spied(monkeypatch)
    rep = load_traces(_bad_then_good(tmp_path), tmp_path / "o.duckdb", workers=2, on_error="skip")
    assert [Path(s.path).name for s in rep.skipped] == ["rank0.json"]
    assert rep.ranks == [1, 2, 3]  # rank 1 from rank1.json.gz, decoded while rank0 was drained
    assert [k for k, _ in seen] == ["start"] * 4 + ["drain"] * 4
