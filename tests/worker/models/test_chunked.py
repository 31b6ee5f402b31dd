"""Chunked attention and the chunked head + cross entropy (worker/models/chunked.py)
against their dense definitions in fp32 — dense.causal_attention (SDPA, under document_mask)
and F.cross_entropy over the whole logits — in value and in every gradient, for chunks that
do and do not divide the sequence; bf16 in gives bf16 out; and what autograd saves and the
largest tensor either pass makes are one chunk's, never S×S or N×V.

    pytest tests/worker/models/test_chunked.py
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from tests.worker.relative_error import rel_err
from wstrain.worker.models.chunked import (
    chunked_attention_lse,
    chunked_causal_attention,
    chunked_lm_loss,
    merge_partials,
)
from wstrain.worker.models.dense import causal_attention, document_mask

S = 64
# three documents a row, uneven; row 0's second crosses the chunk boundaries at 16 and 32
LENGTHS = [[11, 30, 23], [40, 5, 19]]


def _segments(lengths: list[list[int]]) -> torch.Tensor:
    return torch.stack(
        [torch.cat([torch.full((n,), i) for i, n in enumerate(row)]) for row in lengths]
    )  # (B, S)


def _qkv(
    b: int, h: int, kv: int, s: int, hd: int, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, ...]:
    """q (B, H, S, hd), k, v (B, KV, S, hd) leaves and an upstream gradient for the output."""
    q, k, v = (torch.randn(b, n, s, hd).to(dtype).requires_grad_() for n in (h, kv, kv))
    return q, k, v, torch.randn(b, h, s, hd)


def _grads(
    fn: Callable[..., torch.Tensor], q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: Any
) -> tuple[torch.Tensor, ...]:
    """(out, dq, dk, dv) of fn(q, k, v) under the upstream gradient do."""
    out = fn(q, k, v)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), do.to(out.dtype))
    return out.detach(), dq, dk, dv


@pytest.mark.parametrize("chunk", [16, 24, 7, S, 100], ids=lambda c: f"chunk{c}")
@pytest.mark.parametrize("heads", [(8, 2), (4, 4)], ids=["gqa8:2", "mha4"])
@pytest.mark.parametrize("documents", [False, True], ids=["causal", "documents"])
def test_chunked_attention_equals_sdpa(chunk: int, heads: tuple[int, int], documents: bool) -> None:
    torch.manual_seed(0)
    q, k, v, do = _qkv(2, *heads, S, 16)
    seg = _segments(LENGTHS) if documents else None
    mask = document_mask(seg) if seg is not None else None
    ref = _grads(lambda q, k, v: causal_attention(q, k, v, mask), q, k, v, do)
    got = _grads(lambda q, k, v: chunked_causal_attention(q, k, v, chunk, seg), q, k, v, do)
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, ref):
        assert rel_err(a, b) < 1e-5, name


def _dense_lse(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention and its log-sum-exp spelled out: (B, H, S, hd), (B, H, S)."""
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)  # (B, H, S, hd)
    s = (q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5).masked_fill(~mask, float("-inf"))
    return s.softmax(-1) @ v, torch.logsumexp(s, -1)


def test_lse_and_its_gradient() -> None:
    """The lse output equals the rows' logsumexp, and a loss on out and lse together gets
    the gradients autograd gives the dense definition."""
    torch.manual_seed(1)
    q, k, v, do = _qkv(2, 8, 2, S, 16)
    dlse = torch.randn(2, 8, S)
    seg = _segments(LENGTHS)
    res = []
    for fn in (
        lambda: _dense_lse(q, k, v, document_mask(seg)),
        lambda: chunked_attention_lse(q, k, v, 24, seg),
    ):
        out, lse = fn()
        res.append(
            (out, lse, *torch.autograd.grad((out * do).sum() + (lse * dlse).sum(), (q, k, v)))
        )
    for name, a, b in zip(("out", "lse", "dq", "dk", "dv"), *res):
        assert rel_err(a, b) < 1e-5, name
    # the lse alone: out's gradient never arrives
    (dq,) = torch.autograd.grad(chunked_attention_lse(q, k, v, 7, seg)[1].sum(), (q,))
    (ref,) = torch.autograd.grad(_dense_lse(q, k, v, document_mask(seg))[1].sum(), (q,))
    assert rel_err(dq, ref) < 1e-5


def test_merge_partials_is_attention_over_the_union() -> None:
    """Keys split in two sets, rows of which see none of one set (lse -inf there): the merge
    of the two attentions is the attention over all keys."""
    torch.manual_seed(2)
    s = torch.randn(3, 5, 12)  # scores (.., R, L)
    v = torch.randn(3, 12, 4)
    seen = torch.rand(3, 5, 12) > 0.3
    seen[:, 0, :6] = False  # row 0 sees nothing of the first set
    seen[:, :, 6] = True  # every row sees a key of the second
    s = s.masked_fill(~seen, float("-inf"))

    def part(lo: int, hi: int) -> tuple[torch.Tensor, torch.Tensor]:
        lse = torch.logsumexp(s[..., lo:hi], -1)
        p = torch.exp(s[..., lo:hi] - lse.nan_to_num(neginf=0.0).unsqueeze(-1))
        return p @ v[:, lo:hi], lse

    out, lse = merge_partials(*part(0, 6), *part(6, 12))
    assert torch.allclose(out, s.softmax(-1) @ v, atol=1e-6)
    assert torch.allclose(lse, torch.logsumexp(s, -1), atol=1e-6)


