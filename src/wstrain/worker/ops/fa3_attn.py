"""FlashAttention-3's Hopper kernels for a piece's attention, when their wheel is installed
(`pip install wstrain[fa3]` finds none on PyPI: scripts/build_fa3.sh builds it from the
public Dao-AILab/flash-attention sources on the GPU host, bench/README.md). An optional
accelerator: without it, or off Hopper, or at another head dim, ops/prefix_attn.py runs
cuDNN, then FA2, then the exact reference.

A piece's queries [s0, s1) over keys [0, s1) are one forward launch: FA3 aligns its causal
mask bottom-right when queries are fewer than keys (query i sees key j when
j <= i + s_k - s_q), the prefix and the diagonal together, no log-sum-exp merge. Its
backward takes the whole row's out and log-sum-exp, so, as the fused kernels before it, it
runs one block of keys a call (the block ending at s1 holds the diagonal) and each call's
dk, dv are that block's exact share. Grouped-query K/V go in as they are and their
gradients come back per KV head (FA3 sums the query heads of a group in fp32 itself).

The tensors stay in wstrain's (B, H, S, hd) layout: FA3 takes any batch, sequence and head
strides with the head dim contiguous, so (B, S, H, hd) views of them are passed, never
copies. Built only for what wstrain calls (bf16, head dim 128, sm90a): 704/598 TFLOP/s
fwd/bwd causal at 32K on an H100 against cuDNN's 600/539 (bench/RESULTS.md, Long context).
"""

from __future__ import annotations

import functools
from types import ModuleType

import torch

HEAD_DIM = 128  # the only head dim scripts/build_fa3.sh builds


@functools.cache
def _ops() -> ModuleType | None:
    """The FA3 extension's ops, or None where its wheel is not installed or this is not a
    Hopper GPU (its kernels are sm90a only)."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        return None
    try:
        import flash_attn_interface  # noqa: F401 - registers torch.ops.flash_attn_3
    except ImportError:
        return None
    return torch.ops.flash_attn_3


def fa3_present() -> bool:
    """Whether FA3's kernels can run here (asked once a process)."""
    return _ops() is not None


def fa3_takes(dtype: torch.dtype, head_dim: int) -> bool:
    """Whether FA3 runs queries of `dtype` and `head_dim` here: bf16 at 128 on Hopper."""
    return dtype == torch.bfloat16 and head_dim == HEAD_DIM and fa3_present()


def _bshd(t: torch.Tensor) -> torch.Tensor:
    return t.transpose(1, 2)  # (B, H, S, hd) -> a (B, S, H, hd) view, no copy


def fa3_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal attention of the last c queries over s1 keys: q (B, H, c, hd), k, v
    (B, KV, s1, hd) -> (out (B, H, c, hd) bf16, lse (B, H, c) fp32). One launch."""
    ops = _ops()
    assert ops is not None, "fa3_forward without FA3: ask fa3_takes first"
    # one split: the build leaves split-KV out (a piece's c queries already fill the GPU)
    out, lse, *_ = ops.fwd(_bshd(q), _bshd(k), _bshd(v), is_causal=True, num_splits=1)
    # out (B, c, H, hd), lse (B, H, c)
    return _bshd(out), lse


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
    ops = _ops()
    assert ops is not None, "fa3_block_backward without FA3: ask fa3_takes first"
    dq = torch.empty_like(_bshd(q), memory_format=torch.contiguous_format)  # (B, c, H, hd)
    dk = torch.empty_like(_bshd(k), memory_format=torch.contiguous_format)  # (B, n, KV, hd)
    dv = torch.empty_like(_bshd(v), memory_format=torch.contiguous_format)
    ops.bwd(
        _bshd(dout), _bshd(q), _bshd(k), _bshd(v), _bshd(out), lse, dq, dk, dv,
        is_causal=causal,
    )  # fmt: skip
    return _bshd(dq), _bshd(dk), _bshd(dv)
