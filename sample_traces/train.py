"""The sample model as an ordinary torchrun training script, with no profiler of its own.

Why: `ranklens capture -- torchrun --nproc-per-node 4 sample_traces/train.py ...` must profile
a job that knows nothing about ranklens. Same model, groups and schedules as generate.py;
options are generate.py's (`--tp --pp --dp --microbatches --schedule --steps --slow-rank ...`).
"""

from __future__ import annotations

import os
import sys
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main(argv: list[str] | None = None) -> int:
    """Run `--steps` training steps on this rank (RANK/WORLD_SIZE/MASTER_* from the launcher)."""
    import _model  # type: ignore[import-not-found,unused-ignore]
    import torch
    import torch.distributed as dist
    from generate import group_layout, parse_args  # type: ignore[import-not-found,unused-ignore]

    args = parse_args(argv)
    cfg = {
        "tp": args.tp,
        "pp": args.pp,
        "dp": args.dp,
        "microbatches": args.microbatches,
        "schedule": args.schedule,
        "steps": args.steps,
        "layers": args.layers,
        "hidden": args.hidden,
        "mb_size": args.mb_size,
        "slow_rank": args.slow_rank,
        "slow_ms": args.slow_ms,
        "offcpu_ms": args.offcpu_ms,
        "unnamed": args.unnamed_groups,
    }
    world = args.tp * args.pp * args.dp
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=300))
    rank = dist.get_rank()
    if dist.get_world_size() != world:
        raise SystemExit(f"tp*pp*dp = {world} but the launcher started {dist.get_world_size()}")
    torch.manual_seed(rank)
    ctx = _model.build_ctx(rank, cfg, group_layout(args.tp, args.pp, args.dp))
    dist.barrier()
    for step in range(args.steps):
        _model.run_step(ctx, step, profiled=False)  # ends with optimizer.step()
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] if os.environ.get("RANK") is not None else None))
