"""Device memory of a working-set plan by phase: the plan for a bench/runtime.py row (or a
saved plan, cut to its first `--layers` layers), run with the allocator allowed
`--allow-gib`, and the peak allocated bytes per (phase, layer) printed against the
planner's prediction, with the unit (chunk, or piece of a long sequence) where each phase
peaked. GPU only.

    python -m bench.memprobe --row ws-20 --allow-gib 40
    python -m bench.memprobe --plan-file plan.json --layers 2 --seq 524288 --global-batch 1 \
        --device-gib 24 --allow-gib 40 --steps 1
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from bench.harness import RandomTokens
from bench.runtime import plan_for
from bench.specs import llama_dims, llama_spec
from wstrain.contracts.calibration import GIB
from wstrain.contracts.plan import Plan
from wstrain.worker.build import ws_config
from wstrain.worker.runtime.working_set.schedule import WorkingSetRuntime
from wstrain.worker.runtime.working_set.state import HostState


def saved_plan(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    """(spec, dims, plan) of a plan saved as JSON, on its first args.layers layers (the
    levels of the others dropped): a long row's phases probed in minutes, not its step."""
    plan = Plan.model_validate_json(Path(args.plan_file).read_text())
    ws = plan.working_set
    assert ws is not None, "a working-set plan"
    ws = ws.model_copy(update={"levels": ws.levels[: args.layers]})
    plan = plan.model_copy(update={"working_set": ws, "layers": args.layers})
    spec = llama_spec(
        "probe",
        args.layers,
        args.seq,
        args.global_batch,
        args.steps,
        args.device_gib,
        args.host_gib,
        {"optimizer": "host"},
    )
    return spec, llama_dims(args.layers), plan


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--row", default="ws-20")
    p.add_argument("--plan-file", default="", help="a Plan's JSON instead of --row's plan")
    p.add_argument("--allow-gib", type=float, default=40.0)
    p.add_argument("--device-gib", type=float, default=24.0, help="with --plan-file")
    p.add_argument("--host-gib", type=float, default=110.0, help="with --plan-file")
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--seq", type=int, default=8192)
    p.add_argument("--global-batch", type=int, default=32)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--link-share", type=float, default=0.0)
    p.add_argument("--jobs-on-gpu", type=int, default=1, help="plan for a GPU shared by N jobs")
    args = p.parse_args()
    if args.plan_file:
        spec, dims, plan = saved_plan(args)
    else:
        spec, dims, plan, _ = plan_for(args.row, args)
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, args.allow_gib * GIB / total), 0)
    host = HostState.create(dims, "bf16", pin=True, fused_adamw=True)
    rt = WorkingSetRuntime(dims, ws_config(spec, plan), spec.optimizer, host)
    peaks: dict[str, tuple[float, object]] = {}  # (phase, layer) -> (GiB, unit at the peak)

    def wrap(name: str, fn):  # type: ignore[no-untyped-def]
        def inner(k, unit, *a, **kw):  # type: ignore[no-untyped-def]
            torch.cuda.reset_peak_memory_stats()
            out = fn(k, unit, *a, **kw)
            key, gib = f"{name}{k:02d}", torch.cuda.max_memory_allocated() / GIB
            if gib > peaks.get(key, (0.0, None))[0]:
                peaks[key] = (gib, unit if isinstance(unit, int) else str(unit))
            return out

        return inner

    rt._forward_layer = wrap("fwd", rt._forward_layer)  # type: ignore[method-assign]
    rt._backward_layer = wrap("bwd", rt._backward_layer)  # type: ignore[method-assign]
    rt._rebuild_window = wrap("rebuild", rt._rebuild_window)  # type: ignore[method-assign]
    data = RandomTokens(dims.vocab_size, spec.seq_len, "cuda")
    for i in range(args.steps):
        rt.train_step(data, i)
    torch.cuda.synchronize()
    print(
        json.dumps(
            {
                "predicted_gib": plan.predicted.peak_device_bytes / GIB,
                "levels": plan.working_set.levels,
                "window": plan.window,
                "peak_gib": max(g for g, _ in peaks.values()),
                "peak_reserved_gib": torch.cuda.max_memory_reserved() / GIB,
                "peaks": {k: (round(g, 2), u) for k, (g, u) in sorted(peaks.items())},
            }
        )
    )


if __name__ == "__main__":
    main()
