"""A piece's attention over packed documents (worker/ops/document_attn.py) against SDPA under
the dense document mask over the whole sequence: each piece's rows of the output and its
share of every gradient, pieces that do and do not divide the sequence, GQA, documents that
cross pieces; on the reference kernel (CPU, fp32) and, on CUDA, the fused kernels per
document.

    pytest tests/worker/ops/test_document_attn.py
"""

from __future__ import annotations

import pytest
import torch

from tests.worker.ops.kernels import FUSED, use_kernel
from tests.worker.relative_error import rel_err
from wstrain.worker.models.dense import causal_attention, document_mask
from wstrain.worker.ops.document_attn import (
    document_attention,
    document_attention_backward,
    document_runs,
)

# two sequences of 64 tokens: short documents, one across several pieces, one token alone
LENGTHS = [[5, 30, 1, 20, 8], [64]]


def _segments(lengths: list[list[int]]) -> torch.Tensor:
    return torch.stack(
        [torch.cat([torch.full((n,), d) for d, n in enumerate(row)]) for row in lengths]
    )  # (B, S)


def test_runs_are_each_sequences_documents_and_a_returning_id_is_refused() -> None:
    seg = _segments([[3, 1, 4], [8]])
    assert document_runs(seg) == (((0, 3), (3, 4), (4, 8)), ((0, 8),))
    assert document_runs(torch.tensor([[7, 7, 2, 9]])) == (((0, 2), (2, 3), (3, 4)),)
    with pytest.raises(ValueError, match=r"sequence 0 .* one\s+contiguous run"):
        document_runs(torch.tensor([[0, 0, 1, 0]]))


def _case(device: str, dtype: torch.dtype, s: int, h: int, kv: int, hd: int, b: int = 2):  # type: ignore[no-untyped-def]
    g = torch.Generator(device="cpu").manual_seed(0)
    q, k, v = (torch.randn(b, n, s, hd, generator=g).to(device, dtype) for n in (h, kv, kv))
    do = torch.randn(b, h, s, hd, generator=g).to(device, dtype)
    return q, k, v, do


def _pieces(q, k, v, do, runs, chunk):  # type: ignore[no-untyped-def]
    """The sequences a piece at a time: (out, dq, dk, dv), backward pieces reversed."""
    s = q.shape[2]
    spans = [(s0, min(s0 + chunk, s)) for s0 in range(0, s, chunk)]
    parts = []
    for s0, s1 in spans:
        parts.append(document_attention(q[:, :, s0:s1], k[:, :, :s1], v[:, :, :s1], s0, runs))
    dk = torch.zeros(k.shape, dtype=torch.float32, device=k.device)
    dv = torch.zeros_like(dk)
    dq = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    for (s0, s1), (o, lse) in reversed(list(zip(spans, parts))):
        dq[:, :, s0:s1] = document_attention_backward(
            do[:, :, s0:s1], q[:, :, s0:s1], k[:, :, :s1], v[:, :, :s1], o, lse, s0,
            dk[:, :, :s1], dv[:, :, :s1], runs,
        )  # fmt: skip
    return torch.cat([o for o, _ in parts], 2), dq, dk, dv


def _reference(q, k, v, do, segments):  # type: ignore[no-untyped-def]
    q, k, v = (t.detach().float().requires_grad_() for t in (q, k, v))
    out = causal_attention(q, k, v, document_mask(segments.to(q.device)))
    return (out.detach(), *torch.autograd.grad(out, (q, k, v), do.float()))


@pytest.mark.parametrize("chunk", [16, 24, 64], ids=lambda c: f"piece{c}")
def test_reference_kernel_documents_equal_the_dense_mask(chunk: int) -> None:
    q, k, v, do = _case("cpu", torch.float32, 64, 8, 2, 16)
    seg = _segments(LENGTHS)
    got = _pieces(q, k, v, do, document_runs(seg), chunk)
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, _reference(q, k, v, do, seg)):
        assert rel_err(a, b) < 1e-5, name
    # without the runs the documents see each other: the test tells them apart
    plain = _pieces(q, k, v, do, (((0, 64),), ((0, 64),)), chunk)
    assert rel_err(plain[0], got[0]) > 1e-2


@pytest.mark.parametrize("kernel", FUSED)
def test_fused_kernels_per_document_equal_the_dense_mask_on_cuda(
    kernel: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """bf16, GQA 32:8, head_dim 128, 4096 tokens in pieces of 768 (not a divisor), documents
    of 100 to 1500 tokens: each fused kernel's call per (sequence, document) within bf16
    rounding of fp32 SDPA under the dense mask."""
    use_kernel(kernel, monkeypatch)
    lengths = [[100, 1500, 700, 1, 1295, 500], [4096]]
    q, k, v, do = _case("cuda", torch.bfloat16, 4096, 32, 8, 128)
    seg = _segments(lengths)
    got = _pieces(q, k, v, do, document_runs(seg), 768)
    ref = _reference(q, k, v, do, seg)
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, ref):
        assert rel_err(a.float(), b) < 1e-2, name  # bf16 inputs against fp32 math
