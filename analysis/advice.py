"""Fix texts in the run's own terms: what applies to its parallelisms, model and framework.

Why apart from the analyses: each analysis writes a fix that is true of any run (no CP, no
LLM, no framework flags in it); what only some runs can act on (a context-parallel split, a
Megatron flag, an embedding sharding plan) depends on the whole run, which `run_profile`
reads once. `tailor` adds those clauses to the findings of a report; a finding whose fix has
nothing run-specific to add is left as the analysis wrote it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from ranklens.analysis._base import Finding
from ranklens.analysis.run_profile import RECSYS, TRANSFORMER, RunProfile

Rule = Callable[[Finding, RunProfile], list[str]]


def _megatron(p: RunProfile) -> bool:
    return p.framework == "megatron" or p.model == TRANSFORMER


def _uneven_work(f: Finding, p: RunProfile) -> list[str]:
    """Why one rank does more than its peers, in the run's terms."""
    out = []
    if p.model == TRANSFORMER:
        out.append("uneven sequence lengths or token counts per rank (pack or bucket sequences)")
    if p.model == RECSYS:
        out.append(
            "embedding shards heavier on some ranks or more sparse ids in their batches "
            "(rebalance the sharding plan by pooling factor and table size, e.g. the "
            "TorchRec planner with measured costs)"
        )
    if p.has("CP"):
        out.append(
            "an unbalanced context-parallel split (causal mask: give each rank an early and "
            "a late chunk of the sequence)"
        )
    if p.has("EP"):
        out.append("tokens routed unevenly to experts (auxiliary balance loss, capacity factor)")
    if p.has("PP") and f.code == "STRAGGLER_COMPUTE_IMBALANCE":
        out.append("uneven layer counts per pipeline stage")
    return out


def _comm_volume(f: Finding, p: RunProfile) -> list[str]:
    out = []
    if p.has("DP") or p.model == RECSYS:
        out.append("larger gradient buckets or gradient compression for the DP all-reduce")
    if p.has("TP"):
        out.append("a layout that keeps TP inside one NVLink domain")
    if p.has("EP"):
        out.append("fewer tokens crossing nodes in the expert all-to-all (node-limited routing)")
    if p.model == RECSYS:
        out.append(
            "lower-precision embedding all-to-all (fp16/bf16 quantized comms) and sharding "
            "that keeps hot tables local (table-wise/column-wise within a node)"
        )
    return out


def _exposed_comm(f: Finding, p: RunProfile) -> list[str]:
    top = next(iter(f.evidence.get("exposed_ns_by_parallelism", {}) or {}), None)
    out = []
    if top in ("DP", "DP_SHARD") and p.has("PP"):
        out.append("move the DP gradient communication into the pipeline bubbles")
    if top == "TP" and p.model == TRANSFORMER:
        out.append("enable sequence parallelism so the TP all-reduces become overlappable")
    if top not in ("DP", "DP_SHARD", "TP", "PP", "EP") and p.model == RECSYS:
        out.append(
            "overlap the embedding all-to-all with dense compute by distributing the next "
            "batch's sparse features a step ahead (TorchRec TrainPipelineSparseDist) and let "
            "DDP overlap the dense gradient all-reduce with backward"
        )
    return out


def _stage_imbalance(f: Finding, p: RunProfile) -> list[str]:
    if not _megatron(p):
        return []
    return [
        "with Megatron, --decoder-first-pipeline-num-layers / --decoder-last-pipeline-num-layers"
        + (
            "; count the embedding (first stage) and the output layer and loss (last stage) "
            "as layers"
            if p.model == TRANSFORMER
            else ""
        )
    ]


def _dp_into_bubbles(f: Finding, p: RunProfile) -> list[str]:
    if _megatron(p):
        return [
            "with Megatron, --overlap-grad-reduce / --overlap-param-gather with per-stage buckets"
        ]
    return []


def _p2p(f: Finding, p: RunProfile) -> list[str]:
    return ["with Megatron, --overlap-p2p-communication"] if _megatron(p) else []


def _variance(f: Finding, p: RunProfile) -> list[str]:
    out = []
    if p.has("DP"):
        out.append(
            "the stretched micro-batches often carry overlapped DP communication: issue the "
            "DP gradient reduce-scatter/all-gather during warm-up/cool-down and re-bucket so "
            "no single micro-batch carries a large bucket"
        )
    if p.has("TP"):
        out.append("check whether TP communication stretches them (contention analysis)")
    return out


def _compute_contention(f: Finding, p: RunProfile) -> list[str]:
    if p.has("TP") and p.model == TRANSFORMER:
        return ["cap the SMs of TP comm overlap (Transformer Engine userbuffers num_sm)"]
    return []


def _comm_contention(f: Finding, p: RunProfile) -> list[str]:
    out = []
    if p.has("DP") and p.has("PP"):
        out.append(
            "move the DP gradient communication into pipeline bubbles ('vertical alignment') "
            "and put PP and DP traffic on different NICs/rails"
        )
    if p.model == RECSYS:
        out.append("keep the embedding all-to-all and the dense all-reduce from overlapping")
    return out


RULES: dict[str, Rule] = {
    "STRAGGLER_RANK": _uneven_work,
    "STRAGGLER_COMPUTE_IMBALANCE": _uneven_work,
    "BREAKDOWN_COMM_SHARE_HIGH": _comm_volume,
    "OVERLAP_EXPOSED_COMM_HIGH": _exposed_comm,
    "PIPELINE_STAGE_IMBALANCE": _stage_imbalance,
    "PIPELINE_DP_INTO_BUBBLES": _dp_into_bubbles,
    "PIPELINE_P2P_LATENCY": _p2p,
    "PIPELINE_MICROBATCH_VARIANCE": _variance,
    "CONTENTION_COMPUTE_SLOWDOWN": _compute_contention,
    "CONTENTION_COMM_SLOWDOWN": _comm_contention,
}


def fix_for(f: Finding, p: RunProfile) -> str:
    """`f`'s fix with what applies to this run added ("on this run: ...")."""
    rule = RULES.get(f.code)
    extra = rule(f, p) if rule is not None else []
    if not extra:
        return f.fix
    return f"{f.fix.rstrip('. ')}; on this run: " + "; ".join(extra)


def tailor(findings: list[Finding], p: RunProfile) -> list[Finding]:
    """The findings with their fixes in the run's terms (same order, same everything else)."""
    return [replace(f, fix=fix_for(f, p)) for f in findings]
