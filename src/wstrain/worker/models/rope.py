"""Rotary position embedding as Hugging Face's Llama computes it: the cos/sin tables (with
Llama 3.1's frequency scaling) and their rotation of queries and keys, through one fused
kernel on CUDA (worker/kernels/fused.py). worker/models/dense.py's attention applies it;
the runtimes build the tables once a step.

    from wstrain.worker.models.rope import rope_tables, apply_rope
    pytest tests/worker/models   (against transformers; tests/worker/kernels on a GPU)
"""

from __future__ import annotations

import math

import torch

from wstrain.contracts.model_dims import ModelDims
from wstrain.worker.kernels import fused as fused_ops


def rope_tables(
    dims: ModelDims, seq_len: int, device: torch.device, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of shape (S, head_dim), computed in fp32 as Hugging Face does."""
    half = torch.arange(0, dims.head_dim, 2, dtype=torch.int64, device=device).float()
    inv_freq = 1.0 / (dims.rope_theta ** (half / dims.head_dim))  # (head_dim/2,)
    if dims.rope_llama3 is not None:
        inv_freq = _llama3_scaled(inv_freq, *dims.rope_llama3)
    pos = torch.arange(seq_len, device=device).float()
    freqs = torch.outer(pos, inv_freq)  # (S, head_dim/2)
    emb = torch.cat((freqs, freqs), dim=-1)  # (S, head_dim)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def _llama3_scaled(
    inv_freq: torch.Tensor,
    factor: float,
    low_freq_factor: float,
    high_freq_factor: float,
    original_context: int,
) -> torch.Tensor:
    """Llama 3.1's RoPE scaling: wavelengths longer than original_context / low_freq_factor
    are stretched by `factor`, shorter than original_context / high_freq_factor kept, and
    the band between blended linearly in original_context / wavelength."""
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > original_context / low_freq_factor, inv_freq / factor, inv_freq)
    blend = (original_context / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    middle = (wavelen >= original_context / high_freq_factor) & (
        wavelen <= original_context / low_freq_factor
    )
    return torch.where(middle, (1 - blend) * inv_freq / factor + blend * inv_freq, scaled)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: (B, S, H, hd), cos/sin: (S, 1, hd), or (B, S, 1, hd) per token (packed documents'
    positions); Hugging Face rotates the transposed (B, H, S, hd) view, the same values
    through strided, unvectorised kernels. On CUDA one fused kernel (worker/kernels/fused.py)
    that also takes x strided and returns it contiguous: eager, per-token tables cost five
    passes over q (1 GB at 128K tokens, Llama-3-8B dims) where the kernel makes one."""
    rows = cos.shape[:-2]  # (S,) or (B, S)
    fits = x.dim() == 4 and cos.shape[-2] == 1 and rows in (x.shape[1:2], x.shape[:2])
    if fits and fused_ops.available(x, cos, sin):
        hd = x.shape[-1]
        return fused_ops.rope_autograd(
            x, cos.reshape(-1, hd).contiguous(), sin.reshape(-1, hd).contiguous()
        )
    return x * cos + _rotate_half(x) * sin
