"""Long-context benchmark: Llama-3-8B dimensions, one sequence a step (or `--global-batch`
N) at 32K to 512K tokens under a 24 GiB device budget, planned by the autoconfigurator
(which picks the piece length, the window and the saved-activation levels) and run by the
working-set runtime; beside each row, the attention kernel's own fwd+bwd rate at that
length, as the runtime calls it (the layer's pieces against their prefixes): the ceiling
long context converges to; and FA2's rate beside it, the kernel the runtime takes where
cuDNN's attention is missing.

    python -m bench.long_context --lengths 32768,65536,131072,262144 \
        --out bench/results/X.json
    python -m bench.long_context --lengths 131072 --document-tokens 8192 --out X.json

`--global-batch N` takes N sequences a step: the step's fixed costs (the first layer's
weights, the optimizer's wait) are shared by N sequences, as in AdaWS's runs, whose batches
are chosen for 1-2% optimizer overhead (its §4.1).

`--document-tokens N`: every sequence packs documents of N tokens under document_mask (each
piece attends within its documents, ops/document_attn.py); such a row's `mfu` counts the
attention its documents cost (ModelDims.flops_per_token at N), `mfu_whole_causal` the
whole sequence's, for comparison with the plain rows. `--seq-chunk N` pins the piece length
(0: the planner's), for the same job in pieces the planner did not choose; `--profile` adds
one step under the profiler, whose GPU time by kernel kind goes in the row's `timeline`:

    python -m bench.long_context --lengths 131072 --document-tokens 8192 --seq-chunk 4096 \
        --out X.json

`--windows host,device` runs each row with the pieces' window of keys and values (and their
fp32 gradient sums) on the host, staged a 64K-key block at a time (ops/host_window.py), and on
the device, side by side; a million tokens fit 24 GiB only with it on the host, and the host
only with fp8 saved sets (`--activations fp8`):

    python -m bench.long_context --lengths 1048576 --layers 16 --host-gib 120 \
        --activations fp8 --steps 1 --out X.json

Each row runs in its own process. A row takes 32 layers where the host budget holds their
state and saved inputs, else 16, and says which. Timed over whole steps after one warm-up
step (`--steps 1`: the single step is timed, warm-up included, and the row says so). MFU
divides model FLOPs (ModelDims.flops_per_token: 6·N + causal attention) by the chip
table's dense bf16 peak. Compare: AdaWS Table 2 (H100, 32 layers, 80 GiB device / 256 GiB
host): 57.1% at 32K, 56.0% at 64K, 53.1% at 128K, 51.9% at 256K, 42.5% at 512K.
"""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from typing import Any

import torch

from bench.children import parse_or_run_row, run_children
from bench.held_floor import held_rate
from bench.rows import Row, mfu_fields, row_from
from bench.specs import llama_dims, llama_spec
from bench.table import format_rows
from bench.working_set import measured_node, run_plan
from wstrain.contracts.errors import InfeasibleBudget
from wstrain.contracts.hardware import whole_attention_kernel
from wstrain.contracts.model_dims import ModelDims
from wstrain.planning.planner import make_plan
from wstrain.worker.kernels import fa3
from wstrain.worker.kernels.fa3 import fa3_takes
from wstrain.worker.ops import prefix_attn
from wstrain.worker.ops.prefix_attn import prefix_attention, prefix_attention_backward
from wstrain.worker.profile.node import GPU_GEMM_TOKENS, matmul_call

log = logging.getLogger("bench.long_context")

DEVICE_GIB = 24.0
# past 512K a layer's whole attention, timed twice per kernel, is minutes: time 8 pieces
MOST_TIMED_FROM_TOKENS, MOST_TIMED_PIECES = 524288, 8
ADAWS_H100_MFU = {32768: 0.571, 65536: 0.560, 131072: 0.531, 262144: 0.519, 524288: 0.425}
# the same table's tokens/s (its 80 GiB of device, 256 GiB of host)
ADAWS_TOKENS_PER_S = {32768: 8000, 65536: 5700, 131072: 3600, 262144: 2100, 524288: 900}


