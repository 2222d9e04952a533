"""Nsight Systems reader: one SQLite export (or .nsys-rep) -> one RankPart per rank in it.

Why: Nsight reports come one per rank (`srun nsys profile -o rank_%q{SLURM_PROCID}`) or one for
a whole node (`nsys profile torchrun ...`, every rank a separate process), and they hold no
process-group metadata; this module turns either layout into the normalized events.

What is read (tables are probed, never assumed; columns are selected by name):
  CUPTI_ACTIVITY_KIND_KERNEL    -> `comm` (classify.is_comm_kernel) or `compute`, name from
                                   StringIds (demangled, else short), launch 'grid=[..] block=[..]'
  CUPTI_ACTIVITY_KIND_MEMCPY/MEMSET -> `memcpy` / `memset` ("Memcpy HtoD (Pageable -> Device)")
  CUPTI_ACTIVITY_KIND_RUNTIME   -> `runtime` or `sync` (classify.SYNC_RE) on the host thread,
                                   runtime + driver rows only (eventClass 0/1)
  CUPTI_ACTIVITY_KIND_SYNCHRONIZATION -> `sync` on the device/stream it waited for
  NVTX_EVENTS (push/pop, start/end) -> `annotation`; NCCL's domain -> comm facts (nsys_nccl)
Device events: device = deviceId (the CUDA ordinal = TARGET_INFO_GPU.cuDevice), stream =
streamId, pid/tid = device/stream as in Kineto. Host events: device -1, stream = tid.

Clock: times become UTC epoch ns. If META_DATA_EXPORT says EXPORT_PARAM_TIME_NORMALIZE=true
(`nsys export --ts-normalize=true`) timestamps already are UTC. Otherwise
UTC = ts + utcEpochNs - systemClockNs (TARGET_INFO_SESSION_START_TIME). Unresolved case:
exports of schema >= 3.2x carry `systemClockNs` and their timestamps look like the target's
raw monotonic clock, but no export we hold has a wall-clock anchor that proves whether UTC is
`utcEpochNs + ts - systemClockNs` (what NVIDIA's column comments suggest) or `utcEpochNs + ts`;
we use the former, warn on every rank of such a report, and rely on collective-based clock
alignment to absorb a constant per-report error (it can be tens of seconds). Older exports
(no systemClockNs) are unambiguous: UTC = ts + utcEpochNs. Converting `.nsys-rep` ourselves
always asks nsys for normalized timestamps, which removes the doubt.

Ranks: one rank per process with GPU activity. Its number comes from, in order: MPI_RANKS;
the rank in the largest communicator of NCCL's ncclCommInit payload; for a single-process
report, the launcher's environment (RANK, OMPI_COMM_WORLD_RANK, PMI_RANK, PMIX_RANK,
SLURM_PROCID in META_DATA_CAPTURE; in a many-process report those describe the launcher, not
the workers); an NVTX thread name such as "MPI Rank 3". A single-process report without any of
these returns rank None so the loader can use the file name; in a many-process report the
remaining processes are numbered in pid order and a warning says so. Host = Hostname row of
TARGET_INFO_SYSTEM_ENV.
"""

from __future__ import annotations

import contextlib
import shlex
import shutil
import sqlite3
import subprocess
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from ranklens.ingest._model import RankPart
from ranklens.ingest.errors import TraceFormatError
from ranklens.ingest.inputs import check_readable
from ranklens.ingest.nsys_events import CommInfo, read_kernels, read_runtime
from ranklens.ingest.nsys_memops import read_memops, read_sync
from ranklens.ingest.nsys_meta import Meta, read_meta
from ranklens.ingest.nsys_nccl import ProcNccl, comm_info
from ranklens.ingest.nsys_nvtx import Nvtx, read_nvtx
from ranklens.ingest.nsys_sqlite import Report, as_format_error
from ranklens.ingest.nsys_tables import Strings
from ranklens.ingest.tempfiles import private_dir

_NSIGHT_TABLES = (
    "META_DATA_EXPORT",
    "EXPORT_META_DATA",
    "CUPTI_ACTIVITY_KIND_KERNEL",
    "CUPTI_ACTIVITY_KIND_RUNTIME",
    "NVTX_EVENTS",
)
_GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def read_nsys(path: Path, trace_id: int) -> list[RankPart]:
    """Read one Nsight Systems report (`.sqlite` export or `.nsys-rep`) into RankParts."""
    path = Path(path)
    check_readable(str(path))
    if path.suffix == ".nsys-rep":
        with private_dir("nsys") as tmp:
            return _read_sqlite(export_rep(path, tmp), shown=path)
    return _read_sqlite(path, shown=path)


