"""Regression checks against a baseline run: what got slower, by more than the noise.

A change counts as a regression only when it exceeds both the threshold and the runs' own
step-to-step noise, judged robustly because one slow step (warm-up, a stolen CPU, a GC pause)
is common in a baseline and must not excuse a real slowdown:

- centre: the median of the metric's per-step values on that rank, in each run;
- spread: sigma = b_n·1.4826·MAD per run (MAD: median absolute deviation from the median;
  1.4826 makes it the standard deviation for normal steps, b_n removes its bias at small n),
  but never below the run's typical sigma for that metric (the median over its ranks): a
  rank's few steps can agree by chance, and the run's noise is shared by its ranks;
- noise = k·sqrt(pi/2)·sqrt(sigma_cur²/n_cur + sigma_base²/n_base): sqrt(pi/2)·sigma/sqrt(n) is
  the standard error of a median, and k = 3 + 3.3/min(n_cur, n_base) standard errors.

Three, not two: every (rank, metric, parallelism) pair is compared, and with dozens of pairs a
~95% band would flag some unchanged pair in most runs. The 3.3/n widening is what the
robustness costs at few steps (a median of 3 steps and its MAD rest on two of them): simulated
on normal steps, k alone keeps the false-alarm rate per pair at or below that of a mean ± sd
rule, and the floor cuts it ~10x with 4 ranks at 3 steps; an outlier step moves neither the
median nor the MAD much. With one step per run the noise cannot be measured and is reported as
such.

Metrics: step time (relative change), and as absolute change in share of the step: exposed
communication and communication per parallelism (compare), and each PP stage's bubble
(BUBBLE: run_compare judges the pipeline analysis' per-step table with judge_runs).

A share also rises when the step gets shorter around an unchanged time: a run whose compute got
faster would fail the gate on its communication's share. So a share's rise is a regression
only when its own time per step grew too, by more than the threshold and that time's noise, in
units of the baseline's step (time_growth).

A share also moves between ranks when the straggler changes: the rank that was slow now waits
in the collectives and its exposed comm rises, the new straggler's falls, the step is as long
as before. Both directions failed the gate on two generated runs that differed only in which
of two DP peers was slow. So a metric's rises are regressions only when they are not offset
by falls on its other ranks: the sum of its changes over every rank compared must be at least
half the sum of its flagged rises (`offset`). A run-wide slowdown, or one confined to some
ranks, keeps its sum; a step that got longer is judged on step time, which is never offset.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import duckdb
import polars as pl
from ranklens.analysis import _activity
from ranklens.analysis._sql import query_pl
from ranklens.analysis.check import Verdict
from ranklens.analysis.thresholds import THRESHOLDS
from ranklens.analysis.views import apply_all_views

# (rank, key, step, v) per metric; a share's query also gives its time (ns) and the step's (w).
_PER_STEP: dict[str, str] = {
    "step_time": "SELECT rank, 'all' AS key, step, window_ns::DOUBLE AS v FROM breakdown_by_step",
    "exposed_comm": """SELECT p.rank, p.parallelism AS key, p.step,
        p.exposed_ns / nullif(w.window_ns, 0) AS v, p.exposed_ns AS ns, w.window_ns AS w
        FROM overlap_by_parallelism p JOIN overlap_by_step w USING (rank, step)""",
    "comm_share": """SELECT b.rank, b.parallelism AS key, b.step, b.comm_share AS v,
        b.comm_ns AS ns, s.window_ns AS w
        FROM breakdown_by_parallelism b JOIN breakdown_by_step s USING (rank, step)""",
}
_RELATIVE = {"step_time"}
BUBBLE = "bubble"  # the per-stage pipeline bubble, key "PP" (run_compare.bubble_changes)
# What summarize calls a share metric: "PP bubble", "DP exposed comm".
_NAMES = {"exposed_comm": "exposed comm", "comm_share": "comm share", BUBBLE: "bubble"}
NOISE_SIGMAS = 3.0
SMALL_N_WIDENING = 3.3  # k = NOISE_SIGMAS + SMALL_N_WIDENING / n: see the module docstring
MAD_TO_SD = 1.4826
# b_n: E[b_n·1.4826·MAD] = sd for n normal values (a simulation of normal samples);
# n / (n - 0.8) beyond, after Croux & Rousseeuw (1992).
_MAD_BIAS = {2: 1.197, 3: 1.487, 4: 1.360, 5: 1.218, 6: 1.189, 7: 1.138, 8: 1.128, 9: 1.101}


@dataclass(frozen=True)
class Change:
    """One metric on one rank (and parallelism): baseline vs current median per step."""

    metric: str
    key: str
    rank: int
    base: float
    cur: float
    delta: float  # relative for step_time, absolute share points otherwise
    noise: float | None  # in the units of delta
    regression: bool
    # A share's own time per step: its change in units of the baseline's step (time_growth).
    time_delta: float | None = None
    # A rise beyond the limit and the noise that other ranks' falls offset (who waits changed,
    # see the module docstring): not a regression.
    offset: bool = False


Key = tuple[int, str]  # (rank, key)
# A share's own time per step and its step's time per step (ns), in step order.
Times = tuple[list[float], list[float]]


def per_step(
    con: duckdb.DuckDBPyConnection, query: str
) -> tuple[dict[Key, list[float]], dict[Key, Times]]:
    """(rank, key) -> per-step values of a (rank, key, step, v[, ns, w]) query (steps with no
    value left out), and when it has ns and w, (rank, key) -> their per-step Times."""
    df = query_pl(con, query).with_columns(pl.col("v").cast(pl.Float64))
    df = df.filter(pl.col("v").is_not_null() & pl.col("v").is_not_nan()).sort("step")
    timed = "ns" in df.columns and "w" in df.columns
    cols = [
        pl.col("v"),
        *([pl.col("ns").cast(pl.Float64), pl.col("w").cast(pl.Float64)] if timed else []),
    ]
    values: dict[Key, list[float]] = {}
    times: dict[Key, Times] = {}
    for r in df.group_by("rank", "key").agg(cols).iter_rows(named=True):
        key = (int(r["rank"]), str(r["key"]))
        values[key] = r["v"]
        if timed:
            times[key] = (r["ns"], r["w"])
    return values, times


def compare(
    cur: duckdb.DuckDBPyConnection, base: duckdb.DuckDBPyConnection, max_regression: float
) -> list[Change]:
    """Every (metric, rank, key) present in both runs, with its verdict."""
    apply_all_views(cur)
    apply_all_views(base)
    with _activity.held(cur), _activity.held(base):  # every metric reads the activity views
        steps = {m: (per_step(cur, q), per_step(base, q)) for m, q in _PER_STEP.items()}
    out: list[Change] = []
    for metric, ((s_cur, t_cur), (s_base, t_base)) in steps.items():
        times = (t_cur, t_base) if metric not in _RELATIVE else None
        out += judge_runs(metric, s_cur, s_base, max_regression, times)
    return out


def judge_runs(
    metric: str,
    s_cur: Mapping[Key, Sequence[float]],
    s_base: Mapping[Key, Sequence[float]],
    max_regression: float,
    times: tuple[Mapping[Key, Times], Mapping[Key, Times]] | None = None,
) -> list[Change]:
    """The verdict on every (rank, key) of one metric present in both runs (per_step's);
    times: a share's Times in each run, which its verdict then also rests on (time_growth)."""
    f_cur, f_base = spread_floors(s_cur), spread_floors(s_base)
    out: list[Change] = []
    for pair in sorted(s_cur.keys() & s_base.keys()):
        rank, key = pair
        floor = (f_cur.get(key, 0.0), f_base.get(key, 0.0))
        both = None
        if times is not None and pair in times[0] and pair in times[1]:
            both = (times[0][pair], times[1][pair])
        c = s_cur[pair], s_base[pair]
        out.append(judge(metric, key, rank, *c, max_regression, floor, both))
    return out if metric in _RELATIVE else _offsets(out)


OFFSET_SHARE = 0.5  # a metric's net change must keep this part of its flagged rises


def _offsets(changes: list[Change]) -> list[Change]:
    """`changes` (one metric, its ranks and keys) with the rises of each key that its other
    ranks' falls offset no longer regressions (the module docstring's rule)."""
    out = list(changes)
    for key in {c.key for c in changes}:
        mine = [i for i, c in enumerate(changes) if c.key == key]
        rises = sum(changes[i].delta for i in mine if changes[i].regression)
        net = sum(changes[i].delta for i in mine)
        if rises > 0 and net < OFFSET_SHARE * rises:
            for i in mine:
                if changes[i].regression:
                    out[i] = replace(changes[i], regression=False, offset=True)
    return out


def judge(
    metric: str,
    key: str,
    rank: int,
    cur: Sequence[float],
    base: Sequence[float],
    max_regression: float,
    floor: tuple[float, float] = (0.0, 0.0),
    times: tuple[Times, Times] | None = None,
) -> Change:
    """The verdict on one pair from its per-step values (the rule in the module docstring);
    floor: the least spread of the current and the baseline run (spread_floors); times: a
    share's Times (current, baseline): its rise counts only if its time grew too."""
    med, med_b = statistics.median(cur), statistics.median(base)
    noise = robust_noise(cur, base, floor)
    raw = med - med_b
    if metric in _RELATIVE:
        delta = raw / med_b if med_b else 0.0
        noise_rel = noise / med_b if noise is not None and med_b else None
    else:
        delta, noise_rel = raw, noise
    reg = _beyond(delta, max_regression, noise_rel)
    growth = time_growth(*times) if times is not None else None
    if growth is not None:
        reg = reg and _beyond(growth[0], max_regression, growth[1])
    return Change(
        metric,
        key,
        rank,
        float(med_b),
        float(med),
        float(delta),
        noise_rel,
        reg,
        None if growth is None else growth[0],
    )


def _beyond(delta: float, limit: float, noise: float | None) -> bool:
    return delta > limit and (noise is None or delta > noise)


def time_growth(cur: Times, base: Times) -> tuple[float, float | None] | None:
    """(change of the median time per step, its noise), both in units of the baseline's median
    step; None when the baseline has no step time to measure it in."""
    if not cur[0] or not base[0] or not base[1]:
        return None
    step = statistics.median(base[1])
    if not step > 0:
        return None
    grew = statistics.median(cur[0]) - statistics.median(base[0])
    noise = robust_noise(cur[0], base[0])
    return grew / step, None if noise is None else noise / step


def robust_sd(values: Sequence[float]) -> float | None:
    """b_n·1.4826·MAD: the standard deviation of normal steps, barely moved by a few outliers."""
    n = len(values)
    if n < 2:
        return None
    med = statistics.median(values)
    mad = statistics.median(abs(v - med) for v in values)
    return _MAD_BIAS.get(n, n / (n - 0.8)) * MAD_TO_SD * mad


def spread_floors(per_step: Mapping[tuple[int, str], Sequence[float]]) -> dict[str, float]:
    """key -> the median over ranks of robust_sd: the run's typical step-to-step noise."""
    by_key: dict[str, list[float]] = {}
    for (_, key), values in per_step.items():
        sd = robust_sd(values)
        if sd is not None:
            by_key.setdefault(key, []).append(sd)
    return {key: statistics.median(sds) for key, sds in by_key.items()}


def robust_noise(
    cur: Sequence[float], base: Sequence[float], floor: tuple[float, float] = (0.0, 0.0)
) -> float | None:
    """The band the difference of medians must exceed; None with fewer than 2 steps a run."""
    sd, sd_b = robust_sd(cur), robust_sd(base)
    if sd is None or sd_b is None:
        return None
    sd, sd_b = max(sd, floor[0]), max(sd_b, floor[1])
    n, n_b = len(cur), len(base)
    k = NOISE_SIGMAS + SMALL_N_WIDENING / min(n, n_b)
    return k * math.sqrt(math.pi / 2) * math.sqrt(sd * sd / n + sd_b * sd_b / n_b)


def summarize(changes: list[Change], offset: bool = False) -> list[str]:
    """Lines naming what regressed most, e.g. 'DP exposed comm +4.1% of step on ranks 8-15',
    'PP bubble +6.2% of step on ranks 4-7'; offset: the rises other ranks' falls offset."""
    lines = []
    regs = [c for c in changes if (c.offset if offset else c.regression)]
    by: dict[tuple[str, str], list[Change]] = {}
    for c in regs:
        by.setdefault((c.metric, c.key), []).append(c)
    ranked = sorted(by.items(), key=lambda kv: -max(c.delta for c in kv[1]))
    for (metric, key), cs in ranked:
        ranks = _ranges(sorted(c.rank for c in cs))
        worst = max(cs, key=lambda c: c.delta)
        if metric in _RELATIVE:
            what = f"step time +{100 * worst.delta:.1f}%"
        else:
            what = f"{key} {_NAMES.get(metric, metric)} +{100 * worst.delta:.1f}% of step"
        noise = (
            "noise not measurable (1 step)"
            if worst.noise is None
            else (f"noise ±{100 * worst.noise:.1f}%")
        )
        lines.append(f"{what} on ranks {ranks} ({noise})")
    return lines


def _ranges(ranks: list[int]) -> str:
    """[0, 1, 2, 5] -> '0–2, 5'."""
    parts: list[str] = []
    start = prev = ranks[0]
    for r in ranks[1:]:
        if r != prev + 1:
            parts.append(f"{start}" if start == prev else f"{start}–{prev}")
            start = r
        prev = r
    parts.append(f"{start}" if start == prev else f"{start}–{prev}")
    return ", ".join(parts)


def verdict(changes: list[Change], limit: float, source: str) -> Verdict:
    """The max_regression check as a Verdict, naming the largest regression."""
    regs = [c for c in changes if c.regression]
    label = THRESHOLDS["max_regression"].label
    if not changes:
        return Verdict(
            "max_regression",
            label,
            limit,
            "skipped",
            None,
            None,
            f"{label}: skipped, no metric in common with the baseline",
            source,
        )
    # a pass names its largest change that is not offset (an offset rise exceeds the limit)
    worst = max(regs or [c for c in changes if not c.offset] or changes, key=lambda c: c.delta)
    subject = f"rank {worst.rank} {worst.metric}" + ("" if worst.key == "all" else f" {worst.key}")
    if regs:
        msg = f"{label}: " + "; ".join(summarize(changes)[:3])
        return Verdict(
            "max_regression", label, limit, "fail", subject, worst.delta, msg, source, len(changes)
        )
    msg = f"{label}: no regression beyond {100 * limit:.1f}% and the noise"
    if moved := summarize(changes, offset=True):
        msg += f"; offset by other ranks' falls (who waits changed): {'; '.join(moved[:3])}"
    return Verdict(
        "max_regression", label, limit, "pass", subject, worst.delta, msg, source, len(changes)
    )