def plan_row(  # type: ignore[no-untyped-def]
    seq: int,
    host_gib: float,
    steps: int,
    layers: int | None = None,
    documents: int = 0,
    seq_chunk: int = 0,
    global_batch: int = 1,
    kernel: str = "auto",
    window: str = "auto",
    activations: str = "bf16",
    write_buffer: str = "auto",
    device_gib: float = DEVICE_GIB,
):
    """(spec, dims, plan, node) at `layers`, or the 32 layers when they fit the host
    budget and else 16; `documents`: under document_mask, documents of that many tokens
    (the agent reads the span from a token file's index; here every query's is known);
    `seq_chunk`: the piece length pinned (0: the planner's); `global_batch`: sequences a
    step (the planner picks the micro-batch); `kernel` "cudnn": plan and run without FA3
    where it is installed ("auto": the fastest present); `window` "host" or "device": the
    pieces' window of keys and values pinned there ("auto": the planner's);
    `activations`: the saved sets' precision ("fp8": opt-in, lossy); `write_buffer`: GiB
    pinned, or "auto" (the planner's); `device_gib`: the device budget."""
    node = measured_node()  # no layer timing: a whole layer at 512K is what does not fit
    node = node.with_documents(documents)
    if kernel == "cudnn":
        fa3.ENABLED = False
        node = replace(node, fa3_attention_points=())
    last: Exception | None = None
    for n in [layers] if layers else [32, 16]:
        pinned: dict[str, object] = {"seq_chunk": seq_chunk} if seq_chunk else {}
        if window != "auto":
            pinned["window_home"] = window == "host"
        if write_buffer != "auto":
            pinned["write_buffer_gib"] = float(write_buffer)
        spec = llama_spec(
            f"long-{seq}", n, seq, global_batch, steps, device_gib, host_gib, pinned,
            activation_precision=activations,
        )  # fmt: skip
        spec = spec.model_copy(update={"document_mask": documents > 0})
        dims = llama_dims(n)
        try:
            return spec, dims, make_plan(spec, dims, node), node
        except InfeasibleBudget as e:
            log.info("%d layers at %d tokens: %s", n, seq, e)
            last = e
    raise RuntimeError(f"no plan at {seq} tokens: {last}")


