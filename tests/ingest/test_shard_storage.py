"""A sharded run's shards are where its writer reads them, or the ingest stops and says why.

Why: with `--engine ray` each rank's shards are written by the node that reads its trace, into
the run directory; on a node that does not mount the output on shared storage they used to land
on that node's own disk (the task created the directories) and the run lacked those ranks'
events, silently. A full or read-only file system is the storage's fault too, not the trace's:
with --skip-bad it used to skip every file in turn, each as "cannot read the file".
"""

from __future__ import annotations

import errno
import shutil
from pathlib import Path
from typing import Any

import pytest
from ranklens.ingest import engines, load_traces, rank_task, shards
from ranklens.ingest.errors import ShardWriteFailed
from ranklens.sample_traces.gpu_job import GpuJob, write_job


def _job(tmp: Path) -> Path:
    write_job(GpuJob(tp=2, pp=2, dp=2, m=2, steps=2, kernels_per_block=2), tmp / "raw")
    return tmp / "raw"


def _nothing_left(out: Path) -> None:
    assert not out.exists()
    assert [p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}")] == []


@pytest.mark.parametrize("how", ["elsewhere", "cut"])
def test_shards_the_writer_does_not_see_stop_the_ingest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """As a task on a node without the shared output: rank 3's shards written, then not in
    the run directory the writer reads (moved away, or cut short), even with --skip-bad."""
    raw = _job(tmp_path)
    node_disk = tmp_path / "node-disk"
    real = engines.read_file

    def on_a_node(fmt: str, path: str, tid: int, run_dir: str) -> Any:
        out = real(fmt, path, tid, run_dir)
        for res in out:
            if res.rank == 3:
                for rel, _size in res.parts:
                    if how == "elsewhere":
                        (node_disk / rel).parent.mkdir(parents=True, exist_ok=True)
                        shutil.move(Path(run_dir, rel), node_disk / rel)
                    else:
                        data = Path(run_dir, rel).read_bytes()
                        Path(run_dir, rel).write_bytes(data[: len(data) // 2])
        return out

    monkeypatch.setattr(engines, "read_file", on_a_node)
    out = tmp_path / "run"
    with pytest.raises(ShardWriteFailed) as err:
        load_traces([str(raw)], out, storage="shards", workers=1, on_error="skip")
    said = err.value.message
    assert "rank 3" in said and "events/rank=3/" in said
    assert ("is not there" if how == "elsewhere" else " bytes are") in said
    assert err.value.hint is not None and "every node mounts at the same path" in err.value.hint
    _nothing_left(out)


def test_a_task_whose_run_directory_is_not_on_its_machine_writes_nothing(tmp_path: Path) -> None:
    raw = _job(tmp_path)
    trace = sorted(raw.glob("*rank0*.json*"))[0]
    absent = tmp_path / "not-mounted"
    with pytest.raises(ShardWriteFailed, match=r"does not exist on \S+") as err:
        rank_task.read_file("kineto", str(trace), 0, str(absent / "run"))
    assert err.value.hint is not None and "--engine ray" in err.value.hint
    assert not absent.exists()  # no directory made where the run will never look


def test_a_full_disk_stops_the_ingest_even_with_skip_bad(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    raw = _job(tmp_path)

    def full(*_a: Any, **_k: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(shards.pq, "write_table", full)
    out = tmp_path / "run"
    with pytest.raises(ShardWriteFailed, match="No space left on device") as err:
        load_traces([str(raw)], out, storage="shards", workers=1, on_error="skip")
    assert "events of rank" in err.value.message
    _nothing_left(out)


def test_a_ray_task_s_storage_error_reaches_the_user_as_it_is(tmp_path: Path) -> None:
    """Through Ray's own error wrapping, on a real local instance: the task's ShardWriteFailed,
    message and hint, not a generic "a Ray task died"."""
    ray = pytest.importorskip("ray", reason="Ray is part of the dev extra (CI installs it)")
    raw = _job(tmp_path)
    trace = sorted(raw.glob("*rank0*.json*"))[0]
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        with pytest.raises(ShardWriteFailed, match="does not exist on") as err:
            engines.run_tasks(
                [("kineto", str(trace), 0)],
                str(tmp_path / "not-mounted" / "run"),
                workers=1,
                engine="ray",
                done=lambda _path, _results: None,
            )
    finally:
        ray.shutdown()
    assert err.value.hint is not None and "every node mounts" in err.value.hint
