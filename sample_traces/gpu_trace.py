"""Render a simulated rank (`gpu_sim.Timed` intervals) as the Kineto JSON torch writes.

Why its own module: the shapes of the events are the contract with the ingest (see
kineto-notes.md): host ops with `External id`, `cudaLaunchKernel` with `correlation`, kernels
on `pid` = device, `tid` = stream, NCCL kernels with the newer-torch group args but no peer,
`record_param_comms` with `Dst Rank`/`Src Rank` (global) and `Rank` (the peer's group rank),
persistent GEMMs launched with grid = SM count whatever the problem size; a host thread that
launches ahead of the device (as torch's does) and ends each step in cudaDeviceSynchronize.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ranklens.sample_traces.gpu_sim import Timed

if TYPE_CHECKING:
    from ranklens.sample_traces.gpu_job import GpuJob

SMS = 132
HOST_US = 4.0  # host time per op: launches run ahead of the device, as torch's do
# (kernel name, grid, host op, input dims) per kernel class k % 3 of a block.
_KERNELS = (
    (
        "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_persistent_kernel",
        [SMS, 1, 1],
        "aten::mm",
        [[2048, 4096], [4096, 4096]],
    ),
    (
        "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_persistent_kernel",
        [SMS, 1, 1],
        "aten::mm",
        [[4096, 4096], [4096, 8192]],
    ),
    (
        "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_persistent_kernel",
        [SMS, 1, 1],
        "aten::mm",
        [[8192, 4096], [4096, 8192]],
    ),
)
_STREAMS = {"compute": 7, "coll": 20, "async": 24, "batch": 39}
_NCCL = {
    "all_reduce": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
    "reduce_scatter": (
        "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
    ),
    "p2p": "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)",
}


def groups_of(job: GpuJob) -> list[dict[str, Any]]:
    """Megatron's groups with a global creation counter as pg_name (the same on every rank)."""
    out: list[dict[str, Any]] = [
        {"pg_name": "0", "pg_desc": "default_pg", "ranks": list(range(job.world))}
    ]

    def add(desc: str, members: list[int]) -> None:
        out.append({"pg_name": str(len(out)), "pg_desc": desc, "ranks": members})

    if job.tp > 1:
        for s in range(job.pp):
            for d in range(job.dp):
                add("TENSOR_MODEL_PARALLEL_GROUP", [job.rank(t, d, s) for t in range(job.tp)])
    if job.dp > 1:
        for s in range(job.pp):
            for t in range(job.tp):
                add("DATA_PARALLEL_GROUP", [job.rank(t, d, s) for d in range(job.dp)])
    if job.pp > 1:
        for d in range(job.dp):
            for t in range(job.tp):
                add("PIPELINE_MODEL_PARALLEL_GROUP", [job.rank(t, d, s) for s in range(job.pp)])
    return out


