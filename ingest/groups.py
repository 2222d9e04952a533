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

# A description is read as words (`TENSOR_AND_DATA_PARALLEL_GROUP_WITH_CP`, `mesh_dp_shard`,
# `dp`): a substring would find DP in `TENSOR_AND_DATA_...` and miss the short DeviceMesh names.
# Word -> the parallel dimension it names (Megatron-LM, torchtitan/DeviceMesh, DeepSpeed, FSDP).
_DIM_WORDS: dict[str, str] = {
    "tp": "tp", "tensor": "tp", "etp": "tp",
    "pp": "pp", "pipeline": "pp", "pipe": "pp",
    "cp": "cp", "context": "cp", "sequence": "cp", "sp": "cp",  # Ulysses sequence parallel
    "ep": "ep", "expert": "ep", "moe": "ep",
    "dp": "dp", "data": "dp", "ddp": "dp", "replicate": "dp", "edp": "dp",
    "shard": "dp_shard", "fsdp": "dp_shard", "zero": "dp_shard",
}  # fmt: skip
# Groups named for their purpose, not a dimension: the tied embedding's first/last pipeline
# stages, FP8 amax reduction over tp x dp (x cp).
_OTHER_WORDS = frozenset({"embedding", "amax"})
# `EXPERT_DATA_...`/`EXPERT_TENSOR_...`: the expert layers' own DP/TP group, not EP.
_QUALIFIED_BY_EXPERT = frozenset({"dp", "tp", "dp_shard"})
_WORD = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")
_WORLD_NAMES = frozenset({"default_pg", "world"})


def _named_dims(words: list[str]) -> set[str]:
    """The parallel dimensions a description's words name, read as Megatron composes them:
    `X_MODEL` is X (`TENSOR_MODEL_PARALLEL`), a bare `MODEL` is tp x pp, but in an expert group
    `MODEL` is ep (`EXPERT_TENSOR_AND_MODEL_PARALLEL`: etp x ep); `EXPERT_DATA`/`EXPERT_TENSOR`
    are the expert layers' own DP/TP; `A_MODULO_B`/`a_mod_b` leaves B out
    (`DATA_MODULO_EXPERT_PARALLEL`: DP of the expert parameters); `dp_shard` is one dimension."""
    dims: set[str] = set()
    expert = any(_DIM_WORDS.get(w) == "ep" for w in words)
    for i, w in enumerate(words):
        prev = words[i - 1] if i else ""
        nxt = _DIM_WORDS.get(words[i + 1], "") if i + 1 < len(words) else ""
        if prev in ("modulo", "mod"):
            continue
        if w == "model":
            if expert:
                dims.add("ep")
            elif prev not in _DIM_WORDS:
                dims |= {"tp", "pp"}
        elif _DIM_WORDS.get(w) == "ep" and nxt in _QUALIFIED_BY_EXPERT:
            continue
        elif w in _DIM_WORDS:
            dims.add(_DIM_WORDS[w])
    if "dp_shard" in dims:
        dims.discard("dp")  # `mesh_dp_shard`, `DATA_PARALLEL_SHARD`: the shard part of dp
    return dims


def label_from_description(
    desc: str | None, size: int | None, world_size: int | None
) -> tuple[str | None, str]:
    """(label, evidence) from a group's description; label None when the name says nothing.

    The name wins over spanning the world: a DeviceMesh `dp` group of every rank is still DP."""
    if desc:
        label, why = _label_from_words(desc)
        if label is not None:
            return label, f"description {desc!r} {why}"
    if size is not None and world_size is not None and size == world_size and size > 1:
        return "WORLD", f"spans all {world_size} ranks"
    return None, "no naming evidence"


def _label_from_words(desc: str) -> tuple[str | None, str]:
    """(label, why) from the words of a description; (None, '') when it names no dimension."""
    if desc.strip().lower() in _WORLD_NAMES:
        return "WORLD", "names the default (world) group"
    words = [w.lower() for w in _WORD.findall(desc)]
    purpose = _OTHER_WORDS.intersection(words)
    if purpose:
        return "OTHER", f"names the {'/'.join(sorted(purpose))} group (not one parallel dimension)"
    dims = _named_dims(words)
    if not dims:
        return None, ""
    shown = " x ".join(sorted(dims, key=list(DIM_LABEL).index))
    if len(dims) == 1:
        return DIM_LABEL[next(iter(dims))], f"names {shown}"
    if dims <= {"dp", "cp", "dp_shard"}:
        # Replicas of the same parameters: gradients are reduced (or shards gathered) over all.
        label = "DP_SHARD" if "dp_shard" in dims else "DP"
        return label, f"names {shown}: data parallel incl. context/shard replicas"
    return "OTHER", f"names {shown}: a composite of several parallel dimensions"


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
