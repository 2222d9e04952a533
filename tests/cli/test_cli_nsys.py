"""The CLI on Nsight-ingested runs, end to end, checked against raw SQL on the exports.

Why: issue 5 promises that every analysis and the CLI work the same whatever format the ranks
came in. Two real layouts: one report per rank (distributedsyslab, 9 ranks on 3 hosts, one
AllReduce, its directory also holding each report's .nsys-rep beside the .sqlite) and one report
for two ranks (nsys-ai, 2 processes, NCCL SendRecv). Expected numbers come from the SQLite files
through sqlite3 (independent of ranklens), never from ranklens itself.
"""

from __future__ import annotations

import csv
import io
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from lookups import sqlite_rows
from ranklens.cli.main import app
from typer.testing import CliRunner

runner = CliRunner()
DSL = ("distributedsyslab-fs24-nccl", "tree_allreduce_3nodes_9ranks")
AI = ("nsys-ai", "mfu_2gpu_before.sqlite")
KINETO = Path(__file__).resolve().parents[2] / "sample_traces" / "straggler_rank3" / "raw"
_DEVICE_TABLES = ("KERNEL", "MEMCPY", "MEMSET", "SYNCHRONIZATION")


def _union(iv: list[tuple[int, int]]) -> int:
    total, end = 0, None
    for s, e in sorted(iv):
        if end is None or s > end:
            total, end = total + e - s, e
        elif e > end:
            total, end = total + e - end, e
    return total


def _json(args: list[str]) -> Any:
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def _ingest(src: list[Path], out: Path) -> str:
    res = runner.invoke(app, ["ingest", *map(str, src), "-o", str(out)])
    assert res.exit_code == 0, res.output
    return res.output