def export_command(rep: Path, out: Path, exe: str = "nsys") -> list[str]:
    """The `nsys export` call that turns a report into the SQLite file we read."""
    return [
        exe,
        "export",
        "--type",
        "sqlite",
        "--ts-normalize=true",
        "--output",
        str(out),
        str(rep),
    ]


def export_rep(rep: Path, tmp: Path) -> Path:
    """Convert a .nsys-rep with the nsys on PATH into `tmp` (never next to the user's file)."""
    exe = shutil.which("nsys")
    if exe is None:
        cmd = shlex.join(export_command(rep, rep.with_suffix(".sqlite")))
        raise TraceFormatError(
            f"{rep}: is an Nsight Systems report (.nsys-rep) and `nsys` is not on PATH",
            f"convert it first, then ingest the .sqlite file: {cmd}",
        )
    out = tmp / (rep.stem + ".sqlite")
    done = subprocess.run(
        export_command(rep, out, exe), capture_output=True, text=True, check=False
    )
    if done.returncode != 0 or not out.is_file():
        tail = (done.stderr or done.stdout or "").strip().splitlines()[-3:]
        raise TraceFormatError(
            f"{rep}: `nsys export` failed (exit {done.returncode}): {' / '.join(tail)}",
            f"try it by hand: {shlex.join(export_command(rep, rep.with_suffix('.sqlite')))}",
        )
    return out


def _read_sqlite(path: Path, shown: Path) -> list[RankPart]:
    empty = False
    with contextlib.suppress(OSError):  # unreadable: Report says so
        empty = path.stat().st_size == 0
    if empty:  # SQLite would open it as a database without tables
        raise TraceFormatError(
            f"{shown}: the file is empty",
            "an interrupted `nsys export` leaves an empty file: export the report again "
            "(nsys export --type sqlite --ts-normalize=true)",
        )
    try:
        rep = Report(path)
    except TraceFormatError as err:
        raise TraceFormatError(err.message.replace(str(path), str(shown)), err.hint) from err
    try:
        if not any(rep.exists(t) for t in _NSIGHT_TABLES):
            raise TraceFormatError(
                f"{shown}: is an SQLite file but not an Nsight Systems export "
                "(no META_DATA_EXPORT, CUPTI_ACTIVITY_KIND_* or NVTX_EVENTS table)",
                "give the file written by `nsys export --type sqlite` (or the .nsys-rep)",
            )
        return _read(rep, shown)
    except sqlite3.Error as err:
        raise as_format_error(shown, err) from err
    finally:
        rep.close()


def _read(rep: Report, shown: Path) -> list[RankPart]:
    meta = read_meta(rep)
    strings = Strings(rep)
    nv = Nvtx()
    tables = list(read_nvtx(rep, meta.shift_ns, nv))
    threads = {(p << 24) | t for p, t in nv.nccl}
    launches: list[pa.Table] = []
    tables += read_runtime(rep, strings, meta.shift_ns, threads, launches)
    procs: dict[int, ProcNccl] = {}
    comm = CommInfo()
    if nv.nccl:
        info, procs = comm_info(rep, nv.nccl, launches)
        comm = CommInfo(info)
    tables += read_kernels(rep, strings, meta.shift_ns, comm)
    tables += read_memops(rep, meta.shift_ns)
    tables += read_sync(rep, meta.shift_ns)
    return _split(tables, meta, nv, procs, shown)


def _pids(tables: list[pa.Table], gpu_only: bool) -> set[int]:
    out: set[int] = set()
    for t in tables:
        if t.num_rows and (not gpu_only or t.column("cat")[0].as_py() in _GPU_CATS):
            out.update(v for v in pc.unique(t.column("_pid")).to_pylist() if v is not None)
    return out


