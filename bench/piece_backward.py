"""One layer's attention backward over a long sequence in pieces, as the runtime calls it
(ops/prefix_attn.py's prefix_attention_backward, a block of keys a call, the dq, dk, dv
gradients added into fp32 sums), with the sums added by kernels/fused.py's add_into and by
eager PyTorch, side by side on one GPU; each kernel present (FA3 where its wheel is
installed, then cuDNN). Llama-3-8B's 32 query and 8 key/value heads, head dim 128, bf16.

    python -m bench.piece_backward --seq-len 131072 --piece 8192 --out X.json

A row: the kernel, `backward_s` (every piece's backward, one layer, mean of `--repeats`)
with the fused sums and with eager ones, and their ratio; the sums alone at the same shapes
(`sums_s`, both ways), which is what the fused add changes.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable

import torch

from wstrain.worker.kernels import fa3 as fa3_switch
from wstrain.worker.kernels import fused
from wstrain.worker.ops.prefix_attn import kernel_for, prefix_attention, prefix_attention_backward

Q_HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128  # Llama-3-8B


def _timed(fn: Callable[[], None], repeats: int) -> float:
    """Mean seconds of fn on the GPU after one warm-up call."""
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / repeats / 1e3


def one_layer(seq_len: int, piece: int, repeats: int) -> dict[str, float]:
    """Every piece's backward of one layer, fused sums then eager sums."""
    g = torch.Generator(device="cuda").manual_seed(0)
    mk = lambda *s: torch.randn(*s, device="cuda", dtype=torch.bfloat16, generator=g)
    k, v = mk(1, KV_HEADS, seq_len, HEAD_DIM), mk(1, KV_HEADS, seq_len, HEAD_DIM)
    dk_sum = torch.zeros(k.shape, dtype=torch.float32, device="cuda")  # (B, KV, S, hd)
    dv_sum = torch.zeros_like(dk_sum)
    pieces = []
    for s0 in range(0, seq_len, piece):
        q = mk(1, Q_HEADS, piece, HEAD_DIM)  # (B, H, c, hd)
        out, lse = prefix_attention(q, k[:, :, : s0 + piece], v[:, :, : s0 + piece], s0)
        pieces.append((s0, q, out, lse, mk(*q.shape)))

    def backward() -> None:
        for s0, q, out, lse, dout in pieces:
            n = s0 + piece
            prefix_attention_backward(
                dout, q, k[:, :, :n], v[:, :, :n], out, lse, s0, dk_sum[:, :, :n], dv_sum[:, :, :n]
            )

    # the sums alone, at the shapes the backward adds: FA3's (B, n, KV, hd) gradients seen
    # as (B, KV, n, hd) into the window's slice, and dq (B, c, H, hd) into fp32
    grads = [
        (mk(1, s0 + piece, KV_HEADS, HEAD_DIM).transpose(1, 2), mk(1, piece, Q_HEADS, HEAD_DIM))
        for s0, *_ in pieces
    ]
    dq_sum = torch.zeros(1, Q_HEADS, piece, HEAD_DIM, dtype=torch.float32, device="cuda")

    def sums() -> None:
        for dkv, dq in grads:
            n = dkv.shape[2]
            fused.add_into(dk_sum[:, :, :n], dkv)
            fused.add_into(dv_sum[:, :, :n], dkv)
            fused.add_into(dq_sum, dq.transpose(1, 2))

    row: dict[str, float] = {}
    for name, enabled in (("fused", True), ("eager", False)):
        fused.ENABLED = enabled
        row[f"backward_s_{name}"] = _timed(backward, repeats)
        row[f"sums_s_{name}"] = _timed(sums, repeats)
    fused.ENABLED = True
    row["backward_eager_over_fused"] = row["backward_s_eager"] / row["backward_s_fused"]
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seq-len", type=int, default=131072)
    p.add_argument("--piece", type=int, default=8192)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", help="write the rows as JSON here")
    args = p.parse_args()
    rows = []
    for fa3_on in (True, False):
        fa3_switch.ENABLED = fa3_on
        kernel = kernel_for(torch.device("cuda"), torch.bfloat16, False, HEAD_DIM)
        if any(r["attention_kernel"] == kernel for r in rows):
            continue  # FA3 absent: cuDNN once
        row = {
            "attention_kernel": kernel,
            "seq_len": args.seq_len,
            "piece": args.piece,
            "device": torch.cuda.get_device_name(),
            **one_layer(args.seq_len, args.piece, args.repeats),
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    fa3_switch.ENABLED = True
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"when": time.strftime("%Y-%m-%d"), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
