"""The JAX/XLA reader (`ingest/jax_trace.py`) on the real 4-process JAX run in
sample_traces/jax_cpu_dp/run, checked against the truth its generator recorded.

No jax is needed: the traces are committed. What is checked: ranks, steps, kinds, every
all-reduce matched across the ranks, the injected straggler named by `report`, the third reader
landing in the directory scan, the routing and the mixed-run rule, no Kineto file routed
elsewhere, and bad JAX files refused with an `error:` naming them.
"""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path
from typing import Any

import duckdb
import pytest
from ranklens.cli.main import app
from ranklens.ingest import jax_trace, load_traces, output, readers
from ranklens.ingest.errors import MixedFormatsError, RankError, TraceFormatError
from ranklens.ingest.inputs import scan_inputs
from typer.testing import CliRunner

REPO = Path(__file__).resolve().parents[2]
RUN = REPO / "sample_traces" / "jax_cpu_dp" / "run"
TRUTH: dict[str, Any] = json.loads((RUN / "truth.json").read_text())
HOST_FILES = sorted(RUN.glob("rank*/plugins/profile/*/vm.trace.json.gz"))
PERFETTO_FILES = sorted(RUN.glob("rank*/plugins/profile/*/perfetto_trace.json.gz"))
KINETO_SAMPLE = REPO / "sample_traces" / "straggler_rank3" / "raw" / "rank0.json.gz"
runner = CliRunner()


def q(db: Path, sql: str) -> list[tuple[Any, ...]]:
    with duckdb.connect(str(db), read_only=True) as con:
        return con.sql(sql).fetchall()


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("jax") / "run.duckdb"
    res = runner.invoke(app, ["ingest", str(RUN), "-o", str(out), "--workers", "1"])
    assert res.exit_code == 0, res.output
    assert "perfetto_trace.json.gz file(s) have their profile's" in res.output
    return out


# ---------------------------------------------------------------------------------------------
# the real run against its truth
# ---------------------------------------------------------------------------------------------
def test_the_committed_run_is_what_truth_says() -> None:
    assert TRUTH["jax_version"] == "0.10.2" and TRUTH["world_size"] == 4
    assert sorted(str(p.relative_to(RUN)) for p in (*HOST_FILES, *PERFETTO_FILES)) == sorted(
        TRUTH["trace_files"]
    )
    assert sum(p.stat().st_size for p in RUN.rglob("*.json.gz")) < 3_000_000


def test_ranks_steps_and_kinds(db: Path) -> None:
    ranks = TRUTH["ranks"]
    # one file per rank read (the HOST trace; its perfetto twin left out), rank from the dir
    assert q(db, "SELECT rank, format, status, path FROM sources ORDER BY rank") == [
        (r, "jax", "ok", str(f)) for r, f in zip(ranks, HOST_FILES, strict=True)
    ]
    assert q(db, "SELECT rank, has_gpu, host, world_size FROM ranks ORDER BY 1") == [
        (r, False, None, None) for r in ranks
    ]
    assert q(db, "SELECT rank, list(step ORDER BY step) FROM steps GROUP BY 1 ORDER BY 1") == [
        (r, TRUTH["steps"]) for r in ranks
    ]
    markers = q(db, "SELECT DISTINCT name FROM events WHERE kind = 'annotation' AND cat = 'step'")
    assert sorted(n for (n,) in markers) == [f"ProfilerStep#{s}" for s in TRUTH["steps"]]
    kinds = {k for (k,) in q(db, "SELECT DISTINCT kind FROM events")}
    assert {"compute", "comm", "annotation", "runtime", "sync"} <= kinds
    assert "memcpy" not in kinds and "cpu_op" not in kinds
    # every XLA op execution is compute or comm, on the host (-1) of a CPU-only rank
    assert q(db, "SELECT DISTINCT kind, device FROM events WHERE cat = 'xla_op' ORDER BY 1") == [
        ("compute", -1),
        ("comm", -1),
    ]


