"""What-if replay and the critical path for the dashboard: the graph built once per run.

Why here: building the dependency graph takes seconds on a large run, a replay about a second
per million vertices; the Findings page's form and the timeline's overlay must not pay the
build on every request. The model is kept on the run's RunData (one per database); a kernel
pattern the model was not built with is read from the numbered events once and kept too. The
numbers are whatif_run's (`answer_of`), so the page says what `ranklens whatif` says.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import partial

import polars as pl
from ranklens.analysis import critical_path as cp
from ranklens.analysis import whatif as wi
from ranklens.analysis import whatif_run
from ranklens.analysis.report import stored_scenarios
from ranklens.dashboards.data import RunData
from ranklens.ingest.errors import RanklensError

MODEL_KEY = "critical_path_model"
PATTERN_KEY = "whatif_pattern"


@dataclass(frozen=True)
class Answer:
    """A form's scenarios replayed: mean step times (ns) and one row per scenario, or the
    message that says why there is nothing to show (bad input, no graph)."""

    measured_step_ns: int = 0
    replayed_step_ns: int = 0
    rows: tuple[dict[str, object], ...] = ()
    error: str | None = None


def model(data: RunData) -> cp.Model:
    """The run's graph, unchanged replay and critical path, built on first use."""
    m = data.cached(MODEL_KEY, cp.model)
    assert isinstance(m, cp.Model)
    return m


def unavailable(data: RunData) -> str | None:
    """Why the run has no replay (its critical_path analysis failed), or None."""
    why = data.error(cp.NAME)
    return f"no what-if replay for this run: {why}" if why else None


def scenario_options(data: RunData) -> list[str]:
    """The fixes that apply to this run (what `ranklens whatif` replays by default)."""
    if unavailable(data):
        return []
    kept = data.cached("whatif_scenarios", stored_scenarios)  # stored at ingest: no graph built
    if isinstance(kept, list):
        return kept
    return whatif_run.default_scenarios(model(data))


def scenario_names(
    chosen: list[str] | None,
    straggler_rank: str | None,
    scale_comm: str | None,
    kernels: str | None,
) -> list[str]:
    """The form's fields as scenario texts: a rank -> straggler:RANK, `PAR=F` ->
    scale-comm:PAR=F, `REGEX=F` -> scale-kernels:REGEX=F (blank fields add nothing)."""
    out = [str(c) for c in chosen or []]
    if straggler_rank is not None and str(straggler_rank).strip():
        out.append(f"straggler:{str(straggler_rank).strip()}")
    if scale_comm and scale_comm.strip():
        out.append(f"scale-comm:{scale_comm.strip()}")
    if kernels and kernels.strip():
        out.append(f"scale-kernels:{kernels.strip()}")
    return out


def run(data: RunData, names: list[str]) -> Answer:
    """Replay `names` (none: say so) on the run's kept model."""
    why = unavailable(data)
    if why:
        return Answer(error=why)
    if not names:
        return Answer(error="choose a scenario or fill in a field, then press Replay")
    try:
        parsed = whatif_run.parse_all(names)
        m = _with_patterns(data, model(data), [s.pattern for s in parsed if s.pattern])
        out = whatif_run.answer_of(m, parsed)
    except RanklensError as exc:
        return Answer(error=str(exc) + (f" ({exc.hint})" if exc.hint else ""))
    rows = tuple(
        {k: s[k] for k in ("name", "predicted_step_ns", "saving_ns", "saving_share", "note")}
        for s in out["scenarios"]
    )
    return Answer(int(out["measured_step_ns"]), int(out["replayed_step_ns"]), rows)


def _with_patterns(data: RunData, m: cp.Model, patterns: list[str]) -> cp.Model:
    """`m` whose context also holds each pattern's per-node time (a copy: the kept model is
    shared by concurrent requests)."""
    todo = [p for p in patterns if p not in m.ctx.pattern_ns]
    if not todo:
        return m
    extra = {p: data.memo((PATTERN_KEY, p), partial(_pattern_ns, data, m, p)) for p in todo}
    ctx = dataclasses.replace(m.ctx, pattern_ns={**m.ctx.pattern_ns, **extra})
    return dataclasses.replace(m, ctx=ctx)


def _pattern_ns(data: RunData, m: cp.Model, pattern: str) -> wi.F64:
    """Per node: time of the events matching `pattern` (critical_path.pattern_ns)."""
    cur = data.cursor()
    try:
        return cp.pattern_ns(cur, m, pattern)
    finally:
        cur.close()


def path_segments(
    data: RunData, start_ns: int, end_ns: int, ranks: list[int] | None
) -> pl.DataFrame:
    """The critical path's segments (the analysis' `critical_path` table) of the steps that
    overlap the window, on `ranks` (None: all), each on a rank (joins have none)."""
    res = data.result(cp.NAME)
    if res is None or "critical_path" not in res.tables:
        return pl.DataFrame(schema={"rank": pl.Int64, "start_ns": pl.Int64, "end_ns": pl.Int64})
    path = res.tables["critical_path"]
    steps = (
        path.group_by("step")
        .agg(pl.col("start_ns").min().alias("s"), pl.col("end_ns").max().alias("e"))
        .filter((pl.col("s") < end_ns) & (pl.col("e") > start_ns))["step"]
    )
    out = path.filter(pl.col("step").is_in(steps.to_list()) & (pl.col("rank") >= 0))
    if ranks:
        out = out.filter(pl.col("rank").is_in(ranks))
    return out.sort("step", "seq")
