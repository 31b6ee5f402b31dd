"""worker/kernels/fa3.py's whole-sequence causal attention on FlashAttention-3 against fp32
SDPA, on a Hopper GPU with FA3's wheel (skipped elsewhere, as on CI): outputs and dq, dk,
dv of Llama-3's GQA 32:8 at head dim 128 within bf16 rounding, and no worse than SDPA's own
bf16 kernels; models/dense.py's causal_attention takes it there and SDPA when it is
switched off, with masks, and in fp32.

    pytest -m gpu tests/worker/kernels/test_fa3.py
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.worker.relative_error import rel_err
from wstrain.worker.kernels import fa3
from wstrain.worker.kernels.fa3 import fa3_causal_attention, fa3_present, fa3_takes
from wstrain.worker.models.dense import causal_attention

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not (torch.cuda.is_available() and fa3_present()),
        reason="needs FA3's wheel on a Hopper GPU",
    ),
]


def _inputs(b: int, s: int, strided: bool):  # type: ignore[no-untyped-def]
    """q (B, 32, S, 128), k, v (B, 8, S, 128) bf16 leaves and dout; `strided`: each a
    (B, S, H, hd) tensor seen through a transpose, as models/dense.py's projections give."""
    g = torch.Generator(device="cpu").manual_seed(0)

    def one(h: int) -> torch.Tensor:
        t = torch.randn(b, s, h, 128, generator=g).to("cuda", torch.bfloat16)
        t = t.transpose(1, 2) if strided else t.transpose(1, 2).contiguous()
        return t.detach().requires_grad_()

    q, k, v = one(32), one(8), one(8)
    dout = torch.randn(b, 32, s, 128, generator=g).to("cuda", torch.bfloat16)
    return q, k, v, dout


def _grads(fn, q, k, v, dout):  # type: ignore[no-untyped-def]
    out = fn(q, k, v)
    return (out.detach(), *torch.autograd.grad(out, (q, k, v), dout))


def _same_run(a: tuple[torch.Tensor, ...], b: tuple[torch.Tensor, ...]) -> None:
    """Two runs of the same FA3 kernels: the forward bit for bit; the gradients to the
    rounding of its backward's fp32 atomic adds, whose order varies run to run (dq's
    accumulator; dk, dv's over a group's query heads)."""
    assert torch.equal(a[0], b[0]), "out"
    for name, x, y in zip(("dq", "dk", "dv"), a[1:], b[1:]):
        assert rel_err(x.float(), y.float()) < 1e-3, name


def _sdpa(q, k, v):  # type: ignore[no-untyped-def]
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)


@pytest.mark.parametrize("strided", [False, True], ids=["contiguous", "strided"])
@pytest.mark.parametrize("b,s", [(1, 4096), (2, 1536)])
def test_whole_sequences_equal_fp32_sdpa_within_bf16_rounding(
    b: int, s: int, strided: bool
) -> None:
    q, k, v, dout = _inputs(b, s, strided)
    got = _grads(fa3_causal_attention, q, k, v, dout)
    fp32 = [t.detach().float().requires_grad_() for t in (q, k, v)]
    truth = _grads(_sdpa, *fp32, dout.float())
    bf16 = _grads(_sdpa, q, k, v, dout)  # torch's own bf16 kernels, for the yardstick
    for name, a, ref, theirs in zip(("out", "dq", "dk", "dv"), got, truth, bf16):
        assert a.shape == ref.shape and a.dtype == torch.bfloat16, name
        err, sdpa_err = rel_err(a.float(), ref), rel_err(theirs.float(), ref)
        assert err < 1e-2, (name, err)  # bf16 inputs against fp32 math
        assert err < 1.5 * sdpa_err + 1e-3, (name, err, sdpa_err)


def test_a_non_contiguous_incoming_gradient() -> None:
    """The gradient autograd hands the backward may not be contiguous in its head dim (a
    (B, H, hd, S) tensor seen transposed): it is made so, and the result is the same."""
    q, k, v, dout = _inputs(1, 1024, True)
    want = _grads(fa3_causal_attention, q, k, v, dout)
    odd = dout.transpose(-1, -2).contiguous().transpose(-1, -2)  # stride(-1) != 1
    assert odd.stride(-1) != 1
    again = _grads(fa3_causal_attention, q, k, v, odd)
    _same_run(want, again)


def test_dense_attention_takes_fa3_and_falls_back_to_sdpa(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    q, k, v, dout = _inputs(1, 2048, True)
    assert fa3_takes(q.dtype, 128)
    assert not fa3_takes(torch.float32, 128) and not fa3_takes(torch.bfloat16, 64)
    via_dense = _grads(causal_attention, q, k, v, dout)
    direct = _grads(fa3_causal_attention, q, k, v, dout)
    _same_run(via_dense, direct)
    monkeypatch.setattr(fa3, "ENABLED", False)
    assert not fa3_takes(q.dtype, 128)
    sdpa = _grads(causal_attention, q, k, v, dout)
    for name, a, b in zip(("out", "dq", "dk", "dv"), sdpa, direct):
        assert rel_err(a.float(), b.float()) < 2e-2, name  # two bf16 kernels
