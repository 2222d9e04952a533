"""The JAX/XLA profiler's Chrome-trace JSON: its declaration (`READER`) and reader.

What it reads: what `jax.profiler.trace(logdir)` writes per process,
`logdir/plugins/profile/RUN/HOST.trace.json.gz` (and, with `create_perfetto_trace=True`,
`perfetto_trace.json.gz` beside it: the same events, so only one of the two is read). TensorFlow's
profiler writes the same layout. Why a reader of its own rather than Kineto's: both are Chrome
traces with `traceEvents`, but XLA names processes after XPlanes (`/host:CPU`, `/device:GPU:0`),
marks an XLA op execution by `hlo_op`/`hlo_module` args and a step by a `step_num` arg, and
carries no rank, world size, process group or epoch clock.

Mapping: an event with `hlo_op` is an op execution: `comm` when the HLO op (or the JAX primitive
it is named after) is a collective, with `coll_op` set, else `compute` (on a CPU-only run the
host executes the ops); a `step_num` event (`StepTraceAnnotation`) becomes the step marker
`ProfilerStep#N`; Python-tracer frames (`$file:line name`) and other annotations with args are
`annotation`; `... (wait for completion)` / `Wait for ...` spans are `sync`; the runtime's host
spans are `runtime`; compiler threads' spans are `other`. Events of an accelerator plane
(`/device:GPU:N`, `/device:TPU:N`) get device N (ops as above, other lines `annotation`); only
CPU runs were available to test, so that part follows the layout, not a sample. No group is in
the file, so communicators are inferred from the ranks' collective sequences
(`carries_groups=False`). Timestamps are float microseconds since the process's profiler
started (no epoch): they become int64 ns, and `host` is left NULL so each rank is its own clock
domain, aligned by collectives. Left out: non-'X' phases (counted in a warning), flow events,
op shapes and sizes (XLA:CPU records none), `run_id` (the same on every rank for one launch).
"""

from __future__ import annotations

import json
import re
import shutil
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
from ranklens.ingest import classify, gz
from ranklens.ingest._model import RankPart, Reader, event_schema, rank_from_name
from ranklens.ingest.errors import RankError, TraceFormatError

# A process_name metadata event naming an XPlane: the layout's signature in the first bytes.
_XPLANE_NAME_RE = re.compile(
    rb'"process_name"[^{}]{0,200}"args"\s*:\s*\{\s*"name"\s*:\s*"/(?:host|device):'
)
# Keys only a Kineto (PyTorch profiler) trace starts with: never ours, whatever else it holds.
_KINETO_KEYS_RE = re.compile(rb'"(?:schemaVersion|distributedInfo|deviceProperties)"\s*:')
_DEVICE_RE = re.compile(r"^/device:([A-Za-z_]+):(\d+)")
_HLO_SUFFIX_RE = re.compile(r"(\.\d+)+$")
_ASYNC_RE = re.compile(r"-(start|done|update)$")

# HLO collective opcodes and the JAX primitives whose names XLA gives their ops.
_COLLECTIVES: dict[str, str] = {
    "all-reduce": "all_reduce",
    "psum": "all_reduce",
    "psum_invariant": "all_reduce",
    "pmax": "all_reduce",
    "pmin": "all_reduce",
    "pmean": "all_reduce",
    "all-gather": "all_gather",
    "all_gather": "all_gather",
    "all_gather_invariant": "all_gather",
    "reduce-scatter": "reduce_scatter",
    "psum_scatter": "reduce_scatter",
    "reduce_scatter": "reduce_scatter",
    "all-to-all": "all_to_all",
    "all_to_all": "all_to_all",
    "ragged-all-to-all": "all_to_all",
    "ragged_all_to_all": "all_to_all",
    "collective-permute": "collective_permute",
    "ppermute": "collective_permute",
    "collective-broadcast": "broadcast",
    "pbroadcast": "broadcast",
    "send": "send",
    "recv": "recv",
}
_HINT = "check that the file is a complete JAX/XLA profiler trace (HOST.trace.json.gz)"


