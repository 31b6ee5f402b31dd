"""Attention kernels side by side on one GPU: cuDNN's SDPA (today's piece kernel) against
FlashAttention-3's Hopper kernels built by scripts/build_fa3.sh, forward and backward, bf16,
head dim 128, Llama-3-8B's 32 query and 8 key/value heads. Correctness first (outputs and
dq, dk, dv against fp32 SDPA at 2K tokens), then TFLOP/s at the piece lengths the long-context
plans use.

    python -m bench.attention_kernels --out bench/results/long-context/X.json

FA3 is optional: without it the rows say so and only cuDNN is timed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

Q_HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128  # Llama-3-8B


def _fa3():  # the optional accelerator: absent unless its wheel was installed
    try:
        from flash_attn_interface import flash_attn_func
    except ImportError:
        return None
    return flash_attn_func


def _cudnn(q, k, v, causal):  # (B, S, H, D) in and out, as FA3 takes them
    rep = Q_HEADS // KV_HEADS
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    kt, vt = kt.repeat_interleave(rep, 1), vt.repeat_interleave(rep, 1)
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal).transpose(1, 2)


def _reference(q, k, v, causal):  # fp32 math SDPA
    rep = Q_HEADS // KV_HEADS
    qt, kt, vt = (x.float().transpose(1, 2) for x in (q, k, v))
    kt, vt = kt.repeat_interleave(rep, 1), vt.repeat_interleave(rep, 1)
    with sdpa_kernel(SDPBackend.MATH):
        return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal).transpose(1, 2)


def _inputs(seq_len: int, seed: int = 0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    shape_q, shape_kv = (1, seq_len, Q_HEADS, HEAD_DIM), (1, seq_len, KV_HEADS, HEAD_DIM)
    mk = lambda s: torch.randn(s, device="cuda", dtype=torch.bfloat16, generator=g)
    return [x.requires_grad_() for x in (mk(shape_q), mk(shape_kv), mk(shape_kv))]


def _grads(fn, q, k, v, causal, dout):
    q.grad = k.grad = v.grad = None
    out = fn(q, k, v, causal)
    out.backward(dout)
    return out.detach().float(), q.grad.float(), k.grad.float(), v.grad.float()


def check(fn, causal: bool, seq_len: int = 2048) -> dict[str, float]:
    """Max abs error of out, dq, dk, dv against fp32 SDPA, and the bf16-cuDNN error beside it."""
    q, k, v = _inputs(seq_len)
    dout = torch.randn_like(q)
    ref = _grads(_reference, q, k, v, causal, dout)
    got = _grads(fn, q, k, v, causal, dout)
    return {n: (g - r).abs().max().item() for n, g, r in zip(("out", "dq", "dk", "dv"), got, ref)}


def time_fwd_bwd(fn, causal: bool, seq_len: int, repeats: int) -> dict[str, float]:
    q, k, v = _inputs(seq_len)
    dout = torch.randn_like(q)
    for _ in range(2):
        fn(q, k, v, causal).backward(dout)
    torch.cuda.synchronize()
    start, mid, end = (torch.cuda.Event(enable_timing=True) for _ in range(3))
    fwd_ms = bwd_ms = 0.0
    for _ in range(repeats):
        start.record()
        out = fn(q, k, v, causal)
        mid.record()
        out.backward(dout)
        end.record()
        torch.cuda.synchronize()
        fwd_ms += start.elapsed_time(mid)
        bwd_ms += mid.elapsed_time(end)
    # 4·S²·H·D multiply-adds x2 forward (QKᵀ and PV); backward 2.5x that; causal halves both
    fwd_flop = 4 * seq_len**2 * Q_HEADS * HEAD_DIM * (0.5 if causal else 1.0)
    fwd_s, bwd_s = fwd_ms / repeats / 1e3, bwd_ms / repeats / 1e3
    return {
        "fwd_s": fwd_s,
        "bwd_s": bwd_s,
        "fwd_tflops": fwd_flop / fwd_s / 1e12,
        "bwd_tflops": 2.5 * fwd_flop / bwd_s / 1e12,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seq-lens", type=int, nargs="+", default=[8192, 32768])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", help="write the rows as JSON here")
    args = p.parse_args()
    fa3 = _fa3()
    kernels = {"cudnn": _cudnn}
    if fa3 is not None:
        kernels["fa3"] = lambda q, k, v, causal: fa3(q, k, v, causal=causal)
    rows = []
    for name, fn in kernels.items():
        for causal in (True, False):
            row = {"kernel": name, "causal": causal, "device": torch.cuda.get_device_name()}
            row["max_abs_err_2k"] = check(fn, causal)
            for seq_len in args.seq_lens:
                row[f"s{seq_len}"] = time_fwd_bwd(fn, causal, seq_len, args.repeats)
            rows.append(row)
            print(json.dumps(row), flush=True)
    if fa3 is None:
        print("flash_attn_interface not installed: FA3 not timed", file=sys.stderr)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"when": time.strftime("%Y-%m-%d"), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
