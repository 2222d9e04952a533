"""Speed and peak memory of each analysis on a big run (the dashboard's 64-rank benchmark DB).

Why: the dashboard computes every analysis before it serves its first page, and `report` does
the same, so an analysis that takes minutes on a 10 M-event run makes both unusable. This
times each registered analysis (and the whole report, as the dashboard warms it) in its own
fresh process, on a read-only sandboxed connection as the dashboard opens it, and prints the
median wall time, CPU seconds (DuckDB threads included) and the process's peak RSS. The
2 dev cores are shared with other work: read wall time with the CPU column and the load.

The database is bench_dashboard.py's (built once, cached in benchmarks/_work/): the Megatron
sample's 8 ranks x 8 side by side and REPEAT times in time (repeat 50: 64 ranks, 10.1 M
events; repeat 5: 1 M).

    .venv/bin/python benchmarks/bench_analysis.py [--repeat 50] [--runs 3] [--only overlap]
    .venv/bin/python benchmarks/bench_analysis.py --db run.duckdb
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def child(name: str, db: str) -> None:
    """Time one analysis (or 'report': all of them on one connection) in this process."""
    from ranklens.analysis import by_name
    from ranklens.analysis.report import build_report
    from ranklens.analysis.sql_console import safe_connect

    con = safe_connect(db)
    base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    cpu0, t0 = time.process_time(), time.perf_counter()
    if name == "report":
        rows = sum(r.table.height for r in build_report(con).results.values())
    else:
        rows = by_name()[name].run(con).table.height
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    con.close()
    print(
        json.dumps(
            {
                "wall_s": wall,
                "cpu_s": cpu,
                "peak_mb": peak / 1024,
                "base_mb": base_rss / 1024,
                "rows": rows,
            }
        )
    )


def measure(name: str, db: Path) -> dict[str, float]:
    """One run of `name` in a fresh interpreter (so peak RSS is this analysis' alone)."""
    out = subprocess.run(
        [sys.executable, __file__, "--child", name, "--db", str(db)],
        check=True,
        capture_output=True,
        text=True,
    )
    res: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=50, help="bench_dashboard.py's run size")
    ap.add_argument("--db", help="time this ranklens database instead")
    ap.add_argument("--runs", type=int, default=3, help="runs per analysis (median reported)")
    ap.add_argument("--only", action="append", help="analysis name (repeatable); 'report' too")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.db)
        return
    if args.db:
        db = Path(args.db)
    else:
        sys.path.insert(0, str(HERE))
        from bench_dashboard import build

        db = build(args.repeat)
    from ranklens.analysis import REGISTRY

    names = args.only or [m.NAME for m in REGISTRY] + ["report"]
    import duckdb

    con = duckdb.connect(str(db), read_only=True)
    n_ev, n_ranks = con.execute("SELECT count(*), count(DISTINCT rank) FROM events").fetchone()  # type: ignore[misc]
    con.close()
    print(f"{db.name}: {n_ranks} ranks, {n_ev / 1e6:.2f} M events; {args.runs} run(s) each")
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"{'analysis':<12} {'median s':>9} {'min s':>7} {'max s':>7} {'cpu s':>7} {'peak MB':>8}")
    for name in names:
        runs = [measure(name, db) for _ in range(args.runs)]
        walls = [r["wall_s"] for r in runs]
        print(
            f"{name:<12} {statistics.median(walls):9.2f} {min(walls):7.2f} {max(walls):7.2f} "
            f"{statistics.median(r['cpu_s'] for r in runs):7.2f} "
            f"{max(r['peak_mb'] for r in runs):8.0f}",
            flush=True,
        )
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