def sniff(head: bytes) -> bool:
    """The first bytes are a JAX/XLA trace: a process named `/host:...` or `/device:...` and
    none of a Kineto trace's top-level keys (so no Kineto file is ever taken)."""
    return _XPLANE_NAME_RE.search(head) is not None and _KINETO_KEYS_RE.search(head) is None


def collective_of(hlo_op: str) -> str | None:
    """The ranklens op of an XLA op name (`all-reduce.1`, `psum_invariant.7`,
    `all-gather-start`), or None when it is not communication."""
    base = _ASYNC_RE.sub("", _HLO_SUFFIX_RE.sub("", hlo_op.strip().lower()))
    return _COLLECTIVES.get(base)


def rank_of_path(path: str) -> int | None:
    """The rank the file's name gives, else the nearest directory named with one: JAX names
    the file after the host, so the rank is in the log directory (`.../rank3/plugins/...`)."""
    p = Path(path)
    for part in (p.name, *(d.name for d in p.parents)):
        rank = rank_from_name(part)
        if rank is not None:
            return rank
    return None


def select(files: list[str]) -> tuple[list[str], list[str]]:
    """(files to read, notes): a `perfetto_trace.json.gz` beside the HOST.trace.json.gz of the
    same profile holds the same events and is left out."""
    dirs = {str(Path(f).parent) for f in files if not _is_perfetto(f)}
    twins = [f for f in files if _is_perfetto(f) and str(Path(f).parent) in dirs]
    notes = (
        [
            f"{len(twins)} perfetto_trace.json.gz file(s) have their profile's HOST.trace.json.gz "
            f"beside them (e.g. {twins[0]}); the HOST.trace.json.gz files were read"
        ]
        if twins
        else []
    )
    left_out = set(twins)
    return [f for f in files if f not in left_out], notes


def _is_perfetto(path: str) -> bool:
    return Path(path).name.startswith("perfetto_trace.json")


def read(path: str, trace_id: int) -> Iterator[RankPart]:
    """One JAX/XLA trace file: the one process (rank) that wrote it."""
    doc = _load(path)
    events = doc.get("traceEvents") if isinstance(doc, dict) else None
    if not isinstance(events, list):
        raise TraceFormatError(f"{path}: no `traceEvents` array: not a JAX/XLA trace", _HINT)
    rank = rank_of_path(path)
    if rank is None:
        raise RankError(
            f"{path}: cannot tell which rank wrote this JAX trace (a JAX trace holds no rank; "
            "neither the file name nor a directory above it names one)",
            "profile each process into a directory of its own named by its rank, e.g. "
            "jax.profiler.trace(f'{logdir}/rank{jax.process_index()}'), or rename the file to "
            "include it (rank3.trace.json.gz)",
        )
    yield _part(path, rank, events)


def _load(path: str) -> Any:
    """The parsed JSON (a .gz inflated with gz.py's size checks into a private temp dir)."""
    data, tmp = gz.uncompressed(path, None)
    try:
        with open(data, "rb") as f:
            return json.load(f)
    except (ValueError, UnicodeDecodeError) as exc:
        raise TraceFormatError(
            f"{path}: not valid JSON ({str(exc)[:120]}): the file is truncated or damaged",
            f"{_HINT}; re-copy it, or --skip-bad ingests the other ranks",
        ) from None
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


class _Columns:
    """The event columns, filled one event at a time (files are small: one process each)."""

    def __init__(self) -> None:
        self.cols: dict[str, list[Any]] = {f.name: [] for f in event_schema()}

    def add(self, **values: Any) -> None:
        for name, col in self.cols.items():
            col.append(values.get(name))

    def table(self) -> pa.Table:
        schema = event_schema()
        return pa.table({f.name: pa.array(self.cols[f.name], f.type) for f in schema}, schema)


