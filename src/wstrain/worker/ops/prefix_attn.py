"""Attention of one query chunk against its prefix and itself, the kernel of a long sequence
processed a chunk at a time (ops/chunk_attn.py): the queries [s0, s1) of a sequence see the
keys [0, s1), causal with the mask aligned bottom-right (query i sees key j when
j <= s0 + i). Forward returns the output and each row's log-sum-exp; backward takes both
back and returns dq and the gradients of all s1 keys and values, so a long sequence's
attention costs one chunk of queries at a time and never a score matrix on the device.

    out, lse = prefix_attention(q, k[:, :, :s1], v[:, :, :s1], s0)     # (B, H, c, hd), (B, H, c)
    dq = prefix_attention_backward(dout, q, k_s1, v_s1, out, lse, s0, dk_sum, dv_sum)
    # the earlier keys a block at a time (a window on the host, ops/host_window.py)
    out, lse = streamed_prefix_attention(q, k_own, v_own, prefix_blocks)
    dq = blocks_backward(dout, q, out, lse, s0, blocks)   # blocks(ranges) -> KeyBlock's

Kernels (names and rule: contracts/hardware.py, which the plan records). On a Hopper GPU
with FlashAttention-3's wheel installed, in bf16 at head dim 128: FA3, the prefix and the
diagonal in one launch (ops/fa3_attn.py): 704/598 TFLOP/s fwd/bwd on an H100 at 32K.
Otherwise on CUDA in bf16/fp16: cuDNN's fused attention twice, the prefix [0, s0) with no
mask and the diagonal block [s0, s1) with its causal mask (square, so cuDNN's top-left
alignment is right), merged by log-sum-exp: 575/561 TFLOP/s fwd/bwd on an H100 at 32K;
without cuDNN, FlashAttention-2 through aten's flash op in one call, whose is_causal aligns
bottom-right when queries are fewer than keys (torch's own CausalBias LOWER_RIGHT
dispatches to it the same way): 357/313. SDPA's public `is_causal` would align top-left
here: silently wrong. Grouped-query K/V go to both as they are. Elsewhere (CPU, fp32) the
exact reference of models/chunked.py, the same two parts merged in fp32. Packed documents
run each document's part through these (ops/document_attn.py).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator

import torch

from wstrain.contracts.calibration import ATTENTION_KEY_BLOCK_TOKENS
from wstrain.contracts.hardware import CUDNN_PREFIX_DIAGONAL as CUDNN
from wstrain.contracts.hardware import FA3_HOPPER as FA3
from wstrain.contracts.hardware import FLASH_LOWER_RIGHT as FLASH
from wstrain.contracts.hardware import piece_attention_kernel
from wstrain.worker.kernels.fused import add_into
from wstrain.worker.models.chunked import (
    block_attention_backward,
    block_attention_forward,
    chunk_attention_forward,
    merge_partials,
)
from wstrain.worker.ops.fa3_attn import fa3_block_backward, fa3_forward, fa3_takes

ATEN = torch.ops.aten
USE_CUDNN = True  # tests and the bench switch it off to run flash


@functools.cache
def _cudnn_present() -> bool:
    """cuDNN's fused attention: cuDNN 9 and an sm80+ GPU, as torch's own SDPA requires
    (asked once a process: every piece of every layer asks which kernel runs)."""
    if not (torch.cuda.is_available() and torch.backends.cudnn.is_available()):
        return False
    version = torch.backends.cudnn.version() or 0
    return version >= 90000 and torch.cuda.get_device_capability() >= (8, 0)


def _cudnn_attention() -> bool:
    return USE_CUDNN and _cudnn_present()


def kernel_for(device: torch.device, dtype: torch.dtype, documents: bool, head_dim: int) -> str:
    """The attention kernel prefix_attention uses for these inputs (the plan records it)."""
    precision = "bf16" if dtype in (torch.bfloat16, torch.float16) else "fp32"
    cudnn = device.type == "cuda" and _cudnn_attention()
    fa3 = device.type == "cuda" and fa3_takes(dtype, head_dim)
    return piece_attention_kernel(device.type, precision, documents, cudnn, fa3)


def _call_kernel(q: torch.Tensor) -> str:
    """The kernel of one call over the queries q (B, H, c, hd): kernel_for's, except that a
    single query goes to FA2 where cuDNN was chosen. Its diagonal is one query over one key,
    which cuDNN refuses ("s_q = s_kv = 1 is not supported", cuDNN 9 under torch 2.11 on an
    H100): a one-token document, or a document's first token at a piece's last position."""
    kernel = kernel_for(q.device, q.dtype, False, q.shape[-1])
    return FLASH if kernel == CUDNN and q.shape[2] == 1 else kernel


def _cudnn_part(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """cuDNN attention of q over k, v (causal: square, so its top-left mask is the
    diagonal's): (out (B, H, c, E), lse (B, H, c) fp32)."""
    out, lse, *_ = ATEN._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0, causal, False)
    return out, lse.squeeze(-1)  # cuDNN's stats are (B, H, c, 1)


