"""FlashAttention-3's Hopper kernels for a piece's attention, when their wheel is installed
(kernels/fa3.py: the extension, whether it runs here, whole sequences). An optional
accelerator: without it, or off Hopper, or at another head dim, ops/prefix_attn.py runs
cuDNN, then FA2, then the exact reference.

A piece's queries [s0, s1) over keys [0, s1) are one forward launch: FA3 aligns its causal
mask bottom-right when queries are fewer than keys (query i sees key j when
j <= i + s_k - s_q), the prefix and the diagonal together, no log-sum-exp merge. Its
backward takes the whole row's out and log-sum-exp, so, as the fused kernels before it, it
runs one block of keys a call (the block ending at s1 holds the diagonal) and each call's
dk, dv are that block's exact share. Grouped-query K/V go in as they are and their
gradients come back per KV head (FA3 sums the query heads of a group in fp32 itself).

The tensors stay in wstrain's (B, H, S, hd) layout, passed as (B, S, H, hd) views.
"""

from __future__ import annotations

import torch

from wstrain.worker.kernels.fa3 import bshd, fa3_ops, fa3_present, fa3_takes

__all__ = ["fa3_block_backward", "fa3_forward", "fa3_present", "fa3_takes"]


def fa3_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of the last c queries over s1 keys, causal (or every key: a block of keys
    before them): q (B, H, c, hd), k, v (B, KV, s1, hd) -> (out (B, H, c, hd) bf16, lse
    (B, H, c) fp32). One launch."""
    ops = fa3_ops()
    assert ops is not None, "fa3_forward without FA3: ask fa3_takes first"
    # one split: the build leaves split-KV out (a piece's c queries already fill the GPU)
    out, lse, *_ = ops.fwd(bshd(q), bshd(k), bshd(v), is_causal=causal, num_splits=1)
    # out (B, c, H, hd), lse (B, H, c)
    return bshd(out), lse


def fa3_block_backward(
    dout: torch.Tensor,
    q: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq (B, H, c, hd), dk, dv (B, KV, n, hd)) of queries q over one block of n keys k, v,
    with the whole row's out and lse (B, H, c) fp32; `causal` for the block that ends at
    the queries' last position (bottom-right aligned)."""
    ops = fa3_ops()
    assert ops is not None, "fa3_block_backward without FA3: ask fa3_takes first"
    dq = torch.empty_like(bshd(q), memory_format=torch.contiguous_format)  # (B, c, H, hd)
    dk = torch.empty_like(bshd(k), memory_format=torch.contiguous_format)  # (B, n, KV, hd)
    dv = torch.empty_like(bshd(v), memory_format=torch.contiguous_format)
    ops.bwd(
        bshd(dout), bshd(q), bshd(k), bshd(v), bshd(out), lse, dq, dk, dv,
        is_causal=causal,
    )  # fmt: skip
    return bshd(dq), bshd(dk), bshd(dv)
