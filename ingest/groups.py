"""Parallelism labels (DP, TP, PP, CP, EP, DP_SHARD, WORLD, OTHER) for process groups.

Why here: the label is a column of `process_groups` that every analysis groups by, so it is
decided once, at ingest, with the evidence written beside it. Evidence, strongest first: a
layout the user gives (`--layout tp=2,pp=2,dp=2`, an override), the name the framework gave
the group (Megatron-LM, torchtitan/DeviceMesh, DeepSpeed, FSDP), the ops it carries (only
send/recv: PP; mostly all-to-all: EP), and spanning the whole world.
"""

from __future__ import annotations

import re

from ranklens.ingest.config import DIM_LABEL, Layout

# (pattern on the description, label) — Megatron-LM, torchtitan/DeviceMesh, DeepSpeed, FSDP.
_DESC_RULES: tuple[tuple[str, str], ...] = (
    (r"^default_pg$", "WORLD"),
    (r"EXPERT_DATA_PARALLEL|EXPERT_DP|mesh_edp", "DP"),
    (r"EXPERT_MODEL_PARALLEL|EXPERT_PARALLEL|mesh_ep$|^ep_|expert_parallel", "EP"),
    (r"CONTEXT_PARALLEL|mesh_cp$|^cp_|context_parallel|sequence_parallel", "CP"),
    (r"TENSOR_MODEL_PARALLEL|TENSOR_PARALLEL|mesh_tp$|^tp_|tensor_parallel", "TP"),
    (r"PIPELINE_MODEL_PARALLEL|PIPELINE_PARALLEL|mesh_pp$|^pp_|pipe_parallel|pipeline", "PP"),
    (r"mesh_dp_shard|DATA_PARALLEL_SHARD|fsdp|zero_shard", "DP_SHARD"),
    (r"DATA_PARALLEL|mesh_dp|mesh_dp_replicate|^dp_|data_parallel|ddp", "DP"),
    (r"MODEL_PARALLEL_GROUP|EMBEDDING_GROUP|POSITION_EMBEDDING", "OTHER"),
)
_COMPILED = tuple((re.compile(p, re.IGNORECASE), label) for p, label in _DESC_RULES)


def label_from_description(
    desc: str | None, size: int | None, world_size: int | None
) -> tuple[str | None, str]:
    """(label, evidence) from a group's description; label None when the name says nothing."""
    if desc:
        for rx, label in _COMPILED:
            if rx.search(desc):
                return label, f"description {desc!r} matches {rx.pattern!r}"
    if size is not None and world_size is not None and size == world_size and size > 1:
        return "WORLD", f"spans all {world_size} ranks"
    return None, "no naming evidence"


def _layout_label(ranks: list[int], layout: Layout) -> tuple[str, str] | None:
    """(label, evidence) when the members form exactly the group of some layout dimensions."""
    dims = [d for d in layout.order if layout.sizes.get(d, 1) > 1]
    coords: dict[int, dict[str, int]] = {}
    for r in ranks:
        if r >= layout.world_size:
            return None
        rest, c = r, {}
        for d in layout.order:
            n = layout.sizes.get(d, 1)
            c[d], rest = rest % n, rest // n
        coords[r] = c
    varying = {d for d in dims if len({coords[r][d] for r in ranks}) > 1}
    expected = 1
    for d in varying:
        expected *= layout.sizes[d]
    if not varying or expected != len(set(ranks)):
        return None
    shown = "x".join(sorted(varying, key=layout.order.index))
    why = f"members are exactly one {shown} group of layout {layout.describe()}"
    if len(varying) == 1:
        return DIM_LABEL[next(iter(varying))], why
    if varying == set(dims):
        return "WORLD", why
    if varying <= {"dp", "cp", "dp_shard"}:
        return "DP", why + " (data parallel incl. context/shard replicas)"
    return "OTHER", why + " (several parallel dimensions: e.g. model parallel)"


def _ops_label(ops: dict[str, int]) -> tuple[str, str] | None:
    """PP from point-to-point traffic, EP from all-to-all; None when the ops say nothing."""
    total = sum(ops.values())
    if not total:
        return None
    p2p = ops.get("send", 0) + ops.get("recv", 0)
    a2a = ops.get("all_to_all", 0)
    shown = ", ".join(f"{k} x{v}" for k, v in sorted(ops.items()))
    if p2p == total:
        return "PP", f"carries only send/recv ({shown}): pipeline traffic"
    if a2a and a2a * 2 >= total:
        return "EP", f"carries mostly all-to-all ({shown}): expert dispatch/combine"
    return None


def attribute(
    desc: str | None,
    ranks: list[int] | None,
    size: int | None,
    world: int | None,
    ops: dict[str, int],
    layout: Layout | None,
) -> tuple[str, str]:
    """(parallelism, evidence) from every kind of evidence, strongest first: the user's
    layout (an override), the framework's name, the ops carried, spanning the world."""
    named, name_why = label_from_description(desc, size, world)
    by_ops = _ops_label(ops)
    by_layout = _layout_label(list(ranks), layout) if layout is not None and ranks else None
    notes = []
    if by_layout is not None:
        label, why = by_layout
        if named and named != label:
            notes.append(f"overrides the name ({name_why} -> {named})")
    elif named is not None:
        label, why = named, name_why
    elif by_ops is not None:
        label, why = by_ops
    else:
        label = "OTHER"
        why = "no naming, op or layout evidence" + (
            "" if layout is not None else " (give --layout to label it from its ranks)"
        )
    if by_ops is not None and by_ops[0] != label:
        notes.append(f"note: it {by_ops[1]}")
    elif by_ops is not None and by_ops[1] not in why:
        notes.append(f"consistent with its ops: {by_ops[1]}")
    return label, "; ".join([why, *notes])
