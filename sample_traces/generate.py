"""Make sample multi-rank Kineto traces from a REAL torch.distributed (gloo, CPU) job.

ranklens needs traces whose truth is known: this launches tp*pp*dp processes that train a tiny
Megatron-style model (TP all-reduces, PP send/recv, DP gradient all-reduce), profiles them with
torch.profiler, writes ``rank{r}.json.gz`` per rank and ``truth.json`` (config, group layout,
injected slowdown, per-rank timings measured inside the job).

Usage: ``python sample_traces/generate.py --out DIR [--tp 2 --pp 2 --dp 2 ...]``.
torch is imported only when a job is launched, so ``--help`` and the layout helpers work without
it (and nothing from ``ranklens`` is imported).
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import importlib
import json
import os
import shlex
import socket
import sys
import time
from pathlib import Path
from typing import Any

# Megatron-LM's descriptions for the groups it creates (parallel_state.initialize_model_parallel).
GROUP_DESC = {
    "DP": "DATA_PARALLEL_GROUP",
    "MP": "MODEL_PARALLEL_GROUP",
    "TP": "TENSOR_MODEL_PARALLEL_GROUP",
    "PP": "PIPELINE_MODEL_PARALLEL_GROUP",
}
UNNAMED_DESC = "undefined"  # what torch writes as pg_desc when a group has no description


def rank_coords(rank: int, tp: int, dp: int) -> tuple[int, int, int]:
    """(tp_idx, dp_idx, pp_stage) of a global rank in Megatron's "tp-cp-ep-dp-pp" order."""
    return rank % tp, (rank // tp) % dp, rank // (tp * dp)


def group_layout(tp: int, pp: int, dp: int) -> list[dict[str, Any]]:
    """All groups, in the order every rank creates them (Megatron's: DP, MP, TP, PP).

    Rank order is tp fastest, then dp, then pp, so rank = tp_idx + tp*(dp_idx + dp*pp_stage).
    Size-1 groups are kept, as Megatron creates them too.
    """
    world = tp * pp * dp
    coords = {r: rank_coords(r, tp, dp) for r in range(world)}

    def groups_by(kind: str, key: Any) -> list[dict[str, Any]]:
        buckets: dict[Any, list[int]] = {}
        for r in range(world):
            buckets.setdefault(key(*coords[r]), []).append(r)
        return [
            {"kind": kind, "description": GROUP_DESC[kind], "ranks": rs}
            for _, rs in sorted(buckets.items())
        ]

    return (
        groups_by("DP", lambda t, d, p: (p, t))
        + groups_by("MP", lambda t, d, p: d)
        + groups_by("TP", lambda t, d, p: (p, d))
        + groups_by("PP", lambda t, d, p: (d, t))
    )


def free_port() -> int:
    """A localhost TCP port that was free a moment ago (for the gloo rendezvous)."""
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def read_trace(path: Path) -> dict[str, Any]:
    """Load one gzip-compressed Kineto trace."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        data: dict[str, Any] = json.load(f)
    return data


def check_trace(
    trace: dict[str, Any],
    rank: int,
    world: int,
    layout: list[dict[str, Any]],
    unnamed: bool,
    steps: int,
) -> list[str]:
    """Problems with one rank's trace versus what the job should have produced (empty = ok)."""
    problems: list[str] = []
    info = trace.get("distributedInfo", {})
    if info.get("rank") != rank or info.get("world_size") != world:
        problems.append(
            f"rank{rank}: distributedInfo rank/world_size = "
            f"{info.get('rank')}/{info.get('world_size')}"
        )
    seen = {(g.get("pg_desc"), tuple(g.get("ranks", []))) for g in info.get("pg_config", [])}
    for g in layout:
        if rank in g["ranks"]:
            desc = UNNAMED_DESC if unnamed else g["description"]
            if (desc, tuple(g["ranks"])) not in seen:
                problems.append(f"rank{rank}: pg_config lacks {desc} {g['ranks']}")
    names = [e.get("name", "") for e in trace.get("traceEvents", [])]
    n_steps = sum(1 for n in names if n.startswith("ProfilerStep#"))
    if n_steps != steps:
        problems.append(f"rank{rank}: {n_steps} ProfilerStep# spans, expected {steps}")
    if not any(n.startswith("gloo:") for n in names):
        problems.append(f"rank{rank}: no gloo: events")
    return problems


def _pg_names(trace: dict[str, Any]) -> dict[tuple[str, tuple[int, ...]], str]:
    """(pg_desc, ranks) -> pg_name as torch recorded it in one rank's trace."""
    return {
        (str(g.get("pg_desc")), tuple(g.get("ranks", []))): str(g.get("pg_name"))
        for g in trace.get("distributedInfo", {}).get("pg_config", [])
    }


def _sibling(module: str) -> Any:
    """Import a module beside this file, whether it runs as a script or as a package."""
    name = f"{__package__}.{module}" if __package__ else module
    here = str(Path(__file__).resolve().parent)
    if not __package__ and here not in sys.path:
        sys.path.insert(0, here)
    return importlib.import_module(name)


def _load_worker() -> Any:
    """The torch-dependent worker module (imported only when a job is launched)."""
    return _sibling("_model")


_scenarios = _sibling("_scenarios")  # the committed scenarios (no torch)


def summarize(part: dict[str, Any]) -> dict[str, Any]:
    """Per-rank means over the profiled steps (ms), so a reader need not redo the arithmetic."""
    steps = [s for s in part["steps"] if s["profiled"]]
    n = max(len(steps), 1)

    def mean_ms(key: str) -> float:
        tot = sum(sum(s[key]) if isinstance(s[key], list) else s[key] for s in steps)
        return round(tot / n / 1e6, 3)

    wall, fwd, bwd = mean_ms("wall_ns"), mean_ms("forward_ns"), mean_ms("backward_ns")
    return {
        "step_wall_ms": wall,
        "forward_ms": fwd,
        "backward_ms": bwd,
        "injected_slow_ms": mean_ms("slow_ns"),
        "p2p_recv_wait_ms": mean_ms("p2p_recv_wait_ns"),
        "dp_allreduce_ms": mean_ms("dp_allreduce_ns"),
        "outside_fwd_bwd_fraction": round(1 - (fwd + bwd) / wall, 4) if wall else None,
    }


def generate(
    out: Path,
    *,
    tp: int = 2,
    pp: int = 2,
    dp: int = 2,
    microbatches: int = 4,
    schedule: str = "1f1b",
    steps: int = 3,
    layers: int = 2,
    hidden: int = 128,
    mb_size: int = 16,
    slow_rank: int | None = None,
    slow_ms: float = 0.0,
    offcpu_ms: float = 0.0,
    unnamed: bool = False,
    raw: bool = False,
    command: str | None = None,
) -> dict[str, Any]:
    """Run the job, write ``rank{r}.json.gz`` (in ``out`` or ``out/raw``) and ``out/truth.json``.

    Returns the truth dict. Raises RuntimeError if a trace lacks what the job should have put
    in it (rank, groups, step spans, gloo events).
    """
    import torch
    import torch.multiprocessing as mp

    world = tp * pp * dp
    if slow_rank is not None and not 0 <= slow_rank < world:
        raise ValueError(f"--slow-rank {slow_rank} outside 0..{world - 1}")
    if (4 * hidden) % tp:
        raise ValueError(f"tp={tp} must divide the FFN width 4*hidden={4 * hidden}")
    trace_dir = out / "raw" if raw else out
    trace_dir.mkdir(parents=True, exist_ok=True)
    for old in trace_dir.glob("rank*.json*"):
        old.unlink()
    cfg: dict[str, Any] = {
        "tp": tp,
        "pp": pp,
        "dp": dp,
        "world_size": world,
        "microbatches": microbatches,
        "schedule": schedule,
        "steps": steps,
        "layers": layers,
        "hidden": hidden,
        "mb_size": mb_size,
        "slow_rank": slow_rank,
        "slow_ms": slow_ms if slow_rank is not None else 0.0,
        "offcpu_ms": offcpu_ms,
        "unnamed": unnamed,
    }
    layout = group_layout(tp, pp, dp)
    worker = _load_worker()
    t0 = time.perf_counter()
    spawn_args = (cfg, layout, free_port(), str(trace_dir))
    mp.spawn(worker.worker, args=spawn_args, nprocs=world, join=True)  # type: ignore[attr-defined, no-untyped-call, unused-ignore]
    wall = time.perf_counter() - t0

    problems: list[str] = []
    pg_names: dict[tuple[str, tuple[int, ...]], str] = {}
    ranks: list[dict[str, Any]] = []
    for r in range(world):
        trace = read_trace(trace_dir / f"rank{r}.json.gz")
        problems += check_trace(trace, r, world, layout, unnamed, steps)
        pg_names.update(_pg_names(trace))
        part_path = trace_dir / f"_truth_rank{r}.json"
        part = json.loads(part_path.read_text())
        part_path.unlink()
        ranks.append({**part, "summary": summarize(part)})
    if problems:
        raise RuntimeError("generated traces failed checks:\n" + "\n".join(problems))
    for g in layout:
        g["pg_desc"] = UNNAMED_DESC if unnamed else g["description"]
        g["pg_name"] = pg_names.get((g["pg_desc"], tuple(g["ranks"])))
    cpus = os.cpu_count() or 1
    truth = {
        "command": command,
        "config": cfg,
        "torch_version": torch.__version__,
        "python_version": sys.version.split()[0],
        "trace_files": [
            str((trace_dir / f"rank{r}.json.gz").relative_to(out)) for r in range(world)
        ],
        "model": {
            "hidden": hidden,
            "ffn": 4 * hidden,
            "ffn_per_tp_rank": 4 * hidden // tp,
            "microbatch_size": mb_size,
            "layers_per_stage": layers,
            "block": "x + RowParallel(gelu(ColumnParallel(x))), fp32, SGD",
        },
        "rank_order": "tp-cp-ep-dp-pp (tp fastest): rank = tp_idx + tp*(dp_idx + dp*pp_stage)",
        "groups": layout,
        "profiled_steps": list(range(2, steps + 2)),
        "bubble_fraction_closed_form": round((pp - 1) / (microbatches + pp - 1), 4),
        "injected": {
            "slow_rank": slow_rank,
            "slow_ms_per_forward": cfg["slow_ms"],
            "what": "busy torch.mm loop (wall-clock timed) inside each forward_mb* span of "
            "slow_rank, no annotation of its own"
            if slow_rank is not None
            else None,
        },
        "tolerances": {
            "host_cpus": cpus,
            "ranks_per_cpu": round(world / cpus, 2),
            "note": "ranks time-share the CPUs: durations are inflated by preemption; treat "
            "them as qualitative. Measured *_ns come from time.perf_counter_ns inside "
            "the job; start/end_epoch_ns match baseTimeNanoseconds + ts*1000 within "
            "~0.1 ms (one host clock).",
            "cross_rank_clock_skew_ms": 0.1,
        },
        "generation_wall_s": round(wall, 2),
        "ranks": ranks,
    }
    (out / "truth.json").write_text(json.dumps(truth, indent=1) + "\n")
    return truth


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--out", type=Path, help="output folder (required without --scenario)")
    p.add_argument(
        "--scenario",
        choices=[*_scenarios.SCENARIOS, "all"],
        help="regenerate a committed scenario under sample_traces/ (flags preset)",
    )
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--pp", type=int, default=2)
    p.add_argument("--dp", type=int, default=2)
    p.add_argument("--microbatches", type=int, default=4)
    p.add_argument("--schedule", choices=["gpipe", "1f1b"], default="1f1b")
    p.add_argument("--steps", type=int, default=3, help="profiled (active) steps")
    p.add_argument("--layers", type=int, default=2, help="MLP blocks per pipeline stage")
    p.add_argument("--hidden", type=int, default=128, help="model width (FFN = 4x)")
    p.add_argument("--mb-size", type=int, default=16, help="rows per micro-batch")
    p.add_argument("--slow-rank", type=int, default=None)
    p.add_argument(
        "--slow-ms",
        type=float,
        default=0.0,
        help="extra busy compute per micro-batch forward on --slow-rank",
    )
    p.add_argument(
        "--offcpu-ms",
        type=float,
        default=0.0,
        help="every rank also waits this long off the CPU in each micro-batch forward, as a GPU "
        "job's CPU waits on its device (keeps runs taken on a loaded machine comparable)",
    )
    p.add_argument(
        "--unnamed-groups", action="store_true", help="create the same groups without group_desc"
    )
    p.add_argument(
        "--raw", action="store_true", help="put traces in OUT/raw/ (the committed scenario layout)"
    )
    return p.parse_args(argv)


def run(argv: list[str], readme_for: str | None = None, recorded: list[str] | None = None) -> None:
    """Generate one job from command-line flags (and a scenario README if named).

    ``recorded`` is the command line written to truth.json when it differs from ``argv``.
    """
    a = parse_args(argv)
    if a.out is None:
        raise SystemExit("--out is required")
    truth = generate(
        a.out,
        tp=a.tp,
        pp=a.pp,
        dp=a.dp,
        microbatches=a.microbatches,
        schedule=a.schedule,
        steps=a.steps,
        layers=a.layers,
        hidden=a.hidden,
        mb_size=a.mb_size,
        slow_rank=a.slow_rank,
        slow_ms=a.slow_ms,
        offcpu_ms=a.offcpu_ms,
        unnamed=a.unnamed_groups,
        raw=a.raw,
        command="python sample_traces/generate.py " + shlex.join(recorded or argv),
    )
    if readme_for:
        (a.out / "README.md").write_text(_scenarios.readme(readme_for, truth))
    size = sum(f.stat().st_size for f in a.out.glob("**/rank*.json.gz"))
    print(
        f"wrote {truth['config']['world_size']} traces ({size / 1e6:.2f} MB) to {a.out} "
        f"in {truth['generation_wall_s']} s"
    )


def main(argv: list[str] | None = None) -> int:
    """CLI entry: one job from flags, or committed scenarios by name."""
    argv = sys.argv[1:] if argv is None else argv
    a = parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if a.scenario is None:
        run(argv)
        return 0
    names = list(_scenarios.SCENARIOS) if a.scenario == "all" else [a.scenario]
    for name in names:
        flags = [*shlex.split(_scenarios.SCENARIOS[name][0]), "--raw", "--out"]
        out = Path(__file__).resolve().parent / name
        run([*flags, str(out)], readme_for=name, recorded=[*flags, f"sample_traces/{name}"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
