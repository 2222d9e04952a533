"""Cross-analysis findings (analysis/findings.py) on hand-built results: values by hand, ties.

Why: `derive` combines two analyses' tables; its numbers are simple enough to compute by hand,
and which rank it names must not depend on the order polars' group_by happens to return.
"""

from __future__ import annotations

from collections.abc import Callable

import duckdb
import polars as pl
from kineto_builder import KinetoTrace, PgConfig
from ranklens.analysis import Result, overlap
from ranklens.analysis.findings import derive

MS = 1_000_000
US = 1_000


def _results(rows: list[tuple[int, int, int, int, int, int]]) -> dict[str, Result]:
    """rows: (rank, stage, step, bubble_ns, window_ns, dp_exposed_ns)."""
    pipe = pl.DataFrame(
        [(r, st, s, b, w) for r, st, s, b, w, _ in rows],
        schema=["rank", "stage", "step", "bubble_ns", "window_ns"],
        orient="row",
    )
    dp = pl.DataFrame(
        [(r, s, dp) for r, _, s, _, _, dp in rows],
        schema=["rank", "step", "exposed_ns"],
        orient="row",
    )
    return {
        "pipeline": Result("pipeline", pipe),
        "overlap": Result("overlap", pl.DataFrame(), tables={"dp_by_step": dp}),
    }


def test_dp_into_bubbles_by_hand() -> None:
    # rank 3: dp 4 and 6 ms (mean 5), bubble 10 ms, window 100 ms -> movable min(5, 10) = 5 ms
    # rank 1: dp 20 ms, bubble 2 ms -> movable 2 ms.
    res = _results(
        [
            (1, 0, 0, 2 * MS, 100 * MS, 20 * MS),
            (1, 0, 1, 2 * MS, 100 * MS, 20 * MS),
            (3, 1, 0, 10 * MS, 100 * MS, 4 * MS),
            (3, 1, 1, 10 * MS, 100 * MS, 6 * MS),
        ]
    )
    (f,) = derive(res)
    assert f.code == "PIPELINE_DP_INTO_BUBBLES"
    assert f.time_at_stake_ns == 5 * MS
    assert f.value == 0.05
    assert "stage 1 (rank 3)" in f.message and "5.00 ms" in f.message
    assert set(f.ranks) == {1, 3} and f.steps == (0, 1)


def test_dp_into_bubbles_takes_dp_and_dp_shard_as_one_union(
    ingest: Callable[..., duckdb.DuckDBPyConnection],
) -> None:
    """HSDP rank 0: its shard reduce-scatter [300, 500) and replicate all-reduce [400, 600) run
    on two streams with no compute beside them. Each is exposed 200 µs (by_parallelism), but
    the rank waits 300 µs on data-parallel communication, not 400: the finding's DP time."""
    groups = [PgConfig("1", [0, 1], "mesh_dp_shard"), PgConfig("2", [0, 2], "mesh_dp_replicate")]
    t = KinetoTrace(rank=0, world_size=4, pg_config=groups)
    t.step(1, 0, 1000)
    t.kernel("gemm", 100, 100, stream=7)
    for g, op, start, stream in (
        (groups[0], "ReduceScatter", 300, 10),
        (groups[1], "AllReduce", 400, 11),
    ):
        t.nccl(
            op, start, 200, stream=stream, pg_name=g.pg_name, pg_desc=g.pg_desc, pg_ranks=g.ranks
        )
    ov = overlap.run(ingest(t))
    par = ov.tables["by_parallelism"].sort("parallelism")
    assert par.select("parallelism", "exposed_ns").rows() == [
        ("DP", 200 * US),
        ("DP_SHARD", 200 * US),
    ]
    assert ov.tables["dp_by_step"].select("rank", "step", "exposed_ns").rows() == [(0, 1, 300 * US)]
    pipe = pl.DataFrame(
        {"rank": [0], "stage": [0], "step": [1], "bubble_ns": [500 * US], "window_ns": [1000 * US]}
    )
    (f,) = derive({"pipeline": Result("pipeline", pipe), "overlap": ov})
    assert f.time_at_stake_ns == 300 * US and "0.30 ms per step in exposed DP" in f.message


def test_dp_into_bubbles_names_the_lowest_rank_on_a_tie() -> None:
    rows = [(r, r % 2, 0, 10 * MS, 100 * MS, 4 * MS) for r in (9, 5, 2, 7)]
    for order in (rows, rows[::-1]):
        (f,) = derive(_results(order))
        assert "(rank 2)" in f.message, f.message


def test_dp_into_bubbles_needs_both_analyses() -> None:
    res = _results([(0, 0, 0, 10 * MS, 100 * MS, 4 * MS)])
    assert derive({"pipeline": res["pipeline"]}) == []
    assert derive({"overlap": res["overlap"]}) == []
    small = _results([(0, 0, 0, 10 * MS, 100 * MS, MS // 2)])  # 0.5% of the window: below 1%
    assert derive(small) == []


def _by_rank(shares: list[float]) -> pl.DataFrame:
    """overlap_by_rank rows (the columns the finding reads): 1 s of window, 40% of it
    communication, `shares` of it exposed, one step each."""
    n = len(shares)
    return pl.DataFrame(
        {
            "rank": list(range(n)),
            "exposed_share": shares,
            "exposed_ns": [int(s * 1e9) for s in shares],
            "comm_ns": [400_000_000] * n,
            "window_ns": [1_000_000_000] * n,
            "steps": [1] * n,
            "overlap_ratio": [1 - s / 0.4 for s in shares],
        }
    )


def test_exposed_comm_names_the_worst_rank_and_how_many_others() -> None:
    """Three of four ranks above the threshold: the message names the worst (rank 2) and says
    it is one of three, so it does not read as a single-rank problem; the ranks field lists
    the three. One rank above it: the message names it alone."""
    from ranklens.analysis.overlap import Params, _findings

    by_par = pl.DataFrame({"rank": [0], "parallelism": ["DP"], "exposed_ns": [1]})
    (many,) = _findings(_by_rank([0.2, 0.05, 0.3, 0.15]), by_par, Params())
    assert many.ranks == (0, 2, 3)
    assert "on rank 2, the worst of 3 of 4 ranks above 10% (overlap ratio" in many.message
    (one,) = _findings(_by_rank([0.05, 0.3]), by_par, Params())
    assert one.ranks == (1,) and "on rank 1 (overlap ratio" in one.message
    assert "worst of" not in one.message
