"""The decoding workers leave before the last rank is written: that write is a one-file
ingest's memory peak, and idle workers still hold ~60-80 MB each of what they decoded (the
402 MB trace's peak: ~1.5x -> ~1.25x the file)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from ranklens.ingest import kineto_schedule, lifecycle, loader
from ranklens.ingest.loader import load_traces

SAMPLE = Path(__file__).resolve().parents[2] / "sample_traces" / "megatron_tp2_pp2_dp2" / "raw"


def test_workers_are_gone_before_the_last_rank_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pools: list[Any] = []
    real_pool = lifecycle.worker_pool

    def pool(*a: Any) -> Any:
        pools.append(real_pool(*a))
        return pools[-1]

    alive: list[int] = []  # live workers at each rank's write
    real_finish = kineto_schedule._finish_file

    def finish(*a: Any, **k: Any) -> None:
        procs = pools[-1]._processes or {}
        alive.append(sum(p.is_alive() for p in procs.values()))
        real_finish(*a, **k)

    monkeypatch.setattr(loader, "_SERIAL_BELOW_BYTES", 0)  # the sample is small: use the pool
    monkeypatch.setattr(lifecycle, "worker_pool", pool)
    monkeypatch.setattr(kineto_schedule, "_finish_file", finish)
    rep = load_traces([str(SAMPLE)], tmp_path / "r.duckdb", workers=2)
    assert rep.ranks == list(range(8)) and len(alive) == 8
    assert alive[-1] == 0  # the last rank: written with no worker left
    assert max(alive[:-1]) > 0  # the others: written while the workers decoded the next file