def attention_call(
    dims: ModelDims, seq: int, seq_chunk: int, most_pieces: int = 0
) -> tuple[Callable[[], None], float]:
    """One layer's causal attention fwd+bwd at `seq` tokens in pieces of `seq_chunk` (or
    whole), as ops/prefix_attn.py runs it, and its FLOPs counted as the model's
    (4·S²·H·hd/2 forward, 2.5x that backward). `most_pieces`: that many pieces evenly
    spread over the sequence, their own FLOPs counted (a 1M-token layer's whole attention
    is over a minute twice)."""
    h, kv, hd = dims.num_heads, dims.num_kv_heads, dims.head_dim
    dev, bf16 = "cuda", torch.bfloat16
    q = torch.randn(1, h, seq, hd, device=dev, dtype=bf16)
    k, v = (torch.randn(1, kv, seq, hd, device=dev, dtype=bf16) for _ in range(2))
    dk = torch.zeros(1, kv, seq, hd, device=dev, dtype=torch.float32)
    dv = torch.zeros_like(dk)
    c = seq_chunk or seq
    spans = [(s0, min(s0 + c, seq)) for s0 in range(0, seq, c)]
    if most_pieces and len(spans) > most_pieces:
        spans = spans[len(spans) // most_pieces - 1 :: len(spans) // most_pieces]

    def once() -> None:
        for s0, s1 in spans:
            o, lse = prefix_attention(q[:, :, s0:s1], k[:, :, :s1], v[:, :, :s1], s0)
            g = torch.randn_like(o)
            prefix_attention_backward(
                g, q[:, :, s0:s1], k[:, :, :s1], v[:, :, :s1], o, lse, s0,
                dk[:, :, :s1], dv[:, :, :s1],
            )  # fmt: skip

    # causal fwd 2·S²·H·hd over the whole sequence, bwd 2.5x; a piece's share (s1²-s0²)/S²
    return once, 3.5 * 2 * h * hd * sum(s1 * s1 - s0 * s0 for s0, s1 in spans)


def attention_rate(dims: ModelDims, seq: int, seq_chunk: int, most_pieces: int = 0) -> float:
    """attention_call's FLOP/s, one call timed after one warm-up call."""
    once, flops = attention_call(dims, seq, seq_chunk, most_pieces)
    once()  # warm-up
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    once()
    torch.cuda.synchronize()
    return flops / (time.perf_counter() - t0)


def floor_flops(dims: ModelDims, seq: int, sequences: int, docs: int = 0) -> tuple[float, float]:
    """(GEMM, attention) FLOPs of a step as the floor counts them: the model's GEMMs
    (6·Ψ_active a token), each layer's attention as attention_call counts it (with
    documents, each query's document span instead of the whole prefix)."""
    h, hd, layers = dims.num_heads, dims.head_dim, dims.num_layers
    span = docs or seq  # tokens a query's causal attention spans, doubled (half are masked)
    gemm = sequences * seq * dims.flops_per_token(0)
    return gemm, sequences * layers * 3.5 * 2 * seq * span * h * hd


def kernel_floor_s(
    dims: ModelDims, seq: int, sequences: int, gemm_flops: float, attn_flops: float, docs: int
) -> float:
    """A step's kernels alone at their measured rates, no recomputation, stall or idle: its
    floor_flops at the profiled GEMM rate and the rate attention_rate measured."""
    gemm, attention = floor_flops(dims, seq, sequences, docs)
    return gemm / gemm_flops + attention / attn_flops


def held_floor(
    dims: ModelDims, seq: int, sequences: int, seq_chunk: int, most: int, docs: int, hold_s: float
) -> dict[str, Any]:
    """kernel_floor_s at held rates (bench/held_floor.py): the GEMM at the node profile's
    shape and the attention as the row's pieces call it, each timed over `hold_s` of calls
    after as long a warm-up; with the SM clock and power each ran at."""
    cuda, bf16 = torch.device("cuda"), torch.bfloat16
    fn, flops = matmul_call(cuda, bf16, GPU_GEMM_TOKENS, dims.hidden_size, dims.intermediate_size)
    gemm = held_rate(fn, flops, hold_s)
    fn, flops = attention_call(dims, seq, seq_chunk, most)
    attn = held_rate(fn, flops, hold_s)
    floor_s = kernel_floor_s(dims, seq, sequences, gemm.flops_per_s, attn.flops_per_s, docs)
    return {
        "step_seconds": floor_s,
        "hold_s": hold_s,
        "gemm": asdict(gemm),
        "attention": asdict(attn),
    }


def run_row(args: argparse.Namespace) -> Row:
    seq, docs, batch = int(args.row), args.document_tokens, args.global_batch
    spec, dims, plan, node = plan_row(
        seq, args.host_gib, args.steps, args.layers, docs, args.seq_chunk, batch, args.kernel,
        args.window, args.activations, args.write_buffer, args.device_gib,
    )  # fmt: skip
    log.info("plan: %s", plan.reasons)
    res = run_plan(spec, dims, plan, args.steps, args.profile, node, document_tokens=docs)
    if args.steps == 1:  # one step: timed as it is, warm-up included
        res["times"] = [0.0, *res["times"]]
    name = f"long-{seq}" + (f"-docs{docs}" if docs else "") + (f"-x{batch}" if batch > 1 else "")
    name += f"-{args.kernel}" if args.kernel != "auto" else ""
    name += f"-window-{args.window}" if args.window != "auto" else ""
    name += f"-wb{args.write_buffer}gib" if args.write_buffer != "auto" else ""
    name += "-fp8" if args.activations == "fp8" else ""
    name += f"-device{args.device_gib:g}gib" if args.device_gib != DEVICE_GIB else ""
    row = row_from(name, "working_set", dims, seq, batch, args.device_gib, res)
    if docs:  # the FLOPs its documents cost, and the whole sequence's beside them
        row.plan["mfu_whole_causal"] = row.mfu  # type: ignore[index]
        gpu = torch.cuda.get_device_name(0)
        row.mfu = mfu_fields(dims.flops_per_token(docs), row.tokens_per_s, gpu, "bf16")["mfu"]
        row.plan["document_tokens"] = docs  # type: ignore[index]
    ws = plan.working_set
    assert ws is not None
    del res
    torch.cuda.set_per_process_memory_fraction(1.0, 0)  # the kernel alone, whole-GPU
    torch.cuda.empty_cache()
    cuda = torch.device("cuda")
    row.attention_kernel = (  # whole sequences run models/dense.py's attention
        prefix_attn.kernel_for(cuda, torch.bfloat16, docs > 0, dims.head_dim)
        if ws.seq_chunk
        else whole_attention_kernel(
            "cuda", "bf16", docs > 0, fa3_takes(torch.bfloat16, dims.head_dim)
        )
    )
    most = MOST_TIMED_PIECES if seq > MOST_TIMED_FROM_TOKENS else 0
    rate = attention_rate(dims, seq, ws.seq_chunk, most)
    row.plan["attention_fwd_bwd_flops"] = rate  # type: ignore[index]
    row.plan["attention_rate_pieces_timed"] = most or "all"  # type: ignore[index]
    floor_s = kernel_floor_s(dims, seq, batch, node.matmul_flops, rate, docs)
    row.plan["kernel_floor_step_seconds"] = floor_s  # type: ignore[index]
    row.kernel_floor_ratio = floor_s / row.measured_step_seconds
    if args.held_s > 0:
        held = held_floor(dims, seq, batch, ws.seq_chunk, most, docs, args.held_s)
        row.plan["held_floor"] = held  # type: ignore[index]
        row.kernel_floor_held_ratio = held["step_seconds"] / row.measured_step_seconds
    fa3.ENABLED = prefix_attn.USE_CUDNN = False  # FA2, the fallback, for the record
    row.plan["flash2_fwd_bwd_flops"] = attention_rate(dims, seq, ws.seq_chunk, most)  # type: ignore[index]
    row.plan["adaws_h100_mfu"] = ADAWS_H100_MFU.get(seq)  # type: ignore[index]
    row.plan["steps_timed"] = max(1, args.steps - 1)  # type: ignore[index]
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lengths", default="32768,65536,131072,262144,524288")
    p.add_argument("--host-gib", type=float, default=110.0, help="host budget of every row")
    p.add_argument("--layers", type=int, default=0, help="force this many layers (0: 32 or 16)")
    p.add_argument(
        "--document-tokens", type=int, default=0, help="packed documents of N tokens (0: none)"
    )
    p.add_argument("--seq-chunk", type=int, default=0, help="pin the piece length (0: planned)")
    p.add_argument(
        "--global-batch",
        type=int,
        default=1,
        help="sequences a step (AdaWS picks its batches for 1-2%% optimizer overhead)",
    )
    p.add_argument(
        "--profile", action="store_true", help="one more step's GPU timeline (bench/timeline.py)"
    )
    p.add_argument(
        "--kernels",
        default="auto",
        help="comma-separated: auto (FA3 where installed, else cuDNN) and/or cudnn; each "
        "row runs once per kernel, side by side in one run",
    )
    p.add_argument(
        "--window",
        default="auto",
        choices=["auto", "host", "device"],
        help=argparse.SUPPRESS,  # one row's, internal
    )
    p.add_argument(
        "--activations", default="bf16", choices=["bf16", "fp8"], help="saved sets' precision"
    )
    p.add_argument(
        "--windows", default="auto", help="comma-separated windows (auto, host, device), each "
        "row once per window, side by side in one run",
    )  # fmt: skip
    p.add_argument(
        "--write-buffers", default="auto", help="comma-separated write buffers (auto, or GiB "
        "pinned), each row once per buffer, side by side in one run",
    )  # fmt: skip
    p.add_argument(
        "--held-s", type=float, default=10.0, help="also time the floor's kernels held: this "
        "many seconds of calls after as many of warm-up, each (bench/held_floor.py; 0: off)",
    )  # fmt: skip
    p.add_argument(
        "--device-gibs", default=f"{DEVICE_GIB:g}", help="comma-separated device budgets in "
        "GiB, each row once per budget, side by side in one run (AdaWS's rows had 80)",
    )  # fmt: skip
    p.add_argument("--device-gib", type=float, default=DEVICE_GIB, help=argparse.SUPPRESS)
    p.add_argument("--write-buffer", default="auto", help=argparse.SUPPRESS)  # one row's
    p.add_argument("--kernel", default="auto", help=argparse.SUPPRESS)  # one row's, internal
    args = parse_or_run_row(p, "", run_row)
    if args is None:
        return
    common = ["--steps", str(args.steps), "--host-gib", str(args.host_gib)]
    common += ["--layers", str(args.layers), "--document-tokens", str(args.document_tokens)]
    common += ["--seq-chunk", str(args.seq_chunk), "--global-batch", str(args.global_batch)]
    common += ["--activations", args.activations, "--held-s", str(args.held_s)]
    common += ["--profile"] if args.profile else []
    children = [
        (
            [
                *("bench.long_context", "--row", s, *common, "--kernel", k, "--window", w),
                *(*buffer, "--device-gib", g),
            ],
            {"name": f"long-{s}", "seq_len": int(s), "attention_kernel": k, "window": w}
            | {"write_buffer": buffer[1], "device_budget_gib": float(g)},
        )
        for s in args.lengths.split(",")
        for k in args.kernels.split(",")
        for w in args.windows.split(",")
        for buffer in (["--write-buffer", b] for b in args.write_buffers.split(","))
        for g in args.device_gibs.split(",")
    ]
    rows = run_children(children, args.out)
    print(format_rows(rows))
    for r in rows:
        if "error" in r:
            continue
        plan = r["plan"]
        print(
            f"{r['seq_len']:>7} {r['layers']:>2}L  MFU {r['mfu']:.3f} (AdaWS "
            f"{plan.get('adaws_h100_mfu')})  attention {plan['attention_fwd_bwd_flops'] / 1e12:.0f}"
            f" TFLOP/s (FA2 {plan['flash2_fwd_bwd_flops'] / 1e12:.0f})  step "
            f"{r['measured_step_seconds']:.1f} s predicted "
            f"{r['predicted_step_seconds']:.1f} s  peak {r['peak_reserved_gib']:.1f} GiB "
            f"reserved of {r['device_budget_gib']:g}  RSS {r['peak_rss_gib']:.1f} GiB  stall "
            f"{r['stall_share']:.3f}  on demand {r.get('h2d_on_demand_gb') or 0.0:.1f} GB"
            f"  piece {plan['working_set']['seq_chunk']}  {r.get('attention_kernel')}"
            f"  floor ratio {r.get('kernel_floor_ratio') or 0.0:.3f}"
            f" (held {r.get('kernel_floor_held_ratio') or 0.0:.3f})"
        )


if __name__ == "__main__":
    main()
