"""Send/recv peers where the trace gives none (older torch, Nsight), and clocks of hosts that
only send/recv join, on GPU-shaped jobs with exact truth (sample_traces/gpu_job.py).

Truth is the generator's: each p2p kernel's real peer, and each host's clock shift. With
Megatron's layout (tp fastest, then dp, then pp; 8 ranks per host) the stages sit on their own
hosts, so no DP or TP collective crosses hosts: only pipeline messages can align them.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import duckdb
import pytest
from ranklens.sample_traces.gpu_job import BASE_NS, GpuJob, JobRun, write_job

Ingest = Callable[..., duckdb.DuckDBPyConnection]

JOBS: dict[str, GpuJob] = {
    "1f1b_tp2_dp2_pp4": GpuJob(tp=2, dp=2, pp=4, m=8, peers=False),
    "gpipe_pp4": GpuJob(dp=2, pp=4, m=8, schedule="gpipe", peers=False, ranks_per_host=2),
    "interleaved_pp4_v2": GpuJob(tp=2, dp=2, pp=4, m=8, v=2, schedule="interleaved", peers=False),
    "1f1b_pp8_m16": GpuJob(pp=8, m=16, kernels_per_block=3, steps=1, peers=False, ranks_per_host=2),
    "straggler_pp4": GpuJob(tp=2, dp=2, pp=4, m=8, rank_factor={9: 1.3}, peers=False),
    "with_peers": GpuJob(tp=2, dp=2, pp=4, m=8),
    # batch_isend_irecv: one kernel per batch, its ops only on the host (with their peers)
    "batched_1f1b": GpuJob(tp=2, dp=2, pp=4, m=8, batched=True),
    "batched_interleaved": GpuJob(
        tp=2, pp=4, m=8, v=2, schedule="interleaved", batched=True, ranks_per_host=2
    ),
    # torch < 2.5 with Megatron's batch_p2p_comm: batches without peers (p2p_batch_peers)
    "batched_no_peers_tp2_dp2_pp4": GpuJob(tp=2, dp=2, pp=4, m=8, batched=True, peers=False),
    "batched_no_peers_pp8_host_each": GpuJob(
        pp=8, m=16, kernels_per_block=3, steps=1, batched=True, peers=False, ranks_per_host=1
    ),
    "batched_no_peers_straggler": GpuJob(
        tp=2, dp=2, pp=4, m=8, rank_factor={9: 1.3}, batched=True, peers=False, ranks_per_host=4
    ),
    "batched_no_peers_pp3_host_each": GpuJob(
        pp=3, m=6, batched=True, peers=False, ranks_per_host=1
    ),
}


def _true_peers(run: JobRun, rank: int) -> list[tuple[float, str, int]]:
    """(start, op, peer) of each p2p op; the ops of a batch share their kernel's start."""
    ops = sorted((t for t in run.timed[rank] if t.kind == "p2p"), key=lambda t: t.start)
    return sorted(
        (t.start, str(o["op"]), int(o["peer"])) for t in ops for o in t.meta.get("ops", [t.meta])
    )


@pytest.mark.parametrize("name", sorted(JOBS))
def test_peers_and_clocks_against_truth(name: str, tmp_path: Path, ingest: Ingest) -> None:
    job = JOBS[name]
    run = write_job(job, tmp_path / "run")
    con = ingest([tmp_path / "run"])
    status = dict(con.execute("SELECT status, count(*) FROM collectives GROUP BY 1").fetchall())
    assert set(status) == {"matched"}, status
    want_source = "trace" if job.peers else "inferred"
    sources = {
        s
        for (s,) in con.execute(
            "SELECT DISTINCT peer_source FROM collectives WHERE op IN ('send', 'recv')"
        ).fetchall()
    }
    assert sources == {want_source}
    for rank in range(job.world):
        got = con.execute(
            """SELECT ts_ns, op, peer FROM collectives WHERE rank = ? AND op IN ('send', 'recv')
               ORDER BY ts_ns""",
            [rank],
        ).fetchall()
        shift = job.shift_us(rank) * 1000 + BASE_NS
        mine: dict[tuple[str, int], list[float]] = defaultdict(list)
        for t, o, p in got:
            mine[(str(o), int(p))].append((t - shift) / 1000)
        want: dict[tuple[str, int], list[float]] = defaultdict(list)
        for t, o, p in _true_peers(run, rank):
            want[(o, p)].append(t)
        assert sorted(mine) == sorted(want), rank  # the same (op, peer) pairs ...
        for key, times in want.items():  # ... each as often, at the same times (1 µs)
            assert len(mine[key]) == len(times), (rank, key)
            assert all(abs(a - b) <= 1 for a, b in zip(sorted(mine[key]), times, strict=True))
    # Every send pairs with a recv of its peer (one instance = one message).
    bad = con.execute(
        """SELECT instance_id FROM collectives WHERE op IN ('send', 'recv') GROUP BY 1
           HAVING count(*) <> 2 OR count(*) FILTER (op = 'send') <> 1
               OR min(rank) = max(rank)"""
    ).fetchall()
    assert bad == []
    # Hosts are joined only through send/recv, and every clock comes back within 1 µs.
    offsets = dict(con.execute("SELECT rank, clock_offset_ns FROM ranks").fetchall())
    want = run.truth["clock_offset_ns"]
    for rank, off in offsets.items():
        assert abs(off - want[str(rank)]) <= 1_000, (rank, off, want[str(rank)])
    methods = {m for (m,) in con.execute("SELECT DISTINCT clock_method FROM ranks").fetchall()}
    assert "unconnected" not in methods and "p2p" in methods


def test_linking_needs_agreeing_messages(tmp_path: Path, ingest: Ingest) -> None:
    """A pipeline whose only cross-host messages were cut from the traces (one stage's ranks
    missing) stays unaligned and says so, rather than guessing an offset; the messages to the
    missing stage keep no peer (never paired round the ring with the last stage)."""
    job = GpuJob(tp=2, dp=2, pp=4, m=8, peers=False)
    write_job(job, tmp_path / "run")
    keep = [
        p
        for p in sorted((tmp_path / "run").glob("rank*.json"))
        if job.coords(int(p.stem[4:]))[2] != 1
    ]
    con = ingest(keep)
    methods = {m for (m,) in con.execute("SELECT DISTINCT clock_method FROM ranks").fetchall()}
    # Stage 0 (host 0) and stages 2-3 (host 1) exchange nothing directly in 1F1B.
    assert methods == {"none"}
    note = con.execute("SELECT value FROM meta WHERE key = 'align_note'").fetchone()
    assert note == ("no collective or send/recv spans two hosts",)
    unknown = con.execute(
        "SELECT DISTINCT rank // 4 FROM collectives WHERE status = 'peer_unknown'"
    ).fetchall()
    assert sorted(s for (s,) in unknown) == [0, 2]  # stage 0's and stage 2's ops to stage 1
