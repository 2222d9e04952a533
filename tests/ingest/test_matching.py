"""Collective matching: instance ids across ranks, p2p pairing, mismatches and the hang culprit,
on hand-built jobs and on real multi-rank traces (100% of communication ops matched)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import duckdb
import pytest
from kineto_builder import KinetoTrace, PgConfig
from multirank import gpu_job
from ranklens.analysis import collectives

Ingest = Callable[..., duckdb.DuckDBPyConnection]
SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"


def _status(con: duckdb.DuckDBPyConnection) -> dict[str, int]:
    return dict(con.execute("SELECT status, count(*) FROM collectives GROUP BY ALL").fetchall())


def test_collectives_share_instance_ids(ingest: Ingest) -> None:
    job = gpu_job(4)
    for k in range(3):
        job.collective("all_reduce", {r: 1000 + 100 * k + r for r in range(4)}, 1500 + 100 * k)
    con = ingest(job.traces)
    rows = con.execute(
        "SELECT seq, list(DISTINCT instance_id), count(*), any_value(bytes), any_value(status) "
        "FROM collectives GROUP BY seq ORDER BY seq"
    ).fetchall()
    assert [(s, len(ids), n) for s, ids, n, _, _ in rows] == [(0, 1, 4), (1, 1, 4), (2, 1, 4)]
    assert {b for *_, b, _ in rows} == {(1 << 20) * 4}  # 1 Mi float elements
    assert _status(con) == {"matched": 12}


def test_missing_rank_is_the_hang_culprit(ingest: Ingest) -> None:
    """Rank 2 never joins the third all-reduce: that instance is incomplete, and the finding
    names rank 2, the group and the sequence number."""
    job = gpu_job(4)
    for k in range(3):
        ranks = range(4) if k < 2 else (0, 1, 3)
        job.collective("all_reduce", {r: 1000 + 1000 * k for r in ranks}, 1500 + 1000 * k)
    con = ingest(job.traces)
    assert _status(con) == {"matched": 8, "incomplete": 3}
    res = collectives.run(con)
    mism = res.tables["mismatches"].to_dicts()
    assert len(mism) == 1
    assert (mism[0]["pg_name"], mism[0]["seq"], mism[0]["status"]) == ("0", 2, "incomplete")
    assert mism[0]["missing_ranks"] == [2] and mism[0]["ranks"] == [0, 1, 3]
    (f,) = [f for f in res.findings if f.code == "COLLECTIVE_MISMATCH"]
    assert f.severity.value == "critical" and f.ranks == (2,)
    assert "seq 2" in f.message and "rank(s) [2]" in f.message


def test_size_and_op_mismatch(ingest: Ingest) -> None:
    job = gpu_job(2)
    job.collective("all_reduce", {0: 100, 1: 100}, 200)
    job.collective("all_reduce", {0: 300}, 400, nelems=1024)
    job.collective("all_reduce", {1: 300}, 400, nelems=2048)
    job.collective("all_reduce", {0: 500}, 600)
    job.collective("all_gather", {1: 500}, 600)
    con = ingest(job.traces)
    got = con.execute(
        "SELECT seq, any_value(status) FROM collectives GROUP BY seq ORDER BY seq"
    ).fetchall()
    assert got == [(0, "matched"), (1, "size_mismatch"), (2, "op_mismatch")]
    assert any(f.code == "COLLECTIVE_MISMATCH" for f in collectives.run(con).findings)


def test_p2p_paired_by_peer_and_order(ingest: Ingest) -> None:
    """Send/recv in a two-rank group: the peer is the other member; k-th send pairs with the
    k-th receive of the same direction, whatever else runs in between."""
    pp = PgConfig("1", [0, 1], "PIPELINE_MODEL_PARALLEL_GROUP")
    job = gpu_job(2, groups=[pp])
    for k in range(3):
        job.collective("send", {0: 100 + 1000 * k}, 200 + 1000 * k, pg="1")
        job.collective("recv", {1: 150 + 1000 * k}, 200 + 1000 * k, pg="1")
        job.collective("send", {1: 500 + 1000 * k}, 600 + 1000 * k, pg="1")
        job.collective("recv", {0: 520 + 1000 * k}, 600 + 1000 * k, pg="1")
    con = ingest(job.traces)
    assert _status(con) == {"matched": 12}
    rows = con.execute(
        "SELECT instance_id, list(rank ORDER BY rank), list(op ORDER BY rank), "
        "list(peer ORDER BY rank), any_value(seq) FROM collectives GROUP BY ALL ORDER BY 1"
    ).fetchall()
    assert len(rows) == 6
    for _, ranks, ops, peers, _ in rows:
        assert ranks == [0, 1] and peers == [1, 0] and sorted(ops) == ["recv", "send"]
    label = con.execute("SELECT parallelism FROM process_groups WHERE pg_name = '1'").fetchall()
    assert label == [("PP",)]


def test_trace_window_cut_is_realigned(ingest: Ingest) -> None:
    """Rank 1's trace misses the group's first collective (its window opened later): its
    positions shift by one so the rest still match, and only the first instance is short."""
    job = gpu_job(2)
    for k in range(4):
        ranks = (0, 1) if k else (0,)
        nel = 1024 * (k + 1)
        job.collective("all_reduce", {r: 100 + 1000 * k for r in ranks}, 500 + 1000 * k, nelems=nel)
    con = ingest(job.traces)
    got = con.execute(
        "SELECT seq, count(*), any_value(status) FROM collectives GROUP BY seq ORDER BY seq"
    ).fetchall()
    assert got == [(0, 1, "incomplete"), (1, 2, "matched"), (2, 2, "matched"), (3, 2, "matched")]


def _seq_job(seqs: dict[int, list[int]] | None) -> list[KinetoTrace]:
    """Two ranks, three all-reduces each, with the `Seq` numbers given per rank (None: none)."""
    job = gpu_job(2)
    for k in range(3):
        job.collective("all_reduce", {0: 100 + 1000 * k, 1: 120 + 1000 * k}, 500 + 1000 * k)
    for rank, numbers in (seqs or {}).items():
        kernels = [e for e in job.traces[rank].events if e.get("cat") == "kernel"]
        for ev, n in zip(sorted(kernels, key=lambda e: e["ts"]), numbers, strict=True):
            ev["args"]["Seq"] = n
    return job.traces


def test_given_sequence_numbers_win_and_a_repeated_one_is_a_duplicate(ingest: Ingest) -> None:
    """With the trace's `Seq` on every op, instances follow it, not the ops' order; rank 1
    giving one number twice is a duplicate (it joined that collective twice), its other
    instance is short of rank 1. Without `Seq`, the same ops pair by position."""
    by_seq = ingest(_seq_job({0: [7, 8, 9], 1: [7, 7, 9]}))
    got = by_seq.execute(
        "SELECT seq, count(*), count(DISTINCT rank), any_value(status) FROM collectives "
        "GROUP BY seq ORDER BY seq"
    ).fetchall()
    assert got == [(7, 3, 2, "duplicate"), (8, 1, 1, "incomplete"), (9, 2, 2, "matched")]
    by_order = ingest(_seq_job(None))
    assert _status(by_order) == {"matched": 6}
    assert by_order.execute("SELECT DISTINCT seq FROM collectives ORDER BY 1").fetchall() == [
        (0,),
        (1,),
        (2,),
    ]


@pytest.mark.parametrize(
    "scenario", sorted(p.name for p in SAMPLES.iterdir() if (p / "raw").is_dir())
)
def test_samples_fully_matched(scenario: str, ingest: Ingest) -> None:
    """Every gloo communication span of the real CPU jobs gets a group and an instance."""
    con = ingest([SAMPLES / scenario / "raw"])
    n_rows = con.execute("SELECT count(*) FROM collectives").fetchall()[0][0]
    assert _status(con) == {"matched": n_rows}
    n_comm = con.execute("SELECT count(*) FROM events WHERE kind = 'comm'").fetchall()[0][0]
    assert n_comm == n_rows
    assert con.execute(
        "SELECT count(*) FROM events WHERE kind = 'comm' AND pg_name IS NULL"
    ).fetchall() == [(0,)]


def test_dlrm_fully_matched(shared_traces: Path, ingest: Ingest) -> None:
    """8 V100 ranks, old Kineto without args: the group is inferred from the op sequence and
    every NCCL kernel (3 all-reduce + 5 grouped send/recv per rank) is matched."""
    con = ingest([shared_traces / "param-dlrm-kineto" / "extracted"])
    assert _status(con) == {"matched": 64}
    per_instance = con.execute(
        "SELECT count(*) FROM collectives GROUP BY instance_id HAVING count(*) <> 8"
    ).fetchall()
    assert per_instance == []
