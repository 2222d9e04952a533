"""Make the real JAX sample run: a 4-process data-parallel CPU job, each process profiled.

Run with a Python that has jax (never the project's environment; ranklens never imports this):

    python -m venv /tmp/jaxenv && /tmp/jaxenv/bin/pip install 'jax[cpu]'
    /tmp/jaxenv/bin/python sample_traces/jax_cpu_dp/generate.py --out sample_traces/jax_cpu_dp/run

What the job does (the truth is written to OUT/truth.json): N processes join one JAX runtime
(`jax.distributed.initialize` on a localhost coordinator, gloo CPU collectives), one CPU device
each, a 1-D mesh ('dp') over all of them. Each process holds its own shard of the batch; a tiny
MLP's loss and gradients are computed per shard under `shard_map` and averaged with
`jax.lax.pmean` (XLA all-reduces across the processes), then an SGD update. The slow process
runs an extra jitted matmul loop of about --slow-ms inside every step, before the train step,
so it is the straggler the others wait for in the all-reduces. Compilation happens before the
profiler starts; a barrier (`sync_global_devices`) right after it makes the ranks start step 1
together; every profiled step is a `jax.profiler.StepTraceAnnotation('train', step_num=k)`.
Each process writes its own profile under OUT/rank{i}/ (JAX's layout: plugins/profile/RUN/
HOST.trace.json.gz and perfetto_trace.json.gz; the .xplane.pb is removed).
"""

from __future__ import annotations

import argparse
import json
import platform
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def worker(args: argparse.Namespace) -> None:
    """One process of the job (run by `main` as a subprocess)."""
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=f"127.0.0.1:{args.port}",
        num_processes=args.procs,
        process_id=args.worker,
    )
    import jax.numpy as jnp
    import numpy as np
    from jax.experimental.multihost_utils import sync_global_devices
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    me = jax.process_index()
    mesh = Mesh(np.array(jax.devices()), ("dp",))
    rng = np.random.default_rng(0)
    params = {
        "w1": rng.standard_normal((args.hidden, args.hidden), np.float32) * 0.1,
        "b1": np.zeros((args.hidden,), np.float32),
        "w2": rng.standard_normal((args.hidden, 1), np.float32) * 0.1,
        "b2": np.zeros((1,), np.float32),
    }
    replicated = NamedSharding(mesh, P())
    params = jax.tree.map(lambda a: jax.make_array_from_process_local_data(replicated, a), params)
    data = np.random.default_rng(1 + me)
    xs = data.standard_normal((args.batch, args.hidden), np.float32)
    ys = data.standard_normal((args.batch, 1), np.float32)
    sharded = NamedSharding(mesh, P("dp"))
    x = jax.make_array_from_process_local_data(sharded, xs)
    y = jax.make_array_from_process_local_data(sharded, ys)

    def loss_fn(p: Any, x: Any, y: Any) -> Any:
        h = jax.nn.gelu(x @ p["w1"] + p["b1"])
        return jnp.mean((h @ p["w2"] + p["b2"] - y) ** 2)

    def local_step(p: Any, x: Any, y: Any) -> Any:
        # Gradients of this shard only (params made device-varying), then averaged: XLA
        # combines the five pmeans into one all-reduce.
        local = jax.lax.pcast(p, "dp", to="varying")
        loss, grads = jax.value_and_grad(loss_fn)(local, x, y)
        grads = jax.lax.pmean(grads, "dp")
        loss = jax.lax.pmean(loss, "dp")
        new = jax.tree.map(lambda a, g: a - args.lr * g, p, grads)
        # The loss after the update needs the first all-reduce's result: a second one.
        after = jax.lax.pmean(loss_fn(new, x, y), "dp")
        return new, jnp.stack([loss, after])

    train = jax.jit(
        jax.shard_map(local_step, mesh=mesh, in_specs=(P(), P("dp"), P("dp")), out_specs=(P(), P()))
    )
    busy = jax.jit(lambda a: jnp.tanh(a @ a) * 0.5)
    hlo = train.lower(params, x, y).compile().as_text()
    params, loss = train(params, x, y)  # compile + warm up outside the profile
    block = jnp.ones((256, 256), jnp.float32) * 0.01
    busy(block).block_until_ready()

    opts = jax.profiler.ProfileOptions()
    opts.python_tracer_level = 0  # keep the traces small: no Python call stacks
    out = Path(args.out) / f"rank{me}"
    losses = []
    sync_global_devices("compiled")
    with jax.profiler.trace(str(out), create_perfetto_trace=True, profiler_options=opts):
        # Profilers start at different times: a barrier (one all-reduce, outside any step)
        # makes every rank begin step 1 together.
        sync_global_devices("profiling")
        for k in range(1, args.steps + 1):
            with jax.profiler.StepTraceAnnotation("train", step_num=k):
                if me == args.slow_rank:
                    t_end = time.perf_counter() + args.slow_ms / 1e3
                    while time.perf_counter() < t_end:
                        block = busy(block)
                        block.block_until_ready()
                params, loss = train(params, x, y)
                losses.append(np.asarray(loss).tolist())  # no jitted indexing
    for p in out.rglob("*.xplane.pb"):
        p.unlink()
    facts = {
        "process_index": me,
        "device_id": jax.local_devices()[0].id,
        "hlo_all_reduces": [
            line.split("=")[0].strip().lstrip("%")
            for line in hlo.splitlines()
            if " all-reduce(" in line or " all-reduce-start(" in line
        ],
        "losses": losses,
    }
    (Path(args.out) / f".facts{me}.json").write_text(json.dumps(facts))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--slow-rank", type=int, default=2)
    ap.add_argument("--slow-ms", type=float, default=30.0)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--batch", type=int, default=64, help="per process")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--worker", type=int, default=-1, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker >= 0:
        worker(args)
        return
    out = Path(args.out)
    for r in range(args.procs):
        if (out / f"rank{r}").exists():
            sys.exit(f"{out / f'rank{r}'} exists: remove it first")
    out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    cmd = [sys.executable, __file__, *sys.argv[1:], "--port", str(port)]
    procs = [subprocess.Popen([*cmd, "--worker", str(i)]) for i in range(args.procs)]
    if any(p.wait(timeout=600) != 0 for p in procs):
        sys.exit("a worker failed")
    write_truth(args, out)