def test_every_collective_matched_across_the_ranks(db: Path) -> None:
    per_step, barrier = TRUTH["all_reduces_per_step"], TRUTH["barrier_collectives"]
    group = TRUTH["all_reduce_group"]
    comm = q(db, "SELECT DISTINCT coll_op, name FROM events WHERE kind = 'comm' ORDER BY 2")
    assert comm == [
        ("all_gather", "all-gather"),  # the barrier before step 1 (sync_global_devices)
        *[("all_reduce", n) for n in sorted(TRUTH["all_reduce_hlo_ops"])],
    ]
    per_rank_step = "SELECT DISTINCT count(*) FROM events WHERE kind = 'comm' GROUP BY rank, step"
    assert q(db, per_rank_step + " HAVING step IS NOT NULL") == [(per_step,)]
    assert q(db, per_rank_step + " HAVING step IS NULL") == [(barrier,)]
    assert q(db, "SELECT ranks, source FROM process_groups") == [(group, "inferred_sequence")]
    n = len(TRUTH["steps"]) * per_step
    assert q(
        db,
        """SELECT status, op, count(DISTINCT instance_id), count(*) FROM collectives
           GROUP BY ALL ORDER BY op""",
    ) == [
        ("matched", "all_gather", barrier, barrier * len(group)),
        ("matched", "all_reduce", n, n * len(group)),
    ]
    # each instance is one step's same HLO op on every rank
    assert q(
        db,
        """SELECT DISTINCT count(DISTINCT rank), count(DISTINCT step), count(DISTINCT name)
           FROM collectives WHERE step IS NOT NULL GROUP BY instance_id""",
    ) == [(len(group), 1, 1)]


def test_the_injected_straggler_is_named(db: Path) -> None:
    slow = TRUTH["slow_rank"]
    res = runner.invoke(app, ["report", str(db)])
    assert res.exit_code == 0, res.output
    assert f"stragglers: holding the job back: rank {slow} by" in res.output
    n = len(TRUTH["all_reduce_group"]) * (
        len(TRUTH["steps"]) * TRUTH["all_reduces_per_step"] + TRUTH["barrier_collectives"]
    )
    assert f"collectives: {n} of {n} comm ops matched (100.0%)" in res.output
    # and why: the slow rank computes most of the injected time per step, the others wait
    rows = q(
        db,
        """SELECT rank, sum(dur_ns) FILTER (WHERE kind = 'compute') / 4,
                  sum(dur_ns) FILTER (WHERE kind = 'comm') / 4
           FROM events WHERE step IS NOT NULL GROUP BY 1 ORDER BY 1""",
    )
    compute = {r: c for r, c, _ in rows}
    comm = {r: m for r, _, m in rows}
    injected = TRUTH["slow_ms_per_step"] * 1e6
    assert compute[slow] > 0.5 * injected
    assert all(compute[r] < 0.1 * injected for r in compute if r != slow)
    assert all(comm[r] > comm[slow] for r in comm if r != slow)


def test_the_perfetto_twin_alone_reads_the_same(db: Path, tmp_path: Path) -> None:
    for p in PERFETTO_FILES:
        dst = tmp_path / "run" / p.relative_to(RUN)
        dst.parent.mkdir(parents=True)
        shutil.copy(p, dst)
    out = tmp_path / "p.duckdb"
    report = load_traces([tmp_path / "run"], out, workers=1)
    assert report.ranks == TRUTH["ranks"] and not report.skipped
    same = "SELECT rank, kind, count(*), sum(dur_ns) FROM events GROUP BY ALL ORDER BY ALL"
    assert q(out, same) == q(db, same)


# ---------------------------------------------------------------------------------------------
# one registry line: scan, routing, mixed runs, output names; no Kineto file taken
# ---------------------------------------------------------------------------------------------
def test_the_third_reader_lands_everywhere(tmp_path: Path) -> None:
    assert readers.READERS[-1] is jax_trace.READER
    found = scan_inputs([str(RUN)], readers.trace_suffixes()).files
    assert found == sorted(map(str, (*HOST_FILES, *PERFETTO_FILES)))  # truth.json left out
    routed, notes = readers.route(found, allow_mixed=False)
    assert [(r.name, fs) for r, fs in routed] == [("jax", list(map(str, HOST_FILES)))]
    assert len(notes) == 1 and "perfetto_trace" in notes[0]
    with pytest.raises(MixedFormatsError, match=r"1 Kineto trace\(s\) .* and 4 JAX/XLA"):
        load_traces([KINETO_SAMPLE, *HOST_FILES], tmp_path / "m.duckdb", workers=1)
    assert readers.infers_communicators([(jax_trace.READER, [])])
    with pytest.raises(output.OutputError, match="named like a trace"):
        output.check_output(tmp_path / "out.trace.json.gz", [])


def _routing_before_and_after(
    files: list[str], monkeypatch: pytest.MonkeyPatch
) -> list[tuple[str, str, str]]:
    """(file, reader without the JAX line, reader with it) for every file."""
    now = [readers.reader_for(f).name for f in files]
    with monkeypatch.context() as m:
        m.setattr(readers, "READERS", readers.READERS[:-1])
        before = [readers.reader_for(f).name for f in files]
    return list(zip(files, before, now, strict=True))


