"""A working-set plan trained and measured on this GPU: the node profile the scheduler agent
would plan with here (the hardware profile, plus the job's layer timed here), and a plan's
steps run under the spec's device budget, timed, with the stalls, copies, GC pauses, PSS
and predictions a benchmark row reports. One rank of a data-parallel run too
(bench/data_parallel.py). Needs a GPU.
"""

from __future__ import annotations

import gc
import logging
import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, cast

import torch

from bench.harness import GcPauses, RandomTokens, pss_bytes, time_steps
from bench.timeline import profile_step
from wstrain.contracts.calibration import GIB, host_arena_limit_bytes
from wstrain.contracts.hardware import LayerTimes, NodeProfile
from wstrain.contracts.model_dims import ModelDims
from wstrain.contracts.plan import Plan
from wstrain.contracts.spec import JobSpec
from wstrain.planning import cost_model
from wstrain.worker.build import ws_config
from wstrain.worker.profile.layer import measure
from wstrain.worker.profile.node import cached_profile
from wstrain.worker.runtime.stats import proc_status_bytes
from wstrain.worker.runtime.working_set.schedule import WorkingSetRuntime
from wstrain.worker.runtime.working_set.state import HostState

log = logging.getLogger("bench.runtime")


def measured_node(layer_seq: int | None = None, dims: ModelDims | None = None) -> NodeProfile:
    """This GPU's hardware profile (worker/profile/node.py), plus the job's layer timed here when
    dims are given (worker/profile/layer.py): what the scheduler agent plans with."""
    measured = cached_profile(Path(os.environ.get("BENCH_PROFILE_DIR", "/tmp/wstrain-profiles")))
    total = torch.cuda.get_device_properties(0).total_memory
    rates = cast(dict[str, float], measured["profile"])
    node = NodeProfile.from_profile("cuda", rates, total, 128 * GIB)
    if dims is not None and layer_seq is not None:
        node = node.with_layer(LayerTimes.from_json(measure(dims, layer_seq, "bf16")))
    return node


def _fill(host: HostState, dims: ModelDims) -> None:
    """Random bf16 weights (std 0.02) drawn on the GPU, RMSNorm weights at one, and the fp32
    master copies of precision "mixed" from them. A function of its own so that its last
    noise tensor (the LM head's, 0.98 GiB at Llama-3-8B's vocabulary) is freed before the
    timed steps instead of counting in the row's device peak and budget."""
    g = torch.Generator(device="cuda").manual_seed(0)
    for tile in [*host.weights, host.embed_w, host.head_w]:  # init on the GPU
        noise = torch.randn(tile.numel(), device="cuda", generator=g, dtype=torch.bfloat16)
        tile.copy_(noise * 0.02)
    for k in range(dims.num_layers):  # RMSNorm weights start at one
        for n, v in host.layout.views(host.weights[k]).items():
            if n.endswith("norm.weight"):
                v.fill_(1.0)
    for (tile, _), master in zip(host.groups, host.master):  # mixed
        master.copy_(tile)


