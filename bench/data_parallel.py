"""Data-parallel benchmark: the working-set runtime on 1 and N GPUs of one node at the same
per-GPU batch, Llama-3-8B dimensions, one shared host copy of the training state
(worker/runtime/working_set/node_share.py). Scaling is global tokens/s over the one-GPU
row's; host memory is the job's PSS summed over its rank processes (shared pages counted
once), read after the timed steps.

    python -m bench.data_parallel --rows ws-1,ws-1-host,ws-2 --layers 32 --seq 8192 \
        --per-gpu-batch 8 --device-gib 20 --host-gib 200 --steps 4 --out bench/results/X.json

Rows: `fsdp2-N` and `deepspeed-N` FSDP2 with CPUOffloadPolicy and DeepSpeed ZeRO-3 with
parameters and optimizer offloaded (bench/baselines.py) on N GPUs, per_gpu_batch sequences
a rank, one a micro-batch, full activation checkpointing; `ws-1` one GPU as the planner
plans it today; `ws-1-host` one GPU with the host
optimizer the data-parallel ranks use (working_set/data_parallel.py: ranks update on the
host only); `ws-N` N GPUs, planned with the D2H rate its GPUs get copying at once (the node
profile's, worker/profile/shared_links.py), `ws-N-onelink` with one GPU's alone; a row
named `X-old` runs X with the package at `--old-src DIR` (an earlier commit's src/) first on
the path: the one-GPU path before and after the data-parallel code, side by side (with
`--plan-file`, on the same plan). Every row runs in
its own process (the ranks in their own processes under it); timed over whole steps after
one warm-up step.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import torch
import torch.multiprocessing as mp

from bench.baselines import run_deepspeed_zero3_offload, run_fsdp2_offload
from bench.children import run_child
from bench.rows import mfu_fields
from bench.specs import llama_dims, llama_spec
from bench.working_set import measured_node, run_plan
from wstrain.contracts.plan import Plan
from wstrain.planning.layouts import PIECES_FROM_TOKENS
from wstrain.planning.planner import make_plan
from wstrain.worker.runtime.distributed import ProcessGroup

log = logging.getLogger("bench.data_parallel")


def _as_rank(rank: int, world: int, port: int) -> None:
    """This process as rank `rank` of `world` on one host (torchrun's environment)."""
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_WORLD_SIZE=str(world),
    )
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s rank{rank} %(name)s: %(message)s")


def _write(res: dict, out: str, rank: int) -> None:  # type: ignore[type-arg]
    """A rank's row, with its GPU's peak reserved memory, where the launcher reads it."""
    res["peak_reserved_gib"] = torch.cuda.max_memory_reserved() / 2**30
    with open(f"{out}.{rank}", "w") as f:
        json.dump(res, f, default=str)


def _rank(rank: int, world: int, port: int, job: tuple, steps: int, out: str) -> None:  # type: ignore[type-arg]
    _as_rank(rank, world, port)
    group = ProcessGroup.from_env("cuda") if world > 1 else None
    spec, dims, plan, node = job
    res = run_plan(spec, dims, plan, steps, False, node, group)
    _write(res, out, rank)
    if group is not None:
        group.close()


def _baseline_rank(
    rank: int, world: int, port: int, kind: str, args: argparse.Namespace, out: str
) -> None:
    """One rank of an offload baseline (bench/baselines.py) on GPU `rank`: its per-GPU batch
    a step; its PSS is read after the timed steps, with the model still held."""
    _as_rank(rank, world, port)
    args.global_batch = args.per_gpu_batch  # the rank's own sequences a step
    run = run_fsdp2_offload if kind == "fsdp2" else run_deepspeed_zero3_offload
    res = run(args)
    _write(res, out, rank)


def _spawn(fn, world: int, extra: tuple) -> list[dict]:
    """`world` ranks of fn(rank, world, port, *extra, out) in their own processes: each
    rank's row."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tempfile.mktemp(prefix="dp-")
    mp.spawn(fn, args=(world, port, *extra, out), nprocs=world)
    return [json.loads(Path(f"{out}.{r}").read_text()) for r in range(world)]


def _gang_row(args: argparse.Namespace, world: int, ranks: list[dict]) -> dict[str, object]:
    """What every row reports of its ranks: tokens/s over the slowest rank's steps (the
    first one warm-up, unless it is the only one), MFU a GPU, the PSS summed over the
    ranks, each one's peak."""
    times = [max(r["times"][i] for r in ranks) for i in range(args.steps)]  # the gang's step
    timed = times[1:] or times  # `--steps 1` (a 512K step is minutes): warm-up included
    step_s = sum(timed) / len(timed)
    tokens_per_s = world * args.per_gpu_batch * args.seq / step_s
    gpu = torch.cuda.get_device_name(0)
    flops = llama_dims(args.layers).flops_per_token(args.seq)
    return {
        "name": args.row,
        "gpus": world,
        "layers": args.layers,
        "seq_len": args.seq,
        "per_gpu_batch": args.per_gpu_batch,
        "tokens_per_s": tokens_per_s,
        **mfu_fields(flops, tokens_per_s / world, gpu, "bf16"),
        "step_seconds": times,
        "steps_timed": len(timed),
        "host_pss_gib": sum(r["pss_bytes"] for r in ranks) / 2**30,
        "peak_reserved_gib": [r["peak_reserved_gib"] for r in ranks],
        "plan": ranks[0]["plan"],
        "gpu": gpu,
        "commit": os.environ.get("BENCH_COMMIT", "?"),
    }


