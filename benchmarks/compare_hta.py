"""Side-by-side: HTA's comm/comp overlap and temporal breakdown vs ranklens' overlap/breakdown.

Why: ranklens claims HTA's overlap definition (|M ∩ C| / |M| on unions). This checks it per rank
on real traces, and separates genuine disagreements from differences of definition (HTA's window,
its µs rounding of ns traces, its name-regex classes) by also computing HTA's exact definition
with plain SQL over the ranklens database. See docs/hta-comparison.md for the explanations.

Exit status: 1 if any rank's ranklens overlap ratio, taken over the steps HTA analyses, differs
from HTA's by more than --tol-pp percentage points (default 0.5).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import duckdb
import polars as pl

HERE = Path(__file__).resolve().parent
WORK = HERE / "_work"
PUBLIC = Path("/work/shared/traces/public")
DATASETS: dict[str, list[Path]] = {
    "nccl_data": [PUBLIC / "hta-testdata/nccl_parser_config/nccl_data.json.gz"],
    "param-dlrm": sorted((PUBLIC / "param-dlrm-kineto/extracted").glob("*.json.gz")),
}

# HTA 0.6.1 kernel classes (hta/common/types.py), applied with re.match, i.e. anchored at start.
HTA_COMM = r"^(?:nccl.*|hip|hccl|.*ncclKernel.*)"
HTA_MEM = r"^(?:(?:hip)?Memcpy|(?:hip)?Memset|dma)"
HTA_NOT_COMP = (
    r"^(?:nccl|.*Memcpy|.*Memset|.*dma|.*Sync|Stream Wait Event|cuda.*LaunchKernel|runFunction"
    r"|hip|job_exe|packet|pe_exe|cpum_exe_subgraph|hccl|collective_subgraph_execution)"
)

# HTA's definition over the ranklens events table. Window: if >= 2 distinct ProfilerStep names
# exist (over all ranks), only device events launched (same correlation) by a host event that
# starts before the rank's last ProfilerStep; else all. Rounding (ns traces): [ceil µs, floor µs].
HTA_DEF_SQL = f"""
WITH nsteps AS (
  SELECT count(DISTINCT name) AS n FROM events
  WHERE device = -1 AND regexp_matches(name, '^ProfilerStep#\\d+')
), last_step AS (
  SELECT rank, max(ts_ns) AS t FROM events
  WHERE device = -1 AND regexp_matches(name, '^ProfilerStep#\\d+') GROUP BY rank
), launch AS (
  SELECT DISTINCT e.rank, e.correlation FROM events e JOIN last_step l USING (rank)
  WHERE e.device = -1 AND e.correlation IS NOT NULL AND e.ts_ns < l.t
), frac AS (
  SELECT rank, bool_or(ts_ns % 1000 <> 0 OR dur_ns % 1000 <> 0) AND $round AS r
  FROM events GROUP BY rank
), dev AS (
  SELECT g.rank,
         CASE WHEN regexp_matches(g.name, '{HTA_COMM}') THEN 1
              WHEN regexp_matches(g.name, '{HTA_MEM}') THEN 2
              WHEN NOT regexp_matches(g.name, '{HTA_NOT_COMP}') THEN 0 ELSE 3 END AS cls,
         CASE WHEN f.r THEN (g.ts_ns + 999) // 1000 * 1000 ELSE g.ts_ns END AS s,
         CASE WHEN f.r THEN (g.ts_ns + g.dur_ns) // 1000 * 1000 ELSE g.ts_ns + g.dur_ns END AS e
  FROM events g JOIN frac f USING (rank)
  WHERE g.device >= 0 AND g.kind IN ('compute', 'comm', 'memcpy', 'memset')
    AND g.correlation IS NOT NULL
    AND ((SELECT n FROM nsteps) < 2
         OR EXISTS (SELECT 1 FROM launch l
                    WHERE l.rank = g.rank AND l.correlation = g.correlation))
), iv AS (
  SELECT rank, cls, s, greatest(e, s) AS e FROM dev
  UNION ALL SELECT rank, 9 AS cls, s, greatest(e, s) AS e FROM dev
), o AS (
  SELECT *, max(e) OVER (PARTITION BY rank, cls ORDER BY s, e
                         ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS reach
  FROM iv
), g AS (
  SELECT *, sum(CASE WHEN reach IS NULL OR s > reach THEN 1 ELSE 0 END)
              OVER (PARTITION BY rank, cls ORDER BY s, e ROWS UNBOUNDED PRECEDING) AS island
  FROM o
), isl AS (
  SELECT rank, cls, min(s) AS s, max(e) AS e FROM g GROUP BY rank, cls, island
), inter AS (
  SELECT m.rank, sum(least(m.e, c.e) - greatest(m.s, c.s)) AS mc
  FROM isl m JOIN isl c ON m.rank = c.rank AND m.cls = 1 AND c.cls = 0
   AND m.s < c.e AND c.s < m.e
  GROUP BY m.rank
)
SELECT rank,
  sum(e - s) FILTER (WHERE cls = 1) AS comm_ns,
  coalesce(any_value(inter.mc), 0) AS hidden_ns,
  sum(e - s) FILTER (WHERE cls = 0) AS compute_ns,
  sum(e - s) FILTER (WHERE cls = 9) AS busy_ns,
  max(e) FILTER (WHERE cls = 9) - min(s) FILTER (WHERE cls = 9) AS window_ns
FROM isl LEFT JOIN inter USING (rank)
GROUP BY rank ORDER BY rank
"""


@dataclass
class Row:
    """Per-rank figures in one definition; times in µs."""

    overlap_pct: float | None
    window_us: float
    compute_us: float
    idle_us: float

    @property
    def noncompute_us(self) -> float:
        return self.window_us - self.compute_us - self.idle_us

    def pct(self, what: str) -> float:
        value = {
            "idle": self.idle_us,
            "compute": self.compute_us,
            "noncompute": self.noncompute_us,
        }[what]
        return 100.0 * value / self.window_us if self.window_us else float("nan")


def run_hta(files: list[Path], tmp: Path) -> dict[int, Row]:
    """HTA's numbers per rank (TraceAnalysis over a dir of links to the shared files)."""
    from hta.configs.config import logger
    from hta.trace_analysis import TraceAnalysis

    logger.setLevel(logging.ERROR)
    for f in files:
        os.symlink(f, tmp / f.name)
    ta = TraceAnalysis(trace_dir=str(tmp))
    ov = ta.get_comm_comp_overlap(visualize=False).set_index("rank")
    tb = ta.get_temporal_breakdown(visualize=False).set_index("rank")
    return {
        int(r): Row(
            float(ov.loc[r, "comp_comm_overlap_pctg"]),
            float(tb.loc[r, "kernel_time(us)"]),
            float(tb.loc[r, "compute_time(us)"]),
            float(tb.loc[r, "idle_time(us)"]),
        )
        for r in tb.index
    }


def _row_from_sums(comm: float, hidden: float, window: float, compute: float, idle: float) -> Row:
    return Row(100.0 * hidden / comm if comm else None, window / 1e3, compute / 1e3, idle / 1e3)


def run_ranklens(files: list[Path], db: Path) -> tuple[dict[str, dict[int, Row]], pl.DataFrame]:
    """ranklens' own per-rank numbers (over all steps / over HTA's steps) and HTA's definition
    evaluated in SQL over the ranklens database (exact ns / with HTA's µs rounding)."""
    from ranklens.analysis import breakdown, overlap
    from ranklens.ingest import load_traces

    load_traces([str(f) for f in files], db)
    con = duckdb.connect(str(db), read_only=True)
    ov = overlap.run(con).table.select("rank", "step", "comm_ns", "hidden_ns")
    bd = breakdown.run(con).table.select("rank", "step", "window_ns", "compute_ns", "idle_ns")
    per_step = ov.join(bd, on=["rank", "step"], how="full", coalesce=True).sort("rank", "step")
    # HTA drops each rank's last ProfilerStep when >= 2 distinct step numbers exist overall.
    n_steps = per_step.filter(pl.col("step") >= 0)["step"].n_unique()
    last = pl.col("step") == pl.col("step").max().over("rank")
    kept = per_step.filter(~last) if n_steps >= 2 else per_step
    out: dict[str, dict[int, Row]] = {}
    for label, frame in (("all_steps", per_step), ("hta_steps", kept)):
        sums = frame.group_by("rank").agg(pl.col("*").exclude("step").sum()).sort("rank")
        out[label] = {
            int(r["rank"]): _row_from_sums(
                r["comm_ns"], r["hidden_ns"], r["window_ns"], r["compute_ns"], r["idle_ns"]
            )
            for r in sums.iter_rows(named=True)
        }
    for label, rounding in (("sql_exact", False), ("sql_rounded", True)):
        rows = con.execute(HTA_DEF_SQL.replace("$round", str(rounding).upper())).fetchall()
        out[label] = {
            int(r[0]): _row_from_sums(r[1] or 0, r[2], r[5], r[3] or 0, r[5] - r[4]) for r in rows
        }
    con.close()
    return out, per_step


def _pp(a: float | None, b: float | None) -> str:
    return f"{a - b:+7.2f}" if a is not None and b is not None else "    n/a"


def _fmt(x: float | None) -> str:
    return f"{x:7.2f}" if x is not None else "    n/a"


COLUMNS_OV = (
    ("all_steps", "rl all steps"),
    ("hta_steps", "rl HTA steps"),
    ("sql_exact", "SQL HTA-def ns"),
    ("sql_rounded", "SQL HTA-def µs"),
)


def print_tables(name: str, hta: dict[int, Row], rl: dict[str, dict[int, Row]]) -> float:
    """Print overlap and breakdown side by side; return the worst gated overlap gap (pp)."""
    print(f"\n=== {name}: comm/comp overlap % (HTA vs ranklens; Δ = ranklens − HTA, pp)")
    print(f"{'rank':>4} {'HTA':>7} " + " ".join(f"{h:>15} {'Δ':>7}" for _, h in COLUMNS_OV))
    worst = 0.0
    for r in sorted(hta):
        ho = hta[r].overlap_pct
        cells = []
        for key, _ in COLUMNS_OV:
            v = rl[key].get(r)
            val = v.overlap_pct if v else None
            cells.append(f"{_fmt(val):>15} {_pp(val, ho)}")
            if key == "hta_steps" and val is not None and ho is not None:
                worst = max(worst, abs(val - ho))
            elif key == "hta_steps" and (val is None) != (ho is None):
                worst = float("inf")  # one tool sees communication, the other none
        print(f"{r:>4} {_fmt(ho)} " + " ".join(cells))
    print(f"\n=== {name}: temporal breakdown (window µs; shares in %; Δ in pp vs HTA)")
    print(
        f"{'rank':>4} {'source':<15} {'window µs':>11} {'idle %':>7} {'Δ':>7} "
        f"{'compute %':>9} {'Δ':>7} {'non-comp %':>10} {'Δ':>7}"
    )
    for r in sorted(hta):
        h = hta[r]
        print(
            f"{r:>4} {'HTA':<15} {h.window_us:>11.0f} {h.pct('idle'):>7.2f} {'':>7} "
            f"{h.pct('compute'):>9.2f} {'':>7} {h.pct('noncompute'):>10.2f}"
        )
        for key, label in COLUMNS_OV:
            v = rl[key].get(r)
            if v is None:
                continue
            print(
                f"{'':>4} {label:<15} {v.window_us:>11.0f} {v.pct('idle'):>7.2f} "
                f"{_pp(v.pct('idle'), h.pct('idle'))} {v.pct('compute'):>9.2f} "
                f"{_pp(v.pct('compute'), h.pct('compute'))} {v.pct('noncompute'):>10.2f} "
                f"{_pp(v.pct('noncompute'), h.pct('noncompute'))}"
            )
    return worst


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--dataset",
        choices=sorted(DATASETS),
        action="append",
        help="limit to these datasets (default: all)",
    )
    ap.add_argument("--tol-pp", type=float, default=0.5, help="overlap tolerance in pp")
    ap.add_argument("--per-step", action="store_true", help="also print ranklens' step rows")
    args = ap.parse_args(argv)
    WORK.mkdir(parents=True, exist_ok=True)
    failed: list[str] = []
    for name in args.dataset or sorted(DATASETS):
        files = DATASETS[name]
        missing = [str(f) for f in files if not f.exists()]
        if not files or missing:
            print(f"skip {name}: missing {missing or 'files'}", file=sys.stderr)
            continue
        with tempfile.TemporaryDirectory(dir=WORK, prefix=f"cmp_{name}_") as d:
            tmp = Path(d)
            (tmp / "hta").mkdir()
            hta = run_hta(files, tmp / "hta")
            rl, per_step = run_ranklens(files, tmp / "ranklens.duckdb")
        worst = print_tables(name, hta, rl)
        if args.per_step:
            print(per_step)
        verdict = "PASS" if worst <= args.tol_pp else "FAIL"
        print(
            f"[{verdict}] {name}: max |Δ overlap| over HTA's steps = {worst:.2f} pp "
            f"(tolerance {args.tol_pp} pp)"
        )
        if worst > args.tol_pp:
            failed.append(name)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
