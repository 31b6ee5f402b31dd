"""The disk tier beside all state in host memory: the same job (Llama-3-8B dimensions at
`--layers`, synthetic tokens, the same global batch) planned and trained twice on this GPU,
each in its own process: once with a host budget that holds its whole training state, once
with a host budget `--state-over-host` times smaller than the state and a disk budget in
`--spill-dir` (a local disk), where the planner puts the AdamW moments the host cannot hold.

    python -m bench.disk_tier --layers 8 --seq 8192 --global-batch 64 --steps 3 \
        --state-over-host 1.5 --spill-dir /tmp/wstrain-spill --out X.json

`--predict` plans the same pair on the H200 reference profile (contracts/hardware.py) with the
disk rates given, for each global batch of `--batches`, and prints the predicted ratio (no
GPU): what a disk's rates buy before it is measured.

    python -m bench.disk_tier --layers 56 --predict --read-gbps 1.1 --write-gbps 1.3 \
        --batches 8,64,256,1024

A row: params, tokens/s, the planner's predicted step beside the measured one, the spilled
layers, the state over the host budget, peak host RSS, the spill file's bytes, and
`budget_violations` (device peak, host RSS or spill file past its budget: 0 or 1); the disk
row's `x_in_memory` is its tokens/s over the in-memory row's. The disk's read and write
rates are measured first (worker/profile/disk.py) and planned with, as an agent with
WSTRAIN_SPILL_DIR would. Needs a GPU.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench.children import run_child
from bench.specs import llama_dims, llama_spec
from wstrain.contracts.calibration import GIB
from wstrain.contracts.hardware import NodeProfile
from wstrain.contracts.model_dims import PRESETS, ModelDims
from wstrain.contracts.spec import JobSpec
from wstrain.planning import memory_model as mm
from wstrain.planning.planner import make_plan

log = logging.getLogger("bench.disk_tier")

DEVICE_GIB = 24.0
WARMUP_STEPS = 2


def _dims(args: argparse.Namespace) -> ModelDims:
    """The job's model: the preset --model, else Llama-3-8B dimensions at --layers."""
    return PRESETS[args.model] if args.model else llama_dims(args.layers)


def _spec(args: argparse.Namespace, host_gib: float, disk_gib: float) -> JobSpec:
    spec = llama_spec(
        "disk-tier", args.layers, args.seq, args.global_batch, args.steps, DEVICE_GIB,
        host_gib, {"runtime": "working_set"},
    )  # fmt: skip
    budget = spec.budget.model_copy(update={"disk_gib": disk_gib})
    update: dict[str, Any] = {"budget": budget}
    if args.model:
        update["model"] = JobSpec.model_validate(
            {**spec.model_dump(exclude={"model"}), "model": {"preset": args.model}}
        ).model
    return spec.model_copy(update=update)


def _budgets(args: argparse.Namespace, name: str) -> tuple[float, float]:
    """(host GiB, disk GiB) of row `name`: the in-memory row's host budget is --host-gib,
    the disk row's --disk-host-gib, else the state over --state-over-host; its disk
    --disk-gib."""
    state_gib = mm.host_state_bytes(_dims(args), "bf16") / GIB
    if name == "in-memory":
        return args.host_gib, 0.0
    return args.disk_host_gib or round(state_gib / args.state_over_host, 2), args.disk_gib


def run_row(args: argparse.Namespace) -> dict[str, Any]:
    """One row in this process (the child): plan at its budgets on this GPU, train, time."""
    import torch  # the child's only: the driver stays light

    from bench.working_set import measured_node, run_plan
    from wstrain.worker.profile.disk import disk_bandwidth

    dims = _dims(args)
    host_gib, disk_gib = _budgets(args, args.row)
    spec = _spec(args, host_gib, disk_gib)
    node: NodeProfile = measured_node(args.seq, dims)
    spill_dir = Path(args.spill_dir) / args.row
    if disk_gib:
        spill_dir.mkdir(parents=True, exist_ok=True)
        node = replace(node, **disk_bandwidth(spill_dir, GIB))
    plan = make_plan(spec, dims, node)
    assert plan.working_set is not None
    disk_rates = {
        f"disk_{k}_bytes_per_s": getattr(node, f"disk_{k}_bytes_per_s") for k in ("read", "write")
    }
    if args.plan_only:  # the prediction with this GPU's and disk's rates, no training
        return {
            "name": args.row, "model": args.model or "llama3-8b", "layers": dims.num_layers,
            "global_batch": args.global_batch, "spilled_layers": plan.working_set.spilled_layers,
            "predicted_step_seconds": plan.predicted.step_seconds, **disk_rates,
        }  # fmt: skip
    res = run_plan(spec, dims, plan, args.steps, node=node, spill_dir=spill_dir)
    # two warm-up steps, both rows alike: step 1 waits on step 0's update, whose reads of a
    # new spill file hit unwritten (fallocated) extents and move no bytes; from step 2 on
    # every spilled byte is read and written (measured at 56 layers: step 1 took 73 s with
    # writes alone where the planner's steady state is 107 s)
    timed = res["times"][WARMUP_STEPS:]
    step_s = sum(timed) / len(timed)
    state_bytes = mm.host_state_bytes(dims, spec.precision)
    rss_bytes = res["peak_rss_bytes"]
    disk_bytes = res.get("disk_bytes", 0)
    device_peak = torch.cuda.max_memory_reserved()
    violations = int(
        device_peak > spec.budget.device_bytes
        or rss_bytes > spec.budget.host_bytes
        or disk_bytes > spec.budget.disk_bytes
    )
    return {
        "name": args.row,
        "gpu": torch.cuda.get_device_name(0),
        "model": args.model or "llama3-8b",
        "layers": dims.num_layers,
        "params": dims.params,
        "seq_len": args.seq,
        "global_batch": args.global_batch,
        "tokens_per_s": args.global_batch * args.seq / step_s,
        "step_seconds": res["times"],
        "predicted_step_seconds": plan.predicted.step_seconds,
        "predicted_over_measured": plan.predicted.step_seconds / step_s,
        "host_budget_gib": host_gib,
        "disk_budget_gib": disk_gib,
        "device_budget_gib": DEVICE_GIB,
        "state_gib": state_bytes / GIB,
        "state_over_host": state_bytes / spec.budget.host_bytes,
        "spilled_layers": plan.working_set.spilled_layers,
        "optimizer": plan.working_set.optimizer,
        "peak_device_reserved_gib": device_peak / GIB,
        "peak_rss_gib": rss_bytes / GIB,
        "disk_gib": disk_bytes / GIB,
        **disk_rates,
        "stalls_s": {  # a timed step's (res["stalls"] sums every step past the first)
            k: sum(s.get(k, 0.0) for s in res["stalls_by_step"][WARMUP_STEPS:]) / len(timed)
            for k in res["stalls"]
        },
        "predicted_optimizer_seconds": plan.predicted.optimizer_seconds,
        "budget_violations": violations,
        "plan": res["plan"],  # with the node profile it was planned on: re-plan it anywhere
        "commit": os.environ.get("BENCH_COMMIT", ""),
    }


