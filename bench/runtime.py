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
import gc
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypedDict

from wstrain.contracts.calibration import GIB
from wstrain.contracts.chips import compute_precision, peak_flops

log = logging.getLogger("bench.runtime")


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
    # that no stall counter times (long context's rebuild inputs, issue 24)
    h2d_on_demand_gb: float | None = None
    kernels: str = "fused"  # worker/kernels/fused.py's Triton kernels, or "eager" (--eager-kernels)
    precision: str | None = None  # what the matmuls compute in: bf16, tf32, fp32
    peak_flops: float | None = None  # the dense peak FLOP/s the mfu divides by
    peak_source: str | None = None  # the chip table's row


class GcPauses:
    """Seconds the interpreter spent collecting garbage, by generation, and the longest
    pause (a host pause drains the GPU's queue like any other host wait)."""

    def __init__(self) -> None:
        self.total_s: dict[str, float] = {}
        self.longest_s = 0.0
        self._start = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._start = time.perf_counter()
            return
        pause_s = time.perf_counter() - self._start
        gen = f"gen{info['generation']}"
        self.total_s[gen] = self.total_s.get(gen, 0.0) + pause_s
        self.longest_s = max(self.longest_s, pause_s)

    def per_step(self, steps: int) -> dict[str, float]:
        return {**{k: v / steps for k, v in self.total_s.items()}, "longest": self.longest_s}


