"""NCCL's NVTX domain -> communicator, size and rank facts for NCCL kernels.

Why: Nsight has no process-group metadata; NCCL's own NVTX ranges (ncclAllReduce, ncclSend,
ncclGroupEnd, ncclCommInitRank, ...) and their extended payloads (communicator id, message
size, number of ranks, rank, peer) are the only place it keeps them. A kernel gets the facts of
the NCCL range its launch call ran in, on the same thread: the op's own range, or - for
grouped ops, which NCCL launches inside ncclGroupEnd - every op since the ncclGroupStart.

Payloads are read from `jsonText`/`jsonTextId` (JSON), or from `binaryData` decoded with the
NVTX_PAYLOAD_SCHEMA_ENTRIES layout (schema from NVTX_EVENTS_PAYLOAD_SCHEMAS when the export has
it, else the schema of the NCCL domain that fits the op and the blob size). The exports we hold
carry schemas but no payload values (blobs are not exported by default), so these kernels then
get only what the kernel name says.
"""

from __future__ import annotations

import bisect
import json
import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from ranklens.ingest.classify import normalize_op
from ranklens.ingest.nsys_nvtx import NcclRange
from ranklens.ingest.nsys_sqlite import Report

_FMT = {
    1: "b",
    2: "B",
    3: "h",
    4: "H",
    5: "i",
    6: "I",
    7: "q",
    8: "Q",
    9: "q",
    10: "Q",
    11: "b",
    12: "B",
    13: "h",
    14: "H",
    15: "i",
    16: "I",
    17: "q",
    18: "Q",
    19: "f",
    20: "d",
    22: "Q",
    23: "Q",
}  # NVTX_PAYLOAD_ENTRY_TYPE_* -> struct code (LP64)
_ENUM_FMT = "i"  # schema/enum-typed entries (ids >= 2**24): NCCL's enums are C ints
OP_RANGE = re.compile(
    r"^nccl(AllReduce|AllGather|ReduceScatter|Reduce|Broadcast|Bcast|Send|Recv"
    r"|AllToAll|AlltoAll|Gather|Scatter)$"
)
INIT_RANGE = re.compile(r"^ncclComm(Init|Split)")
_NEEDS = {
    "send": "peer",
    "recv": "peer",
    "broadcast": "root",
    "bcast": "root",
    "reduce": "root",
    "allreduce": "redop",
    "reducescatter": "redop",
}


def field_key(label: str) -> str | None:
    """Map an NCCL payload entry label onto the few facts we use."""
    k = re.sub(r"[^a-z0-9]", "", label.lower())
    if "communicator" in k or k in ("comm", "commid", "commhash"):
        return "comm"
    if "ranks" in k or k == "nranks":
        return "nranks"
    if "peer" in k:
        return "peer"
    if k == "rank":
        return "rank"
    if "size" in k or "bytes" in k or k == "count":
        return "size"
    if k == "root":
        return "root"
    if "reduction" in k or k == "redop":
        return "redop"
    return None


