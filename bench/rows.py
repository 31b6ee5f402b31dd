"""A benchmark row as the runtime, long-context and MoE drivers write it to JSON: its fields,
its MFU against the chip table's dense peak (contracts/chips.py), and the row built from a
run's result (times, stalls, plan, predictions) and this process's device and host peaks.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from typing import Any, TypedDict

import torch

from bench.specs import job_precision
from wstrain.contracts.calibration import GIB
from wstrain.contracts.chips import compute_precision, peak_flops
from wstrain.contracts.model_dims import ModelDims
from wstrain.worker.runtime.stats import proc_status_bytes


@dataclass
class Row:
    name: str
    runtime: str
    layers: int
    seq_len: int
    device_budget_gib: float | None
    global_batch: int
    tokens_per_s: float
    mfu: float | None  # None on a GPU the chip table does not know
    peak_device_gib: float
    peak_reserved_gib: float
    peak_rss_gib: float
    arena_gib: float | None
    stall_share: float | None
    stalls_s: dict[str, float]
    step_seconds: list[float]
    plan: dict[str, object]
    commit: str
    gpu: str
    measured_step_seconds: float
    predicted_step_seconds: float | None
    predicted_peak_device_gib: float | None
    predicted_peak_host_gib: float | None
    alloc_retries: int | None = None  # the caching allocator freed its cache to fit (syncs)
    timeline: dict[str, object] | None = None  # one extra step's GPU timeline (--profile)
    gc_pause_s: dict[str, float] | None = None  # GC pauses a step (warm-up included)
    # a timed step's saved sets copied on the compute stream, the prefetch behind: GPU idle
    # that no stall counter times (long context's rebuild inputs)
    h2d_on_demand_gb: float | None = None
    kernels: str = "fused"  # worker/kernels/fused.py's Triton kernels, or "eager" (--eager-kernels)
    precision: str | None = None  # what the matmuls compute in: bf16, tf32, fp32
    peak_flops: float | None = None  # the dense peak FLOP/s the mfu divides by
    peak_source: str | None = None  # the chip table's row
    attention_kernel: str | None = None  # long context: the kernel a piece's attention ran
    # long context: the step's kernels alone at their measured rates over the measured step
    # (bench/long_context.py kernel_floor_s), = tokens/s over the floor's tokens/s
    kernel_floor_ratio: float | None = None
    # the same over the floor at held rates (bench/held_floor.py): the kernels timed at the
    # clock a long run settles at, as the step's own ran
    kernel_floor_held_ratio: float | None = None


class MfuFields(TypedDict):
    mfu: float | None
    precision: str
    peak_flops: float | None
    peak_source: str | None


def mfu_fields(flops_per_token: float, tokens_per_s: float, gpu: str, precision: str) -> MfuFields:
    """A row's mfu, compute precision, peak and peak_source: model FLOPs per token x
    tokens/s over the chip table's dense peak for `gpu` (torch's device name) at the
    compute precision of JobSpec.precision `precision` (the bench never enables TF32)."""
    compute = compute_precision(precision)
    found = peak_flops(gpu, compute)
    return {
        "mfu": flops_per_token * tokens_per_s / found[0] if found else None,
        "precision": compute,
        "peak_flops": found[0] if found else None,
        "peak_source": found[1] if found else None,
    }


def row_from(
    name: str,
    runtime: str,
    dims: ModelDims,
    seq_len: int,
    global_batch: int,
    budget: float | None,
    res: dict[str, Any],
) -> Row:
    """A row from a run's result (times, stalls, plan, predictions) and this process's
    device and host peaks."""
    timed = res["times"][1:]  # the first step is warm-up
    step_s = sum(timed) / len(timed)
    tokens_per_s = global_batch * seq_len / step_s
    stall_total = sum(res["stalls"].values()) / max(1, len(timed))
    # BENCH_COMMIT first: the GPU host's copy of the tree carries a stale .git
    commit = (
        os.environ.get("BENCH_COMMIT")
        or subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
    )
    gpu = torch.cuda.get_device_name(0)
    return Row(
        name=name,
        runtime=runtime,
        layers=dims.num_layers,
        seq_len=seq_len,
        device_budget_gib=budget,
        global_batch=global_batch,
        tokens_per_s=tokens_per_s,
        **mfu_fields(dims.flops_per_token(seq_len), tokens_per_s, gpu, job_precision(name)),
        peak_device_gib=torch.cuda.max_memory_allocated() / GIB,
        peak_reserved_gib=torch.cuda.max_memory_reserved() / GIB,
        peak_rss_gib=proc_status_bytes("VmHWM") / GIB,
        arena_gib=res["arena_gib"],
        stall_share=None if budget is None else stall_total / step_s,
        stalls_s={k: v / len(timed) for k, v in res["stalls"].items()},
        step_seconds=res["times"],
        plan=res["plan"],
        commit=commit,
        gpu=gpu,
        measured_step_seconds=step_s,
        predicted_step_seconds=res.get("predicted_step_seconds"),
        predicted_peak_device_gib=res.get("predicted_peak_device_gib"),
        predicted_peak_host_gib=res.get("predicted_peak_host_gib"),
        alloc_retries=res.get("alloc_retries"),
        timeline=res.get("timeline"),
        h2d_on_demand_gb=(
            None
            if res.get("on_demand_bytes") is None
            else res["on_demand_bytes"] / len(timed) / 1e9
        ),
        gc_pause_s=res.get("gc_pause_s"),
    )
