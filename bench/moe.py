"""MoE benchmark: OLMoE-7Bx1B (AdaWS Table 1) on the working-set runtime under a device budget,
next to resident PyTorch running the Hugging Face `OlmoeForCausalLM` where it fits. Each row
runs in its own process; the driver prints a table and writes the raw rows as JSON.

    python -m bench.moe --seq 8192 --global-batch 32 --rows hf-resident,ws-20 \
        --out bench/results/X.json

Needs a GPU. Timed over whole steps after one warm-up step, optimizer included; MFU counts
Ψ_active (AdaWS: 6·S·(Ψ_active + S·L·n_Q·h_dim) per sequence over 989 TFLOP/s).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
from dataclasses import asdict

from bench.runtime import (GIB, HOST_BUDGET_GIB, PEAK_FLOPS, RandomTokens, Row, _table,
                           _time_steps, measured_node, run_children, run_plan)

log = logging.getLogger("bench.moe")

PRESET = "olmoe-7b-a1b"
# working-set rows: (device budget GiB, plan overrides)
WS_ROWS = {"ws-20": (20.0, {}), "ws-12": (12.0, {}), "ws-40": (40.0, {}),
           "ws-20-host": (20.0, {"optimizer": "host"})}


def run_hf_resident(args: argparse.Namespace, ckpt: bool) -> dict[str, object]:
    """transformers' own OLMoE, bf16 weights, fused torch AdamW, micro-batch 1, the experts
    through transformers' grouped GEMM where it has one, the load-balancing loss on."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from scheduler.model_dims import PRESETS

    dims = PRESETS[PRESET]
    cfg = AutoConfig.for_model(**dims.to_hf_config())
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa",
                                                 dtype=torch.bfloat16)
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
    data = RandomTokens(dims.vocab_size, args.seq, "cuda")
    mb = 1
    rounds = args.global_batch // mb

    def step(i: int) -> None:
        for r in range(rounds):
            x, _ = data.batch(i, r, mb)
            x = x.cuda()
            out = model(input_ids=x, labels=x, output_router_logits=True)
            (out.loss / rounds).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    times = _time_steps(step, args.steps)
    return {"times": times, "stalls": {}, "arena_gib": None,
            "plan": {"micro_batch": mb, "rounds": rounds, "checkpointing": ckpt,
                     "experts_implementation": experts}}


def run_ws(args: argparse.Namespace, budget_gib: float,
           overrides: dict[str, object]) -> dict[str, object]:
    from scheduler.contracts import JobSpec
    from scheduler.model_dims import PRESETS
    from scheduler.planner import make_plan

    dims = PRESETS[PRESET]
    spec = JobSpec.model_validate({
        "name": args.row, "model": {"preset": PRESET}, "data": {"kind": "synthetic"},
        "seq_len": args.seq, "global_batch": args.global_batch, "steps": args.steps,
        "precision": "bf16", "optimizer": {"lr": 1e-4},
        "budget": {"device_gib": budget_gib, "host_gib": HOST_BUDGET_GIB},
        "overrides": {"runtime": "working_set", **overrides}})
    plan = make_plan(spec, dims, measured_node(args.seq, dims))
    log.info("plan %s", plan.model_dump_json(exclude={"reasons"}))
    return run_plan(spec, dims, plan, args.steps)


def run_row(args: argparse.Namespace) -> Row:
    import torch

    from scheduler.model_dims import PRESETS
    from worker.stats import proc_status_bytes

    dims = PRESETS[PRESET]
    budget, overrides = WS_ROWS.get(args.row, (None, {}))
    res = (run_ws(args, budget, overrides) if budget is not None
           else run_hf_resident(args, ckpt=args.row == "hf-resident-ckpt"))
    timed = res["times"][1:]  # the first step is warm-up
    step_s = sum(timed) / len(timed)
    tokens_per_s = args.global_batch * args.seq / step_s
    # BENCH_COMMIT first: the GPU host's copy of the tree carries a stale .git
    commit = os.environ.get("BENCH_COMMIT") or subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    return Row(name=args.row, runtime="working_set" if budget is not None else "resident_hf",
               layers=dims.num_layers, seq_len=args.seq, device_budget_gib=budget,
               global_batch=args.global_batch, tokens_per_s=tokens_per_s,
               mfu=dims.flops_per_token(args.seq) * tokens_per_s / PEAK_FLOPS,
               peak_device_gib=torch.cuda.max_memory_allocated() / GIB,
               peak_reserved_gib=torch.cuda.max_memory_reserved() / GIB,
               peak_rss_gib=proc_status_bytes("VmHWM") / GIB, arena_gib=res["arena_gib"],
               stall_share=(sum(res["stalls"].values()) / len(timed) / step_s
                            if budget is not None else None),
               stalls_s={k: v / len(timed) for k, v in res["stalls"].items()},
               step_seconds=res["times"], plan=res["plan"], commit=commit,
               gpu=torch.cuda.get_device_name(0), measured_step_seconds=step_s,
               predicted_step_seconds=res.get("predicted_step_seconds"),
               predicted_peak_device_gib=res.get("predicted_peak_device_gib"),
               predicted_peak_host_gib=res.get("predicted_peak_host_gib"))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seq", type=int, default=8192)
    p.add_argument("--global-batch", type=int, default=32)
    p.add_argument("--steps", type=int, default=3, help="1 warm-up + timed steps")
    p.add_argument("--rows", default="hf-resident,ws-20")
    p.add_argument("--row", help=argparse.SUPPRESS)  # child mode: run one row
    p.add_argument("--out")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(name)s: %(message)s")
    if args.row:
        print(json.dumps(asdict(run_row(args))), flush=True)
        return
    common = ["--seq", str(args.seq), "--global-batch", str(args.global_batch),
              "--steps", str(args.steps)]
    children = [(["bench.moe", "--row", name, *common],
                 {"name": name, "global_batch": args.global_batch})
                for name in args.rows.split(",")]
    print(_table(run_children(children, args.out)))


if __name__ == "__main__":
    main()