@dataclass
class Schema:
    """One payload schema: (struct code, offset or None, label) per entry, plus static size."""

    size: int | None
    entries: list[tuple[str, int | None, str]] = field(default_factory=list)

    def keys(self) -> set[str]:
        return {k for _f, _o, lab in self.entries if (k := field_key(lab))}

    def decode(self, blob: bytes) -> dict[str, int]:
        out: dict[str, int] = {}
        pos = 0
        for fmt, off, label in self.entries:
            width = struct.calcsize(fmt)
            pos = off if off is not None else -(-pos // width) * width  # natural alignment
            if pos + width > len(blob):
                break
            key = field_key(label)
            if key:
                out[key] = int(struct.unpack_from("<" + fmt, blob, pos)[0])
            pos += width
        return out


def load_schemas(rep: Report) -> dict[tuple[int, int], Schema]:
    """(domainId, schemaId) -> Schema from the NVTX payload schema tables."""
    out: dict[tuple[int, int], Schema] = {}
    if not rep.has("NVTX_PAYLOAD_SCHEMA_ENTRIES"):
        return out
    sizes: dict[tuple[int, int], int | None] = {}
    if rep.has("NVTX_PAYLOAD_SCHEMAS"):
        for d, s, size in rep.query(
            "SELECT domainId, schemaId, payloadSize FROM NVTX_PAYLOAD_SCHEMAS"
        ):
            sizes[(int(d), int(s))] = int(size) if size else None
    seen: set[tuple[int, int, int]] = set()
    for d, s, idx, typ, name, off in rep.query(
        "SELECT domainId, schemaId, idx, type, name, offset FROM NVTX_PAYLOAD_SCHEMA_ENTRIES "
        "ORDER BY domainId, schemaId, idx"
    ):
        if (d, s, idx) in seen:  # exports repeat each schema once per process
            continue
        seen.add((d, s, idx))
        key = (int(d), int(s))
        fmt = _FMT.get(int(typ or 0), _ENUM_FMT if int(typ or 0) >= 1 << 24 else "")
        sch = out.setdefault(key, Schema(sizes.get(key)))
        if not fmt:  # unknown layout: entries after it cannot be placed
            sch.entries.append(("B", None, "?unknown"))
            continue
        sch.entries.append((fmt, int(off) if off is not None else None, str(name or "")))
    return out


def _choose(
    schemas: dict[tuple[int, int], Schema], dom: int, op: str, blob: bytes
) -> Schema | None:
    """The domain's schema that fits this op and blob when the export does not say which."""
    want = {"nranks", "rank"} if INIT_RANGE.match(op) else {"size"}
    need = _NEEDS.get(op[4:].lower()) if op.startswith("nccl") else None
    best: tuple[int, int, Schema] | None = None
    for (d, sid), sch in schemas.items():
        keys = sch.keys()
        if d != dom or not want <= keys or (sch.size is not None and sch.size != len(blob)):
            continue
        score = (need in keys if need else 0) - len(keys - want - {need, "comm"})
        if best is None or (score, -sid) > best[:2]:
            best = (score, -sid, sch)
    return best[2] if best else None


def decode_payload(
    r: NcclRange, schemas: dict[tuple[int, int], Schema], by_event: dict[int, int]
) -> dict[str, int]:
    """The facts (comm, size, nranks, rank, peer, ...) one NCCL range carries, if any."""
    pl = r.payload
    for key in ("jsonText", "jsonTextRef"):
        text = pl.get(key)
        if isinstance(text, str) and text.strip().startswith("{"):
            try:
                obj = json.loads(text)
            except ValueError:
                continue
            flat = {k2: v2 for v in obj.values() if isinstance(v, dict) for k2, v2 in v.items()}
            facts = {
                fk: int(v)
                for k, v in {**obj, **flat}.items()
                if (fk := field_key(str(k)))
                and isinstance(v, int | float | str)
                and str(v).lstrip("-").isdigit()
            }
            if facts:
                return facts
    blob = pl.get("binaryData")
    if isinstance(blob, str):
        text = blob
        try:
            blob = bytes.fromhex(text)
        except ValueError:
            blob = text.encode("latin-1", "replace")
    if not isinstance(blob, bytes | bytearray) or not blob:
        return {}
    dom = int(str(pl.get("domainId", 0)))
    sid = by_event.get(int(str(pl["eventId"]))) if "eventId" in pl else None
    blob = bytes(blob)
    sch = schemas.get((dom, sid)) if sid is not None else _choose(schemas, dom, r.name, blob)
    return sch.decode(blob) if sch else {}


@dataclass
class ProcNccl:
    """NCCL facts of one process: communicators seen at init and the rank it had in them."""

    comms: dict[int, int] = field(default_factory=dict)  # comm id -> nranks
    inits: list[dict[str, int]] = field(default_factory=list)

    def rank_world(self) -> tuple[int, int] | None:
        """(rank, nranks) in the largest communicator, when the payload says so unambiguously."""
        full = [f for f in self.inits if "rank" in f and "nranks" in f]
        if not full:
            return None
        top = max(f["nranks"] for f in full)
        ranks = {f["rank"] for f in full if f["nranks"] == top}
        return (ranks.pop(), top) if len(ranks) == 1 else None


def comm_info(
    rep: Report, ranges: dict[tuple[int, int], list[NcclRange]], launches: Sequence[pa.Table]
) -> tuple[pa.Table, dict[int, ProcNccl]]:
    """Table (pid, corr, pg_name, op, bytes, group_size, peer) and per-process NCCL facts."""
    schemas = load_schemas(rep)
    by_event: dict[int, int] = {}
    if rep.has("NVTX_EVENTS_PAYLOAD_SCHEMAS"):
        by_event = {
            int(e): int(s)
            for e, s in rep.query(
                "SELECT eventId, payloadSchemaID FROM NVTX_EVENTS_PAYLOAD_SCHEMAS"
            )
        }
    facts: dict[int, dict[str, int]] = {}
    procs: dict[int, ProcNccl] = {}
    for (pid, _tid), rs in ranges.items():
        proc = procs.setdefault(pid, ProcNccl())
        for r in rs:
            f = facts[id(r)] = decode_payload(r, schemas, by_event)
            if INIT_RANGE.match(r.name) and f:
                proc.inits.append(f)
                if "comm" in f and "nranks" in f:
                    proc.comms[f["comm"]] = f["nranks"]
    by_thread: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for t in launches:
        for p, th, ts, corr in zip(*(t.column(i).to_pylist() for i in range(4)), strict=True):
            if corr is not None:
                by_thread.setdefault((p, th), []).append((ts, corr))
    rows: dict[str, list[Any]] = {
        k: [] for k in ("pid", "corr", "pg_name", "op", "bytes", "group_size", "peer")
    }
    for key, calls in by_thread.items():
        rs = ranges.get(key, [])
        starts = [r.start for r in rs]
        used: set[int] = set()
        for ts, corr in sorted(calls):
            i = bisect.bisect_right(starts, ts) - 1
            if i < 0 or rs[i].end < ts:
                continue
            ops = _ops_of(rs, i)
            if not ops:
                continue
            info = _info(ops, [facts[id(o)] for o in ops], procs[key[0]], first=i not in used)
            used.add(i)
            for k, v in zip(rows, (key[0], corr, *info), strict=True):
                rows[k].append(v)
    types = [pa.int64(), pa.int64(), pa.string(), pa.string(), pa.int64(), pa.int32(), pa.int32()]
    table = pa.table({k: pa.array(v, ty) for (k, v), ty in zip(rows.items(), types, strict=True)})
    return table, procs


def _ops_of(rs: list[NcclRange], i: int) -> list[NcclRange]:
    """The NCCL ops a launch inside range i belongs to."""
    if OP_RANGE.match(rs[i].name):
        return [rs[i]]
    if rs[i].name != "ncclGroupEnd":
        return []
    ops: list[NcclRange] = []
    for r in reversed(rs[:i]):
        if r.name in ("ncclGroupStart", "ncclGroupEnd"):
            break
        if OP_RANGE.match(r.name):
            ops.append(r)
    return ops[::-1]


def _info(
    ops: list[NcclRange], facts: list[dict[str, int]], proc: ProcNccl, first: bool
) -> tuple[str | None, str | None, int | None, int | None, int | None]:
    """(pg_name, op, bytes, group_size, peer) for a kernel launched for these ops."""
    comms = {f["comm"] for f in facts if "comm" in f}
    comm = comms.pop() if len(comms) == 1 else None
    nranks = proc.comms.get(comm) if comm is not None else None
    if nranks is None and len(proc.comms) <= 1 and proc.inits:
        sizes = {f["nranks"] for f in proc.inits if "nranks" in f}
        nranks = sizes.pop() if len(sizes) == 1 else None
    names = {normalize_op(o.name[4:].replace("Bcast", "Broadcast")) for o in ops}
    op = names.pop() if len(names) == 1 else ("send_recv" if names == {"send", "recv"} else None)
    size = sum(f["size"] for f in facts) if first and all("size" in f for f in facts) else None
    world = proc.rank_world()
    peer = facts[0].get("peer") if len(ops) == 1 and world and nranks == world[1] else None
    return (f"{comm:#x}" if comm is not None else None, op, size, nranks, peer)