def prefix_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    s0: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out (B, H, c, E) in q's dtype, lse (B, H, c) fp32) of queries [s0, s0+c) over keys
    [0, s0+c): q (B, H, c, hd); k, v (B, KV, s0+c, hd) (documents: ops/document_attn.py)."""
    s1 = s0 + q.shape[2]
    assert k.shape[2] == s1 == v.shape[2], (q.shape, k.shape, v.shape, s0)
    kernel = _call_kernel(q)
    if kernel == FA3:
        return fa3_forward(q, k, v)
    if kernel == CUDNN:  # the diagonal, then the prefix as one block, merged
        prefix = [(k[:, :, :s0], v[:, :, :s0])] if s0 else []
        return streamed_prefix_attention(q, k[:, :, s0:], v[:, :, s0:], prefix)
    if kernel == FLASH:
        out, lse, *_ = ATEN._scaled_dot_product_flash_attention(q, k, v, 0.0, is_causal=True)
        return out, lse
    out, lse = chunk_attention_forward(q, k, v, None, (s0, s1))
    return out.to(q.dtype), lse


def part_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out (B, H, c, E), lse (B, H, c) fp32) of queries q over one block of keys k, v
    (B, KV, n, hd): every key, or `causal` for the block of the queries' own keys (n == c)."""
    kernel = _call_kernel(q)
    if kernel == FA3:
        return fa3_forward(q, k, v, causal)
    if kernel == CUDNN:
        return _cudnn_part(q, k, v, causal)
    if kernel == FLASH:
        out, lse, *_ = ATEN._scaled_dot_product_flash_attention(q, k, v, 0.0, is_causal=causal)
        return out, lse
    return block_attention_forward(q, k, v, causal)


def streamed_prefix_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    prefix: Iterable[tuple[torch.Tensor, torch.Tensor]],
) -> tuple[torch.Tensor, torch.Tensor]:
    """prefix_attention's (out, lse) where the keys before the queries come a block at a
    time (a window kept on the host, ops/host_window.py): k, v (B, KV, c, hd) the queries'
    own keys; `prefix` yields the earlier keys' blocks (k, v (B, KV, n, hd)), each
    attended to whole and merged in fp32 by log-sum-exp."""
    out, lse = part_attention(q, k, v, True)
    merged: torch.Tensor | None = None  # fp32 once a block is merged in
    for kb, vb in prefix:
        o, m = part_attention(q, kb, vb, False)
        merged, lse = merge_partials(o.float(), m, out.float() if merged is None else merged, lse)
        del o, m
    return (out, lse) if merged is None else (merged.to(q.dtype), lse)


def key_blocks(
    s0: int, s1: int, block: int | None = None, diagonal_apart: bool = False
) -> list[tuple[int, int]]:
    """The key ranges one backward call each takes for queries [s0, s1): blocks of `block`
    (default ATTENTION_KEY_BLOCK_TOKENS) keys, the last one [a, s1) holding the diagonal
    (a <= s0 while the piece is no longer than a block; a == s0 with `diagonal_apart`, for
    a kernel whose causal mask is top-left), the others wholly before it."""
    block = block or ATTENTION_KEY_BLOCK_TOKENS
    last = s0 if diagonal_apart else min(s0, max(0, s1 - block))
    return [(a, min(a + block, last)) for a in range(0, last, block)] + [(last, s1)]


