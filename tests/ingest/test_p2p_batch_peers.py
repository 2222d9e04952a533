"""Batched send/recv without peers (torch < 2.5, Megatron's batch_p2p_comm): the rendezvous
rule on hand-built batches, what it must leave unknown, and the report it makes possible.

Peers and clocks against the generator's truth on whole jobs are in test_p2p_infer.py (its
`batched_no_peers_*` jobs). Here: the rule's cases by hand (a few batches whose answer is
obvious), the schedules it must not name (interleaved, GPipe's two-message batches: unknown,
never wrong), and the report of a two-host job, which must read as the report of the same job
whose trace gave every peer.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest
from ranklens.cli.main import app
from ranklens.ingest import load_traces
from ranklens.ingest.p2p_rendezvous import Batch, in_flight_together, ring, solve_all
from ranklens.sample_traces.gpu_job import GpuJob, write_job
from typer.testing import CliRunner

RANKS = [10, 11, 12, 13]  # a pipeline group's ranks in stage order
TOL = 10


def _b(pos: int, end: int, sends: int, recvs: int, start: int | None = None) -> Batch:
    rank = RANKS[pos - 1]
    b = Batch("pp", "", pos, end - 5 if start is None else start, end, 0)
    b.sends = [(rank, end, 7, "send", k) for k in range(sends)]
    b.recvs = [(rank, end, 7, "recv", k) for k in range(recvs)]
    b.sizes = {4096}
    return b


def _peers(batches: list[Batch]) -> dict[tuple[int, str], int]:
    return {(op[0], op[3]): peer for op, peer, _b in solve_all(batches, RANKS, TOL)}


def test_counts_follow_from_the_first_stage() -> None:
    """Stages 1-4 end together: 1 sends, 2 receives, 3 sends and receives, 4 receives and
    sends. Stage 1 can only talk to 2, so 2's recv is 1's send and 2 has nothing left for 3;
    3 then talks to 4 both ways, which closes at the last stage."""
    got = _peers([_b(1, 100, 1, 0), _b(2, 101, 0, 1), _b(3, 99, 1, 1), _b(4, 100, 1, 1)])
    assert got == {
        (10, "send"): 11,
        (11, "recv"): 10,
        (12, "send"): 13,
        (12, "recv"): 13,
        (13, "send"): 12,
        (13, "recv"): 12,
    }


def test_two_pairs_ending_together_are_told_apart() -> None:
    """Lockstep: 1<->2 and 3<->4 exchange at the same moment; 'nearest end' cannot tell 2's
    partner (1 or 3), the counts can: 1 talks only to 2."""
    got = _peers([_b(1, 100, 1, 1), _b(2, 100, 1, 1), _b(3, 100, 1, 1), _b(4, 100, 1, 1)])
    assert got[11, "send"] == 10 and got[12, "send"] == 13 and got[13, "recv"] == 12


@pytest.mark.parametrize(
    "batches",
    [
        [_b(1, 100, 1, 0), _b(2, 100, 0, 0)],  # stage 1's send has no recv: counts do not close
        [_b(2, 100, 1, 1), _b(3, 100, 1, 0)],  # 2's recv would come from absent stage 1
        [_b(1, 100, 1, 0), _b(2, 100, 1, 1), _b(3, 100, 0, 1)],  # 2 talks both ways: two partners
        [_b(1, 100, 1, 0), _b(2, 100, 0, 1), _b(2, 104, 0, 1)],  # two batches of stage 2
    ],
    ids=["unclosed", "absent_stage", "two_partners", "stage_twice"],
)
def test_what_the_rule_leaves_unknown(batches: list[Batch]) -> None:
    assert solve_all(batches, RANKS, TOL) == []


def test_sizes_that_differ_are_not_split() -> None:
    a, b = _b(1, 100, 1, 0), _b(2, 100, 0, 1)
    b.sizes = {8192}
    assert solve_all([a, b], RANKS, TOL) == []


def test_in_flight_together_and_ring() -> None:
    """The k-th send and recv of a pair must have run at once; a group whose end stages talk
    as much as the middle ones is a ring (interleaved), one with half as much is straight."""
    ok = solve_all([_b(1, 100, 1, 0, start=50), _b(2, 100, 0, 1, start=90)], RANKS, TOL)
    assert ok and in_flight_together(ok, TOL)
    # the recv's kernel began after the send's ended: not one message
    late = solve_all(
        [_b(1, 100, 1, 0, start=50), _b(2, 100, 0, 1, start=100 + 2 * TOL)], RANKS, TOL
    )
    assert late and not in_flight_together(late, TOL)
    straight = [_b(1, 1, 1, 1), _b(2, 2, 2, 2), _b(3, 3, 2, 2), _b(4, 4, 1, 1)]
    assert not ring(straight, 4)
    assert ring([_b(1, 1, 2, 1), _b(2, 2, 2, 2), _b(3, 3, 2, 2), _b(4, 4, 1, 2)], 4)


@pytest.mark.parametrize(
    "job",
    [
        GpuJob(pp=4, m=8, v=2, schedule="interleaved", batched=True, peers=False, ranks_per_host=2),
        GpuJob(pp=3, m=6, schedule="gpipe", batched=True, peers=False, ranks_per_host=1),
    ],
    ids=["interleaved", "gpipe"],
)
def test_schedules_it_cannot_read_stay_unknown_never_wrong(job: GpuJob, tmp_path: Path) -> None:
    """Interleaved calls batch ops with both neighbours; GPipe's turn batches two messages
    that end apart. Whatever is named must be the true peer; the rest stays unknown."""
    run = write_job(job, tmp_path / "run")
    db = tmp_path / "run.duckdb"
    load_traces([tmp_path / "run"], db, workers=1)
    con = duckdb.connect(str(db), read_only=True)
    rows = con.execute(
        "SELECT rank, op, ts_ns, peer, status FROM collectives WHERE op IN ('send', 'recv')"
    ).fetchall()
    truth: dict[tuple[int, str], set[int]] = {}
    for rank in range(job.world):
        for t in run.timed[rank]:
            for o in t.meta.get("ops", [t.meta]) if t.kind == "p2p" else []:
                truth.setdefault((rank, str(o["op"])), set()).add(int(o["peer"]))
    named = [(r, o, p) for r, o, _t, p, s in rows if s != "peer_unknown"]
    assert all(p in truth[r, o] for r, o, p in named)
    assert len(named) < len(rows)  # the rule declined some: these schedules are not 1F1B


def test_the_report_reads_as_with_peers(tmp_path: Path) -> None:
    """Two hosts (stages 0-1 and 2-3), a slow rank: without peers the report said m=9, named
    a second straggler and could not align the hosts. Now it is the report of the same job
    whose trace gave every peer, word for word."""
    runner = CliRunner()
    text = {}
    for peers in (True, False):
        job = GpuJob(
            tp=2, dp=2, pp=4, m=8, steps=3, batched=True, peers=peers, rank_factor={5: 1.3}
        )
        write_job(job, tmp_path / f"run{peers}")
        db = tmp_path / f"run{peers}.duckdb"
        load_traces([tmp_path / f"run{peers}"], db, workers=1)
        res = runner.invoke(app, ["report", str(db)], env={"COLUMNS": "200"})
        text[peers] = res.stdout  # stderr names the file its results were stored in
    assert text[False] == text[True]
    assert "m=8 micro-batches" in text[True] and "clock alignment: collectives, p2p" in text[True]
    assert "holding the job back: rank 5" in text[True]


def test_unknown_peers_are_said_and_no_schedule_is_guessed(tmp_path: Path) -> None:
    """An interleaved job without peers (the rule declines it): the pipeline analysis guessed
    each op's side from kernel overlap and reported "1f1b with p=4 stages and m=6" with a
    stage imbalance, and the straggler analysis named rank 0. Now no schedule is read from ops
    without a side, their end still releases the rank, and the report says how many send/recv
    have no peer."""
    job = GpuJob(
        tp=2, pp=4, m=8, v=2, schedule="interleaved", batched=True, peers=False, ranks_per_host=2
    )
    write_job(job, tmp_path / "run")
    db = tmp_path / "run.duckdb"
    load_traces([tmp_path / "run"], db, workers=1)
    out = CliRunner().invoke(app, ["report", str(db)], env={"COLUMNS": "200"}).output
    unknown = (
        duckdb.connect(str(db), read_only=True)
        .execute("SELECT count(*) FROM collectives WHERE status = 'peer_unknown'")
        .fetchone()
    )
    assert unknown is not None and unknown[0] > 0
    assert f"send/recv without a peer: {unknown[0]:,}" in out
    assert "PIPELINE_BUBBLE_SCHEDULE" not in out and "1f1b with" not in out
    assert "PIPELINE_STAGE_IMBALANCE" not in out
    # A stage waiting on such a recv is released when it ends: no straggler (the same job with
    # peers has none; rank 0 was named by 2.1 ms/step).
    assert "stragglers: none" in out and "STRAGGLER_RANK" not in out
