"""A file system that refuses ranklens' writes (full, over a quota or a size limit): `error:`
naming what could not be written and a hint, exit 1, nothing of the run kept, whatever
--skip-bad says. Never an internal error, and never the trace blamed for it.

Why this way: the writes really fail. The ranklens process runs under RLIMIT_FSIZE, so the OS
refuses every write past the limit (EFBIG), as a full disk does (ENOSPC); it needs no
privileges. Before, a full output ended in "internal error: TransactionException ... report
it", and a full temporary directory in "<trace>.json.gz: corrupt gzip data", with --skip-bad
skipping every file in turn as unreadable."""

from __future__ import annotations

import hashlib
import resource
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from ranklens.sample_traces.gpu_job import GpuJob, write_job

RANKLENS = str(Path(sys.executable).with_name("ranklens"))
SAMPLE = Path(__file__).resolve().parents[2] / "sample_traces" / "megatron_tp2_pp2_dp2" / "raw"


def _limited(nbytes: int) -> Callable[[], None]:
    def limit() -> None:  # in the child, before ranklens starts: its workers inherit both
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG, not the signal that kills
        resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, nbytes))

    return limit


def _ranklens(nbytes: int, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [RANKLENS, *args],
        preexec_fn=_limited(nbytes),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def _said_plainly(done: subprocess.CompletedProcess[str]) -> str:
    said = done.stdout + done.stderr
    assert done.returncode == 1, said
    assert "internal error" not in said and "Traceback" not in said, said
    assert "hint: free space there (or raise the limit)" in said, said
    return said


@pytest.mark.parametrize("extra", [[], ["--skip-bad"], ["--storage", "shards"]])
def test_an_output_that_cannot_be_written(tmp_path: Path, extra: list[str]) -> None:
    write_job(GpuJob(tp=2, pp=2, dp=2, m=2, steps=2, kernels_per_block=2), tmp_path / "raw")
    out = tmp_path / "out"
    said = _said_plainly(
        _ranklens(100_000, "ingest", str(tmp_path / "raw"), "-o", str(out), *extra)
    )
    assert "error: cannot write:" in said and "File too large" in said
    assert str(tmp_path) in said  # where: the output's directory
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["raw"]  # no half-written run beside


def test_a_gz_trace_that_cannot_be_inflated_is_not_blamed(tmp_path: Path) -> None:
    before = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in SAMPLE.iterdir()}
    out = tmp_path / "run.duckdb"
    said = _said_plainly(_ranklens(300_000, "ingest", str(SAMPLE), "-o", str(out), "--skip-bad"))
    assert "cannot inflate it into" in said and "File too large" in said
    assert "corrupt" not in said and "skipped" not in said
    assert not out.exists()
    assert {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in SAMPLE.iterdir()} == before


def test_an_export_that_cannot_be_written(tmp_path: Path) -> None:
    run = tmp_path / "run.duckdb"
    done = subprocess.run(
        [RANKLENS, "ingest", str(SAMPLE), "-o", str(run)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    said = _said_plainly(_ranklens(20_000, "export", str(run), "--parquet", str(tmp_path / "pq")))
    assert "error: cannot write:" in said and "File too large" in said