def run_plan(
    spec: JobSpec,
    dims: ModelDims,
    plan: Plan,
    steps: int,
    profile: bool = False,
    node: NodeProfile | None = None,
    group: Any = None,
    document_tokens: int = 0,
    spill_dir: Path | None = None,
) -> dict[str, object]:
    """Train `steps` steps of a working-set plan under the spec's device budget (and with
    `profile`, one more under the profiler: bench/timeline.py); the row keeps the node
    profile the plan was made with, so it can be planned again elsewhere. With
    `document_tokens` (a document_mask spec) the sequences are packed documents of that
    length. With `group` (worker/runtime/distributed.py) this is one rank of a
    data-parallel run over one shared host copy (bench/data_parallel.py). A plan that spills
    layers keeps their moments in `spill_dir` (the row's disk_bytes: its file, removed at the
    end; peak_rss_bytes: the process's host peak, page cache not included)."""
    gpu = torch.cuda.current_device()
    total = torch.cuda.get_device_properties(gpu).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, spec.budget.device_bytes / total), gpu)
    t0 = time.perf_counter()
    # the worker's limit (worker/build.py): the arena refuses to grow past the host budget
    arena_limit = host_arena_limit_bytes(
        spec.budget.host_bytes, dims.params, spec.precision, "cuda"
    )
    share, data_parallel = None, dict[str, Any]()
    if group is not None and group.local_world > 1:
        # lazy: a data-parallel row named *-old runs this bench over an earlier src/
        # (bench/data_parallel.py --old-src), whose one-GPU path may predate node_share
        from wstrain.worker.runtime.working_set.node_share import NodeShare

        share = NodeShare.create(group, Path(os.environ.get("WSTRAIN_SHM_DIR", "/dev/shm")))
        data_parallel = {"share": share}
    assert plan.working_set is not None  # a working-set plan
    spilled = plan.working_set.spilled_layers
    if spilled:  # the disk tier, as worker/build.py sets it up
        assert spill_dir is not None, "a plan that spills needs a spill_dir"
        data_parallel |= {
            "spilled_layers": spilled,
            "spill_dir": spill_dir,
            "disk_limit_bytes": spec.budget.disk_bytes,
        }
    host = HostState.create(
        dims,
        spec.precision,
        pin=True,
        fused_adamw=True,
        arena_limit_bytes=arena_limit,
        **data_parallel,
    )
    if group is None or group.local_rank == 0:  # each node's local rank 0 fills its copy
        _fill(host, dims)
    if group is not None:
        group.barrier()  # every rank has mapped the tiles and rank 0 has filled them
        if share is not None:
            share.unlink()
    log.info(
        "host state %.1f GiB ready in %.1f s",
        host.arena.total_bytes / GIB,
        time.perf_counter() - t0,
    )
    rt = WorkingSetRuntime(
        dims, ws_config(spec, plan), spec.optimizer, host, *([group] if group else [])
    )
    data = RandomTokens(dims.vocab_size, spec.seq_len, "cuda", document_tokens=document_tokens)
    stalls: dict[str, float] = {}
    stalls_by_step: list[dict[str, float]] = []  # every step's, warm-up included
    on_demand_bytes = 0  # over the timed steps
    gc.freeze()  # as worker/main.py does once the runtime is built

    def step(i: int) -> None:
        nonlocal on_demand_bytes
        stats = rt.train_step(data, i)
        stalls_by_step.append(dict(stats.stall_s))
        if i > 0 or steps == 1:  # the timed steps' (`--steps 1`: the one, warm-up included)
            for k, v in stats.stall_s.items():
                stalls[k] = stalls.get(k, 0.0) + v
            on_demand_bytes += rt.counters["h2d_on_demand_bytes"]
        log.info(
            "step %d loss %.4f h2d %.1f GB (%.1f GB on demand) d2h %.1f GB stalls %s",
            i,
            stats.loss,
            stats.h2d_bytes / 1e9,
            # copied on the compute stream when backward found them not prefetched: the
            # GPU's idle, which no stall counter times
            rt.counters["h2d_on_demand_bytes"] / 1e9,
            stats.d2h_bytes / 1e9,
            {k: round(v, 3) for k, v in stats.stall_s.items()},
        )

    pauses = GcPauses()
    gc.callbacks.append(pauses)
    times = time_steps(step, steps)
    gc.callbacks.remove(pauses)
    # the budgets' figures so far, in the log before the last deferred update (a disk-bound
    # one takes ~40 s at 56 layers): a child stopped in it still leaves them
    log.info(
        "after %d steps: host peak RSS %.2f GiB, device peak reserved %.2f GiB, spill %d bytes",
        steps,
        proc_status_bytes("VmHWM") / GIB,
        torch.cuda.max_memory_reserved() / GIB,
        host.spill.file.size_bytes if host.spill is not None else 0,
    )
    retries = torch.cuda.memory_stats().get("num_alloc_retries", 0)
    timeline = profile_step(lambda: rt.train_step(data, steps)) if profile else None
    rt.finish()  # the last step's deferred update, outside the timing
    # PSS with the state and the store still held; ranks read theirs between two barriers,
    # every rank mapping the shared state, so the sum counts its pages once
    if group is not None:
        group.barrier()
    pss = pss_bytes(os.getpid())
    peak_rss = proc_status_bytes("VmHWM")
    disk_bytes = host.spill.file.size_bytes if host.spill is not None else 0
    if host.spill is not None:
        host.spill.close(remove=True)
    if group is not None:
        group.barrier()
    summary = plan.model_dump(exclude={"reasons"})
    summary["link_share"] = cost_model.LINK_SHARE
    if node is not None:
        summary["node"] = asdict(node)
    assert plan.working_set is not None  # a working-set plan
    summary["working_set"]["levels"] = [
        sum(row.count(lv) for row in plan.working_set.levels) for lv in range(4)
    ]  # chunks per level
    return {
        "times": times,
        "stalls": stalls,
        "stalls_by_step": stalls_by_step,
        "on_demand_bytes": on_demand_bytes,
        "arena_gib": host.arena.total_bytes / GIB,
        "pss_bytes": pss,
        "peak_rss_bytes": peak_rss,
        "disk_bytes": disk_bytes,
        "plan": summary,
        "layers": dims.num_layers,
        "alloc_retries": retries,
        "gc_pause_s": pauses.per_step(steps),
        "timeline": timeline,
        "predicted_step_seconds": plan.predicted.step_seconds,
        "predicted_peak_device_gib": plan.predicted.peak_device_bytes / GIB,
        "predicted_peak_host_gib": plan.predicted.peak_host_bytes / GIB,
    }