def predict(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The planner's in-memory and disk-tier steps for each global batch, on the H200
    reference profile with the given disk rates."""
    from wstrain.contracts.hardware import H200

    node = replace(H200, disk_read_bytes_per_s=args.read_gbps * 1e9)
    node = replace(node, disk_write_bytes_per_s=args.write_gbps * 1e9)
    dims = _dims(args)
    out = []
    for batch in (int(b) for b in args.batches.split(",")):
        args.global_batch = batch
        plans = {
            name: make_plan(_spec(args, *_budgets(args, name)), dims, node)
            for name in args.rows.split(",")
        }
        disk = plans["disk"]
        ws = disk.working_set
        host_bytes = _budgets(args, "disk")[0] * GIB
        row = {
            "model": args.model or "llama3-8b", "layers": dims.num_layers,
            "params": dims.params, "global_batch": batch,
            "state_over_host": mm.host_state_bytes(dims, "bf16") / host_bytes,
            "spilled_layers": ws.spilled_layers if ws else 0,
            "predicted_step_seconds_disk": disk.predicted.step_seconds,
            "predicted_tokens_per_s_disk": batch * args.seq / disk.predicted.step_seconds,
            "read_gbps": args.read_gbps, "write_gbps": args.write_gbps,
        }  # fmt: skip
        if "in-memory" in plans:  # a model whose whole state fits no host has none
            mem_s = plans["in-memory"].predicted.step_seconds
            row["predicted_step_seconds_in_memory"] = mem_s
            row["predicted_x_in_memory"] = mem_s / disk.predicted.step_seconds
        out.append(row)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--seq", type=int, default=8192)
    p.add_argument("--global-batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=3, help="2 warm-up + timed steps")
    p.add_argument("--host-gib", type=float, default=100.0, help="the in-memory row's")
    p.add_argument("--model", choices=sorted(PRESETS), help="a preset instead of --layers")
    p.add_argument("--state-over-host", type=float, default=1.5)
    p.add_argument("--disk-host-gib", type=float, help="the disk row's host budget")
    p.add_argument("--disk-gib", type=float, default=60.0)
    p.add_argument("--spill-dir", default="/tmp/wstrain-spill")
    p.add_argument("--rows", default="in-memory,disk")
    p.add_argument("--predict", action="store_true", help="plan only, no GPU")
    p.add_argument("--read-gbps", type=float, default=1.1)
    p.add_argument("--write-gbps", type=float, default=1.3)
    p.add_argument("--plan-only", action="store_true", help="measure and plan, no training")
    p.add_argument("--batches", default="8,64,256,1024")
    p.add_argument("--row", help=argparse.SUPPRESS)  # child mode
    p.add_argument("--out")
    args = p.parse_args()
    if args.steps <= WARMUP_STEPS and not (args.predict or args.plan_only):
        p.error(f"--steps={args.steps}: at least {WARMUP_STEPS + 1} ({WARMUP_STEPS} warm up)")
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(message)s")
    if args.row:
        print(json.dumps(run_row(args)), flush=True)
        return
    if args.predict:
        print(json.dumps(predict(args), indent=1))
        return
    rows: list[dict[str, Any]] = []
    argv = [
        *("--layers", str(args.layers), "--seq", str(args.seq)),
        *(("--model", args.model) if args.model else ()),
        *(("--disk-host-gib", str(args.disk_host_gib)) if args.disk_host_gib else ()),
        *("--global-batch", str(args.global_batch), "--steps", str(args.steps)),
        *("--host-gib", str(args.host_gib), "--state-over-host", str(args.state_over_host)),
        *("--disk-gib", str(args.disk_gib), "--spill-dir", args.spill_dir),
        *(("--plan-only",) if args.plan_only else ()),
    ]
    for name in args.rows.split(","):
        row, last = run_child([sys.executable, "-m", "bench.disk_tier", *argv, "--row", name], {
            **os.environ, "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"
        })  # fmt: skip
        rows.append(row if row is not None else {"name": name, "error": last})
        base = next((r for r in rows if r.get("name") == "in-memory" and "error" not in r), None)
        for r in rows:
            if base is not None and "tokens_per_s" in r:
                r["x_in_memory"] = r["tokens_per_s"] / base["tokens_per_s"]
        if args.out:
            Path(args.out).write_text(json.dumps(rows, indent=1))
    print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
