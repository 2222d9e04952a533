"""stragglers: a hand-built late rank with every number worked out, and the real CPU job with
one deliberately slowed rank, whose injected delay must be recovered within 10%."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import duckdb
from multirank import gpu_job
from ranklens.analysis import stragglers

Ingest = Callable[..., duckdb.DuckDBPyConnection]
SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"
US = 1000


def test_late_rank_waits_and_transfer(ingest: Ingest) -> None:
    """3 ranks, 4 all-reduces; rank 2 arrives 500 µs after ranks 0 and 1 each time, and every
    rank ends at the same time, 200 µs after rank 2 arrived. Rank 2 runs on a second host whose
    clock is 7 ms ahead: alignment removes that before arrivals are compared.

    Per instance: skew 500, late rank 2; waits 500/500/0; transfer 200 on each rank.
    Held back by rank 2 = mean wait of the others = 500 per instance, 2000 over the step,
    minus its own waits (0) = 2000 net. Ranks 0/1: held back 0, waited 2000: net -2000.
    Exposed split (no compute): rank 0 exposed = 4 x 700, of which wait 4 x 500."""
    job = gpu_job(3, hosts=["a", "a", "b"], shift_us={2: 7000.0})
    for k in range(4):
        t0 = 1000 + 2000 * k
        job.collective("all_reduce", {0: t0, 1: t0, 2: t0 + 500}, t0 + 700)
    con = ingest(job.traces)
    res = stragglers.run(con)
    inst = res.tables["by_instance"]
    assert inst["skew_ns"].to_list() == [500 * US] * 4
    assert inst["late_rank"].to_list() == [2] * 4
    rows = {r["rank"]: r for r in res.table.to_dicts()}
    assert rows[2]["late_count"] == 4 and rows[2]["held_back_ns"] == 2000 * US
    assert rows[2]["net_held_back_per_step_ns"] == 2000 * US
    assert rows[0]["waited_ns"] == 2000 * US
    assert rows[0]["net_held_back_per_step_ns"] == -2000 * US
    assert rows[0]["exposed_wait_ns"] == 2000 * US
    assert rows[0]["exposed_transfer_ns"] == 800 * US
    assert rows[2]["exposed_wait_ns"] == 0 and rows[2]["exposed_transfer_ns"] == 800 * US
    # rank 2's W is the hull of its device work, [1500, 7700) µs: 2 ms is 32% of it
    (f,) = [f for f in res.findings if f.code == "STRAGGLER_RANK"]
    assert f.ranks == (2,) and f.time_at_stake_ns == 2000 * US
    assert abs(rows[2]["net_held_back_share"] - 2000 / 6200) < 1e-9
    res = stragglers.run(con, stragglers.Params(held_back_share=0.5))
    assert "STRAGGLER_RANK" not in [f.code for f in res.findings]


def test_skew_inside_clock_uncertainty_names_nobody(ingest: Ingest) -> None:
    """Two hosts; rank 2's collective ends wander by up to 1.5 ms from its host-mate's (a
    poor alignment): a 300 µs arrival skew across hosts is not attributed to a late rank."""
    job = gpu_job(4, hosts=["a", "a", "b", "b"])
    for k in range(6):
        t0 = 1000 + 5000 * k
        ends = {0: t0 + 900, 1: t0 + 900, 2: t0 + 900 + (1500 if k % 2 else -500), 3: t0 + 900}
        for r in range(4):
            job.collective("all_reduce", {r: t0 + (300 if r == 3 else 0)}, ends[r])
    con = ingest(job.traces)
    res = stragglers.run(con)
    assert res.tables["by_instance"]["late_rank"].null_count() == 6
    assert any(f.code == "ALIGN_RESIDUAL_POOR" for f in res.findings)


def test_slow_rank_named_with_injected_delay(ingest: Ingest) -> None:
    """straggler_rank3: DP over 4 CPU ranks, rank 3 burns 20 ms of extra matmul per micro-batch
    forward (2 per step). The others wait for it at the DP all-reduce; the time it holds them
    back per step must match the delay really spent in the injected loop within 10%."""
    truth = json.loads((SAMPLES / "straggler_rank3" / "truth.json").read_text())
    con = ingest([SAMPLES / "straggler_rank3" / "raw"])
    res = stragglers.run(con)
    flagged = [f for f in res.findings if f.code == "STRAGGLER_RANK"]
    assert [f.ranks for f in flagged] == [(3,)]
    steps = [s for s in truth["ranks"][3]["steps"] if s["profiled"]]
    injected = sum(sum(s["slow_ns"]) for s in steps) / len(steps)
    row = res.table.filter(res.table["rank"] == 3).row(0, named=True)
    got = row["net_held_back_per_step_ns"]
    assert abs(got - injected) <= 0.10 * injected, (got, injected)
    assert row["late_count"] == row["instances"] == len(steps)
