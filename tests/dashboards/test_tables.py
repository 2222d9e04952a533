"""Tables as people read them: impact first, ms since the run start, no empty columns, groups
by their ranks, evidence without JSON, the late rank of a collective named."""

from __future__ import annotations

import polars as pl
from ranklens.dashboards import tables

MS = 1_000_000
T0 = 1_700_000_000_000_000_000  # an epoch-ns run start, as the job clock has


def test_readable_orders_by_impact_and_converts_units() -> None:
    df = pl.DataFrame(
        {
            "pg_name": ["11", "12"],
            "parallelism": ["PP", "PP"],
            "start_ns": [T0 + 2 * MS, T0 + 1_500_000],
            "time_lost_ns": [1 * MS, 3 * MS],
            "empty": [None, None],
            "note": ["", ""],
            "overlap_ratio": [0.25, 0.5],
        }
    )
    out = tables.readable(df, t0_ns=T0, groups={"11": "PP [0, 4]", "12": "PP [1, 5]"})
    assert out.columns == ["group", "start_ms", "time_lost_ms", "overlap_ratio"]
    assert out["group"].to_list() == ["PP [1, 5]", "PP [0, 4]"]  # 3 ms lost first
    assert out["start_ms"].to_list() == [1.5, 2.0]  # since the run start, not epoch
    assert out["time_lost_ms"].to_list() == [3.0, 1.0]


def test_cell_three_significant_digits() -> None:
    assert tables.cell("window_ms", 12.3456) == "12.3"
    assert tables.cell("window_ms", 0.0123456) == "0.0123"
    assert tables.cell("window_ms", 1234.5) == "1,234"  # whole numbers, not 1.23e+03
    assert tables.cell("overlap_ratio", 0.4512) == "45.1%"
    assert tables.cell("compute_imbalance", 0.17) == "+17%"
    assert tables.cell("start_ms", 12.3456789) == "12.346"  # instants to the µs


def test_evidence_is_readable_not_json() -> None:
    ev = {
        "pp_group": "11",
        "p2p_ns_per_step": 4_979_000,
        "closed_form": 0.2,
        "exposed_ns_by_parallelism": {"PP": 1_144_000_000, "DP": 494_000_000},
        "pipelines": [{"group": "11", "heavy_stage": 1, "work_ms_per_step_by_stage": {0: 1.5}}],
    }
    items = dict(tables.evidence_items(ev, {"11": "PP [0, 4]"}))
    assert items["pp group"] == "PP [0, 4]"
    assert items["p2p per step"] == "4.98 ms" and items["closed form"] == "20%"
    assert items["exposed by parallelism"] == "PP: 1,144 ms, DP: 494 ms"
    frame = items["pipelines"]
    assert isinstance(frame, pl.DataFrame) and frame["group"].to_list() == ["PP [0, 4]"]
    assert frame["work_ms_per_step_by_stage"].to_list() == ["0: 1.5"]


def test_instance_summary_names_the_late_rank() -> None:
    inst = pl.DataFrame({"rank": [0, 1, 2], "arrive_ns": [T0, T0 + 3_200_000, T0 + 100_000]})
    text = tables.instance_summary(inst)
    assert text.startswith("rank 1 arrived last, 3.2 ms after rank 0")
    assert tables.instance_summary(inst.head(1)) == "one rank only: nobody waited"


def test_pipeline_summary_names_the_heavy_stage_and_negative_terms() -> None:
    from ranklens.dashboards import figures_pipeline as fp

    row = {
        "heavy_stage": 2,
        "heavy_rank": 6,
        "busy_max_over_mean": 1.31,
        "imbalance_ns": 22_340_000,
        "microbatch_variance_ns": -1_550_000,
        "p2p_ns": 4_290_000,
        "order_ns": 0,
        "unexplained_ns": -2_000,  # rounding, not a cause
    }
    assert (
        fp.heavy_stage_line(row)
        == "heavy stage: stage 2 (rank 6), 1.31x the mean busy time of the stages"
    )
    terms, notes = fp.decomposition_lines(row)
    assert terms.startswith("stage imbalance 22.34 ms, micro-batch variance -1.55 ms")
    assert len(notes) == 1 and notes[0].startswith("micro-batch variance is negative (-1.55 ms)")
    assert fp.heavy_stage_line({"heavy_stage": None}) is None