def rank_doc(
    job: GpuJob,
    rank: int,
    timed: list[Timed],
    windows: list[tuple[int, float, float]],
    groups: list[dict[str, Any]],
    base_ns: int,
) -> dict[str, Any]:
    """One rank's Kineto document; times are the rank's own clock (true time + shift)."""
    mine = [g for g in groups if rank in g["ranks"]]
    by_desc = {g["pg_desc"]: g for g in mine}
    shift = job.shift_us(rank)
    pid, dev = 100000 + rank, rank % job.ranks_per_host
    ev: list[dict[str, Any]] = []
    for step, s, e in windows:
        ev.append(_x("user_annotation", f"ProfilerStep#{step}", pid, pid, s + shift, e - s))
    win = {step: s + shift for step, s, _ in windows}
    host_at: dict[int, float] = {}  # step -> when the host thread is free again
    dev_end: dict[int, float] = {}
    for corr, tm in enumerate(timed, start=1):
        start = tm.start + shift
        step = int(tm.meta["step"])
        free = host_at.get(step, win[step] + 0.001 * (corr % 500))
        # the host runs ahead of the device: HOST_US per op, less for short kernels (a host
        # slower than the device would make the run host-bound, which the device-only
        # simulation does not model); a launch is never later than the host is free
        cost = max(min(HOST_US, 0.4 * (tm.end - tm.start)), 0.05)
        op_us = min(1.0, 0.8 * cost)
        host = free
        host_at[step] = host + (cost if tm.kind == "compute" else max(cost, 1.2))
        dev_end[step] = max(dev_end.get(step, 0.0), tm.end + shift)
        meta = tm.meta
        if tm.kind == "compute":
            k = int(meta.get("k", 0)) % 3
            name, grid, op, dims = _KERNELS[k]
            if meta.get("phase") == "B":  # backward GEMMs (wgrad) multiply other shapes
                dims = [[dims[1][1], dims[0][0]], [dims[0][0], dims[0][1]]]
            if meta.get("phase") == "O":
                name, grid, op, dims = (
                    "multi_tensor_apply_kernel",
                    [320, 1, 1],
                    "aten::_foreach_add_",
                    [[4096]],
                )
            ev.append(
                _x("cpu_op", op, pid, pid, host, op_us, {"External id": corr, "Input Dims": dims})
            )
            kargs: dict[str, Any] = {"grid": grid, "block": [384, 1, 1]}
            stream = _STREAMS["compute"]
        elif meta.get("op") == "batch":
            ev += _batch_ops(job, by_desc["PIPELINE_MODEL_PARALLEL_GROUP"], pid, host, corr, meta)
            name, kargs, stream = _NCCL["p2p"], {}, _STREAMS["batch"]
        else:
            if tm.kind == "p2p":
                g = by_desc["PIPELINE_MODEL_PARALLEL_GROUP"]
                coll, name = str(meta["op"]), _NCCL["p2p"]
            else:
                g = by_desc[
                    "TENSOR_MODEL_PARALLEL_GROUP"
                    if meta.get("group") == "tp"
                    else "DATA_PARALLEL_GROUP"
                ]
                coll, name = str(meta["op"]), _NCCL[str(meta["op"])]
            nel = int(meta.get("nelems", 1 << 22))
            kargs = {
                "Collective name": coll,
                "In msg nelems": nel,
                "Out msg nelems": nel,
                "Group size": len(g["ranks"]),
                "dtype": "BFloat16",
                "Process Group Name": g["pg_name"],
                "Process Group Description": g["pg_desc"],
                "Process Group Ranks": str(g["ranks"]),
            }
            rpc: dict[str, Any] = {"External id": corr, **kargs}
            if tm.kind == "p2p":
                peer = int(meta["peer"])
                rpc["Rank"] = g["ranks"].index(peer)
                if job.peers:
                    rpc["Dst Rank" if coll == "send" else "Src Rank"] = peer
                # torch: one NCCL communicator and stream per pair of p2p peers
                stream = 40 + g["ranks"].index(peer)
            else:
                stream = _STREAMS["async" if tm.stream == "async" else "coll"]
            ev.append(_x("cpu_op", "record_param_comms", pid, pid, host, op_us, rpc))
        rt = {"correlation": corr, "External id": corr}
        ev.append(_x("cuda_runtime", "cudaLaunchKernel", pid, pid, host + op_us / 2, op_us / 2, rt))
        kargs = {**kargs, "device": dev, "stream": stream, "correlation": corr, "External id": corr}
        ev.append(_x("kernel", name, dev, stream, start, tm.end - tm.start, kargs))
    for step, free in host_at.items():  # the step ends with the host waiting for the device
        ev.append(
            _x(
                "cuda_runtime",
                "cudaDeviceSynchronize",
                pid,
                pid,
                free,
                max(dev_end[step] + 1 - free, 1.0),
            )
        )
    return {
        "schemaVersion": 1,
        "deviceProperties": [
            {"id": dev, "name": "NVIDIA H100 80GB HBM3", "numSms": SMS, "totalGlobalMem": 85e9}
        ],
        "distributedInfo": {
            "backend": "nccl",
            "rank": rank,
            "world_size": job.world,
            "pg_count": len(mine),
            "pg_config": [
                {
                    "pg_name": g["pg_name"],
                    "pg_desc": g["pg_desc"],
                    "backend_config": "cuda:nccl",
                    "pg_size": len(g["ranks"]),
                    "ranks": g["ranks"],
                }
                for g in mine
            ],
        },
        "baseTimeNanoseconds": base_ns,
        "host_name": f"node{rank // job.ranks_per_host:04d}",
        "traceEvents": ev,
        "traceName": f"/tmp/rank{rank}.pt.trace.json",
    }


def _batch_ops(
    job: GpuJob, g: dict[str, Any], pid: int, host: float, corr: int, meta: dict[str, Any]
) -> list[dict[str, Any]]:
    """What torch records for batch_isend_irecv: a `record_param_comms` per op (its group and
    peer; it launches nothing), then `nccl:coalesced`, under which ncclGroupEnd launches the
    one kernel: that kernel carries no group or peer of its own."""
    out = []
    for i, o in enumerate(meta["ops"]):
        rpc: dict[str, Any] = {
            "External id": 50_000_000 + 16 * corr + i,
            "Collective name": o["op"],
            "In msg nelems": int(o["nelems"]),
            "Out msg nelems": int(o["nelems"]),
            "Group size": len(g["ranks"]),
            "dtype": "BFloat16",
            "Process Group Name": g["pg_name"],
            "Process Group Description": g["pg_desc"],
            "Process Group Ranks": str(g["ranks"]),
        }
        if job.peers:
            rpc["Dst Rank" if o["op"] == "send" else "Src Rank"] = int(o["peer"])
        out.append(_x("cpu_op", "record_param_comms", pid, pid, host + 0.02 * i, 0.01, rpc))
    out.append(_x("cpu_op", "nccl:coalesced", pid, pid, host + 0.2, 0.9, {"External id": corr}))
    return out


def _x(
    cat: str,
    name: str,
    pid: int,
    tid: int,
    ts: float,
    dur: float,
    args: dict[str, Any] | None = None,
) -> dict[str, Any]:
    e: dict[str, Any] = {
        "ph": "X",
        "cat": cat,
        "name": name,
        "pid": pid,
        "tid": tid,
        "ts": round(ts, 3),
        "dur": round(dur, 3),
    }
    if args is not None:
        e["args"] = args
    return e
