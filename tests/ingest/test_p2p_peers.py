"""P2p peers from Kineto traces: record_param_comms' `Dst Rank` / `Src Rank` (global ranks) are
read by both decoders, carried to the NCCL SendRecv kernel by External id, and pair each send
with its receive. A three-stage pipeline makes position-only matching fail, so these tests can.
"""

from __future__ import annotations

import mmap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb
import pytest
from kineto_builder import KinetoTrace, PgConfig
from multirank import gpu_job
from ranklens.ingest import kineto, kineto_fast
from ranklens.ingest.errors import TraceFormatError

IngestFn = Callable[..., duckdb.DuckDBPyConnection]
Expected = list[tuple[int, str, int, float]]
PP = PgConfig("1", [0, 1, 2], "PIPELINE_MODEL_PARALLEL_GROUP")
NELEMS = 4096


@pytest.fixture(params=["scanner", "reference"])
def decoder(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run a test under the C scanner and under the msgspec reference decoder."""
    if request.param == "reference":
        monkeypatch.setenv("RANKLENS_PURE_PYTHON", "1")
    elif not kineto_fast.available():
        pytest.skip("C scanner not built")
    return str(request.param)


def _p2p(
    t: KinetoTrace, op: str, peer: int, start: float, end: float, peer_field: Any = "int"
) -> None:
    """A send/recv as newer torch writes it: record_param_comms (with the peer unless
    peer_field is None) and the SendRecv kernel it launched, sharing one External id."""
    k = t.nccl(
        "SendRecv",
        start,
        end - start,
        coll=op,
        pg_name=PP.pg_name,
        group_size=3,
        nelems=NELEMS,
        dtype="BFloat16",
        stream=30,
    )
    args: dict[str, Any] = {
        "External id": k["args"]["External id"],
        "Collective name": op,
        "Process Group Name": PP.pg_name,
        "Group size": 3,
        "In msg nelems": NELEMS,
        "Out msg nelems": NELEMS,
        "dtype": "BFloat16",
        "Rank": PP.ranks.index(peer),  # the peer's *group* rank: must not be read
    }
    if peer_field is not None:
        value = str(peer) if peer_field == "text" else peer if peer_field == "int" else peer_field
        args["Dst Rank" if op == "send" else "Src Rank"] = value
    t.host("record_param_comms", start - 3, 2, args=args)


# (rank, op, peer) in each rank's time order: forward of two microbatches, then backward.
# Stage 1 receives before it sends (Megatron's parity order), so positions do not pair.
def _schedule() -> list[tuple[int, int, float, float]]:
    """(sender, receiver, start, end) of each transfer; both sides end together."""
    out: list[tuple[int, int, float, float]] = []
    for mb in range(2):
        t0 = 1000 + 1000 * mb
        out += [(0, 1, t0, t0 + 100), (1, 2, t0 + 300, t0 + 400)]
    for mb in range(2):
        t0 = 5000 + 1000 * mb
        out += [(2, 1, t0, t0 + 100), (1, 0, t0 + 300, t0 + 400)]
    return out


def _pipeline(tmp_path: Path, peer_field: Any = "int") -> tuple[list[Path], Expected]:
    """Write the 3-rank job; returns the trace paths and the expected (rank, op, peer, end)."""
    job = gpu_job(3, groups=[PP])
    expected: Expected = []
    for src, dst, start, end in _schedule():
        _p2p(job.traces[src], "send", dst, start, end, peer_field)
        _p2p(job.traces[dst], "recv", src, start + 20, end, peer_field)
        expected += [(src, "send", dst, end), (dst, "recv", src, end)]
    paths = [t.write(tmp_path / f"rank{t.rank}.json") for t in job.traces]
    return paths, sorted(expected, key=lambda r: (r[0], r[3]))


def _scanner_takes(path: Path) -> bool:
    """Whether the C scanner decodes every piece of the file itself (no fallback)."""
    prep = kineto.prepare(str(path), 1 << 20)
    try:
        with open(prep.data_path, "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as m:
            return all(
                kineto_fast.columns(m, lo, hi, True, "nccl", 0, 0, 0) is not None
                for lo, hi in prep.pieces
            )
    finally:
        kineto.cleanup(prep)


def _kernels(con: duckdb.DuckDBPyConnection) -> list[tuple[Any, ...]]:
    return con.execute(
        "SELECT rank, coll_op, peer FROM events WHERE kind = 'comm' AND device >= 0 "
        "ORDER BY rank, ts_ns"
    ).fetchall()


@pytest.mark.parametrize("peer_field", ["int", "text"])
def test_peers_reach_kernels_and_pair_sends_with_recvs(
    tmp_path: Path, ingest: IngestFn, decoder: str, peer_field: str
) -> None:
    paths, expected = _pipeline(tmp_path, peer_field)
    if decoder == "scanner":
        assert all(_scanner_takes(p) for p in paths), "the scanner fell back: not tested"
    con = ingest(paths)
    assert _kernels(con) == [(r, op, peer) for r, op, peer, _ in expected]
    # the host op keeps its peer but is not communication itself (no double count)
    host = con.execute(
        "SELECT DISTINCT kind, peer IS NOT NULL FROM events WHERE name = 'record_param_comms'"
    ).fetchall()
    assert host == [("cpu_op", True)]
    assert con.execute("SELECT count(*) FROM collectives").fetchall() == [(len(expected),)]
    inst = con.execute(
        "SELECT list((rank, op, peer, end_ns) ORDER BY op DESC), any_value(status) "
        "FROM collectives GROUP BY instance_id ORDER BY min(end_ns), min(rank)"
    ).fetchall()
    assert {status for _, status in inst} == {"matched"}
    pairs = [[tuple(r) for r in rows] for rows, _ in inst]
    assert len(pairs) == len(_schedule())
    for (s_rank, s_op, s_peer, s_end), (r_rank, r_op, r_peer, r_end) in pairs:
        assert (s_op, r_op) == ("send", "recv")
        assert (s_peer, r_peer) == (r_rank, s_rank)
        assert s_end == r_end  # the k-th send with the k-th recv of that direction


def test_without_peer_fields_peer_stays_null(
    tmp_path: Path, ingest: IngestFn, decoder: str
) -> None:
    """Older torch writes no Dst/Src Rank: nothing is guessed at ingest and nothing breaks."""
    paths, expected = _pipeline(tmp_path, peer_field=None)
    con = ingest(paths)
    assert con.execute("SELECT count(peer) FROM events").fetchall() == [(0,)]
    assert [(r, op) for r, op, _ in _kernels(con)] == [(r, op) for r, op, _, _ in expected]
    assert con.execute("SELECT count(*) FROM collectives").fetchall() == [(len(expected),)]


def test_batched_p2p_with_several_peers_gets_none(ingest: IngestFn, decoder: str) -> None:
    """A kernel launched for ops with different peers (one External id) is not given either;
    several ops naming the same peer still give it."""
    t = KinetoTrace(rank=1, world_size=3, pg_config=[PP])
    t.step(1, 0, 10_000)
    for i, peers in enumerate(([0, 2], [2, 2])):
        k = t.nccl("SendRecv", 1000 + 1000 * i, 50, coll="send", pg_name="1", group_size=3)
        for p in peers:
            args = {"External id": k["args"]["External id"], "Dst Rank": p}
            t.host("record_param_comms", 990 + 1000 * i, 2, args=args)
    con = ingest(t)
    assert [peer for *_, peer in _kernels(con)] == [None, 2]


@pytest.mark.parametrize(
    ("value", "shown"),
    [(2**40, "1099511627776"), ("two", "'two'"), (-1, "-1"), ("1" * 12, "'111111111111'")],
)
def test_bad_peer_is_a_clear_error(
    tmp_path: Path, ingest: IngestFn, decoder: str, value: Any, shown: str
) -> None:
    """A peer that is not a rank in int32 stops the ingest with the file and the field named,
    whichever decoder ran (the scanner leaves such values to the reference)."""
    paths, _ = _pipeline(tmp_path)
    job = gpu_job(3, groups=[PP])
    _p2p(job.traces[1], "send", 2, 100, 200, peer_field=value)
    bad = job.traces[1].write(tmp_path / "bad" / "rank1.json")
    with pytest.raises(TraceFormatError) as err:
        ingest([paths[0], bad, paths[2]])
    msg = str(err.value)
    assert str(bad) in msg and "`Dst Rank`" in msg and shown in msg
