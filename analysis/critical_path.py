"""critical_path: the chain of work across ranks that sets each step's time, and what-if replay.

The dependency graph (graph_build: stream/thread order, waits between lanes read from timing,
every matched collective joining its members, send -> recv) is replayed: unchanged, it must
reproduce each measured step (`replay_error`); its binding edges, followed back from the step's
last end, are the critical path, split by category (graph_replay.CATEGORIES) and by rank, stage
and stream. `Params.scenarios` are replayed too (whatif.py) and become the `whatif` table.
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb
import numpy as np
import numpy.typing as npt
import polars as pl
import pyarrow as pa
from ranklens.analysis import graph_build as gb
from ranklens.analysis import graph_replay as gr
from ranklens.analysis import whatif as wi
from ranklens.analysis._base import Result
from ranklens.analysis._sql import apply_sql, query_pl
from ranklens.ingest.database import registered

NAME = "critical_path"
VIEW_FILES: tuple[str, ...] = ()  # its SQL builds a temp table per run (graph_build), no views
USES_ACTIVITY = False

COLUMNS: dict[str, str] = {
    "step": "Training step.",
    "measured_step_ns": "First rank's window start to the last end, on the job clock.",
    "replayed_step_ns": "The same from the replay of the unchanged graph.",
    "replay_error": "replayed / measured - 1 (0 when the graph explains every start).",
    "path_ranks": "Ranks the critical path passes through (comma-separated).",
    "top_rank": "The rank holding most of the path.",
    **{f"{c}_ns": f"Path time: {d}." for c, d in gr.CATEGORY_DOC.items()},
}

PATH_COLUMNS: dict[str, str] = {
    "step": "Training step.",
    "seq": "Order along the path.",
    "rank": "Rank of the segment (-1: none, the join of a collective).",
    "stage": "Its pipeline stage (NULL without PP).",
    "device": "GPU (-1: host thread).",
    "stream": "Stream or thread of the node.",
    "category": "compute, comm_transfer, comm_wait, memory, host_launch or idle.",
    "start_ns": "Start on the job clock.",
    "end_ns": "End on the job clock.",
    "dur_ns": "end - start.",
    "name": "Name of the node's first event.",
}


DEFAULT_BUILD = gb.BuildParams()


@dataclass(frozen=True)
class Params:
    """scenarios: what-if scenarios to replay (whatif.parse syntax); build: the graph's
    tolerances."""

    scenarios: tuple[str, ...] = ()
    build: gb.BuildParams = DEFAULT_BUILD


@dataclass
class Model:
    """A built graph, its unchanged replay and critical path, and what scenarios need."""

    graph: gb.Graph
    base: gr.Replay
    path: gr.Path
    ctx: wi.Context
    names: pl.DataFrame  # node, name: the first event name of each node on the path


def model(
    con: duckdb.DuckDBPyConnection,
    p: gb.BuildParams = DEFAULT_BUILD,
    patterns: tuple[str, ...] = (),
    contention: bool = True,
) -> Model:
    """Build the graph, replay it unchanged (tracking the path) and read the scenarios' inputs."""
    ctx = wi.Context(wi.stages(con), wi.groups(con), unlinked=wi.unlinked(con))
    if contention:
        apply_sql(con, "intervals", "contention")
    held: list[Model] = []

    def during(c: duckdb.DuckDBPyConnection, g: gb.Graph) -> None:
        if contention:
            ctx.contention_ns = wi.node_contention_ns(c, g)
        for pat in patterns:
            ctx.pattern_ns[pat] = wi.node_pattern_ns(c, g, pat)
        base = gr.replay(g, track=True)
        path = gr.critical_path(g, base)
        held.append(Model(g, base, path, ctx, _names(c, g, path.node)))

    gb.build(con, p, during)
    return held[0]


def pattern_ns(con: duckdb.DuckDBPyConnection, m: Model, pattern: str) -> wi.F64:
    """Per node of a built model: time of the events matching `pattern`, for a pattern the
    model was not built with. The events are numbered again by the same SQL as the graph's
    build (so the same numbering) and dropped after."""
    apply_sql(con, "critical_path")
    try:
        return wi.node_pattern_ns(con, m.graph, pattern)
    finally:
        gb.drop_inputs(con)


def _names(
    con: duckdb.DuckDBPyConnection, g: gb.Graph, nodes: npt.NDArray[np.int64]
) -> pl.DataFrame:
    """First event name of the path's nodes (node, name)."""
    on = np.zeros(len(g.n_start), dtype=bool)  # a mask, not np.unique: paths of millions
    on[nodes[nodes >= 0]] = True
    want = np.flatnonzero(on)
    eids = pa.table({"node": want, "eid": g.n_first_eid[want].astype(np.int64)})
    with registered(con, "_cp_want", eids):
        return query_pl(
            con,
            "SELECT w.node, coalesce(v.name, '') AS name FROM _cp_want w "
            "LEFT JOIN _critical_path_ev v USING (eid)",
        )


def run(con: duckdb.DuckDBPyConnection, params: Params = Params()) -> Result:
    """Summary per step (main table), the path, time by rank, and the what-if table."""
    scen = [wi.parse(s) for s in params.scenarios]
    m = model(con, params.build, tuple(s.pattern for s in scen if s.pattern))
    return result_of(m, wi.run_scenarios(m.graph, scen, m.ctx), params)