def run_baseline_row(args: argparse.Namespace) -> dict[str, object]:
    """`fsdp2-N` / `deepspeed-N`: FSDP2 CPUOffloadPolicy or DeepSpeed ZeRO-3 offload on N
    GPUs, full activation checkpointing, one sequence a micro-batch, per_gpu_batch a rank."""
    kind, world = args.row.split("-")[0], int(args.row.split("-")[1])
    return _gang_row(args, world, _spawn(_baseline_rank, world, (kind, args)))


def run_row(args: argparse.Namespace) -> dict[str, object]:
    name = args.row
    world = int(name.split("-")[1])
    overrides = {"optimizer": "host"} if world > 1 or name.endswith("-host") else {}
    dims = llama_dims(args.layers)
    spec = llama_spec(
        name,
        args.layers,
        args.seq,
        args.per_gpu_batch * world,
        args.steps,
        args.device_gib,
        args.host_gib,
        overrides,
    ).model_copy(update={"gpus": world})  # planned as the service plans a gang's ranks
    # the agent times the job's layer only below PIECES_FROM_TOKENS (agent/hardware.py): a
    # whole layer at 512K is what does not fit the budget
    long = args.seq >= PIECES_FROM_TOKENS
    node = measured_node() if long else measured_node(args.seq, dims)
    if name.endswith("-onelink"):  # as if each rank had its GPU's link to itself
        node = replace(node, d2h_by_gpus=())
    if args.plan_file and Path(args.plan_file).exists():  # the same plan as an earlier row
        plan = Plan.model_validate_json(Path(args.plan_file).read_text())
    else:
        plan = make_plan(spec, dims, node)  # one rank's plan: its per-GPU batch
        if args.plan_file:
            Path(args.plan_file).write_text(plan.model_dump_json())
    torch.cuda.empty_cache()  # the layer timing's blocks: GPU 0 is rank 0's
    ranks = _spawn(_rank, world, ((spec, dims, plan, node), args.steps))
    return {
        **_gang_row(args, world, ranks),
        "name": name,
        "device_budget_gib": args.device_gib,
        "host_budget_gib": args.host_gib,
        "arena_gib": [r["arena_gib"] for r in ranks],
        "stalls_s": [r["stalls"] for r in ranks],
        "predicted_step_seconds": plan.predicted.step_seconds,
        "source": os.environ.get("BENCH_SOURCE", "this tree"),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", default="ws-1,ws-1-host,ws-2")
    p.add_argument("--row", help=argparse.SUPPRESS)
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--seq", type=int, default=8192)
    p.add_argument("--per-gpu-batch", type=int, default=8)
    p.add_argument("--device-gib", type=float, default=20.0)
    p.add_argument("--host-gib", type=float, default=200.0)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--old-src", help="an earlier commit's src/, for rows named *-old")
    p.add_argument(
        "--plan-file",
        help="the first row writes its plan here, later rows run it (the same plan for "
        "rows whose timing would otherwise plan them apart): for A/B of one-GPU rows",
    )
    p.add_argument("--out")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    if args.row:
        baseline = args.row.startswith(("fsdp2-", "deepspeed-"))
        print(json.dumps((run_baseline_row if baseline else run_row)(args)), flush=True)
        return
    common = [
        "--layers", str(args.layers), "--seq", str(args.seq),
        "--per-gpu-batch", str(args.per_gpu_batch), "--device-gib", str(args.device_gib),
        "--host-gib", str(args.host_gib), "--steps", str(args.steps),
        *(["--plan-file", args.plan_file] if args.plan_file else []),
    ]  # fmt: skip
    results: list[dict] = []  # type: ignore[type-arg]
    for name in args.rows.split(","):
        env = {**os.environ, "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
        row = name.removesuffix("-old")
        if row != name:  # the same row with the earlier package first on the path
            assert args.old_src, f"row {name} needs --old-src"
            env["PYTHONPATH"] = f"{Path(args.old_src).resolve()}:{env.get('PYTHONPATH', '')}"
            env["BENCH_SOURCE"] = args.old_src
        argv = [sys.executable, "-m", "bench.data_parallel", "--row", row, *common]
        res, last = run_child(argv, env)
        results.append({**res, "name": name} if res is not None else {"name": name, "error": last})
        if args.out:
            Path(args.out).write_text(json.dumps(results, indent=1))
    base = next((r for r in results if r.get("name") == "ws-1" and "tokens_per_s" in r), None)
    for r in results:
        if "tokens_per_s" not in r:
            print(f"{r['name']:<10} error: {r.get('error')}")
            continue
        scale = r["tokens_per_s"] / base["tokens_per_s"] if base else float("nan")
        print(
            f"{r['name']:<10} gpus {r['gpus']}  {r['tokens_per_s']:>9.0f} tok/s  x{scale:.3f}  "
            f"MFU/GPU {r['mfu'] or 0:.3f}  host PSS {r['host_pss_gib']:.1f} GiB"
        )


if __name__ == "__main__":
    main()