def write_truth(args: argparse.Namespace, out: Path) -> None:
    import jax

    facts = []
    for r in range(args.procs):
        f = out / f".facts{r}.json"
        facts.append(json.loads(f.read_text()))
        f.unlink()
    files = sorted(str(p.relative_to(out)) for p in out.glob("rank*/plugins/profile/*/*.json.gz"))
    truth = {
        "command": "python sample_traces/jax_cpu_dp/generate.py "
        + " ".join(a for a in sys.argv[1:]),
        "jax_version": jax.__version__,
        "python_version": platform.python_version(),
        "world_size": args.procs,
        "ranks": list(range(args.procs)),
        "rank_source": "process_index = process_id of jax.distributed.initialize; dir rank{i}",
        "device_ids": {str(f["process_index"]): f["device_id"] for f in facts},
        "steps": list(range(1, args.steps + 1)),
        "step_annotation": "train",
        "all_reduces_per_step": len(facts[0]["hlo_all_reduces"]),
        "all_reduce_hlo_ops": facts[0]["hlo_all_reduces"],
        "all_reduce_group": list(range(args.procs)),
        "barrier": "multihost_utils.sync_global_devices once after the profiler starts, before "
        "step 1, on all ranks (XLA runs it as one all-gather, outside any step)",
        "barrier_collectives": 1,
        "slow_rank": args.slow_rank,
        "slow_ms_per_step": args.slow_ms,
        "model": {"hidden": args.hidden, "batch_per_process": args.batch, "lr": args.lr},
        "losses": facts[0]["losses"],
        "trace_files": files,
    }
    (out / "truth.json").write_text(json.dumps(truth, indent=1) + "\n")


if __name__ == "__main__":
    main()
