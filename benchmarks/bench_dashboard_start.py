"""Dashboard start: `ranklens dashboard RUN` from the command line to the first page drawn.

Why: issue 15 asks for the first page <= 2 s after start on a 64-rank x 10 M-event run that
was ingested before, with the analyses' results stored in the run (analysis.results_store)
instead of recomputed at every start. This times what a user waits for: a fresh
`ranklens dashboard DB` process, from its launch until headless chromium (already running,
as a user's browser is) shows `/` with every graph drawn and no callback pending. Two runs of
the same events: the run as bench_dashboard.py builds it (no stored results: the dashboard
computes them before it opens its port) and a copy whose results were stored as `ranklens
ingest` stores them (finalize_run, timed: the cost moved to ingest). Peak RSS of the server
process (VmHWM) is read too. Each case starts the server `--runs` + 1 times on one port, as a
user restarts `ranklens dashboard` on its default port: the first start is a first visit (the
browser must fetch and compile the page's ~4 MB of scripts, ~0.5 s), the others a user coming
back (scripts cached per origin); both are printed.

A start answers the last start's page and scripts while it imports (dashboards.early_page),
kept in a cache that the benchmark points at a fresh directory ($RANKLENS_CACHE_DIR): the
stored run's first start has nothing kept (a first start after install: a first visit the
old way), and runs until it has kept its page; the timed starts after it, on another port
(nothing of it in the browser's cache), are a first visit with the page kept, then the user
coming back.

Usage: python benchmarks/bench_dashboard_start.py [--repeat 50] [--runs 3] [--stored-only]
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from bench_dashboard import DRAWN, POLL_S, TARGET_PAGE_S, WORK, _driver, build
from machine import machine_line

HERE = Path(__file__).resolve().parent


def stored_copy(db: Path) -> tuple[Path, float]:
    """A copy of `db` with every analysis' result stored as ingest stores them (built once);
    returns it and the seconds storing took (0 when reused)."""
    from ranklens.analysis.results_store import finalize_run
    from ranklens.ingest.database import connect_writable

    out = db.with_name(db.stem + "_stored.duckdb")
    if out.exists() and _fresh(out):
        return out, 0.0
    tmp = out.with_suffix(".tmp")
    shutil.copyfile(db, tmp)
    t = time.perf_counter()
    con = connect_writable(tmp)
    try:
        finalize_run(con)
        con.execute("CHECKPOINT")
    finally:
        con.close()
    took = time.perf_counter() - t
    tmp.rename(out)
    return out, took


def _fresh(db: Path) -> bool:
    """Whether `db`'s stored report and views are still this code's (else stored again)."""
    import duckdb
    from ranklens.analysis.report import stored_report
    from ranklens.analysis.views import stored_views_current

    con = duckdb.connect(str(db), read_only=True)
    try:
        return stored_report(con) is not None and stored_views_current(con)
    finally:
        con.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _peak_rss_mb(pid: int) -> float:
    """The process' peak resident set (Linux: VmHWM), in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def start_to_page(
    db: Path, driver: object, port: int, keep: Path | None = None
) -> dict[str, float]:
    """One start: launch -> port answers -> first page drawn, and the server's peak RSS; with
    `keep` (the page cache), the server runs on until its page is kept there."""
    sys.path.insert(0, str(HERE.parent / "tests"))
    from dashboards.test_browser import open_page, wait_for

    # the console script beside this interpreter (a venv not activated), else on PATH
    beside = Path(sys.executable).parent / "ranklens"
    exe = str(beside) if beside.exists() else shutil.which("ranklens") or "ranklens"
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [exe, "dashboard", str(db), "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        url = f"http://127.0.0.1:{port}/"
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"the dashboard exited ({proc.returncode}) before serving")
            try:
                urllib.request.urlopen(url, timeout=1).read()
                break
            except OSError:
                time.sleep(POLL_S)
        port_s = time.perf_counter() - t0
        open_page(driver, url, ".dash-graph", poll=POLL_S)
        wait_for(driver, DRAWN, poll=POLL_S)
        wait_for(driver, "!document.querySelector('[data-dash-is-loading=\"true\"]')", poll=POLL_S)
        page_s = time.perf_counter() - t0
        peak = _peak_rss_mb(proc.pid)
        end = time.monotonic() + 60
        while keep is not None and not list(keep.glob("pages/*/manifest.json")):
            if time.monotonic() > end or proc.poll() is not None:
                raise SystemExit("the dashboard kept no page within 60 s")
            time.sleep(POLL_S)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return {"port_s": port_s, "page_s": page_s, "peak_rss_mb": peak}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=50, help="time copies of the sample's steps")
    ap.add_argument("--runs", type=int, default=3, help="starts timed per database")
    ap.add_argument("--stored-only", action="store_true", help="skip the run without results")
    args = ap.parse_args()
    print(machine_line(), flush=True)  # what today's figures are measured on
    WORK.mkdir(exist_ok=True)
    db = build(args.repeat)
    stored, store_s = stored_copy(db)
    load0 = os.getloadavg()[0]
    keep = Path(tempfile.mkdtemp(prefix="bench-page-cache-", dir=WORK))
    os.environ["RANKLENS_CACHE_DIR"] = str(keep)  # the servers' page cache, empty
    driver = _driver()
    try:
        driver.get("data:text/html,<p>ready</p>")  # the browser is running before the start
        rows = {}
        cases = [("stored results", stored), ("no stored results", db)]
        unkept = start_to_page(stored, driver, _free_port(), keep)  # nothing kept yet
        for name, path in cases[:1] if args.stored_only else cases:
            # One port per case, as `ranklens dashboard` keeps its default port: the first
            # start is a first visit (the browser has none of the page's ~4 MB of scripts),
            # the others a user coming back (the browser has them cached, per origin).
            port = _free_port()
            runs = [start_to_page(path, driver, port) for _ in range(args.runs + 1)]
            rows[name] = runs
    finally:
        driver.quit()
        shutil.rmtree(keep, ignore_errors=True)
    print(f"{db.name}: {os.path.getsize(db) / 2**20:.0f} MiB; load average {load0:.1f} before")
    if store_s:
        print(f"storing every analysis' results (ingest's last step): {store_s:.1f} s")
    print(
        f"stored results, first start after install (no page kept): first visit "
        f"{unkept['page_s']:.2f} s (port {unkept['port_s']:.2f} s)"
    )
    for name, (first, *runs) in rows.items():
        page = [r["page_s"] for r in runs]
        port = [r["port_s"] for r in runs]
        rss = max(r["peak_rss_mb"] for r in (first, *runs))
        print(
            f"{name}: first page drawn {statistics.median(page):.2f} s after launch (browser "
            f"cache warm, median of {len(runs)}, worst {max(page):.2f} s; '/' answered at "
            f"{statistics.median(port):.2f} s); first visit, page kept {first['page_s']:.2f} s "
            f"(port {first['port_s']:.2f} s); server peak RSS {rss:,.0f} MB; target <= "
            f"{TARGET_PAGE_S} s with stored results"
        )


if __name__ == "__main__":
    main()
