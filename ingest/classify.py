"""Event classification rules, applied once at ingest (never per analysis).

The rules are data so both readers share them and tests can list them. Communication is more
than NCCL: DeepEP's dispatch/combine kernels and other collective libraries count too.
"""

from __future__ import annotations

import re

# Device kernels whose name marks them as communication.
COMM_KERNEL_PATTERNS: tuple[str, ...] = (
    r"^nccl",  # ncclKernel_*, ncclDevKernel_* (NCCL), also RCCL
    r"(^|\W)nccl[A-Z_]",
    r"dpsk::ep::",  # DeepSeek DeepEP dispatch/combine/notify_dispatch
    r"deep_ep::",
    r"^(void )?(mscclpp|msccl)",
    r"cross_device_reduce",  # vLLM/sglang custom all-reduce
    r"(^|::)(one_shot|two_shot)_all_reduce",
    r"userbuffers",  # Transformer Engine comm-GEMM overlap
)
COMM_KERNEL_RE = re.compile("|".join(COMM_KERNEL_PATTERNS))

# Host-side spans that *are* the execution of a CPU (gloo) collective or a blocking p2p wait.
GLOO_EXEC_RE = re.compile(r"^gloo:")

# Host ops that issue a collective (short; the work runs elsewhere).
COMM_CALL_RE = re.compile(
    r"^(c10d::|record_param_comms$|nccl:|c10d_functional::|_c10d_functional::)"
)

SYNC_RE = re.compile(
    r"^(cudaDeviceSynchronize|cudaStreamSynchronize|cudaEventSynchronize|cudaStreamWaitEvent"
    r"|cuStreamSynchronize|cuCtxSynchronize|cuEventSynchronize)"
)

# The one step marker of every format: classified `annotation` here, numbered by step_assign.
STEP_RE = re.compile(r"^ProfilerStep#(\d+)$")

# Collective op names, normalized (from NCCL kernel names, `Collective name` args, c10d/gloo).
_OP_ALIASES: dict[str, str] = {
    "allreduce": "all_reduce",
    "all_reduce": "all_reduce",
    "allgather": "all_gather",
    "all_gather": "all_gather",
    "_allgather_base": "all_gather",
    "allgather_into_tensor_coalesced": "all_gather",
    "all_gather_into_tensor": "all_gather",
    "reducescatter": "reduce_scatter",
    "reduce_scatter": "reduce_scatter",
    "_reduce_scatter_base": "reduce_scatter",
    "reduce_scatter_tensor": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "alltoall": "all_to_all",
    "all_to_all": "all_to_all",
    "alltoall_base": "all_to_all",
    "all_to_allv": "all_to_all",
    "alltoallv": "all_to_all",
    "broadcast": "broadcast",
    "reduce": "reduce",
    "gather": "gather",
    "scatter": "scatter",
    "barrier": "barrier",
    "send": "send",
    "recv": "recv",
    "recv_": "recv",
    "recv_any_source": "recv",
    "sendrecv": "send_recv",
    "coalesced": "coalesced",
    "allreduce_coalesced": "all_reduce",
    "dispatch": "all_to_all",
    "combine": "all_to_all",
    "notify_dispatch": "all_to_all",
}

_NCCL_KERNEL_OP_RE = re.compile(r"nccl(?:Dev)?Kernel_([A-Za-z]+)")


def normalize_op(raw: str | None) -> str | None:
    """Map a collective name as any framework spells it onto ranklens' op vocabulary."""
    if not raw:
        return None
    key = raw.strip().lower()
    for prefix in ("c10d::", "gloo:", "nccl:", "_c10d_functional::", "c10d_functional::"):
        if key.startswith(prefix):
            key = key[len(prefix) :]
    key = key.rstrip("_") if key not in ("recv_",) else key
    return _OP_ALIASES.get(key, _OP_ALIASES.get(key.rstrip("_"), key))


def kernel_op(name: str) -> str | None:
    """Collective op from a communication kernel's name (older traces carry no args)."""
    m = _NCCL_KERNEL_OP_RE.search(name)
    if m:
        return normalize_op(m.group(1))
    for part in ("notify_dispatch", "dispatch", "combine"):
        if f"::{part}" in name:
            return normalize_op(part)
    return None


def is_comm_kernel(name: str) -> bool:
    """True for device kernels that perform communication."""
    return COMM_KERNEL_RE.search(name) is not None


_DEVICE_CATS = {"kernel": "compute", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}


def kind_of(cat: str, name: str, has_device: bool) -> str:
    """The event kind (schema.KINDS) of a Kineto event.

    In a CPU-only trace the host ops *are* the compute, and gloo's worker spans are the
    communication; in a GPU trace the kernels are, and host ops are just the launching side.
    """
    if STEP_RE.match(name):
        return "annotation"
    dev = _DEVICE_CATS.get(cat)
    if dev is not None:
        return "comm" if dev == "compute" and is_comm_kernel(name) else dev
    if GLOO_EXEC_RE.match(name):
        return "comm"
    if cat in ("cuda_runtime", "cuda_driver", "cuda_api", "runtime"):
        return "sync" if SYNC_RE.match(name) else "runtime"
    if cat in ("cpu_op", "operator"):
        if has_device or COMM_CALL_RE.match(name):
            return "cpu_op"
        return "compute"
    if cat in ("user_annotation", "gpu_user_annotation", "python_function"):
        return "annotation"
    return "other"


def comm_op_of(cat: str, name: str, coll: str | None) -> str | None:
    """Normalized collective op of an event, or None if it is not communication-related."""
    if coll:
        return normalize_op(coll)
    if cat == "kernel":
        return kernel_op(name) if is_comm_kernel(name) else None
    if GLOO_EXEC_RE.match(name) or name.startswith(("c10d::", "nccl:")):
        return normalize_op(name)
    return None