def _split(
    tables: list[pa.Table], meta: Meta, nv: Nvtx, procs: dict[int, ProcNccl], shown: Path
) -> list[RankPart]:
    """One RankPart per process with GPU activity (or, for CPU-only reports, per process)."""
    tables = [t for t in tables if t.num_rows]
    gpu = _pids(tables, gpu_only=True)
    pids = sorted(gpu or _pids(tables, gpu_only=False))
    if not pids:
        raise TraceFormatError(
            f"{shown}: holds no CUDA or NVTX activity",
            "profile with `nsys profile -t cuda,nvtx ...`",
        )
    ranks, notes = _assign_ranks(pids, meta, procs)
    common = [n for n in (meta.clock_note,) if n]
    if nv.open_ranges:
        common.append(
            f"{nv.open_ranges} NVTX ranges have no end (cut by the capture window) "
            "and were left out"
        )
    parts: list[RankPart] = []
    for pid in pids:
        mine = [
            t.filter(pc.equal(t.column("_pid"), pid))
            if len(pids) > 1 or pc.any(pc.not_equal(t.column("_pid"), pid)).as_py()
            else t
            for t in tables
        ]
        events = [t.drop_columns(["_pid"]) for t in mine if t.num_rows]
        said = common if not parts else []  # report-level notes once, not once per rank
        part = RankPart(rank=ranks[pid], events=events, warnings=[*said, *notes.get(pid, [])])
        part.info = _info(pid, events, meta, procs.get(pid), pid in gpu, len(pids))
        part.threads = [(pid, -1, meta.process_names[pid])] if pid in meta.process_names else []
        part.threads += [(p, t, n) for (p, t), n in sorted(meta.thread_names.items()) if p == pid]
        part.groups = (
            [
                {
                    "pg_name": f"{c:#x}",
                    "pg_desc": None,
                    "ranks": None,
                    "size": n,
                    "backend": "nccl",
                    "source": "nsys_nccl_nvtx",
                }
                for c, n in sorted(procs[pid].comms.items())
            ]
            if pid in procs
            else []
        )
        parts.append(part)
    dropped = sum(t.num_rows for t in tables) - sum(p.n_events for p in parts)
    if dropped:
        parts[0].warnings.append(
            f"{dropped} events of processes without GPU activity (launcher, tools) were left out"
        )
    return parts


def _assign_ranks(
    pids: list[int], meta: Meta, procs: dict[int, ProcNccl]
) -> tuple[dict[int, int | None], dict[int, list[str]]]:
    """Rank of each process from the strongest source that names it (see module docstring)."""
    ranks: dict[int, int | None] = {}
    for pid in pids:
        nccl = procs[pid].rank_world() if pid in procs else None
        env = meta.env_rank if len(pids) == 1 else None
        for cand in (
            meta.mpi_rank.get(pid),
            nccl[0] if nccl else None,
            env,
            meta.nvtx_rank.get(pid),
        ):
            if cand is not None:
                ranks[pid] = cand
                break
        else:
            ranks[pid] = None
    notes: dict[int, list[str]] = {}
    if len(pids) > 1 and None in ranks.values():
        free = (r for r in range(len(pids) * 2) if r not in ranks.values())
        for pid in pids:
            if ranks[pid] is None:
                ranks[pid] = next(free)
                notes[pid] = [
                    f"process {pid}: no rank recorded in the report; numbered "
                    f"{ranks[pid]} by pid order among its {len(pids)} GPU processes"
                ]
    return ranks, notes


def _info(
    pid: int, events: list[pa.Table], meta: Meta, nccl: ProcNccl | None, has_gpu: bool, n_procs: int
) -> dict[str, Any]:
    """Values for the `ranks` row: host, pid, GPU model, backend, world size."""
    devices: dict[int, int] = {}
    backend = None
    for t in events:
        if t.column("cat")[0].as_py() != "kernel":
            continue
        for row in pc.value_counts(t.column("device")).to_pylist():
            devices[row["values"]] = devices.get(row["values"], 0) + row["counts"]
        if backend is None:  # the comm kernels' names only, not a copy of their rows
            names = t.column("name").filter(pc.equal(t.column("kind"), "comm"))
            if len(names) and pc.any(pc.starts_with(names.cast(pa.string()), "nccl")).as_py():
                backend = "nccl"
    dev = max(devices, key=lambda d: devices[d]) if devices else None
    gpu = meta.gpu(dev, None) if dev is not None else None
    world = nccl.rank_world() if nccl else None
    return {
        "host": meta.host,
        "pid": pid,
        "device_name": gpu.name if gpu else None,
        "num_sms": gpu.sms if gpu else None,
        "has_gpu": has_gpu,
        "backend": backend,
        "world_size": world[1] if world else (meta.env_world_size if n_procs == 1 else None),
    }