@pytest.fixture(scope="module")
def dsl(shared_traces: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    run_dir = shared_traces.joinpath(*DSL)
    db = tmp_path_factory.mktemp("dsl") / "run.duckdb"
    return run_dir, db, _ingest([run_dir], db)


@pytest.fixture(scope="module")
def ai(shared_traces: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    src = shared_traces.joinpath(*AI)
    db = tmp_path_factory.mktemp("ai") / "run.duckdb"
    _ingest([src], db)
    return src, db


def _dsl_truth(run_dir: Path) -> dict[int, dict[str, Any]]:
    """Per rank, straight from each export: host, the AllReduce kernel, the device window."""
    out = {}
    for f in sorted(run_dir.glob("*.sqlite")):
        (env,) = sqlite_rows(
            f, "SELECT value FROM META_DATA_CAPTURE WHERE value LIKE 'SLURM_PROCID=%'"
        )
        (host,) = sqlite_rows(f, "SELECT value FROM TARGET_INFO_SYSTEM_ENV WHERE name = 'Hostname'")
        (kernel,) = sqlite_rows(f, 'SELECT start, "end" FROM CUPTI_ACTIVITY_KIND_KERNEL')
        spans = [
            r
            for t in _DEVICE_TABLES
            for r in sqlite_rows(f, f'SELECT min(start), max("end") FROM CUPTI_ACTIVITY_KIND_{t}')
            if r[0] is not None
        ]
        mem = [
            (int(s), int(e))
            for t in ("MEMCPY", "MEMSET")
            for s, e in sqlite_rows(f, f'SELECT start, "end" FROM CUPTI_ACTIVITY_KIND_{t}')
        ]
        out[int(str(env[0]).split('"')[1])] = {
            "host": host[0],
            "kernel": kernel,
            "window": (min(s for s, _ in spans), max(e for _, e in spans)),
            "busy": _union([*mem, kernel]),
        }
    return out


def test_ingest_directory_with_reports_beside_exports(dsl: tuple[Path, Path, str]) -> None:
    run_dir, _db, output = dsl
    assert len(list(run_dir.glob("*.nsys-rep"))) == 9  # would need `nsys` if read
    assert "ingested 9 rank(s)" in output
    assert "9 .nsys-rep report(s) have their .sqlite export beside them" in output


def test_ranks_hosts_steps_and_breakdown(dsl: tuple[Path, Path, str]) -> None:
    run_dir, db, _ = dsl
    truth = _dsl_truth(run_dir)
    ranks = _json(["sql", str(db), "SELECT rank, host, world_size FROM ranks", "-f", "json"])
    assert {r["rank"]: r["host"] for r in ranks} == {k: v["host"] for k, v in truth.items()}
    assert {r["world_size"] for r in ranks} == {9}
    steps = _json(["sql", str(db), "SELECT * FROM steps ORDER BY rank", "-f", "json"])
    assert [(s["rank"], s["step"], s["source"]) for s in steps] == [
        (r, -1, "trace") for r in range(9)
    ]  # no ProfilerStep markers: one pseudo-step covering the device work of the trace
    assert {s["rank"]: (s["start_ns"], s["end_ns"]) for s in steps} == {
        r: t["window"] for r, t in truth.items()
    }
    rep = _json(["report", str(db), "-f", "json"])
    facts = rep["facts"]
    assert facts["ranks"] == list(range(9)) and facts["world_size"] == 9
    assert facts["formats"] == ["nsys"] and facts["devices"] == ["NVIDIA GeForce RTX 3090"]
    assert facts["matching"]["matched"] == 9 == facts["matching"]["comm_ops"]
    assert {"breakdown", "overlap"} <= set(rep["analyses"])
    for row in rep["analyses"]["breakdown"]["by_rank"]:
        t = truth[row["rank"]]
        s, e = t["kernel"]
        assert row["window_ns"] == t["window"][1] - t["window"][0]
        assert (row["comm_ns"], row["exposed_comm_ns"], row["compute_ns"]) == (e - s, e - s, 0)
        assert row["idle_ns"] == row["window_ns"] - t["busy"] >= 0
        for share in ("compute_share", "comm_share", "idle_share"):
            assert 0.0 <= row[share] <= 1.0
    for row in rep["analyses"]["overlap"]["by_rank"]:
        assert row["hidden_ns"] == 0 and row["overlap_ratio"] == 0.0  # no compute kernel at all


def test_one_allreduce_instance_on_all_ranks(dsl: tuple[Path, Path, str]) -> None:
    _run_dir, db, _ = dsl
    groups = _json(["sql", str(db), "SELECT ranks, size, source FROM process_groups", "-f", "json"])
    assert groups == [{"ranks": list(range(9)), "size": 9, "source": "inferred_sequence"}]
    rows = _json(["sql", str(db), "SELECT rank, op, instance_id FROM collectives", "-f", "json"])
    assert sorted(r["rank"] for r in rows) == list(range(9))
    assert {(r["op"], r["instance_id"]) for r in rows} == {("all_reduce", 0)}


def test_report_formats_and_analyze(dsl: tuple[Path, Path, str]) -> None:
    _run_dir, db, _ = dsl
    text = runner.invoke(app, ["report", str(db)])
    assert text.exit_code == 0, text.output
    assert "ranks: 9 of 9" in text.output and "NVIDIA GeForce RTX 3090" in text.output
    rows = list(
        csv.DictReader(io.StringIO(runner.invoke(app, ["report", str(db), "-f", "csv"]).stdout))
    )
    assert sorted(int(r["rank"]) for r in rows) == list(range(9))
    md = runner.invoke(app, ["report", str(db), "-f", "markdown"]).stdout
    assert md.startswith("# ranklens report") and "| 8 | 1 |" in md
    table = _json(["analyze", "overlap", str(db), "-f", "json"])
    assert [(r["rank"], r["step"]) for r in table] == [(r, -1) for r in range(9)]
    assert all(r["exposed_ns"] == r["comm_ns"] > 0 for r in table)
    sums = _json(
        [
            "sql",
            str(db),
            "SELECT rank, count(*) AS n FROM events WHERE kind = 'comm' GROUP BY 1 ORDER BY 1",
            "-f",
            "json",
        ]
    )
    assert sums == [{"rank": r, "n": 1} for r in range(9)]


def _ai_truth(src: Path) -> dict[int, dict[str, Any]]:
    rows = sqlite_rows(
        src,
        'SELECT (k.globalPid >> 24) & 16777215, k.deviceId, k.streamId, k.start, k."end", '
        "s.value LIKE 'nccl%' FROM CUPTI_ACTIVITY_KIND_KERNEL k "
        "JOIN StringIds s ON s.id = k.shortName",
    )
    out: dict[int, dict[str, Any]] = {}
    for pid, dev, stream, s, e, nccl in rows:
        t = out.setdefault(pid, {"streams": {}, "comm": [], "compute": [], "device": set()})
        t["streams"][stream] = t["streams"].get(stream, 0) + 1
        t["comm" if nccl else "compute"].append((s, e))
        t["device"].add(dev)
    return out


def test_two_ranks_in_one_report(ai: tuple[Path, Path]) -> None:
    src, db = ai
    truth = _ai_truth(src)
    assert sorted(truth) == [144, 145]
    ranks = _json(["sql", str(db), "SELECT rank, pid, host FROM ranks ORDER BY rank", "-f", "json"])
    assert ranks == [
        {"rank": 0, "pid": 144, "host": "modal"},
        {"rank": 1, "pid": 145, "host": "modal"},
    ]
    per_stream = _json(
        [
            "sql",
            str(db),
            "SELECT rank, stream, count(*) AS n, count(*) FILTER (kind = 'comm') AS comm "
            "FROM events WHERE cat = 'kernel' GROUP BY ALL ORDER BY ALL",
            "-f",
            "json",
        ]
    )
    want = [
        {"rank": r, "stream": st, "n": n, "comm": len(truth[pid]["comm"])}
        for r, pid in ((0, 144), (1, 145))
        for st, n in truth[pid]["streams"].items()
    ]
    assert per_stream == want and [w["comm"] for w in want] == [33, 33]
    rep = _json(["report", str(db), "-f", "json"])
    assert rep["facts"]["ranks"] == [0, 1] and rep["facts"]["formats"] == ["nsys"]
    for row in rep["analyses"]["overlap"]["by_rank"]:
        t = truth[144 + row["rank"]]
        assert row["comm_ns"] == _union(t["comm"]) and row["compute_ns"] == _union(t["compute"])
        assert row["hidden_ns"] == 0  # NCCL ran on the compute stream: nothing could hide
    for row in rep["analyses"]["breakdown"]["by_rank"]:
        assert row["idle_ns"] >= 0 and 0 <= row["idle_share"] <= 1
        assert 0 <= row["compute_share"] + row["comm_share"] <= 1  # one stream: no overlap


def test_report_header_without_step_marks_or_gpu_model(ai: tuple[Path, Path]) -> None:
    """This export has no ProfilerStep ranges (the run is one pseudo-step, -1) and no
    TARGET_INFO_GPU: the header said "steps: -1" and Markdown said "devices: CPU"."""
    src, db = ai
    assert not sqlite_rows(src, "SELECT 1 FROM sqlite_master WHERE name = 'TARGET_INFO_GPU'")
    rep = _json(["report", str(db), "-f", "json"])
    assert rep["facts"]["steps"] == [-1] and not rep["facts"]["devices"]
    text = runner.invoke(app, ["report", str(db)], env={"COLUMNS": "200"}).output
    head = text.splitlines()[0]
    assert "steps: none marked (the whole trace is one window)" in head, head
    assert "GPU model not recorded" in head and "-1" not in head
    md = runner.invoke(app, ["report", str(db), "-f", "markdown"]).stdout.splitlines()
    assert md[2] == (
        "ranks: 2, steps: none marked (the whole trace is one window), GPU model not recorded"
    )
    # a replayed saving names both of its times in ms
    gains = [ln for ln in text.splitlines() if "saves ~" in ln]
    assert gains and all("ms/step" in ln and "at stake ~" in ln for ln in gains)
    assert all(ln.rstrip().endswith(" ms)") for ln in gains), gains


def test_mixed_run_refused_unless_allowed(ai: tuple[Path, Path], tmp_path: Path) -> None:
    src, _ = ai
    files = [str(KINETO / "rank3.json.gz"), str(src)]  # Kineto rank 3, Nsight ranks 0 and 1
    out = tmp_path / "m.duckdb"
    res = runner.invoke(app, ["ingest", *files, "-o", str(out)])
    assert res.exit_code == 1 and "Traceback" not in res.output and not out.exists()
    assert "error:" in res.output and "mixes 1 Kineto trace(s)" in res.output
    assert "hint:" in res.output and "--allow-mixed" in res.output
    rep = runner.invoke(app, ["report", *files, "-f", "json"])
    assert rep.exit_code == 1 and "--allow-mixed" in rep.output
    forced = runner.invoke(app, ["ingest", *files, "-o", str(out), "--allow-mixed"])
    assert forced.exit_code == 0, forced.output
    assert "ingested 3 rank(s)" in forced.output and "mixed run allowed" in forced.output
    both = _json(["report", *files, "-f", "json", "--allow-mixed"])
    assert both["facts"]["ranks"] == [0, 1, 3]
    assert sorted(both["facts"]["formats"]) == ["kineto", "nsys"]


def _bad_files(good: Path, where: Path) -> dict[str, Path]:
    """A truncated copy of a real export, a foreign SQLite file, and a copy kept locked."""
    data = good.read_bytes()
    bad = {
        k: where / f"{k}_rank{i + 20}.sqlite" for i, k in enumerate(("cut", "foreign", "locked"))
    }
    bad["cut"].write_bytes(data[: len(data) // 2])
    con = sqlite3.connect(bad["foreign"])
    con.execute("CREATE TABLE people (name TEXT)")
    con.commit()
    con.close()
    bad["locked"].write_bytes(data)
    return bad


def test_bad_sqlite_inputs_error_or_skip(shared_traces: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    good = sorted(shared_traces.joinpath(*DSL).glob("*ault42*.sqlite"))  # ranks 0-2
    for f in good:
        (run / f.name).write_bytes(f.read_bytes())
    bad = _bad_files(good[0], run)
    writer = sqlite3.connect(bad["locked"], check_same_thread=False)
    writer.execute("BEGIN EXCLUSIVE")  # as if nsys export were still writing it
    try:
        for kind, path in bad.items():
            res = runner.invoke(app, ["ingest", str(path), "-o", str(tmp_path / "x.duckdb")])
            assert res.exit_code == 1 and "Traceback" not in res.output, kind
            text = " ".join(res.output.split())  # rich wraps long paths
            assert "error:" in text and "hint:" in text and str(path) in text.replace(" ", "")
        listed = runner.invoke(app, ["report", str(run), "--skip-bad"])
        assert listed.exit_code == 0, listed.output
        text = "".join(listed.output.split())
        assert all(f"skipped:{p}" in text for p in bad.values())
        assert "ranks:3of9" in text and "missingranks:[3,4,5,6,7,8]" in text
    finally:
        writer.rollback()
        writer.close()
