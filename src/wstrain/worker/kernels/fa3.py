"""FlashAttention-3's Hopper kernels where their wheel is installed (`pip install
wstrain[fa3]` finds none on PyPI: scripts/build_fa3.sh builds it from the public
Dao-AILab/flash-attention sources on the GPU host, bench/README.md): the extension's ops,
whether they run here, and causal attention of whole sequences through them with autograd.

An optional accelerator, built only for what wstrain calls (bf16, head dim 128, sm90a):
without its wheel, off Hopper, at another dtype or head dim, models/dense.py runs SDPA and
ops/prefix_attn.py a long sequence's pieces on cuDNN, FA2 or the exact reference. A whole
sequence's causal attention is one forward and one backward launch, 704/598 TFLOP/s
fwd/bwd at 32K on an H100 against cuDNN's 600/539 (bench/RESULTS.md, Long context);
ops/fa3_attn.py calls the same ops for a piece against its prefix.

    out = fa3_causal_attention(q, k, v)   # (B, H, S, hd), (B, KV, S, hd) x2 -> (B, H, S, hd)

The tensors stay in wstrain's (B, H, S, hd) layout: FA3 takes any batch, sequence and head
strides with the head dim contiguous, so (B, S, H, hd) views of them are passed, never
copies. Grouped-query K/V go in as they are and their gradients come back per KV head.
"""

from __future__ import annotations

import functools
from types import ModuleType
from typing import Any

import torch

HEAD_DIM = 128  # the only head dim scripts/build_fa3.sh builds
ENABLED = True  # the bench switches it off to time cuDNN beside FA3 in one process


@functools.cache
def fa3_ops() -> ModuleType | None:
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
    return fa3_ops() is not None


def fa3_takes(dtype: torch.dtype, head_dim: int) -> bool:
    """Whether FA3 runs queries of `dtype` and `head_dim` here and is not switched off: bf16
    at 128 on Hopper."""
    return ENABLED and dtype == torch.bfloat16 and head_dim == HEAD_DIM and fa3_present()


def bshd(t: torch.Tensor) -> torch.Tensor:
    """(B, H, S, hd) -> a (B, S, H, hd) view, no copy (and back)."""
    return t.transpose(1, 2)


def _last_dim_contiguous(t: torch.Tensor) -> torch.Tensor:
    # FA3 reads any outer strides but a unit stride on the head dim; autograd's incoming
    # gradient may come from a transpose-reshape with another
    return t if t.stride(-1) == 1 else t.contiguous()


class _CausalAttention(torch.autograd.Function):
    """Causal attention of a whole sequence: one FA3 launch each way; saves q, k, v, the
    output and the rows' log-sum-exp (B, H, S) fp32, as SDPA's flash backend does."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        ops = fa3_ops()
        assert ops is not None, "fa3_causal_attention without FA3: ask fa3_takes first"
        q, k, v = (_last_dim_contiguous(t) for t in (q, k, v))
        # one split: the build leaves split-KV out (a whole sequence's queries fill the GPU)
        out, lse, *_ = ops.fwd(bshd(q), bshd(k), bshd(v), is_causal=True, num_splits=1)
        out = bshd(out)  # (B, H, S, hd) view of FA3's (B, S, H, hd)
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ops = fa3_ops()
        assert ops is not None
        q, k, v, out, lse = ctx.saved_tensors
        # (B, S, H, hd) and (B, S, KV, hd), contiguous: FA3 writes them in its layout
        dq, dk, dv = (bshd(t).new_empty(bshd(t).shape) for t in (q, k, v))
        ops.bwd(
            bshd(_last_dim_contiguous(dout)), bshd(q), bshd(k), bshd(v), bshd(out), lse,
            dq, dk, dv, is_causal=True,
        )  # fmt: skip
        return bshd(dq), bshd(dk), bshd(dv)


def fa3_causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal self-attention of whole sequences on FA3, differentiable: q (B, H, S, hd),
    k, v (B, KV, S, hd) bf16 on a Hopper GPU -> (B, H, S, hd). Ask fa3_takes first."""
    out: torch.Tensor = _CausalAttention.apply(q, k, v)
    return out
