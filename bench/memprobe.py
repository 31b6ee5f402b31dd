"""Device memory of a working-set plan by phase: the plan for a bench/runtime.py row, run one
step with the allocator allowed `--allow-gib`, and the peak allocated bytes per (phase,
layer) printed against the planner's prediction. GPU only.

    python -m bench.memprobe --row ws-20 --allow-gib 40
"""

from __future__ import annotations

import argparse
import json

import torch

from bench.runtime import RandomTokens, plan_for
from wstrain.scheduler.contracts.calibration import GIB


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--row", default="ws-20")
    p.add_argument("--allow-gib", type=float, default=40.0)
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--seq", type=int, default=8192)
    p.add_argument("--global-batch", type=int, default=32)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--link-share", type=float, default=0.0)
    args = p.parse_args()
    from wstrain.worker.build import ws_config
    from wstrain.worker.runtime.working_set.schedule import WorkingSetRuntime
    from wstrain.worker.runtime.working_set.state import HostState

    spec, dims, plan, _ = plan_for(args.row, args)
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, args.allow_gib * GIB / total), 0)
    host = HostState.create(dims, "bf16", pin=True, fused_adamw=True)
    rt = WorkingSetRuntime(dims, ws_config(spec, plan), spec.optimizer, host)
    peaks: dict[str, float] = {}

    def wrap(name: str, fn):  # type: ignore[no-untyped-def]
        def inner(k, *a, **kw):  # type: ignore[no-untyped-def]
            torch.cuda.reset_peak_memory_stats()
            out = fn(k, *a, **kw)
            key = f"{name}{k:02d}"
            peaks[key] = max(peaks.get(key, 0.0), torch.cuda.max_memory_allocated() / GIB)
            return out

        return inner

    rt._forward_layer = wrap("fwd", rt._forward_layer)  # type: ignore[method-assign]
    rt._backward_layer = wrap("bwd", rt._backward_layer)  # type: ignore[method-assign]
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
                "peak_gib": max(peaks.values()),
                "peaks": {k: round(v, 2) for k, v in sorted(peaks.items())},
            }
        )
    )


if __name__ == "__main__":
    main()
