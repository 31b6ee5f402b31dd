"""Planner speed: the saved-activation DP at 64 layers x 32 chunks x 4 levels (cold: first
call in the process; warm: after), and the whole plan for every preset at several budgets on
the H200 reference profile. CPU only.

    python -m bench.planner --out bench/results/X-planner.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import statistics
import time

from wstrain.contracts.errors import InfeasibleBudget
from wstrain.contracts.hardware import H200
from wstrain.contracts.model_dims import PRESETS
from wstrain.contracts.spec import JobSpec
from wstrain.planning.levels import LayerCost, solve
from wstrain.planning.planner import make_plan


def _dp_case() -> list[LayerCost]:
    """Llama-3-8B at 8K on an H200: 7.8 ms forward per chunk, a lean set ~3x that over half
    the link, a 1 GiB write buffer."""
    fwd = 0.0078
    return [
        LayerCost(
            32,
            fwd,
            (0.0027, 0.024, 0.024, 0.047),
            tuple(fwd * (1 - r) for r in (1.0, 0.7, 0.3, 0.02)),
            0.042,
        )
    ] * 64


def time_dp(repeats: int) -> dict[str, float]:
    case = _dp_case()
    start = time.perf_counter()
    solve(case).levels(64)
    cold = time.perf_counter() - start
    warm = []
    for _ in range(repeats):
        start = time.perf_counter()
        solve(case).levels(64)
        warm.append(time.perf_counter() - start)
    return {
        "cold_ms": cold * 1e3,
        "warm_median_ms": statistics.median(warm) * 1e3,
        "warm_max_ms": max(warm) * 1e3,
    }


def time_presets() -> dict[str, float]:
    worst: dict[str, float] = {}
    for name, dims in PRESETS.items():
        for dev in (4, 12, 24, 40, 80):
            spec = JobSpec.model_validate(
                {
                    "name": "b",
                    "model": {"preset": name},
                    "data": {"kind": "synthetic"},
                    "seq_len": min(8192, dims.max_position_embeddings),
                    "global_batch": 32,
                    "steps": 1,
                    "budget": {"device_gib": dev, "host_gib": 256},
                }
            )
            start = time.perf_counter()
            with contextlib.suppress(InfeasibleBudget):
                make_plan(spec, dims, H200)
            worst[name] = max(worst.get(name, 0.0), (time.perf_counter() - start) * 1e3)
    return worst


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--out")
    args = p.parse_args()
    result = {
        "dp_64x32x4": time_dp(args.repeats),
        "plan_worst_ms_by_preset": time_presets(),
        "machine": platform.processor() or platform.machine(),
        "python": platform.python_version(),
    }
    print(json.dumps(result, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