def result_of(m: Model, outcomes: list[wi.Outcome], params: Params = Params()) -> Result:
    """The analysis' Result from a model and replayed scenarios."""
    path = path_table(m)
    tables = {"critical_path": path, "by_rank": by_rank(path)}
    if outcomes:
        tables["whatif"] = whatif_table(m, outcomes)
    return Result(NAME, summary_table(m, path), (), params, tables)


def path_table(m: Model) -> pl.DataFrame:
    """Every segment of every step's critical path."""
    g = m.graph
    p = m.path
    stage = pl.DataFrame(
        {"rank": list(m.ctx.stage_of), "stage": list(m.ctx.stage_of.values())},
        schema={"rank": pl.Int64, "stage": pl.Int64},
    )
    nd = np.maximum(p.node, 0)
    own = p.node >= 0
    df = pl.DataFrame(
        {
            "step": p.step,
            "rank": p.rank,
            "node": p.node,
            "device": np.where(own, g.n_device[nd], 0),
            "stream": np.where(own, g.n_stream[nd], 0),
            "own": own,
            "cat": p.cat,
            "start_ns": p.start_ns,
            "end_ns": p.end_ns,
        },
    )
    names = m.names.with_columns(pl.col("node").cast(pl.Int64))
    return (
        df.with_columns(
            pl.int_range(pl.len()).over("step").alias("seq"),
            *(
                pl.when("own").then(pl.col(c)).otherwise(None).alias(c)
                for c in ("device", "stream")
            ),
            (pl.col("end_ns") - pl.col("start_ns")).alias("dur_ns"),
            pl.col("cat")
            .replace_strict(dict(enumerate(gr.CATEGORIES)), return_dtype=pl.Utf8)
            .alias("category"),
        )
        .join(stage, on="rank", how="left", maintain_order="left")
        .join(names, on="node", how="left", maintain_order="left")
        .select(
            pl.col("step", "seq", "rank", "stage", "device", "stream").cast(pl.Int64),
            pl.col("category").cast(pl.Utf8),
            pl.col("start_ns", "end_ns", "dur_ns").cast(pl.Int64),
            pl.col("name").cast(pl.Utf8),
        )
    )


def summary_table(m: Model, path: pl.DataFrame) -> pl.DataFrame:
    """Per step: measured and replayed step time, the path's time by category."""
    g = m.graph
    measured = gr.measured_step_times(g)
    replayed = gr.step_times(g, m.base)
    rows = []
    for i, step in enumerate(g.steps.tolist()):
        seg = path.filter(pl.col("step") == step)
        cats = dict(seg.group_by("category").agg(pl.col("dur_ns").sum()).iter_rows())
        by_rank = seg.filter(pl.col("rank") >= 0).group_by("rank").agg(pl.col("dur_ns").sum())
        top = by_rank.sort(["dur_ns", "rank"], descending=[True, False])["rank"]
        rows.append(
            {
                "step": step,
                "measured_step_ns": int(measured[i]),
                "replayed_step_ns": int(replayed[i]),
                "replay_error": float(replayed[i] / measured[i] - 1) if measured[i] else 0.0,
                "path_ranks": ",".join(str(r) for r in sorted(by_rank["rank"].to_list())),
                "top_rank": int(top[0]) if len(top) else None,
                **{f"{c}_ns": int(cats.get(c, 0)) for c in gr.CATEGORIES},
            }
        )
    schema: dict[str, pl.DataType | type[pl.DataType]] = {
        "step": pl.Int64,
        "measured_step_ns": pl.Int64,
        "replayed_step_ns": pl.Int64,
        "replay_error": pl.Float64,
        "path_ranks": pl.Utf8,
        "top_rank": pl.Int64,
        **{f"{c}_ns": pl.Int64 for c in gr.CATEGORIES},
    }
    return pl.DataFrame(rows, schema=schema)


def by_rank(path: pl.DataFrame) -> pl.DataFrame:
    """Path time per step, rank, stage and category: who holds the step."""
    return (
        path.filter(pl.col("rank") >= 0)
        .group_by(["step", "rank", "stage", "category"])
        .agg(pl.col("dur_ns").sum())
        .sort(["step", "dur_ns", "rank", "category"], descending=[False, True, False, False])
    )


def whatif_table(m: Model, outcomes: list[wi.Outcome]) -> pl.DataFrame:
    """Per scenario: mean measured, replayed and predicted step time and the saving."""
    g = m.graph
    measured = float(np.mean(gr.measured_step_times(g))) if len(g.steps) else 0.0
    replayed = float(np.mean(gr.step_times(g, m.base))) if len(g.steps) else 0.0
    rows = []
    for o in outcomes:
        pred = float(np.mean(o.predicted)) if o.predicted is not None else replayed
        rows.append(
            {
                "name": o.scenario.name,
                "measured_step_ns": round(measured),
                "replayed_step_ns": round(replayed),
                "predicted_step_ns": round(pred),
                "saving_ns": round(replayed - pred),
                "saving_share": (replayed - pred) / replayed if replayed else 0.0,
                "note": o.note or None,
            }
        )
    schema = {
        "name": pl.Utf8,
        "measured_step_ns": pl.Int64,
        "replayed_step_ns": pl.Int64,
        "predicted_step_ns": pl.Int64,
        "saving_ns": pl.Int64,
        "saving_share": pl.Float64,
        "note": pl.Utf8,
    }
    return pl.DataFrame(rows, schema=schema)