def test_bf16_in_bf16_out_close_to_fp32() -> None:
    torch.manual_seed(3)
    q, k, v, do = _qkv(2, 8, 2, S, 16, torch.bfloat16)
    seg = _segments(LENGTHS)
    got = _grads(lambda q, k, v: chunked_causal_attention(q, k, v, 24, seg), q, k, v, do)
    assert all(t.dtype == torch.bfloat16 for t in got)
    q32, k32, v32 = (t.detach().float().requires_grad_() for t in (q, k, v))
    mask = document_mask(seg)
    ref = _grads(lambda q, k, v: causal_attention(q, k, v, mask), q32, k32, v32, do)
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, ref):
        assert rel_err(a.float(), b) < 2e-2, name


def test_documents_skip_the_prefix_and_any_ids_work() -> None:
    """Documents that start at chunk boundaries leave those chunks no prefix at all; ids
    that come back later in a row (not contiguous) still see each other, as document_mask."""
    torch.manual_seed(4)
    q, k, v, do = _qkv(1, 4, 2, 64, 8)
    out = chunked_causal_attention(q, k, v, 16, _segments([[32, 20, 12]]))
    assert out.grad_fn.starts == [0, 0, 32, 32]  # type: ignore[union-attr]
    seg = torch.tensor([[0] * 10 + [1] * 20 + [0] * 14 + [2] * 20])  # document 0 resumes at 30
    ref = _grads(lambda q, k, v: causal_attention(q, k, v, document_mask(seg)), q, k, v, do)
    got = _grads(lambda q, k, v: chunked_causal_attention(q, k, v, 16, seg), q, k, v, do)
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, ref):
        assert rel_err(a, b) < 1e-5, name


def test_shape_errors() -> None:
    q, k, v, _ = _qkv(1, 6, 4, 8, 8)
    with pytest.raises(ValueError, match="multiple"):
        chunked_causal_attention(q, k, v, 4)
    q, k, v, _ = _qkv(1, 4, 2, 8, 8)
    with pytest.raises(ValueError, match="chunk"):
        chunked_causal_attention(q, k, v, 0)
    with pytest.raises(ValueError, match="segments"):
        chunked_causal_attention(q, k, v, 4, torch.zeros(1, 7, dtype=torch.long))


class _Largest(TorchDispatchMode):
    """The most elements of any tensor an op returns while active."""

    def __init__(self) -> None:
        super().__init__()
        self.numel = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.numel = max(self.numel, t.numel())
        return out


def _saved_shapes(fn: Callable[[], torch.Tensor]) -> tuple[torch.Tensor, list[torch.Size]]:
    """fn's result and the shapes of every tensor autograd saves while running it."""
    shapes: list[torch.Size] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        shapes.append(t.shape)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, shapes


def test_attention_saves_and_makes_one_chunk_at_most() -> None:
    """Autograd saves q, k, v, out, the lse and the segments, nothing S×S; no op of the
    forward or the backward returns more than one chunk's scores (B·H·chunk·S elements)."""
    torch.manual_seed(5)
    b, h, kv, s, hd, chunk = 1, 4, 2, 128, 8, 16
    q, k, v, do = _qkv(b, h, kv, s, hd)
    seg = _segments([[50, 78]])
    fwd = _Largest()
    with fwd:
        out, shapes = _saved_shapes(lambda: chunked_causal_attention(q, k, v, chunk, seg))
    assert sorted(shapes) == sorted(
        [q.shape, k.shape, v.shape, out.shape, torch.Size((b, h, s)), seg.shape]
    )
    bwd = _Largest()
    with bwd:
        out.backward(do)
    one_chunk = b * h * chunk * s  # 8192; the dense scores are b·h·s² = 65536
    assert max(fwd.numel, bwd.numel) <= one_chunk
    assert q.grad is not None and k.grad is not None and v.grad is not None


# ---------------------------------------------------------------- head and loss

N, D, V = 64, 12, 50


