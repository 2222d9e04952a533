"""First-pass parallelism labels for process groups, from how the framework named them.

Why here: the label is a column of `process_groups`, and the name is the strongest evidence.
The attribution analysis refines unlabeled groups with the ops they carry and the rank layout.
"""

from __future__ import annotations

import re

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