# Working-set rows: (device budget GiB, layers or None for --layers, plan overrides). Plans
# come from the planner (planning/working_set.py), so the rows also check its predictions.
WS_ROWS: dict[str, tuple[float, int | None, dict[str, object]]] = {
    "ws-40": (40, None, {}),
    "ws-20": (20, None, {}),
    "ws-12": (12, None, {}),
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
HOST_BUDGET_GIB = 100


def job_precision(name: str) -> str:
    """JobSpec.precision of a row: "mixed" for a row named *-mixed, else "bf16"."""
    return "mixed" if name.endswith("-mixed") else "bf16"


def job_activation_precision(name: str) -> str:
    """JobSpec.activation_precision of a row: "fp8" for a row named *-fp8, else "bf16"."""
    return "fp8" if name.endswith("-fp8") else "bf16"


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


def _dims(layers: int):  # type: ignore[no-untyped-def]
    from dataclasses import replace

    from wstrain.contracts.model_dims import PRESETS

    return replace(PRESETS["llama3-8b"], num_layers=layers)


def pss_bytes(pid: int) -> int:
    """Proportional set size of a process: its private pages plus its share of shared ones."""
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    return 0


class RandomTokens:
    """Random token ids; with `document_tokens` each sequence is packed documents of that
    many tokens (the last one cut), for document_mask."""

    def __init__(
        self, vocab: int, seq_len: int, device: str, seed: int = 0, document_tokens: int = 0
    ) -> None:
        import torch

        self.vocab, self.seq_len, self.device = vocab, seq_len, device
        self.gen = torch.Generator(device="cpu").manual_seed(seed)  # a rank's own: its rank
        self.document_tokens = document_tokens

    def documents(self, step: int, round_idx: int, n: int):  # type: ignore[no-untyped-def]
        """(positions, segments), (n, S) each."""
        import torch

        if not self.document_tokens:
            raise ValueError("RandomTokens without document_tokens has no documents")
        rows = torch.arange(self.seq_len).expand(n, self.seq_len)
        return rows % self.document_tokens, rows // self.document_tokens

    def batch(self, step: int, round_idx: int, n: int):  # type: ignore[no-untyped-def]
        import torch

        t = torch.randint(0, self.vocab, (n, self.seq_len + 1), generator=self.gen)
        return t[:, :-1], t[:, 1:]

    def target_tokens(self, step: int, sequences: int) -> int:
        return sequences * self.seq_len  # every random target counts


def time_steps(step_fn, steps: int) -> list[float]:  # type: ignore[no-untyped-def]
    import torch

    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    times = []
    for i in range(steps):
        sync()
        t0 = time.perf_counter()
        step_fn(i)
        sync()
        times.append(time.perf_counter() - t0)
        log.info("step %d: %.2f s", i, times[-1])
    return times


def llama_spec(
    name: str,
    layers: int,
    seq: int,
    global_batch: int,
    steps: int,
    device_gib: float,
    host_gib: float,
    overrides: dict[str, object],
    precision: str = "bf16",
    activation_precision: str = "bf16",
):  # type: ignore[no-untyped-def]
    """A JobSpec for Llama-3-8B dimensions with `layers` layers, on synthetic tokens."""
    from wstrain.contracts.spec import JobSpec

    dims = _dims(layers)
    return JobSpec.model_validate(
        {
            "name": name,
            "model": {
                "hf_config": {
                    "vocab_size": dims.vocab_size,
                    "hidden_size": dims.hidden_size,
                    "intermediate_size": dims.intermediate_size,
                    "num_hidden_layers": dims.num_layers,
                    "num_attention_heads": dims.num_heads,
                    "num_key_value_heads": dims.num_kv_heads,
                    "rope_theta": dims.rope_theta,
                    "max_position_embeddings": 131072,
                }
            },
            "data": {"kind": "synthetic"},
            "seq_len": seq,
            "global_batch": global_batch,
            "steps": steps,
            "precision": precision,
            "activation_precision": activation_precision,
            "optimizer": {"lr": 1e-4},
            "budget": {"device_gib": device_gib, "host_gib": host_gib},
            "overrides": {"runtime": "working_set", **overrides},
        }
    )


def measured_node(layer_seq: int | None = None, dims=None):  # type: ignore[no-untyped-def]
    """This GPU's hardware profile (worker/profile/node.py), plus the job's layer timed here when
    dims are given (worker/profile/layer.py): what the scheduler agent plans with."""
    import torch

    from wstrain.contracts.hardware import LayerTimes, NodeProfile
    from wstrain.worker.profile.layer import measure
    from wstrain.worker.profile.node import cached_profile

    measured = cached_profile(Path(os.environ.get("BENCH_PROFILE_DIR", "/tmp/wstrain-profiles")))
    total = torch.cuda.get_device_properties(0).total_memory
    node = NodeProfile.from_profile("cuda", measured["profile"], total, 128 * GIB)
    if dims is not None and layer_seq is not None:
        node = node.with_layer(LayerTimes.from_json(measure(dims, layer_seq, "bf16")))
    return node


def plan_for(name: str, args: argparse.Namespace):  # type: ignore[no-untyped-def]
    from wstrain.planning import cost_model
    from wstrain.planning.planner import make_plan

    if args.link_share:  # a sweep knob for the planner's D2H share (planning/cost_model.py)
        cost_model.LINK_SHARE = args.link_share
    budget, layers, overrides = WS_ROWS[name]
    dims = _dims(layers or args.layers)
    spec = llama_spec(
        name,
        dims.num_layers,
        args.seq,
        args.global_batch,
        args.steps,
        budget,
        HOST_BUDGET_GIB,
        overrides,
        precision=job_precision(name),
        activation_precision=job_activation_precision(name),
    )
    # packed beside other jobs on one GPU (bench/pack.py): plan with a share of its link,
    # as the agent does (NodeProfile.shared_by)
    node = measured_node(args.seq, dims).shared_by(args.jobs_on_gpu)
    return spec, dims, make_plan(spec, dims, node), node


def run_plan(
    spec,
    dims,
    plan,
    steps: int,
    profile: bool = False,  # type: ignore[no-untyped-def]
    node=None,
    group=None,
    document_tokens: int = 0,
) -> dict[str, object]:
    """Train `steps` steps of a working-set plan under the spec's device budget (and with
    `profile`, one more under the profiler: bench/timeline.py); the row keeps the node
    profile the plan was made with, so it can be planned again elsewhere. With
    `document_tokens` (a document_mask spec) the sequences are packed documents of that
    length. With `group`
    (runtime/distributed.py) this is one rank of a data-parallel run over one shared host
    copy (bench/data_parallel.py)."""
    import torch

    from bench.timeline import profile_step
    from wstrain.contracts.calibration import host_reserve_bytes
    from wstrain.planning import cost_model
    from wstrain.worker.build import ws_config
    from wstrain.worker.runtime.working_set.schedule import WorkingSetRuntime
    from wstrain.worker.runtime.working_set.state import HostState

    gpu = torch.cuda.current_device()
    total = torch.cuda.get_device_properties(gpu).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, spec.budget.device_bytes / total), gpu)
    t0 = time.perf_counter()
    # the worker's limit (worker/build.py): the arena refuses to grow past the host budget
    arena_limit = spec.budget.host_bytes - host_reserve_bytes(dims.params, spec.precision, "cuda")
    share, data_parallel = None, {}
    if group is not None and group.local_world > 1:  # (imported here: ws-1-old runs older code)
        from wstrain.worker.runtime.working_set.node_share import NodeShare

        share = NodeShare.create(group, Path(os.environ.get("WSTRAIN_SHM_DIR", "/dev/shm")))
        data_parallel = {"share": share}
    host = HostState.create(
        dims,
        spec.precision,
        pin=True,
        fused_adamw=True,
        arena_limit_bytes=arena_limit,
        **data_parallel,
    )
    g = torch.Generator(device="cuda").manual_seed(0)
    first = group is None or group.local_rank == 0  # each node's local rank 0 fills its copy
    for tile in [*host.weights, host.embed_w, host.head_w] if first else []:  # init on the GPU
        noise = torch.randn(tile.numel(), device="cuda", generator=g, dtype=torch.bfloat16)
        tile.copy_(noise * 0.02)
    for k in range(dims.num_layers) if first else []:  # RMSNorm weights start at one
        for n, v in host.layout.views(host.weights[k]).items():
            if n.endswith("norm.weight"):
                v.fill_(1.0)
    for (tile, _), master in zip(host.groups, host.master if first else []):  # mixed
        master.copy_(tile)
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
    on_demand_bytes = 0  # over the timed steps
    gc.freeze()  # as worker/main.py does once the runtime is built

    def step(i: int) -> None:
        nonlocal on_demand_bytes
        stats = rt.train_step(data, i)
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
    retries = torch.cuda.memory_stats().get("num_alloc_retries", 0)
    timeline = profile_step(lambda: rt.train_step(data, steps)) if profile else None
    rt.finish()  # the last step's deferred update, outside the timing
    # PSS with the state and the store still held; ranks read theirs between two barriers,
    # every rank mapping the shared state, so the sum counts its pages once
    if group is not None:
        group.barrier()
    pss = pss_bytes(os.getpid())
    if group is not None:
        group.barrier()
    summary = plan.model_dump(exclude={"reasons"})
    summary["link_share"] = cost_model.LINK_SHARE
    if node is not None:
        summary["node"] = asdict(node)
    summary["working_set"]["levels"] = [
        sum(row.count(lv) for row in plan.working_set.levels) for lv in range(4)
    ]  # chunks per level
    return {
        "times": times,
        "stalls": stalls,
        "on_demand_bytes": on_demand_bytes,
        "arena_gib": host.arena.total_bytes / GIB,
        "pss_bytes": pss,
        "plan": summary,
        "layers": dims.num_layers,
        "alloc_retries": retries,
        "gc_pause_s": pauses.per_step(steps),
        "timeline": timeline,
        "predicted_step_seconds": plan.predicted.step_seconds,
        "predicted_peak_device_gib": plan.predicted.peak_device_bytes / GIB,
        "predicted_peak_host_gib": plan.predicted.peak_host_bytes / GIB,
    }


