"""NVTX ranges of an Nsight export -> annotation events, and the NCCL domain's ranges.

Why: NVTX carries the step markers (`ProfilerStep#N` from PyTorch's NVTX emission or the user)
and, in NCCL's own domain, the only communicator and message-size facts Nsight records.
Push/pop (59) and start/end (60) ranges both become `annotation` events on the thread that
opened them; marks (34) have no duration and are left out, and ranges whose end was cut off by
the capture window (end NULL) are dropped and counted in a warning.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
from ranklens.ingest.nsys_meta import PID_SQL
from ranklens.ingest.nsys_sqlite import Report
from ranklens.ingest.nsys_tables import build, duration, labels, pid_of, tid_of

NVTX = "NVTX_EVENTS"
_RANGES = "eventType IN (59, 60)"
_BATCH = 65536


@dataclass
class NcclRange:
    """One range in NCCL's NVTX domain, with its raw payload columns."""

    start: int
    end: int
    name: str
    payload: dict[str, object] = field(default_factory=dict)


@dataclass
class Nvtx:
    """What the NVTX table yielded besides annotation events."""

    domains: dict[tuple[int, int], str] = field(default_factory=dict)  # (pid, id) -> name
    nccl: dict[tuple[int, int], list[NcclRange]] = field(default_factory=dict)  # (pid, tid)
    open_ranges: int = 0


def _name_sql(rep: Report) -> tuple[str, str]:
    """(expression, join) giving a range's text whether inline or a registered string."""
    if "textId" in rep.columns(NVTX) and rep.has("StringIds"):
        return "coalesce(n.text, s.value)", "LEFT JOIN StringIds s ON s.id = n.textId"
    return "n.text", ""


def read_domains(rep: Report) -> dict[tuple[int, int], str]:
    """Domain names per process from the NvtxDomainCreate (75) rows, when the export kept them."""
    out: dict[tuple[int, int], str] = {}
    for g, dom, text in rep.query(
        f"SELECT globalTid, domainId, text FROM {NVTX} "
        "WHERE eventType = 75 AND domainId IS NOT NULL"
    ):
        out[((int(g or 0) >> 24) & 0xFFFFFF, int(dom))] = str(text)
    return out


def nccl_domains(rep: Report, named: dict[tuple[int, int], str]) -> dict[tuple[int, int], str]:
    """(pid, domainId) of NCCL's domain: named 'NCCL', or (windowed exports that lost the
    domain-create row) a non-default domain whose every range name starts with 'nccl'."""
    found = {k: v for k, v in named.items() if v == "NCCL"}
    expr, join = _name_sql(rep)
    names: dict[tuple[int, int], set[str]] = {}
    for pid, dom, name in rep.query(
        f"SELECT DISTINCT {PID_SQL.format(c='n.globalTid')}, n.domainId, {expr} "
        f"FROM {NVTX} n {join} WHERE n.{_RANGES} AND n.domainId > 0"
    ):
        names.setdefault((int(pid), int(dom)), set()).add(str(name or ""))
    for key, ns in names.items():
        if key not in named and all(n.startswith("nccl") for n in ns):
            found[key] = "NCCL"
    return found


def read_nvtx(rep: Report, shift: int, out: Nvtx) -> Iterator[pa.Table]:
    """Annotation events (with `_pid`); fills `out` with domains, NCCL ranges, cut ranges."""
    if not rep.has(NVTX):
        return
    out.domains = read_domains(rep)
    nccl = nccl_domains(rep, out.domains)
    out.domains.update(nccl)
    out.open_ranges = int(
        rep.query(f'SELECT count(*) FROM {NVTX} WHERE {_RANGES} AND "end" IS NULL')[0][0]
    )
    expr, join = _name_sql(rep)
    cur = rep.con.execute(
        f'SELECT n.start, n."end", n.globalTid, n.domainId, {expr} FROM {NVTX} n {join} '
        f'WHERE n.{_RANGES} AND n."end" IS NOT NULL'
    )

    def cat(key: int) -> str:
        dom = key & 0xFFFFFFFF
        name = out.domains.get((key >> 32, dom))
        return "nvtx" if dom == 0 else f"nvtx:{name or dom}"

    while rows := cur.fetchmany(_BATCH):
        s, e, g, dom, name = (pa.array(c) for c in zip(*rows, strict=True))
        s, e, g = (c.cast(pa.int64()) for c in (s, e, g))
        pid = pid_of(g)
        dom = pc.fill_null(dom.cast(pa.int64()), 0)
        yield build(
            len(s),
            {
                "kind": "annotation",
                "name": name.cast(pa.string()),
                "device": -1,
                "stream": tid_of(g),
                "pid": pid,
                "tid": tid_of(g),
                "ts_ns": pc.add(s, shift),
                "dur_ns": duration(s, e),
                "_pid": pid,
                "cat": labels(pc.add(pc.shift_left(pid, 32), dom), cat),
            },
        )
    if nccl:
        out.nccl = _nccl_ranges(rep, sorted({d for _p, d in nccl}), set(nccl))


def _nccl_ranges(
    rep: Report, dom_ids: list[int], keep: set[tuple[int, int]]
) -> dict[tuple[int, int], list[NcclRange]]:
    """NCCL-domain ranges per (pid, tid), sorted by start, with whatever payload columns exist."""
    cols = rep.columns(NVTX)
    extra = [
        c for c in ("jsonText", "binaryData", "eventId", "int64Value", "uint64Value") if c in cols
    ]
    expr, join = _name_sql(rep)
    jt = (
        "(SELECT value FROM StringIds WHERE id = n.jsonTextId)"
        if "jsonTextId" in cols and rep.has("StringIds")
        else "NULL"
    )
    sel = ", ".join([f'n."{c}"' for c in extra] + [f"{jt} AS jsonTextRef"])
    marks = ",".join("?" * len(dom_ids))
    out: dict[tuple[int, int], list[NcclRange]] = {}
    factory = rep.con.text_factory
    rep.con.text_factory = bytes  # binaryData may be stored as TEXT; keep its bytes intact
    try:
        rows = rep.query(
            f'SELECT n.start, n."end", n.globalTid, n.domainId, {expr}, {sel} FROM {NVTX} n '
            f'{join} WHERE n.{_RANGES} AND n."end" IS NOT NULL AND n.domainId IN ({marks}) '
            "ORDER BY n.start",
            dom_ids,
        )
    finally:
        rep.con.text_factory = factory
    names = [*extra, "jsonTextRef"]
    for s, e, g, dom, name, *payload in rows:
        p, t = (int(g) >> 24) & 0xFFFFFF, int(g) & 0xFFFFFF
        if (p, int(dom)) not in keep:
            continue
        if isinstance(name, bytes):
            name = name.decode("utf-8", "replace")
        pl = {
            k: v.decode("utf-8", "replace") if isinstance(v, bytes) and k != "binaryData" else v
            for k, v in zip(names, payload, strict=True)
            if v is not None
        }
        pl["domainId"] = int(dom)
        out.setdefault((p, t), []).append(NcclRange(int(s), int(e), str(name or ""), pl))
    return out