def _per_kv_head(d: torch.Tensor, kv: int) -> torch.Tensor:
    """A K or V gradient (B, heads, L, hd) summed to the kv heads when a kernel returned it
    expanded to every query head."""
    b, h, n, e = d.shape
    return d if h == kv else d.view(b, kv, h // kv, n, e).sum(2)


def _fused_backward(
    kernel: str, dout: torch.Tensor, q: torch.Tensor, out: torch.Tensor, lse: torch.Tensor
) -> Callable[[torch.Tensor, torch.Tensor, bool], tuple[torch.Tensor, ...]]:
    """The fused backward over one block of keys, (k, v, causal) -> (dq, dk, dv), with the
    whole row's out and lse; what every block's call shares is made once."""
    c = q.shape[2]
    if kernel not in (FA3, CUDNN, FLASH):  # the exact reference, a block at a time too
        return lambda k, v, causal: block_attention_backward(dout, q, k, v, out, lse, causal)
    if kernel == FA3:
        return lambda k, v, causal: fa3_block_backward(dout, q, out, lse, k, v, causal)
    if kernel == CUDNN:
        # no dropout: the RNG seed and offset go unread; no bias, no varlen lengths
        rng = torch.zeros((), device=q.device, dtype=torch.long)
        stats = lse.unsqueeze(-1).contiguous()  # (B, H, c, 1), cuDNN's layout
        return lambda k, v, causal: ATEN._scaled_dot_product_cudnn_attention_backward(
            dout, q, k, v, out, stats, rng, rng, None, None, None, c, k.shape[2], 0.0, causal
        )
    # flash: dense inputs have no cumulative lengths (None, as its forward returns them);
    # the RNG state (seed and offset, uint64, as the forward's) goes unread without dropout
    seed = torch.zeros(2, device=q.device, dtype=torch.uint64)
    offset = torch.zeros((), device=q.device, dtype=torch.uint64)
    return lambda k, v, causal: ATEN._scaled_dot_product_flash_attention_backward(
        dout, q, k, v, out, lse, None, None, c, k.shape[2], 0.0, causal, seed, offset
    )


# a block of keys [a, b) as the backward takes it: k, v (B, KV, b-a, hd) and the fp32 sums
# dk, dv (B, KV, b-a, hd) its gradient is added into
KeyBlock = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


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
) -> torch.Tensor:
    """dq (B, H, c, hd) in fp32 from dout (B, H, c, E) and the forward's out and lse; the
    gradients of the keys and values [0, s0+c) (k, v (B, KV, s0+c, hd)) are added into
    dk_sum, dv_sum (B, KV, s0+c, hd), fp32 (blocks_backward over their slices)."""

    def slices(ranges: list[tuple[int, int]]) -> Iterator[KeyBlock]:
        for a, b in ranges:
            yield k[:, :, a:b], v[:, :, a:b], dk_sum[:, :, a:b], dv_sum[:, :, a:b]

    return blocks_backward(dout, q, out, lse, s0, slices)


def blocks_backward(
    dout: torch.Tensor,
    q: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    s0: int,
    blocks: Callable[[list[tuple[int, int]]], Iterator[KeyBlock]],
) -> torch.Tensor:
    """dq (B, H, c, hd) in fp32 of the queries [s0, s0+c); `blocks(ranges)` yields each
    key range's KeyBlock in order (a window on the device slices it, one on the host
    stages it), whose dk, dv sums get the range's gradients. One fused call a block of
    keys (key_blocks): each call's P = exp(S - lse) uses the whole row's lse and
    D = rowsum(dout ∘ out), so its dk, dv are that block's exact share and the calls' dq add
    up; the prefix blocks need no mask, the last block's causal mask is the diagonal's."""
    kernel = _call_kernel(q)
    dq_sum = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    block_backward = _fused_backward(kernel, dout, q, out, lse)
    ranges = key_blocks(s0, s0 + q.shape[2], diagonal_apart=kernel == CUDNN)
    # the generator runs to its end (a staged block goes home after its call is queued)
    for i, (k, v, dk_sum, dv_sum) in enumerate(blocks(ranges)):
        dq, dk, dv = block_backward(k, v, i == len(ranges) - 1)
        add_into(dq_sum, dq)
        add_into(dk_sum, _per_kv_head(dk, k.shape[1]))
        add_into(dv_sum, _per_kv_head(dv, k.shape[1]))
        del dq, dk, dv
    return dq_sum
