"""A query chunk's attention against its prefix (worker/ops/prefix_attn.py) against SDPA
over the whole sequence: the chunk's rows of the output, and its share of every gradient,
on the reference kernel (CPU, fp32) and, on CUDA, every fused kernel: FlashAttention-3
(where its wheel runs: a Hopper GPU), cuDNN (prefix and diagonal merged) and FlashAttention-2
through aten, the last and FA3 with their bottom-right causal mask; the backward split into
key blocks.

    pytest tests/worker/ops/test_prefix_attn.py
"""

from __future__ import annotations

import itertools

import pytest
import torch

from tests.worker.ops.kernels import FUSED, use_kernel
from tests.worker.relative_error import rel_err
from wstrain.worker.models.dense import causal_attention
from wstrain.worker.ops import prefix_attn
from wstrain.worker.ops.prefix_attn import (
    key_blocks,
    prefix_attention,
    prefix_attention_backward,
)


def test_key_blocks_cover_the_prefix_once_with_the_diagonal_last() -> None:
    assert key_blocks(0, 8, 16) == [(0, 8)]
    assert key_blocks(40, 48, 16) == [(0, 16), (16, 32), (32, 48)]
    assert key_blocks(36, 44, 16) == [(0, 16), (16, 28), (28, 44)]
    assert key_blocks(36, 44, 16, diagonal_apart=True) == [(0, 16), (16, 32), (32, 36), (36, 44)]
    for s0, s1 in [(0, 5), (7, 12), (100, 164), (64, 65)]:
        blocks = key_blocks(s0, s1, 16)
        assert blocks[0][0] == 0 and blocks[-1][1] == s1 and blocks[-1][0] <= s0
        apart = key_blocks(s0, s1, 16, diagonal_apart=True)
        assert apart[-1] == (s0, s1) and all(b - a <= 16 for a, b in apart[:-1])
        assert all(a < b == c for (a, b), (c, _) in itertools.pairwise(blocks))


def _case(device: str, dtype: torch.dtype, s: int, h: int, kv: int, hd: int):  # type: ignore[no-untyped-def]
    g = torch.Generator(device="cpu").manual_seed(0)
    q, k, v = (
        torch.randn(1, n, s, hd, generator=g).to(device, dtype).requires_grad_()
        for n in (h, kv, kv)
    )
    do = torch.randn(1, h, s, hd, generator=g).to(device, dtype)
    return q, k, v, do


def _pieces(q, k, v, do, chunk, spans=None):  # type: ignore[no-untyped-def]
    """The whole sequence a chunk at a time (or in `spans`, [s0, s1) covering it in order):
    (out, dq, dk, dv), backward chunks reversed."""
    s = q.shape[2]
    spans = spans or [(s0, min(s0 + chunk, s)) for s0 in range(0, s, chunk)]
    outs, lses = [], []
    with torch.no_grad():
        for s0, s1 in spans:
            o, lse = prefix_attention(q[:, :, s0:s1], k[:, :, :s1], v[:, :, :s1], s0)
            outs.append(o)
            lses.append(lse)
        dk = torch.zeros(k.shape, dtype=torch.float32, device=k.device)
        dv = torch.zeros_like(dk)
        dq = torch.empty(q.shape, dtype=torch.float32, device=q.device)
        for (s0, s1), o, lse in reversed(list(zip(spans, outs, lses))):
            dq[:, :, s0:s1] = prefix_attention_backward(
                do[:, :, s0:s1], q[:, :, s0:s1], k[:, :, :s1], v[:, :, :s1], o, lse, s0,
                dk[:, :, :s1], dv[:, :, :s1],
            )  # fmt: skip
    return torch.cat(outs, 2), dq, dk, dv


def _reference(q, k, v, do):  # type: ignore[no-untyped-def]
    q, k, v = (t.detach().float().requires_grad_() for t in (q, k, v))
    out = causal_attention(q, k, v)
    return (out.detach(), *torch.autograd.grad(out, (q, k, v), do.float()))


@pytest.mark.parametrize("chunk", [16, 24, 64], ids=lambda c: f"chunk{c}")
def test_reference_kernel_pieces_equal_sdpa(chunk: int) -> None:
    q, k, v, do = _case("cpu", torch.float32, 64, 8, 2, 16)
    for name, a, b in zip(
        ("out", "dq", "dk", "dv"), _pieces(q, k, v, do, chunk), _reference(q, k, v, do)
    ):
        assert rel_err(a, b) < 1e-5, name


@pytest.mark.parametrize("kernel", FUSED)
@pytest.mark.parametrize("block", [0, 1024], ids=["one-block", "blocks1024"])
def test_fused_pieces_equal_sdpa_on_cuda(
    kernel: str, block: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """bf16, Llama-3's GQA 32:8 with head_dim 128, 4096 tokens in pieces of 768 (not a
    divisor), on each fused kernel; the backward in one call per piece, then in blocks of
    1024 keys."""
    use_kernel(kernel, monkeypatch)
    if block:
        monkeypatch.setattr(prefix_attn, "ATTENTION_KEY_BLOCK_TOKENS", block)
    q, k, v, do = _case("cuda", torch.bfloat16, 4096, 32, 8, 128)
    assert prefix_attn.kernel_for(q.device, q.dtype, False, 128) == kernel
    got = _pieces(q, k, v, do, 768)
    ref = _reference(q, k, v, do)
    whole = _reference(q.float(), k.float(), v.float(), do)  # the fp32 truth twice: sanity
    for name, a, b, c in zip(("out", "dq", "dk", "dv"), got, ref, whole):
        assert rel_err(a.float(), b) < 1e-2, name  # bf16 inputs against fp32 math
        assert rel_err(b, c) < 1e-6, name


@pytest.mark.parametrize("kernel", FUSED)
def test_fused_kernels_take_one_token_pieces_and_key_blocks_on_cuda(
    kernel: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The degenerate calls a packed document makes: one query over one key (a piece of one
    token at the start), one query over a prefix, and several queries whose last key block
    before the diagonal holds a single key (blocks of 1024, a piece starting at 1025)."""
    use_kernel(kernel, monkeypatch)
    monkeypatch.setattr(prefix_attn, "ATTENTION_KEY_BLOCK_TOKENS", 1024)
    q, k, v, do = _case("cuda", torch.bfloat16, 2100, 32, 8, 128)
    spans = [(0, 1), (1, 2), (2, 3), (3, 1025), (1025, 1030), (1030, 1031), (1031, 2100)]
    got = _pieces(q, k, v, do, 0, spans)
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, _reference(q, k, v, do)):
        assert rel_err(a.float(), b) < 1e-2, name  # bf16 inputs against fp32 math
