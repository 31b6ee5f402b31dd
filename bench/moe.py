"""MoE benchmark: OLMoE-7Bx1B (AdaWS Table 1) on the working-set runtime under a device budget,
next to resident PyTorch running the Hugging Face `OlmoeForCausalLM` where it fits. Each row
runs in its own process; the driver prints a table and writes the raw rows as JSON.

    python -m bench.moe --seq 8192 --global-batch 32 --rows hf-resident,ws-20 \
        --out bench/results/X.json

Needs a GPU. Timed over whole steps after one warm-up step, optimizer included; MFU counts
Ψ_active (AdaWS: 6·S·(Ψ_active + S·L·n_Q·h_dim) per sequence) over the chip table's dense
peak (bench/runtime.py mfu_fields).
"""

from __future__ import annotations

import argparse
import logging

import torch

from bench.baselines import accumulated_step
from bench.children import parse_or_run_row, run_children
from bench.harness import time_steps
from bench.rows import Row, row_from
from bench.specs import HOST_BUDGET_GIB
from bench.table import format_rows
from bench.working_set import measured_node, run_plan
from wstrain.contracts.model_dims import PRESETS
from wstrain.contracts.spec import JobSpec
from wstrain.planning.planner import make_plan

log = logging.getLogger("bench.moe")

PRESET = "olmoe-7b-a1b"
# working-set rows: (device budget GiB, plan overrides)
WS_ROWS = {
    "ws-20": (20.0, {}),
    "ws-12": (12.0, {}),
    "ws-40": (40.0, {}),
    "ws-20-host": (20.0, {"optimizer": "host"}),
}


def run_hf_resident(args: argparse.Namespace, ckpt: bool) -> dict[str, object]:
    """transformers' own OLMoE, bf16 weights, fused torch AdamW, micro-batch 1, the experts
    through transformers' grouped GEMM where it has one, the load-balancing loss on."""
    # lazy: transformers is a test extra of the project, not on every GPU machine; only
    # the hf-resident rows need it
    from transformers import AutoConfig, AutoModelForCausalLM

    dims = PRESETS[PRESET]
    cfg = AutoConfig.for_model(**dims.to_hf_config())
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(
            cfg, attn_implementation="sdpa", dtype=torch.bfloat16
        )
    experts = "eager"
    try:
        model.set_experts_implementation("grouped_mm")
        experts = "grouped_mm"
    except (AttributeError, ValueError) as exc:
        log.warning("grouped_mm experts unavailable (%s); transformers' loop runs", exc)
    if ckpt:
        model.gradient_checkpointing_enable()
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    # transformers' own loss: it shifts the labels and adds coef x the load-balancing loss
    times = time_steps(
        accumulated_step(
            model,
            opt,
            dims.vocab_size,
            args,
            1,
            lambda x, _: model(input_ids=x, labels=x, output_router_logits=True).loss,
        ),
        args.steps,
    )
    return {
        "times": times,
        "stalls": {},
        "arena_gib": None,
        "plan": {
            "micro_batch": 1,
            "rounds": args.global_batch,
            "checkpointing": ckpt,
            "experts_implementation": experts,
        },
    }


def run_ws(
    args: argparse.Namespace, budget_gib: float, overrides: dict[str, object]
) -> dict[str, object]:
    dims = PRESETS[PRESET]
    spec = JobSpec.model_validate(
        {
            "name": args.row,
            "model": {"preset": PRESET},
            "data": {"kind": "synthetic"},
            "seq_len": args.seq,
            "global_batch": args.global_batch,
            "steps": args.steps,
            "precision": "bf16",
            "optimizer": {"lr": 1e-4},
            "budget": {"device_gib": budget_gib, "host_gib": HOST_BUDGET_GIB},
            "overrides": {"runtime": "working_set", **overrides},
        }
    )
    node = measured_node(args.seq, dims)
    plan = make_plan(spec, dims, node)
    log.info("plan %s", plan.model_dump_json(exclude={"reasons"}))
    return run_plan(spec, dims, plan, args.steps, node=node)


def run_row(args: argparse.Namespace) -> Row:
    budget, overrides = WS_ROWS.get(args.row, (None, {}))
    res = (
        run_ws(args, budget, overrides)
        if budget is not None
        else run_hf_resident(args, ckpt=args.row == "hf-resident-ckpt")
    )
    return row_from(
        args.row,
        "working_set" if budget is not None else "resident_hf",
        PRESETS[PRESET],
        args.seq,
        args.global_batch,
        budget,
        res,
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seq", type=int, default=8192)
    p.add_argument("--global-batch", type=int, default=32)
    args = parse_or_run_row(p, "hf-resident,ws-20,ws-12", run_row)
    if args is None:
        return
    common = [
        "--seq",
        str(args.seq),
        "--global-batch",
        str(args.global_batch),
        "--steps",
        str(args.steps),
    ]
    children = [
        (["bench.moe", "--row", name, *common], {"name": name, "global_batch": args.global_batch})
        for name in args.rows.split(",")
    ]
    print(format_rows(run_children(children, args.out)))


if __name__ == "__main__":
    main()