def run_working_set(args: argparse.Namespace, name: str) -> dict[str, object]:
    spec, dims, plan, node = plan_for(name, args)
    return run_plan(spec, dims, plan, args.steps, args.profile, node)


def run_row(args: argparse.Namespace) -> Row:
    from bench.baselines import run_deepspeed_zero3_offload, run_fsdp2_offload, run_resident

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
    dims = _dims(int(res.get("layers") or args.layers))
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


def row_from(
    name: str,
    runtime: str,
    dims,
    seq_len: int,
    global_batch: int,  # type: ignore[no-untyped-def]
    budget: float | None,
    res: dict[str, object],
) -> Row:
    """A row from a run's result (times, stalls, plan, predictions) and this process's
    device and host peaks."""
    import torch

    from wstrain.worker.runtime.stats import proc_status_bytes

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
    )  # type: ignore[arg-type]


def _against(row: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    """A working-set row's tokens/s over the resident row of its model beside it, and
    bench.bound's per-round ceilings (ideal; as planned): issue 26's gap to each."""
    res = next(
        (
            r
            for r in rows
            if r["name"] == "resident"
            and "error" not in r
            and (r["layers"], r["seq_len"]) == (row["layers"], row["seq_len"])
        ),
        None,
    )
    if res is None or row.get("runtime") != "working_set":
        return ""
    from bench.bound import row_ceilings

    ratio = res["measured_step_seconds"] / row["measured_step_seconds"]
    ideal, planned = row_ceilings(row, res["measured_step_seconds"])
    return f"{ratio:>7.3f}{ideal:>9.3f}{planned:>9.3f}"


def _table(rows: list[dict[str, object]]) -> str:
    head = (
        f"{'row':<14}{'L':>3}{'batch':>6}{'tok/s':>9}{'MFU':>7}{'dev GiB':>9}{'rsv GiB':>9}"
        f"{'pred':>7}{'RSS GiB':>9}{'arena':>7}{'stall':>7}{'step s':>8}{'pred s':>8}"
        f"{'x res':>7}{'ceiling':>9}{'planned':>9}"
    )
    lines = [head]
    for r in rows:
        if "error" in r:
            lines.append(f"{r['name']:<14} FAILED: {r['error'][:100]}")
            continue
        arena = f"{r['arena_gib']:.1f}" if r["arena_gib"] else "-"
        stall = f"{r['stall_share']:.1%}" if r["stall_share"] is not None else "-"
        pred = f"{r['predicted_peak_device_gib']:.1f}" if r["predicted_peak_device_gib"] else "-"
        pred_s = f"{r['predicted_step_seconds']:.1f}" if r["predicted_step_seconds"] else "-"
        label = f"{r['name']}*" if r.get("kernels") == "eager" else r["name"]
        mfu = f"{r['mfu']:.1%}" if r.get("mfu") is not None else "-"
        lines.append(
            f"{label:<14}{r['layers']:>3}{r['global_batch']:>6}"
            f"{r['tokens_per_s']:>9.0f}{mfu:>7}{r['peak_device_gib']:>9.1f}"
            f"{r['peak_reserved_gib']:>9.1f}{pred:>7}{r['peak_rss_gib']:>9.1f}{arena:>7}"
            f"{stall:>7}{r['measured_step_seconds']:>8.2f}{pred_s:>8}{_against(r, rows)}"
        )
    if any(r.get("kernels") == "eager" for r in rows):
        lines.append("* eager PyTorch elementwise ops (--eager-kernels)")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--seq", type=int, default=8192)
    p.add_argument("--global-batch", type=int, default=32)
    p.add_argument("--resident-micro-batch", type=int, default=1)
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
    print(_table(run_children(children, args.out)))


def parse_or_run_row(
    p: argparse.ArgumentParser, default_rows: str, run_row: Callable[[argparse.Namespace], Row]
) -> argparse.Namespace | None:
    """Add the options every benchmark driver shares (--steps, --rows, --out and the child's
    --row), parse, set up logging; in a child, run its row and print it (returns None)."""
    p.add_argument("--steps", type=int, default=3, help="1 warm-up + timed steps")
    p.add_argument("--rows", default=default_rows)
    p.add_argument("--row", help=argparse.SUPPRESS)  # child mode: run one row
    p.add_argument("--out")
    p.add_argument(
        "--eager-kernels",
        action="store_true",
        help="run PyTorch's eager elementwise ops instead of worker/kernels/fused.py",
    )
    args = p.parse_args()
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s: %(message)s"
    )
    if args.row:
        from wstrain.worker.kernels import fused as fused_ops

        fused_ops.ENABLED = not args.eager_kernels
        row = run_row(args)
        row.kernels = "eager" if args.eager_kernels else "fused"
        print(json.dumps(asdict(row)), flush=True)
        return None
    return args