def _check_no_kineto_file_taken(top: Path, monkeypatch: pytest.MonkeyPatch) -> int:
    files = scan_inputs([str(top)], readers.trace_suffixes()).files
    kineto = 0
    for f, before, now in _routing_before_and_after(files, monkeypatch):
        if "jax_cpu_dp" in Path(f).parts:
            assert now == "jax", f
        else:
            assert now == before, f
            kineto += before == "kineto"
    return kineto


def test_no_sample_kineto_trace_is_routed_elsewhere(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _check_no_kineto_file_taken(REPO / "sample_traces", monkeypatch) >= 30


def test_no_public_kineto_trace_is_routed_elsewhere(
    shared_traces: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every Kineto file of ../shared/traces/public (skipped when absent, failing under
    RANKLENS_REQUIRE_SHARED=1) still goes to Kineto."""
    assert _check_no_kineto_file_taken(shared_traces, monkeypatch) > 0


@pytest.mark.parametrize(
    "head,jax",
    [
        (
            b'{"displayTimeUnit":"ns","traceEvents":[{"ph":"M","pid":7,"name":"process_name",'
            b'"args":{"name":"/device:TPU:0"}}',
            True,
        ),
        (
            b'{"schemaVersion": 1, "traceEvents": [{"ph": "M", "name": "process_name", '
            b'"args": {"name": "/host:CPU"}}',
            False,
        ),  # a Kineto key: never ours
        (
            b'{"traceEvents": [{"ph": "M", "name": "process_name", "args": {"name": "python"}}',
            False,
        ),
        (b"", False),
    ],
)
def test_sniff(head: bytes, jax: bool) -> None:
    assert jax_trace.sniff(head) is jax


@pytest.mark.parametrize(
    "name,op",
    [
        ("all-reduce.1", "all_reduce"),
        ("psum_invariant.7", "all_reduce"),
        ("all-gather-start.2", "all_gather"),
        ("reduce-scatter", "reduce_scatter"),
        ("collective-permute-done.3", "collective_permute"),
        ("dot.2", None),
        ("ynn_fusion", None),
    ],
)
def test_collective_of(name: str, op: str | None) -> None:
    assert jax_trace.collective_of(name) == op


# ---------------------------------------------------------------------------------------------
# bad JAX files
# ---------------------------------------------------------------------------------------------
def _copy(tmp_path: Path, rank: int, data: bytes, name: str = "vm.trace.json.gz") -> Path:
    dst = tmp_path / f"rank{rank}" / "plugins" / "profile" / "2026_01_01_00_00_00" / name
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_bytes(data)
    return dst


def test_a_truncated_file_is_an_error_naming_it(tmp_path: Path) -> None:
    raw = HOST_FILES[0].read_bytes()
    cut_gz = _copy(tmp_path / "a", 0, raw[: len(raw) // 2])
    cut_json = _copy(tmp_path / "b", 0, gzip.decompress(raw)[:3000], "vm.trace.json")
    for bad in (cut_gz, cut_json):
        assert readers.reader_for(str(bad)) is jax_trace.READER  # its head is still JAX's
        res = runner.invoke(app, ["ingest", str(bad), "-o", str(tmp_path / "x.duckdb")])
        assert res.exit_code == 1, res.output
        assert res.output.startswith(f"error: {bad}: ") and "hint:" in res.output
        assert "Traceback" not in res.output
    with pytest.raises(TraceFormatError, match="corrupt gzip data"):
        load_traces([cut_gz], tmp_path / "y.duckdb", workers=1)
    with pytest.raises(TraceFormatError, match="not valid JSON"):
        load_traces([cut_json], tmp_path / "y.duckdb", workers=1)
    # --skip-bad: the good ranks are ingested, the bad file listed
    good = [_copy(tmp_path / "c", r, HOST_FILES[r].read_bytes()) for r in (1, 2)]
    bad = _copy(tmp_path / "c", 0, raw[: len(raw) // 2])
    report = load_traces([bad, *good], tmp_path / "z.duckdb", workers=1, on_error="skip")
    assert report.ranks == [1, 2] and [s.path for s in report.skipped] == [str(bad)]


def test_a_file_without_a_rank_is_refused_with_a_hint(tmp_path: Path) -> None:
    anon = tmp_path / "profile" / "vm.trace.json.gz"
    anon.parent.mkdir()
    shutil.copy(HOST_FILES[0], anon)
    with pytest.raises(RankError, match="cannot tell which rank wrote this JAX trace") as err:
        load_traces([anon], tmp_path / "r.duckdb", workers=1)
    assert err.value.hint is not None and "rank{jax.process_index()}" in err.value.hint
