"""Autoconfigurator sweep: for (layers, seq_len, device budget) points of Llama-3-8B
dimensions, plan as the scheduler agent does (this GPU's hardware profile plus the job's layer
timed here), run the plan, and compare predicted with measured step time and peak memory;
then a small grid of hand-made plans at one budget against the automatic plan.

    python -m bench.sweep --points all --out bench/results/X.json     # needs a GPU
    python -m bench.sweep --points 0-5 ...                            # a slice, to split runs

Each point runs in its own process (its own budget and peak RSS). Timed over whole steps
after one warm-up step, optimizer included. Raw rows carry predicted_step_seconds,
measured_step_seconds, predicted_peak_device_gib, device_budget_gib, and mfu against the
chip table's dense peak (contracts/chips.py) with its precision, peak_flops and
peak_source.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from dataclasses import asdict, dataclass, field

import torch

from bench.children import run_children
from bench.rows import mfu_fields
from bench.specs import HOST_BUDGET_GIB, llama_dims, llama_spec
from bench.working_set import measured_node, run_plan
from wstrain.contracts.calibration import GIB
from wstrain.planning.planner import make_plan
from wstrain.worker.runtime.stats import proc_status_bytes

log = logging.getLogger("bench.sweep")


@dataclass(frozen=True)
class Point:
    name: str
    layers: int
    seq_len: int
    device_gib: float
    global_batch: int  # about 64K tokens a step
    overrides: dict[str, object] = field(default_factory=dict)  # hand-made plans


POINTS = [
    Point("L8-4k-12g", 8, 4096, 12, 16),
    Point("L8-8k-12g", 8, 8192, 12, 8),
    Point("L8-32k-20g", 8, 32768, 20, 2),
    Point("L16-4k-12g", 16, 4096, 12, 16),
    Point("L16-8k-14g", 16, 8192, 14, 8),
    Point("L16-8k-20g", 16, 8192, 20, 8),
    Point("L16-8k-40g", 16, 8192, 40, 8),
    Point("L16-16k-20g", 16, 16384, 20, 4),
    Point("L16-32k-24g", 16, 32768, 24, 2),
    Point("L24-8k-16g", 24, 8192, 16, 8),
    Point("L32-4k-16g", 32, 4096, 16, 16),
    Point("L32-8k-24g", 32, 8192, 24, 8),
]
# Hand-made plans at the L16-8k-20g point: the automatic plan must be at least as fast.
GRID = [
    Point("hand-recompute-all", 16, 8192, 20, 8, {"micro_batch": 4, "level": 0}),
    Point("hand-lean-window2", 16, 8192, 20, 8, {"micro_batch": 4, "level": 2, "window": 2}),
    Point("hand-mb8-recompute", 16, 8192, 20, 8, {"micro_batch": 8, "level": 0}),
    Point("hand-mb2-lean-w4", 16, 8192, 20, 8, {"micro_batch": 2, "level": 2, "window": 4}),
    Point("hand-host-optimizer", 16, 8192, 20, 8, {"micro_batch": 4, "optimizer": "host"}),
]
ALL = POINTS + GRID


def run_point(point: Point, steps: int) -> dict[str, object]:
    dims = llama_dims(point.layers)
    spec = llama_spec(
        point.name,
        point.layers,
        point.seq_len,
        point.global_batch,
        steps,
        point.device_gib,
        HOST_BUDGET_GIB,
        point.overrides,
    )
    flops_only = make_plan(spec, dims, measured_node())
    node = measured_node(point.seq_len, dims)
    plan = make_plan(spec, dims, node)
    res = run_plan(spec, dims, plan, steps, node=node)
    timed = res["times"][1:]  # type: ignore[index]
    step_s = sum(timed) / len(timed)
    tokens_per_s = point.global_batch * point.seq_len / step_s
    gpu = torch.cuda.get_device_name(0)
    return {
        **asdict(point),
        "device_budget_gib": point.device_gib,
        "measured_step_seconds": step_s,
        "step_seconds": res["times"],
        "predicted_step_seconds": plan.predicted.step_seconds,
        "predicted_step_seconds_flops_only": flops_only.predicted.step_seconds,
        "predicted": plan.predicted.model_dump(),
        "error_ratio": plan.predicted.step_seconds / step_s - 1,
        "predicted_peak_device_gib": plan.predicted.peak_device_bytes / GIB,
        "peak_allocated_gib": torch.cuda.max_memory_allocated() / GIB,
        "peak_reserved_gib": torch.cuda.max_memory_reserved() / GIB,
        "predicted_peak_host_gib": plan.predicted.peak_host_bytes / GIB,
        "peak_rss_gib": proc_status_bytes("VmHWM") / GIB,
        "host_budget_gib": HOST_BUDGET_GIB,
        "arena_gib": res["arena_gib"],
        "stalls_s": {k: v / len(timed) for k, v in res["stalls"].items()},  # type: ignore[union-attr]
        "tokens_per_s": tokens_per_s,
        # mfu, precision, peak_flops, peak_source: the chip table's dense peak
        **mfu_fields(dims.flops_per_token(point.seq_len), tokens_per_s, gpu, spec.precision),
        "plan": res["plan"],
        "layer_times": asdict(node.layer) if node.layer else None,
        "gpu": gpu,
        "commit": os.environ.get("BENCH_COMMIT", "?"),
    }


def _select(spec: str) -> list[Point]:
    if spec == "all":
        return ALL
    if spec == "grid":
        return GRID
    lo, _, hi = spec.partition("-")
    return ALL[int(lo) : int(hi or lo) + 1]


def _table(rows: list[dict[str, object]]) -> str:
    lines = [
        f"{'point':<20}{'mb':>3}{'W':>4}{'meas s':>8}{'pred s':>8}{'err':>7}{'flops s':>8}"
        f"{'budget':>7}{'rsv GiB':>8}{'pred':>6}{'RSS':>6}{'tok/s':>8}{'MFU':>6}"
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"{r['name']:<20} FAILED: {str(r['error'])[:90]}")
            continue
        plan = r["plan"]
        mfu = f"{r['mfu']:.1%}" if r.get("mfu") is not None else "-"
        lines.append(
            f"{r['name']:<20}{plan['micro_batch']:>3}{plan['window']:>4}"  # type: ignore[index]
            f"{r['measured_step_seconds']:>8.2f}{r['predicted_step_seconds']:>8.2f}"
            f"{r['error_ratio']:>7.1%}{r['predicted_step_seconds_flops_only']:>8.2f}"
            f"{r['device_budget_gib']:>7.0f}{r['peak_reserved_gib']:>8.1f}"
            f"{r['predicted_peak_device_gib']:>6.1f}{r['peak_rss_gib']:>6.1f}"
            f"{r['tokens_per_s']:>8.0f}{mfu:>6}"
        )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--points", default="all", help="all | grid | I-J (indices into ALL)")
    p.add_argument("--steps", type=int, default=3, help="1 warm-up + timed steps")
    p.add_argument("--point", help=argparse.SUPPRESS)  # child mode: one point as JSON
    p.add_argument("--out")
    args = p.parse_args()
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s: %(message)s"
    )
    if args.point:
        print(json.dumps(run_point(Point(**json.loads(args.point)), args.steps)), flush=True)
        return
    children = [
        (
            ["bench.sweep", "--point", json.dumps(asdict(point)), "--steps", str(args.steps)],
            asdict(point),
        )
        for point in _select(args.points)
    ]
    print(_table(run_children(children, args.out)))


if __name__ == "__main__":
    main()
