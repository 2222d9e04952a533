"""Report-level facts of an Nsight export: clock shift, host, GPUs, processes, rank hints.

Why: these decide how every event is placed (clock) and attributed (rank, host, device), and
they live in tables whose names and columns changed across export-schema versions.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ranklens.ingest.nsys_sqlite import Report

PID_SQL = "(({c} >> 24) & 16777215)"  # globalTid/globalPid -> OS pid
TID_SQL = "({c} & 16777215)"  # globalTid -> OS tid

_RANK_ENV = ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID")
_SIZE_ENV = ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "SLURM_NTASKS")
_ENV_ROW = re.compile(r'^([A-Za-z_][A-Za-z0-9_]*)="?(.*?)"?$', re.S)
_RANK_TEXT = re.compile(r"\brank\s*[:#=]?\s*(\d+)\b", re.I)


@dataclass
class Gpu:
    """One TARGET_INFO_GPU row."""

    vm: int | None
    cu_device: int
    name: str | None
    sms: int | None


@dataclass
class Meta:
    """What the report says about itself, resolved once."""

    schema_version: str | None = None
    shift_ns: int = 0  # added to every raw timestamp to reach UTC epoch ns
    clock_note: str | None = None  # warning about how the shift was chosen
    host: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    gpus: list[Gpu] = field(default_factory=list)
    process_names: dict[int, str] = field(default_factory=dict)
    thread_names: dict[tuple[int, int], str] = field(default_factory=dict)
    mpi_rank: dict[int, int] = field(default_factory=dict)  # pid -> rank (MPI_RANKS)
    nvtx_rank: dict[int, int] = field(default_factory=dict)  # pid -> rank ("MPI Rank 0")

    @property
    def env_rank(self) -> int | None:
        return _first_int(self.env, _RANK_ENV)

    @property
    def env_world_size(self) -> int | None:
        return _first_int(self.env, _SIZE_ENV)

    def gpu(self, device: int, vm: int | None) -> Gpu | None:
        """The GPU a CUDA ordinal names (deviceId matches cuDevice, not nsys' own id)."""
        same = [g for g in self.gpus if g.cu_device == device]
        return next((g for g in same if vm is None or g.vm in (None, vm)), None) or (
            same[0] if same else None
        )


def _first_int(env: dict[str, str], keys: tuple[str, ...]) -> int | None:
    for k in keys:
        v = env.get(k, "").strip()
        if v.isdigit():
            return int(v)
    return None


def read_meta(rep: Report) -> Meta:
    """Collect the report-level facts, tolerating every table being absent."""
    m = Meta()
    export = rep.kv("META_DATA_EXPORT") or rep.kv("EXPORT_META_DATA")  # 3.x / 2.x name
    m.schema_version = export.get("EXPORT_SCHEMA_VERSION")
    m.shift_ns, m.clock_note = _clock(rep, export)
    if rep.has("TARGET_INFO_SYSTEM_ENV"):
        hosts = rep.query("SELECT value FROM TARGET_INFO_SYSTEM_ENV WHERE name = 'Hostname'")
        m.host = str(hosts[0][0]) if hosts else None
    if rep.has("META_DATA_CAPTURE"):
        for (val,) in rep.query(
            "SELECT value FROM META_DATA_CAPTURE WHERE name LIKE '%ENVIRONMENT_VARIABLE%'"
        ):
            hit = _ENV_ROW.match(str(val or ""))
            if hit:
                m.env.setdefault(hit.group(1), hit.group(2))
    if rep.has("TARGET_INFO_GPU"):
        t = "TARGET_INFO_GPU"
        rows = rep.query(
            f"SELECT {rep.col(t, 'vmId')}, {rep.col(t, 'cuDevice', rep.col(t, 'id'))},"
            f" {rep.col(t, 'name')}, {rep.col(t, 'smCount')} FROM {t}"
        )
        m.gpus = [Gpu(vm, int(dev), name, sms) for vm, dev, name, sms in rows if dev is not None]
    if rep.has("PROCESSES"):
        m.process_names = {
            int(p): str(n)
            for p, n in rep.query(
                "SELECT pid, name FROM PROCESSES WHERE pid IS NOT NULL AND name IS NOT NULL"
            )
        }
    if rep.has("ThreadNames") and rep.has("StringIds"):
        for g, name in rep.query(
            "SELECT t.globalTid, s.value FROM ThreadNames t JOIN StringIds s ON s.id = t.nameId"
        ):
            m.thread_names[((int(g) >> 24) & 0xFFFFFF, int(g) & 0xFFFFFF)] = str(name)
    if rep.has("MPI_RANKS"):
        for g, rank in rep.query("SELECT globalTid, rank FROM MPI_RANKS"):
            m.mpi_rank.setdefault((int(g) >> 24) & 0xFFFFFF, int(rank))
    if rep.has("NVTX_EVENTS"):  # nvtxNameOsThread rows such as "MPI Rank 0"
        for g, text in rep.query("SELECT globalTid, text FROM NVTX_EVENTS WHERE eventType = 39"):
            hit = _RANK_TEXT.search(str(text or ""))
            if hit and g is not None:
                m.nvtx_rank.setdefault((int(g) >> 24) & 0xFFFFFF, int(hit.group(1)))
                m.thread_names[((int(g) >> 24) & 0xFFFFFF, int(g) & 0xFFFFFF)] = str(text)
    return m


def _clock(rep: Report, export: dict[str, str]) -> tuple[int, str | None]:
    """(shift to UTC epoch ns, note) following the clock rules of docs/nsys-schema.md s.3."""
    user_shift = _int(export.get("EXPORT_PARAM_TIME_SHIFT")) or 0
    if export.get("EXPORT_PARAM_TIME_NORMALIZE", "false").lower() == "true":
        return -user_shift, None  # nsys already added utcEpochNs (and any --ts-shift)
    start = "TARGET_INFO_SESSION_START_TIME"
    if not rep.has(start):
        return -user_shift, (
            "no TARGET_INFO_SESSION_START_TIME: timestamps stay on the "
            "report's session clock, not UTC; ranks from other reports "
            "will need clock alignment"
        )
    sys_col = rep.col(start, "systemClockNs")
    utc, sys_clock = rep.query(f"SELECT utcEpochNs, {sys_col} FROM {start}")[0]
    utc, sys_clock = _int(utc) or 0, _int(sys_clock)
    if sys_clock:
        return utc - sys_clock - user_shift, (
            f"time base is ambiguous in this export (schema {export.get('EXPORT_SCHEMA_VERSION')}"
            f", systemClockNs={sys_clock}): used UTC = utcEpochNs + ts - systemClockNs; "
            "re-export with `nsys export --ts-normalize=true` to remove the doubt"
        )
    return utc - user_shift, None


def _int(v: object) -> int | None:
    try:
        return int(str(v)) if v is not None else None
    except ValueError:
        return None