def _head(
    dtype: torch.dtype = torch.float32, n: int = N, ignored: float = 0.25
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    h = torch.randn(n, D).to(dtype).requires_grad_()
    w = (torch.randn(V, D) * 0.5).to(dtype).requires_grad_()
    labels = torch.randint(0, V, (n,))
    labels[torch.rand(n) < ignored] = -100
    return h, w, labels


def _loss_grads(loss: torch.Tensor, h: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, ...]:
    dh, dw = torch.autograd.grad(loss * 0.37, (h, w))  # a caller's 1/target_tokens
    return loss.detach(), dh, dw


@pytest.mark.parametrize("chunk", [16, 10, 7, N, 200], ids=lambda c: f"chunk{c}")
def test_chunked_loss_equals_cross_entropy(chunk: int) -> None:
    torch.manual_seed(6)
    h, w, labels = _head()
    assert (labels == -100).any() and (labels != -100).any()
    ref = _loss_grads(F.cross_entropy(h @ w.T, labels, reduction="sum", ignore_index=-100), h, w)
    got = _loss_grads(chunked_lm_loss(h, w, labels, chunk), h, w)
    assert got[0].dtype == torch.float32
    for name, a, b in zip(("loss", "dh", "dw"), got, ref):
        assert rel_err(a, b) < 1e-5, name


def test_chunked_loss_takes_batches_and_all_ignored() -> None:
    """(B, S, D) and (B, S) as the runtimes hold them; a chunk with no target adds 0 and
    sends no gradient."""
    torch.manual_seed(7)
    h, w, labels = _head()
    got = chunked_lm_loss(h.view(4, 16, D), w, labels.view(4, 16), 12)
    assert rel_err(got, F.cross_entropy(h @ w.T, labels, reduction="sum")) < 1e-5
    none = torch.full((N,), -100)
    loss = chunked_lm_loss(h, w, none, 16)
    dh, dw = torch.autograd.grad(loss, (h, w))
    assert loss.item() == 0.0 and not dh.any() and not dw.any()


def test_chunked_loss_bf16_close_to_fp32() -> None:
    torch.manual_seed(8)
    h, w, labels = _head(torch.bfloat16)
    got = _loss_grads(chunked_lm_loss(h, w, labels, 24), h, w)
    assert got[0].dtype == torch.float32 and got[1].dtype == got[2].dtype == torch.bfloat16
    h32, w32 = (t.detach().float().requires_grad_() for t in (h, w))
    ref = _loss_grads(F.cross_entropy(h32 @ w32.T, labels, reduction="sum"), h32, w32)
    for name, a, b in zip(("loss", "dh", "dw"), got, ref):
        assert rel_err(a.float(), b) < 2e-2, name


def test_chunked_loss_saves_and_makes_no_full_logits() -> None:
    """Autograd saves h, W, the labels and an lse a token; no op returns the (N, V) logits,
    only a chunk's (or W's own size, its gradient)."""
    torch.manual_seed(9)
    h, w, labels = _head(n=256)
    mode = _Largest()
    with mode:
        loss, shapes = _saved_shapes(lambda: chunked_lm_loss(h, w, labels, 16))
        loss.backward()
    assert sorted(shapes) == sorted([h.shape, w.shape, labels.shape, torch.Size((256,))])
    assert mode.numel <= max(16 * V, V * D, 256 * D) < 256 * V


# ---------------------------------------------------------------- random shapes


@settings(max_examples=25, deadline=None)
@given(
    b=st.integers(1, 2),
    kv=st.integers(1, 3),
    group=st.integers(1, 3),
    s=st.integers(1, 40),
    chunk=st.integers(1, 48),
    docs=st.lists(st.integers(1, 15), min_size=1, max_size=5) | st.none(),
    seed=st.integers(0, 2**16),
)
def test_chunked_attention_random_shapes(
    b: int, kv: int, group: int, s: int, chunk: int, docs: list[int] | None, seed: int
) -> None:
    torch.manual_seed(seed)
    q, k, v, do = _qkv(b, kv * group, kv, s, 8)
    seg = None
    if docs is not None:  # the lengths repeated to fill the row, cut at S
        ids = torch.cat([torch.full((n,), i) for i, n in enumerate(docs * s)])[:s]
        seg = ids.expand(b, s).contiguous()
    mask = document_mask(seg) if seg is not None else None
    ref = _grads(lambda q, k, v: causal_attention(q, k, v, mask), q, k, v, do)
    got = _grads(lambda q, k, v: chunked_causal_attention(q, k, v, chunk, seg), q, k, v, do)
    for name, a, c in zip(("out", "dq", "dk", "dv"), got, ref):
        # a token alone in its document has dq exactly 0 here, SDPA's is fp32 rounding
        # noise of the unit-scale inputs (up to 1.04e-6 seen, docs=[1], s=31): relative
        # error is then meaningless, so the absolute error is bounded at 1e-5
        assert rel_err(a, c) < 1e-5 or (a - c).abs().max() < 1e-5, name


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 60), chunk=st.integers(1, 70), seed=st.integers(0, 2**16))
def test_chunked_loss_random_shapes(n: int, chunk: int, seed: int) -> None:
    torch.manual_seed(seed)
    h, w, labels = _head(n=n, ignored=0.3)
    ref = _loss_grads(F.cross_entropy(h @ w.T, labels, reduction="sum"), h, w)
    got = _loss_grads(chunked_lm_loss(h, w, labels, chunk), h, w)
    for name, a, c in zip(("loss", "dh", "dw"), got, ref):
        assert torch.allclose(a, c, rtol=1e-5, atol=1e-5), name
