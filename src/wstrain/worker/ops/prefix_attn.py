"""Attention of one query chunk against its prefix and itself, the kernel of a long sequence
processed a chunk at a time (ops/chunk_attn.py): the queries [s0, s1) of a sequence see the
keys [0, s1), causal with the mask aligned bottom-right (query i sees key j when
j <= s0 + i). Forward returns the output and each row's log-sum-exp; backward takes both
back and returns dq and the gradients of all s1 keys and values, so a long sequence's
attention costs one chunk of queries at a time and never a score matrix on the device.

    out, lse = prefix_attention(q, k[:, :, :s1], v[:, :, :s1], s0)     # (B, H, c, hd), (B, H, c)
    dq = prefix_attention_backward(dout, q, k_s1, v_s1, out, lse, s0, dk_sum, dv_sum)

Kernels. On CUDA in bf16/fp16 without documents: FlashAttention-2 through
aten::_scaled_dot_product_flash_attention, whose is_causal aligns bottom-right when the
query length differs from the key length (FA2's convention: torch's own CausalBias
LOWER_RIGHT dispatches to it the same way), with grouped-query K/V as they are (no
repeat). SDPA's public `is_causal` would align top-left here: silently wrong. Everywhere
else (CPU, fp32, documents) the exact reference of models/chunked.py: the prefix unmasked
and the diagonal block causal, merged by log-sum-exp, in fp32. The names and the rule are
scheduler/contracts/hardware.py's, which the plan records.
"""

from __future__ import annotations

import torch

from wstrain.scheduler.contracts.calibration import ATTENTION_KEY_BLOCK_TOKENS
from wstrain.scheduler.contracts.hardware import FLASH_LOWER_RIGHT as FLASH
from wstrain.scheduler.contracts.hardware import piece_attention_kernel
from wstrain.worker.models.chunked import chunk_attention_backward, chunk_attention_forward


def kernel_for(device: torch.device, dtype: torch.dtype, documents: bool) -> str:
    """The attention kernel prefix_attention uses for these inputs (the plan records it)."""
    precision = "bf16" if dtype in (torch.bfloat16, torch.float16) else "fp32"
    return piece_attention_kernel(device.type, precision, documents)


def prefix_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    s0: int,
    segments: torch.Tensor | None = None,
    lo: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out (B, H, c, E) in q's dtype, lse (B, H, c) fp32) of queries [s0, s0+c) over keys
    [0, s0+c): q (B, H, c, hd); k, v (B, KV, s0+c, hd); segments (B, s0+c) or None; keys
    before `lo` are unseen by every query (documents that start later)."""
    s1 = s0 + q.shape[2]
    assert k.shape[2] == s1 == v.shape[2], (q.shape, k.shape, v.shape, s0)
    if kernel_for(q.device, q.dtype, segments is not None) == FLASH:
        out, lse, *_ = torch.ops.aten._scaled_dot_product_flash_attention(
            q, k, v, 0.0, is_causal=True
        )
        return out, lse
    out, lse = chunk_attention_forward(q, k, v, segments, (s0, s1), lo)
    return out.to(q.dtype), lse


def key_blocks(s0: int, s1: int, block: int | None = None) -> list[tuple[int, int]]:
    """The key ranges one backward call each takes for queries [s0, s1): blocks of `block`
    (default ATTENTION_KEY_BLOCK_TOKENS) keys, the last one [a, s1) holding the diagonal
    (a <= s0 while the piece is no longer than a block), the others wholly before it."""
    block = block or ATTENTION_KEY_BLOCK_TOKENS
    last = min(s0, max(0, s1 - block))
    return [(a, min(a + block, last)) for a in range(0, last, block)] + [(last, s1)]


def prefix_attention_backward(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    s0: int,
    dk_sum: torch.Tensor,
    dv_sum: torch.Tensor,
    segments: torch.Tensor | None = None,
    lo: int = 0,
) -> torch.Tensor:
    """dq (B, H, c, hd) in fp32 from dout (B, H, c, E) and the forward's out and lse; the
    gradients of the keys and values [0, s0+c) are added into dk_sum, dv_sum (B, KV, s0+c,
    hd), fp32. Flash runs a block of keys a call (key_blocks): each call's P = exp(S - lse)
    uses the whole row's lse and D = rowsum(dout ∘ out), so its dk, dv are that block's
    exact share and the calls' dq add up; the prefix blocks need no mask, the last block's
    bottom-right causal mask is the diagonal's."""
    s1 = s0 + q.shape[2]
    if kernel_for(q.device, q.dtype, segments is not None) == FLASH:
        empty = torch.empty(0, device=q.device, dtype=torch.long)
        dq_sum = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        for a, b in key_blocks(s0, s1):
            dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_backward(
                dout, q, k[:, :, a:b], v[:, :, a:b], out, lse, empty, empty,
                q.shape[2], b - a, 0.0, b == s1, empty, empty,
            )  # fmt: skip
            dq_sum += dq
            dk_sum[:, :, a:b] += dk
            dv_sum[:, :, a:b] += dv
            del dq, dk, dv
        return dq_sum
    dq, dkc, dvc = chunk_attention_backward(dout, None, q, k, v, out, lse, segments, (s0, s1), lo)
    dk_sum[:, :, lo:s1] += dkc
    dv_sum[:, :, lo:s1] += dvc
    return dq
