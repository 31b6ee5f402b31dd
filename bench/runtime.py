"""Runtime benchmark: resident PyTorch vs the working-set runtime at several device budgets,
Llama-3-8B dimensions, side by side. Each row runs in its own process (its own budget, its
own peak RSS); the driver prints a table and writes the raw rows as JSON.

    python -m bench.runtime --layers 16 --seq 8192 --global-batch 32 \
        --rows resident,resident-ckpt,ws-40,ws-20,ws-12 --out bench/results/X.json

Needs a GPU. Timed over whole steps after one warm-up step, optimizer included. MFU divides
by the chip table's dense peak (contracts/chips.py) for the row's GPU and compute
precision; a row on a GPU the table does not know has none.
"""

from __future__ import annotations

import argparse
from typing import cast

from bench.baselines import run_deepspeed_zero3_offload, run_fsdp2_offload, run_resident
from bench.children import parse_or_run_row, run_children
from bench.rows import Row, row_from
from bench.specs import (
    HOST_BUDGET_GIB,
    job_activation_precision,
    job_precision,
    llama_dims,
    llama_spec,
)
from bench.table import format_rows
from bench.working_set import measured_node, run_plan
from wstrain.contracts.hardware import NodeProfile
from wstrain.contracts.model_dims import ModelDims
from wstrain.contracts.plan import Plan
from wstrain.contracts.spec import JobSpec
from wstrain.planning import cost_model
from wstrain.planning.planner import make_plan

# Working-set rows: (device budget GiB, layers or None for --layers, plan overrides). Plans
# come from the planner (planning/working_set.py), so the rows also check its predictions.
WS_ROWS: dict[str, tuple[float, int | None, dict[str, object]]] = {
    "ws-40": (40, None, {}),
    "ws-20": (20, None, {}),
    "ws-12": (12, None, {}),
    "ws-24": (24, None, {}),
    "ws-24-32l": (24, 32, {}),
    "ws-20-host": (20, None, {"optimizer": "host"}),
    "ws-24-32l-host": (24, 32, {"optimizer": "host"}),
    # the lead pass (working_set/schedule.py lead_rounds) pinned, for A/B against the planner
    "ws-12-lead1": (12, None, {"lead_rounds": 1}),
    "ws-20-lead2": (20, None, {"lead_rounds": 2}),
    "ws-24-32l-lead2": (24, 32, {"lead_rounds": 2}),
    # the split optimizer (working_set/schedule.py device_opt_layers) pinned
    "ws-24-32l-split": (24, 32, {"optimizer": "split"}),
    "ws-20-split": (20, None, {"optimizer": "split"}),
    "ws-24-split": (24, None, {"optimizer": "split"}),
    # precision "mixed" (a row named *-mixed): fp32 master and moments on the host
    "ws-20-mixed": (20, None, {}),
    "ws-40-mixed": (40, None, {}),
    # cross-round overlap (working_set/pass_order.py) pinned on or off, for A/B
    "ws-20-round": (20, None, {"overlap": False}),
    "ws-12-round": (12, None, {"overlap": False}),
    "ws-20-overlap": (20, None, {"overlap": True}),
    "ws-12-overlap": (12, None, {"overlap": True}),
    # activation_precision "fp8" (a row named *-fp8): saved sets go home at 8 bits (lossy)
    "ws-20-fp8": (20, None, {}),
    "ws-12-fp8": (12, None, {}),
    "ws-20-overlap-fp8": (20, None, {"overlap": True}),
    "ws-12-overlap-fp8": (12, None, {"overlap": True}),
    "ws-20-round-fp8": (20, None, {"overlap": False}),
    "ws-12-round-fp8": (12, None, {"overlap": False}),
}


