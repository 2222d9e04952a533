"""The big Kineto trace the ingest benchmarks time (bench_ingest.py, bench_analysis_hta.py).

Why: real traces of hundreds of MB are not in the repo, so one is built (cached under
benchmarks/_work) by replicating a real trace's events end to end in time, with shifted
timestamps and renumbered ids, in Kineto's layout of one event per line.
"""

from __future__ import annotations

import gzip
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
WORK = HERE / "_work"
DEFAULT_SOURCE = Path(
    "/work/shared/traces/public/hta-testdata/nccl_parser_config/nccl_data.json.gz"
)
MB = 1024 * 1024
ID_KEYS = ("correlation", "External id")


def _shift_event(ev: dict[str, Any], dt_us: int, id_shift: int, step_shift: int) -> dict[str, Any]:
    """One copy of an event: time moved by dt_us, ids and ProfilerStep number made unique."""
    out = dict(ev)
    if isinstance(out.get("ts"), (int, float)):
        out["ts"] = out["ts"] + dt_us
    if "id" in out and isinstance(out["id"], int):
        out["id"] = out["id"] + id_shift
    name = out.get("name")
    if isinstance(name, str) and name.startswith("ProfilerStep#"):
        out["name"] = f"ProfilerStep#{int(name.split('#', 1)[1]) + step_shift}"
    args = out.get("args")
    if isinstance(args, dict):
        args = dict(args)
        for key in ID_KEYS:
            if isinstance(args.get(key), int) and args[key] >= 0:
                args[key] = args[key] + id_shift
        out["args"] = args
    return out


def _copies(events: list[dict[str, Any]]) -> Iterator[tuple[int, dict[str, Any]]]:
    """(copy number, event): metadata once, then endless copies of the timed events laid end to
    end in time (the caller stops at a copy boundary)."""
    timed = [e for e in events if e.get("ph") != "M"]
    starts = [e["ts"] for e in timed if isinstance(e.get("ts"), (int, float))]
    ends = [e["ts"] + e.get("dur", 0) for e in timed if isinstance(e.get("ts"), (int, float))]
    span_us = math.ceil(max(ends) - min(starts)) + 1000
    max_id = 0
    for e in timed:
        if isinstance(e.get("id"), int):
            max_id = max(max_id, e["id"])
        for key in ID_KEYS:
            v = (e.get("args") or {}).get(key)
            if isinstance(v, int):
                max_id = max(max_id, v)
    steps = [
        int(e["name"].split("#", 1)[1])
        for e in timed
        if str(e.get("name", "")).startswith("ProfilerStep#")
    ]
    step_stride = (max(steps) - min(steps) + 1) if steps else 0
    yield from ((0, e) for e in events if e.get("ph") == "M")
    k = 0
    while True:
        for e in timed:
            yield k, _shift_event(e, k * span_us, k * (max_id + 1), k * step_stride)
        k += 1


def build_trace(source: Path, size_mb: int, rank: int | None = None) -> tuple[Path, int]:
    """Write (or reuse) a >= size_mb uncompressed Kineto JSON made from source; return path, events.

    Kineto's layout is kept (header keys in order, one event per line) because HTA finds the rank
    by grepping lines for `"rank": N`. `rank` rewrites distributedInfo.rank (multi-rank runs).
    """
    WORK.mkdir(parents=True, exist_ok=True)
    tag = "" if rank is None else f"_rank{rank}"
    dest = WORK / f"big_{source.name.split('.')[0]}_{size_mb}mb{tag}.json"
    sidecar = dest.with_suffix(".meta.json")
    if dest.exists() and sidecar.exists():
        meta = json.loads(sidecar.read_text())
        if meta.get("size") == dest.stat().st_size:
            return dest, int(meta["events"])
    opener = gzip.open if source.suffix == ".gz" else open
    with opener(source, "rb") as f:
        raw = f.read()
    doc = json.loads(raw)
    if rank is not None:
        doc["distributedInfo"] = {**(doc.get("distributedInfo") or {}), "rank": rank}
    events: list[dict[str, Any]] = doc["traceEvents"]
    n_events = n_copies = 0
    tmp = dest.with_suffix(".tmp")
    with open(tmp, "w", encoding="utf-8") as out:
        out.write("{\n")
        keys = list(doc)
        for i, key in enumerate(keys):
            sep = ",\n" if i < len(keys) - 1 else "\n"
            if key != "traceEvents":
                out.write(f"  {json.dumps(key)}: {json.dumps(doc[key])}{sep}")
                continue
            out.write('  "traceEvents": [\n')
            first = True
            for k, ev in _copies(events):
                if k == n_copies:  # a copy just finished: stop once big enough
                    if out.tell() >= size_mb * MB:
                        break
                    n_copies += 1
                out.write(("  " if first else ",\n  ") + json.dumps(ev))
                first = False
                n_events += 1
            out.write(f"\n  ]{sep}")
        out.write("}\n")
    tmp.replace(dest)
    sidecar.write_text(
        json.dumps(
            {
                "size": dest.stat().st_size,
                "events": n_events,
                "copies": n_copies,
                "source": str(source),
            }
        )
    )
    return dest, n_events
