"""A replay that would keep unmatched communication's waits does not price the findings.

An interleaved, batched job whose trace names no send/recv peer (torch < 2.5): the rendezvous
rule declines it, so its PP ops stay `peer_unknown` and the dependency graph keeps each one at
its measured length, wait included. The straggler's fix then replayed as "saves ~0.000
ms/step" while the same job with peers replays it at ~1.1 ms. Now the findings keep their time
at stake and the report, `whatif` and the dashboard's data say why.
"""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
from ranklens.analysis import report as rp
from ranklens.analysis import whatif as wi
from ranklens.analysis._base import Finding
from ranklens.cli.main import app
from ranklens.ingest import load_traces
from ranklens.sample_traces.gpu_job import GpuJob, write_job
from typer.testing import CliRunner


def _job(tmp_path: Path, peers: bool) -> Path:
    job = GpuJob(
        tp=2, pp=4, m=8, v=2, schedule="interleaved", batched=True, peers=peers,
        rank_factor={3: 1.3},
    )  # fmt: skip
    write_job(job, tmp_path / f"run{peers}")
    db = tmp_path / f"run{peers}.duckdb"
    load_traces([tmp_path / f"run{peers}"], db, workers=1)
    return db


def _straggler(rep: rp.Report) -> Finding:
    (f,) = [f for f in rep.findings if f.code == "STRAGGLER_RANK"]
    assert f.ranks == (3,)
    return f


def test_unmatched_waits_keep_the_estimate_and_say_why(tmp_path: Path) -> None:
    with_peers, without = _job(tmp_path, True), _job(tmp_path, False)
    with duckdb.connect(str(with_peers), read_only=True) as con:
        rep = rp.build_report(con)
    assert rep.facts["replay"] == {"used": True, "unlinked_ops": 0, "unlinked_share": 0.0}
    f = _straggler(rep)
    assert f.saving_ns is not None and f.saving_ns > 500_000  # the replay sees rank 3's cost

    with duckdb.connect(str(without), read_only=True) as con:
        rep = rp.build_report(con)
        (unknown,) = con.execute(
            "SELECT count(*) FROM collectives WHERE status = 'peer_unknown'"
        ).fetchone() or (0,)
        (others,) = con.execute(
            "SELECT count(*) FROM collectives WHERE status NOT IN ('matched', 'peer_unknown')"
        ).fetchone() or (0,)
    assert unknown > 0 and others == 0
    replay = rep.facts["replay"]
    assert replay["used"] is False and replay["unlinked_ops"] == unknown
    assert wi.MAX_UNLINKED_SHARE < replay["unlinked_share"] <= 1.0
    f = _straggler(rep)
    assert f.saving_ns is None and f.time_at_stake_ns > 1_000_000  # was "saves ~0.000"
    assert all(fd.saving_ns is None for fd in rep.findings)

    runner = CliRunner()
    text = runner.invoke(app, ["report", str(without)], env={"COLUMNS": "200"}).output
    assert f"not replayed: {unknown:,} comm ops" in text and "saves ~" not in text
    ans = json.loads(runner.invoke(app, ["whatif", str(without), "--format", "json"]).output)
    assert ans["unmatched_note"].startswith(f"{unknown:,} comm ops")
    replayed = [s for s in ans["scenarios"] if s["name"] != "contention"]
    note = "unmatched comm keeps its measured waits"
    assert replayed and all(s["note"] == note for s in replayed)
    ans = json.loads(runner.invoke(app, ["whatif", str(with_peers), "--format", "json"]).output)
    assert ans["unmatched_note"] is None


def test_the_share_is_of_the_ops_time() -> None:
    """Hand-built: 3 ms of peer_unknown among 10 ms of communication, one incomplete op of 1 ms
    (a member never joined), and 6 ms matched or with no other member in the run."""
    con = duckdb.connect()
    con.execute("CREATE TABLE collectives (status VARCHAR, ts_ns BIGINT, end_ns BIGINT)")
    con.execute(
        "INSERT INTO collectives VALUES ('peer_unknown', 0, 2000000), "
        "('peer_unknown', 5000000, 6000000), ('incomplete', 0, 1000000), "
        "('matched', 0, 4000000), ('others_absent', 0, 2000000)"
    )
    u = wi.unlinked(con)
    assert (u.ops, u.share, u.blind) == (3, 0.4, True)
    con.execute("DELETE FROM collectives WHERE status <> 'matched'")
    assert wi.unlinked(con) == wi.Unlinked(0, 0.0)
