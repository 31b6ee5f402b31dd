"""worker/kernels/fused.py's Triton kernels against the eager ops they replace, on the GPU: each
fused op in bf16 is at least as close to an fp64 reference as eager bf16 is (within 30%),
and in fp32 it matches eager to fp32 rounding. The whole-model tests (test_working_set.py's
CUDA cases against transformers) run through these kernels too.

    pytest -m gpu tests/worker/kernels/test_fused.py
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import torch
import torch.nn.functional as F

from wstrain.worker.kernels import fused as fused_ops
from wstrain.worker.models.dense import rms_norm, silu_mul, silu_mul_backward
from wstrain.worker.models.rope import apply_rope

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not (torch.cuda.is_available() and fused_ops.triton), reason="needs CUDA and Triton"
    ),
]


@pytest.fixture
def eager() -> Iterator[Callable[[], None]]:
    """Call it to run worker/models/dense.py's and rope.py's eager ops until the test ends."""

    def off() -> None:
        fused_ops.ENABLED = False

    yield off
    fused_ops.ENABLED = True


def _rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    return float((a.double() - ref).norm() / ref.norm())


def _grads(
    fn: Callable[..., torch.Tensor], inputs: list[torch.Tensor], dy: torch.Tensor
) -> list[torch.Tensor]:
    leaves = [t.detach().requires_grad_() for t in inputs]
    out = fn(*leaves)
    out.backward(dy.to(out.dtype))
    return [out.detach(), *(leaf.grad for leaf in leaves)]  # type: ignore[misc]


def _compare(
    fn: Callable[..., torch.Tensor], inputs: list[torch.Tensor], eager: Callable[[], None]
) -> None:
    """fn's output and input gradients: fused bf16 vs eager bf16, both against fp64."""
    dy = torch.randn_like(fn(*inputs), dtype=torch.float64)
    ref = _grads(fn, [t.double().cpu() for t in inputs], dy.cpu())
    bf16 = [t.bfloat16() for t in inputs]
    fused = _grads(fn, bf16, dy)
    eager()
    plain = _grads(fn, bf16, dy)
    for f, p, r in zip(fused, plain, ref):
        assert _rel(f.cpu(), r) <= 1.3 * _rel(p.cpu(), r) + 1e-4, (
            _rel(f.cpu(), r),
            _rel(p.cpu(), r),
        )


def test_rms_norm(eager: Callable[[], None]) -> None:
    x = torch.randn(3, 1000, 4096, device="cuda")
    w = 1 + 0.1 * torch.randn(4096, device="cuda")
    _compare(lambda x_, w_: rms_norm(x_, w_, 1e-5), [x, w], eager)


def test_rope_strided_input(eager: Callable[[], None]) -> None:
    """q as the runtime makes it: a transposed view; cos/sin as Llama's tables."""
    q = torch.randn(2, 32, 512, 128, device="cuda").transpose(1, 2)  # (B, S, H, hd) view
    freqs = torch.outer(torch.arange(512.0), 1e4 ** (-torch.arange(0, 128, 2) / 128))
    emb = torch.cat((freqs, freqs), -1).cuda()
    cos, sin = emb.cos(), emb.sin()  # (S, hd), in q's dtype as the model keeps them
    _compare(lambda q_: apply_rope(q_, cos.to(q_)[:, None], sin.to(q_)[:, None]), [q], eager)


def test_rope_per_token_tables(eager: Callable[[], None]) -> None:
    """Packed documents: each token's position restarts at its document, so the tables are
    (B, S, hd) gathered per token; the fused kernel takes them, not the eager fallback."""
    q = torch.randn(2, 32, 512, 128, device="cuda").transpose(1, 2)  # (B, S, H, hd) view
    pos = torch.cat([torch.arange(300), torch.arange(212), torch.arange(512)]).view(2, 512)
    freqs = pos[..., None].float() * 1e4 ** (-torch.arange(0, 128, 2) / 128)  # (B, S, hd/2)
    emb = torch.cat((freqs, freqs), -1).cuda()
    cos, sin = emb.cos(), emb.sin()  # (B, S, hd)
    calls = []
    kernel = fused_ops.rope_autograd
    fused_ops.rope_autograd = lambda *a: calls.append(1) or kernel(*a)  # type: ignore[assignment]
    try:
        _compare(
            lambda q_: apply_rope(q_, cos.to(q_)[:, :, None], sin.to(q_)[:, :, None]), [q], eager
        )
    finally:
        fused_ops.rope_autograd = kernel
    assert calls, "per-token tables fell back to the eager RoPE"


def test_silu_mul(eager: Callable[[], None]) -> None:
    g, u = (torch.randn(2, 777, 14336, device="cuda") for _ in range(2))
    _compare(silu_mul, [g, u], eager)


def test_silu_mul_backward_gives_the_product_too() -> None:
    g, u, dp = (torch.randn(5, 3001, device="cuda") for _ in range(3))
    dg, du, p = silu_mul_backward(dp, g, u)
    gr, ur = g.double().requires_grad_(), u.double().requires_grad_()
    pr = F.silu(gr) * ur
    pr.backward(dp.double())
    for got, want in ((dg, gr.grad), (du, ur.grad), (p, pr)):
        assert _rel(got, want.detach()) < 1e-6  # type: ignore[union-attr]


def test_fp32_matches_eager(eager: Callable[[], None]) -> None:
    x = torch.randn(4, 300, 2048, device="cuda")
    w = torch.randn(2048, device="cuda")
    g, u = torch.randn(2, 4, 300, 2048, device="cuda")
    fused = [_grads(lambda a, b: rms_norm(a, b, 1e-6), [x, w], x), _grads(silu_mul, [g, u], x)]
    eager()
    plain = [_grads(lambda a, b: rms_norm(a, b, 1e-6), [x, w], x), _grads(silu_mul, [g, u], x)]
    for fs, ps in zip(fused, plain):
        for f, p in zip(fs, ps):
            assert _rel(f, p.double()) < 1e-5


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_add_into_equals_the_eager_add(dtype: torch.dtype) -> None:
    """The fp32 sums a piece's backward keeps: FA3's (B, T, KV, hd) gradients seen as
    (B, KV, T, hd), added into a slice of a longer fp32 window; exactly the eager sum (one
    fp32 addition an element either way), the window's other keys untouched."""
    dst = torch.randn(2, 8, 5000, 128, device="cuda")  # (B, KV, S, hd)
    src = torch.randn(2, 3001, 8, 128, device="cuda", dtype=dtype).transpose(1, 2)
    want = dst.clone()
    want[:, :, 1000:4001] += src
    fused_ops.add_into(dst[:, :, 1000:4001], src)
    assert torch.equal(dst, want)


def test_add_into_falls_back_where_it_does_not_take_the_shape() -> None:
    dst = torch.zeros(3, 4, 96, device="cuda")  # 3-D, 96 not a power of two: the eager add
    src = torch.randn(3, 4, 96, device="cuda", dtype=torch.bfloat16)
    fused_ops.add_into(dst, src)
    assert torch.equal(dst, src.float())