def _part(path: str, rank: int, events: list[Any]) -> RankPart:
    procs: dict[int, str] = {}
    threads: dict[tuple[int, int], str] = {}
    for e in events:
        if isinstance(e, dict) and e.get("ph") == "M":
            name = (e.get("args") or {}).get("name")
            if e.get("name") == "process_name" and isinstance(name, str):
                procs[int(e["pid"])] = name
            elif e.get("name") == "thread_name" and isinstance(name, str):
                threads[(int(e["pid"]), int(e["tid"]))] = name
    # Accelerator planes (`/device:GPU:0`, `/device:TPU:3`): their events are device events.
    devices = {
        pid: (m.group(1).upper(), int(m.group(2)))
        for pid, n in procs.items()
        if (m := _DEVICE_RE.match(n)) and m.group(1).upper() != "CPU"
    }
    cols = _Columns()
    skipped: Counter[str] = Counter()
    for i, e in enumerate(events):
        if not isinstance(e, dict) or not e or e.get("ph") == "M":
            continue  # (XLA ends the array with an empty object)
        if e.get("ph") != "X":
            skipped[str(e.get("ph"))] += 1
            continue
        try:
            pid, tid = int(e["pid"]), int(e["tid"])
            ts, dur = round(float(e["ts"]) * 1000), round(float(e.get("dur", 0)) * 1000)
            name = str(e["name"])
        except (KeyError, TypeError, ValueError) as exc:
            raise TraceFormatError(
                f"{path}: event {i} lacks a valid pid, tid, ts or name ({exc!r})", _HINT
            ) from None
        raw_args = e.get("args")
        args: dict[str, Any] = raw_args if isinstance(raw_args, dict) else {}
        dev = devices.get(pid)
        kind, cat, coll, name = _classify(name, args, threads.get((pid, tid), ""), dev)
        cols.add(
            kind=kind,
            cat=cat,
            name=name,
            device=dev[1] if dev else -1,
            stream=tid,
            pid=pid,
            tid=tid,
            ts_ns=ts,
            dur_ns=max(dur, 0),
            coll_op=coll,
        )
    kinds = sorted({k for k, _ in devices.values()})
    info = {"has_gpu": bool(kinds), "device_name": ", ".join(kinds) or None}
    warnings = [
        f"{n} event(s) of phase {ph!r} were not read (only complete 'X' spans are)"
        for ph, n in sorted(skipped.items())
    ]
    labels = [(pid, -1, n) for pid, n in procs.items()] + [
        (pid, tid, n) for (pid, tid), n in threads.items()
    ]
    return RankPart(rank, info, events=[cols.table()], threads=labels, warnings=warnings)


def _classify(
    name: str, args: dict[str, Any], thread: str, device: tuple[str, int] | None
) -> tuple[str, str, str | None, str]:
    """(kind, cat, coll_op, name) of one span; see the module docstring."""
    step = args.get("step_num")
    if step is not None and str(step).lstrip("-").isdigit():
        return "annotation", "step", None, f"ProfilerStep#{int(step)}"
    hlo_op = args.get("hlo_op")
    if isinstance(hlo_op, str):
        coll = collective_of(hlo_op)
        kind = "comm" if coll is not None or classify.is_comm_kernel(name) else "compute"
        return kind, "xla_op", coll, name
    if device is not None:  # a device plane's module/step lines: ranges, not work
        return "annotation", "device_line", None, name
    if name.startswith("$"):
        return "annotation", "python_function", None, name
    if name.startswith("end: "):  # XLA:CPU's zero-length marker after each op
        return "other", "marker", None, name
    if name.startswith("Wait for ") or name.endswith("(wait for completion)"):
        return "sync", "runtime", None, name
    if "Compile" in thread or "codegen" in thread:
        return "other", "compiler", None, name
    if args and "_src" not in args:
        return "annotation", "user_annotation", None, name
    return "runtime", "runtime", None, name


READER: Reader = Reader(
    name="jax",
    title="JAX/XLA",
    unit="trace",
    suffixes=(".json", ".json.gz"),  # Kineto's too: the sniff decides (readers.reader_for)
    read=read,
    sniff=sniff,
    select=select,
)
