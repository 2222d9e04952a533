"""The committed sample scenarios (``sample_traces/<name>/``): the flags that make each one and
what it shows, and the README written beside its traces.

Why apart from ``generate.py``: that file is the generator itself (launch the job, check the
traces, write truth.json); these are the data and text of the scenarios committed with ranklens,
used only by ``generate.py --scenario``.
"""

from __future__ import annotations

from typing import Any

# Committed scenarios: name -> (flags, what it shows). Regenerate with --scenario NAME|all.
SCENARIOS: dict[str, tuple[str, str]] = {
    "megatron_tp2_pp2_dp2": (
        "--tp 2 --pp 2 --dp 2 --microbatches 4 --schedule 1f1b --steps 3 --hidden 256",
        "The main demo: 8 ranks, Megatron layout and group names, 1F1B over 4 micro-batches. "
        "TP all-reduces inside forward/backward, PP send/recv between stages {0-3} and {4-7}, "
        "one bucketed DP gradient all-reduce per step.",
    ),
    "straggler_rank3": (
        "--tp 1 --pp 1 --dp 4 --microbatches 2 --steps 3 --slow-rank 3 --slow-ms 20",
        "Pure data parallel over 4 ranks; rank 3 burns 20 ms of extra matmul per micro-batch "
        "forward (40 ms per step), so ranks 0-2 wait for it in the DP all-reduce every step.",
    ),
    "pp4_gpipe_m2": (
        "--tp 1 --pp 4 --dp 1 --microbatches 2 --schedule gpipe --steps 3 --hidden 512",
        "4 pipeline stages, GPipe, only 2 micro-batches: large bubble "
        "(closed form (p-1)/(m+p-1) = 0.60).",
    ),
    "pp4_1f1b_m8": (
        "--tp 1 --pp 4 --dp 1 --microbatches 8 --schedule 1f1b --steps 3 --hidden 512",
        "4 pipeline stages, 1F1B, 8 micro-batches: smaller bubble "
        "(closed form (p-1)/(m+p-1) = 0.27).",
    ),
    "pp4_slow_stage2": (
        "--tp 1 --pp 4 --dp 1 --microbatches 4 --schedule 1f1b --steps 3 --hidden 512 "
        "--slow-rank 2 --slow-ms 15",
        "4 pipeline stages, 1F1B, 4 micro-batches; stage 2 (rank 2) burns 15 ms of extra "
        "matmul per micro-batch forward: the slow stage the pipeline analysis must name "
        "(closed form (p-1)/(m+p-1) = 0.43 before the imbalance).",
    ),
    "unnamed_tp2_pp2_dp2": (
        "--tp 2 --pp 2 --dp 2 --microbatches 4 --schedule 1f1b --steps 2 --hidden 256 "
        "--unnamed-groups",
        "Same job as megatron_tp2_pp2_dp2 (2 steps) but the groups have no description "
        "(pg_desc 'undefined'): a tool must infer DP/TP/PP from the rank layout.",
    ),
}


def readme(name: str, truth: dict[str, Any]) -> str:
    """README of a committed scenario: the exact command, torch version and what it shows."""
    cfg = truth["config"]
    lines = [
        f"# {name}",
        "",
        SCENARIOS[name][1],
        "",
        f"Made with torch {truth['torch_version']} (CPU, gloo) on a "
        f"{truth['tolerances']['host_cpus']}-CPU host ({cfg['world_size']} ranks) by:",
        "",
        "```",
        f"python sample_traces/generate.py --scenario {name}",
        f"# = {truth['command']}",
        "```",
        "",
        "- `raw/rank{r}.json.gz`: one Kineto trace per rank, "
        f"{cfg['steps']} profiled steps (ProfilerStep#{truth['profiled_steps'][0]}.."
        f"#{truth['profiled_steps'][-1]}).",
        "- `truth.json`: config, group layout (kind, description, ranks, pg_name), injected "
        "slowdown and per-rank timings measured inside the job (see ../README.md).",
        "",
        "Measured per-rank means over the profiled steps (ms; CPU time-sharing inflates "
        "them, treat as qualitative):",
        "",
        "| rank | step | forward | backward | injected slow | p2p recv wait | DP all-reduce |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in truth["ranks"]:
        m = r["summary"]
        lines.append(
            f"| {r['rank']} | {m['step_wall_ms']} | {m['forward_ms']} | "
            f"{m['backward_ms']} | {m['injected_slow_ms']} | "
            f"{m['p2p_recv_wait_ms']} | {m['dp_allreduce_ms']} |"
        )
    return "\n".join(lines) + "\n"
