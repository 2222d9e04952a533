"""Write small synthetic Kineto (PyTorch profiler) JSON traces for tests.

A `KinetoTrace` is a compact description of one rank's trace: host step spans, CUDA runtime
launches, kernels on streams (compute, NCCL, DeepEP), memcpy/memset, CPU ops and gloo spans,
plus the header (`distributedInfo` with `pg_config`, `deviceProperties`). `write()` renders it
in either flavour and optionally gzips it.

Times are given in microseconds relative to the trace origin, so a test can write its expected
values as plain numbers: the event starting at `t` µs is at absolute `base_ns + t * 1000` ns in
both flavours (`new`: `ts = t` with `baseTimeNanoseconds = base_ns`; `old`: `ts = base_ns/1000 +
t`, absolute epoch µs and no base).
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

BASE_NS = 1_700_000_000_000_000_000
"""Default trace origin (epoch ns), a multiple of 1000 so both flavours agree exactly."""

Flavour = Literal["new", "old"]
Event = dict[str, Any]


def ns(t_us: float, base_ns: int = BASE_NS) -> int:
    """The absolute ns an ingest must give a time written as `t_us` µs in a built trace."""
    return base_ns + round(t_us * 1000)


@dataclass
class PgConfig:
    """One `distributedInfo.pg_config` entry (a process group this rank belongs to)."""

    pg_name: str
    ranks: list[int]
    pg_desc: str = "undefined"
    backend_config: str = "cuda:nccl"

    def as_json(self) -> dict[str, Any]:
        return {
            "pg_name": self.pg_name,
            "pg_desc": self.pg_desc,
            "backend_config": self.backend_config,
            "pg_size": len(self.ranks),
            "ranks": list(self.ranks),
        }


@dataclass
class KinetoTrace:
    """One rank's trace, built event by event; every `add_*` method returns the event dict.

    Attributes:
        rank: `distributedInfo.rank`; None writes no `distributedInfo` at all.
        world_size: `distributedInfo.world_size`.
        backend: `distributedInfo.backend`.
        pg_config: the groups this rank belongs to.
        flavour: "new" (relative ts + baseTimeNanoseconds) or "old" (absolute epoch µs).
        base_ns: the trace origin.
        device_name: GPU model for `deviceProperties`; None writes an empty list (CPU traces).
        pid, tid: host process and main thread ids.
        events: the trace events in µs relative to the origin (rendered by `to_json`).
        extra_header: more top-level keys (e.g. `host_name`).
    """

    rank: int | None = 0
    world_size: int | None = 1
    backend: str = "nccl"
    pg_config: list[PgConfig] = field(default_factory=list)
    flavour: Flavour = "new"
    base_ns: int = BASE_NS
    device_name: str | None = "NVIDIA H100 80GB HBM3"
    num_sms: int = 132
    pid: int = 4242
    tid: int = 4242
    events: list[Event] = field(default_factory=list)
    extra_header: dict[str, Any] = field(default_factory=dict)
    _next_corr: int = field(default=1000, init=False, repr=False)

    # -- host side -----------------------------------------------------------------------------
    def add(self, ph: str = "X", **fields: Any) -> Event:
        """Append a raw event (times in relative µs); no field is checked or filled in."""
        ev: Event = {"ph": ph, **fields}
        self.events.append(ev)
        return ev

    def step(self, n: int, start: float, end: float, cat: str = "user_annotation") -> Event:
        """A `ProfilerStep#n` span on the main thread."""
        return self.host(f"ProfilerStep#{n}", start, end - start, cat=cat)

    def host(
        self,
        name: str,
        start: float,
        dur: float,
        *,
        cat: str = "cpu_op",
        tid: int | None = None,
        args: dict[str, Any] | None = None,
    ) -> Event:
        """A host event (cpu_op, user_annotation, cuda_runtime, ...) on a thread."""
        ev = self.add(
            cat=cat,
            name=name,
            pid=self.pid,
            tid=self.tid if tid is None else tid,
            ts=start,
            dur=dur,
        )
        if args is not None:
            ev["args"] = args
        return ev

    def gloo(self, op: str, start: float, dur: float, tid: int = 7777) -> Event:
        """A gloo collective's execution span (`gloo:<op>`) on a pt_gloo_runloop thread."""
        return self.host(f"gloo:{op}", start, dur, cat="user_annotation", tid=tid)

    def thread_name(self, tid: int, name: str) -> Event:
        """A `thread_name` metadata event."""
        return self.add("M", name="thread_name", pid=self.pid, tid=tid, ts=0, args={"name": name})

    def runtime(
        self, name: str, start: float, dur: float = 1.0, correlation: int | None = None
    ) -> Event:
        """A CUDA runtime call on the main thread (with a correlation id when given)."""
        args = (
            None
            if correlation is None
            else {"correlation": correlation, "External id": correlation}
        )
        return self.host(name, start, dur, cat="cuda_runtime", args=args)

    # -- device side ---------------------------------------------------------------------------
    def device_event(
        self,
        cat: str,
        name: str,
        start: float,
        dur: float,
        *,
        stream: int = 7,
        device: int = 0,
        launch: float | None = None,
        launched: bool = True,
        launch_name: str = "cudaLaunchKernel",
        args: dict[str, Any] | None = None,
    ) -> Event:
        """A device event with a fresh correlation id and, unless `launched=False`, the host
        launch carrying the same id at `launch` µs (default: 1 µs before `start`)."""
        self._next_corr += 1
        corr = self._next_corr
        if launched:
            self.runtime(launch_name, start - 1 if launch is None else launch, 0.5, corr)
        a: dict[str, Any] = {
            "device": device,
            "stream": stream,
            "correlation": corr,
            "External id": corr,
        }
        a.update(args or {})
        return self.add(cat=cat, name=name, pid=device, tid=stream, ts=start, dur=dur, args=a)

    def kernel(self, name: str, start: float, dur: float, **kw: Any) -> Event:
        """A compute kernel (any name that is not a communication kernel)."""
        kw.setdefault("args", {"grid": [128, 1, 1], "block": [256, 1, 1]})
        return self.device_event("kernel", name, start, dur, **kw)

    def nccl(
        self,
        op: str,
        start: float,
        dur: float,
        *,
        coll: str | None = None,
        pg_name: str | None = None,
        pg_desc: str | None = None,
        pg_ranks: list[int] | None = None,
        nelems: int | None = None,
        dtype: str | None = None,
        group_size: int | None = None,
        **kw: Any,
    ) -> Event:
        """An NCCL kernel `ncclDevKernel_<op>_RING_LL(...)` with the newer-torch args given."""
        a: dict[str, Any] = {}
        for key, val in (
            ("Collective name", coll),
            ("In msg nelems", nelems),
            ("Out msg nelems", nelems),
            ("Group size", group_size),
            ("dtype", dtype),
            ("Process Group Name", pg_name),
            ("Process Group Description", pg_desc),
            ("Process Group Ranks", None if pg_ranks is None else str(pg_ranks)),
        ):
            if val is not None:
                a[key] = val
        name = f"ncclDevKernel_{op}_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
        return self.device_event("kernel", name, start, dur, args=a, **kw)

    def memcpy(
        self,
        start: float,
        dur: float,
        nbytes: int = 4096,
        direction: str = "HtoD (Pageable -> Device)",
        **kw: Any,
    ) -> Event:
        """A `gpu_memcpy` event."""
        kw.setdefault("launch_name", "cudaMemcpyAsync")
        return self.device_event(
            "gpu_memcpy", f"Memcpy {direction}", start, dur, args={"bytes": nbytes}, **kw
        )

    def memset(self, start: float, dur: float, nbytes: int = 4096, **kw: Any) -> Event:
        """A `gpu_memset` event."""
        kw.setdefault("launch_name", "cudaMemsetAsync")
        return self.device_event(
            "gpu_memset", "Memset (Device)", start, dur, args={"bytes": nbytes}, **kw
        )

    # -- rendering -----------------------------------------------------------------------------
    def _ts(self, t: Any) -> Any:
        if self.flavour == "new" or not isinstance(t, int | float):
            return t
        return self.base_ns // 1000 + t

    def to_json(self) -> dict[str, Any]:
        """The trace as the JSON object Kineto writes."""
        doc: dict[str, Any] = {"schemaVersion": 1}
        if self.device_name is None:
            doc["deviceProperties"] = []
        else:
            doc["deviceProperties"] = [
                {"id": 0, "name": self.device_name, "numSms": self.num_sms, "totalGlobalMem": 85e9}
            ]
        if self.rank is not None:
            doc["distributedInfo"] = {
                "backend": self.backend,
                "rank": self.rank,
                "world_size": self.world_size,
                "pg_count": len(self.pg_config),
                "pg_config": [pg.as_json() for pg in self.pg_config],
            }
        if self.flavour == "new":
            doc["baseTimeNanoseconds"] = self.base_ns
        doc.update(self.extra_header)
        events = []
        for ev in self.events:
            out = dict(ev)
            if "ts" in out:
                out["ts"] = self._ts(out["ts"])
            events.append(out)
        doc["traceEvents"] = events
        doc["traceName"] = "/tmp/tmpabc123.pt.trace.json"
        return doc

    def dumps(self) -> bytes:
        """The rendered JSON bytes (ASCII; non-ASCII characters are escaped)."""
        return json.dumps(self.to_json()).encode()

    def write(self, path: str | Path, gz: bool | None = None) -> Path:
        """Write the trace to `path`; gzip when `gz` is true or the name ends in `.gz`."""
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        data = self.dumps()
        if gz if gz is not None else p.name.endswith(".gz"):
            data = gzip.compress(data, mtime=0)
        p.write_bytes(data)
        return p


def cpu_trace(rank: int, world_size: int = 2, **kw: Any) -> KinetoTrace:
    """A CPU-only (gloo) rank: no deviceProperties, backend gloo."""
    return KinetoTrace(rank=rank, world_size=world_size, backend="gloo", device_name=None, **kw)