def plan_for(name: str, args: argparse.Namespace) -> tuple[JobSpec, ModelDims, Plan, NodeProfile]:
    """(spec, dims, plan, node) of working-set row `name` as the agent would plan it on this
    GPU: its layer timed here, the link shared with --jobs-on-gpu jobs."""
    if args.link_share:  # a sweep knob for the planner's D2H share (planning/cost_model.py)
        cost_model.LINK_SHARE = args.link_share
    budget, layers, overrides = WS_ROWS[name]
    dims = llama_dims(layers or args.layers)
    spec = llama_spec(
        name,
        dims.num_layers,
        args.seq,
        args.global_batch,
        args.steps,
        budget,
        args.host_gib,
        overrides,
        precision=job_precision(name),
        activation_precision=job_activation_precision(name),
    )
    # packed beside other jobs on one GPU (bench/pack.py): plan with a share of its link,
    # as the agent does (NodeProfile.shared_by)
    node = measured_node(args.seq, dims).shared_by(args.jobs_on_gpu)
    return spec, dims, make_plan(spec, dims, node), node


def run_working_set(args: argparse.Namespace, name: str) -> dict[str, object]:
    spec, dims, plan, node = plan_for(name, args)
    return run_plan(spec, dims, plan, args.steps, args.profile, node)


def run_row(args: argparse.Namespace) -> Row:
    """The row --row names: a baseline (bench/baselines.py) or a working-set row."""
    name = args.row
    if name.startswith("resident"):
        res = run_resident(args, ckpt=name == "resident-ckpt")
        budget = None
    elif name == "fsdp2-offload":
        res = run_fsdp2_offload(args)
        budget = None
    elif name == "deepspeed-zero3-offload":
        res = run_deepspeed_zero3_offload(args)
        budget = None
    else:
        res = run_working_set(args, name)
        budget = float(WS_ROWS[name][0])
    dims = llama_dims(cast(int, res.get("layers") or args.layers))
    runtime = {
        "fsdp2-offload": "fsdp2_cpu_offload",
        "deepspeed-zero3-offload": "deepspeed_zero3_cpu_offload",
    }.get(name, "resident")
    return row_from(
        name,
        runtime if budget is None else "working_set",
        dims,
        args.seq,
        args.global_batch,
        budget,
        res,
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--seq", type=int, default=8192)
    p.add_argument("--global-batch", type=int, default=32)
    p.add_argument("--resident-micro-batch", type=int, default=1)
    p.add_argument(
        "--host-gib",
        type=float,
        default=HOST_BUDGET_GIB,
        help="working-set rows' host budget (the largest model a node holds: 110 of 128 GiB)",
    )
    p.add_argument(
        "--fsdp-global-batch",
        type=int,
        default=8,
        help="the FSDP2 and DeepSpeed offload rows' sequences per step (slow)",
    )
    p.add_argument(
        "--link-share",
        type=float,
        default=0.0,
        help="plan with this share of the D2H link for saved activations",
    )
    p.add_argument(
        "--jobs-on-gpu",
        type=int,
        default=1,
        help="working-set rows: plan for a GPU shared by this many jobs (bench/pack.py)",
    )
    p.add_argument(
        "--profile",
        action="store_true",
        help="resident and working-set rows: one extra step under the profiler",
    )
    args = parse_or_run_row(p, "resident,resident-ckpt,ws-40,ws-20,ws-12,ws-24-32l", run_row)
    if args is None:
        return
    common = [
        "--layers",
        str(args.layers),
        "--seq",
        str(args.seq),
        "--steps",
        str(args.steps),
        "--resident-micro-batch",
        str(args.resident_micro_batch),
        "--link-share",
        str(args.link_share),
        "--jobs-on-gpu",
        str(args.jobs_on_gpu),
        "--host-gib",
        str(args.host_gib),
        *(["--profile"] if args.profile else []),
        *(["--eager-kernels"] if args.eager_kernels else []),
    ]
    slow = ("fsdp2-offload", "deepspeed-zero3-offload")
    batch = {
        name: args.fsdp_global_batch if name in slow else args.global_batch
        for name in args.rows.split(",")
    }
    children = [
        (
            ["bench.runtime", "--row", name, *common, "--global-batch", str(b)],
            {"name": name, "global_batch": b},
        )
        for name, b in batch.items()
    ]
    print(format_rows(run_children(children, args.out)))


if __name__ == "__main__":
    main()
