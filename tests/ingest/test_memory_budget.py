"""DuckDB's memory budget during an ingest: a third of the input while the decoding workers
run, two thirds from the cross-rank stage on and for the stored results
(loader._memory_limit_mb, _budget_mb).

Why it matters: with a third, the analyses of a 1,024-rank job spilled their intermediates to
disk (114 MB) and the stored results took 1.6 s longer; with more while the workers decode,
the ingest's peak would pass the input's size.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest
from ranklens.ingest import loader
from ranklens.ingest import sink as sink_mod

SAMPLE = Path(__file__).resolve().parents[2] / "sample_traces" / "megatron_tp2_pp2_dp2" / "raw"
GIB = 2**30


def _as_duckdb_shows(mb: int) -> str:
    """`memory_limit` as DuckDB reports it after SET memory_limit = '<mb>MB'."""
    con = duckdb.connect()
    con.execute(f"SET memory_limit = '{mb}MB'")
    return str(con.execute("SELECT current_setting('memory_limit')").fetchone()[0])


@pytest.mark.parametrize("size", [GIB, 1024])
def test_the_stored_results_get_two_thirds_of_the_input(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, size: int
) -> None:
    """A third while the ranks are read and written, two thirds from the cross-rank stage on
    (every rank written, the decoding workers gone) and for the stored results."""
    files = loader.find_traces([SAMPLE])
    monkeypatch.setattr(loader, "file_size", lambda _f: size)  # every rank file this large
    pages = {"SC_PHYS_PAGES": 64 * GIB // 4096, "SC_PAGE_SIZE": 4096}  # on a 64 GiB machine
    monkeypatch.setattr(loader.os, "sysconf", lambda name: pages[name])
    seen: dict[str, set[str]] = {"traces": set(), "cross-rank": set(), "results": set()}
    finish, write = loader.finish_database, sink_mod.write_ranks

    def limit(con: duckdb.DuckDBPyConnection) -> str:
        return str(con.execute("SELECT current_setting('memory_limit')").fetchone()[0])

    def spy_write(con: duckdb.DuckDBPyConnection, *args: object) -> None:
        seen["traces"].add(limit(con))
        write(con, *args)  # type: ignore[arg-type]

    def spy(con: duckdb.DuckDBPyConnection, *args: object) -> None:
        seen["cross-rank"].add(limit(con))
        finish(con, *args)  # type: ignore[arg-type]

    def finalize(con: duckdb.DuckDBPyConnection) -> None:
        seen["results"].add(limit(con))

    monkeypatch.setattr(sink_mod, "write_ranks", spy_write)
    monkeypatch.setattr(loader, "finish_database", spy)
    loader.load_traces([SAMPLE], tmp_path / "run.duckdb", workers=1, finalize=finalize)
    total_mb = len(files) * size // 2**20
    if size == 1024:  # a small run: the floor, every time
        floor = {_as_duckdb_shows(256)}
        assert seen == {"traces": floor, "cross-rank": floor, "results": floor}
    else:
        two = {_as_duckdb_shows(2 * total_mb // 3)}
        assert seen == {
            "traces": {_as_duckdb_shows(total_mb // 3)},
            "cross-rank": two,
            "results": two,
        }


def test_the_budget_is_at_most_half_the_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """A run larger than the machine gets half its memory, not two thirds of the input: past
    that DuckDB would not spill before the system ran out."""
    pages = {"SC_PHYS_PAGES": 4 * GIB // 4096, "SC_PAGE_SIZE": 4096}  # a 4 GiB machine
    monkeypatch.setattr(loader.os, "sysconf", lambda name: pages[name])
    assert loader._budget_mb(30 * GIB) == 2048
    assert loader._budget_mb(3 * GIB) == 2048
    assert loader._budget_mb(GIB) == 1024
    assert loader._budget_mb(1000) == 256


def test_the_stored_results_get_room_for_every_event(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An input dense in events (an Nsight export packs ~100 B a kernel) gets at least
    CROSS_RANK_BYTES_PER_EVENT per event for its cross-rank stage and RESULTS_BYTES_PER_EVENT
    for its stored results (the analyses beside the graph's queries), whatever its bytes: here
    tiny files, 512 kB and 1 MB an event, so the budgets are the events' count in MB, halved
    for the cross-rank stage."""
    monkeypatch.setattr(loader, "file_size", lambda _f: 1024)
    monkeypatch.setattr(loader, "CROSS_RANK_BYTES_PER_EVENT", 2**19)
    monkeypatch.setattr(loader, "RESULTS_BYTES_PER_EVENT", 2**20)
    pages = {"SC_PHYS_PAGES": 64 * GIB // 4096, "SC_PAGE_SIZE": 4096}
    monkeypatch.setattr(loader.os, "sysconf", lambda name: pages[name])
    seen: dict[str, str] = {}
    finish = loader.finish_database

    def limit(con: duckdb.DuckDBPyConnection) -> str:
        return str(con.execute("SELECT current_setting('memory_limit')").fetchone()[0])

    def spy(con: duckdb.DuckDBPyConnection, *args: object) -> None:
        seen["cross-rank"] = limit(con)
        finish(con, *args)  # type: ignore[arg-type]

    def finalize(con: duckdb.DuckDBPyConnection) -> None:
        seen["results"] = limit(con)
        seen["events"] = str(con.execute("SELECT count(*) FROM events").fetchone()[0])

    monkeypatch.setattr(loader, "finish_database", spy)
    report = loader.load_traces([SAMPLE], tmp_path / "run.duckdb", workers=1, finalize=finalize)
    assert report.n_events == int(seen["events"]) > 512  # past the floor, so it is the events'
    assert seen["results"] == _as_duckdb_shows(report.n_events)
    assert seen["cross-rank"] == _as_duckdb_shows(report.n_events // 2)