def run_child(argv: list[str], env: dict[str, str]) -> tuple[dict[str, object] | None, str]:
    """Run one child Python process: (the row it printed as its last stdout line, or None
    where it failed; its last stderr line). Its stderr streams through as it comes, so a
    command stopped at the device tool's limit still shows how far a long row got."""
    with tempfile.TemporaryFile("w+") as stdout:
        proc = subprocess.Popen(argv, stdout=stdout, stderr=subprocess.PIPE, text=True, env=env)
        assert proc.stderr is not None
        last = "?"
        for line in proc.stderr:
            sys.stderr.write(line)
            sys.stderr.flush()
            last = line.strip() or last
        stdout.seek(0)
        lines = stdout.read().strip().splitlines()
    ok = proc.wait() == 0 and lines
    return (json.loads(lines[-1]) if ok else None), last


def run_children(
    children: list[tuple[list[str], dict[str, object]]], out: str | None
) -> list[dict[str, object]]:
    """Run each (module + args, identity) in its own Python process, as the workers run:
    each child prints its row as the last line of stdout; a failed child's row carries the
    last line of its stderr. Rows are written to `out` after each child."""
    rows: list[dict[str, object]] = []
    env = {**os.environ, "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    for argv, identity in children:
        row, last = run_child([sys.executable, "-m", *argv], env)
        rows.append(row if row is not None else {**identity, "error": last})
        if out:
            with open(out, "w") as f:
                json.dump(rows, f, indent=1)
    return rows


if __name__ == "__main__":
    main()
