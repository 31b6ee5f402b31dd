"""The MoE pieces against `transformers`: the load-balancing loss and its gradient equal
`load_balancing_loss_func`'s over several layers, and (GPU) the grouped-GEMM experts equal
the expert-by-expert loop."""

from __future__ import annotations

import pytest
import torch
from transformers.models.olmoe.modeling_olmoe import load_balancing_loss_func

from wstrain.worker.models.moe import RouterTotals, experts, route


def test_router_totals_equal_transformers_load_balancing_loss_per_sequence() -> None:
    """Sequences of 5 tokens, added a chunk of 2 then a chunk of 1 per layer (as the working
    set adds them): the sum over sequences of transformers' loss of each sequence alone."""
    g = torch.Generator().manual_seed(0)
    n_experts, top_k, layers, seqs, seq_len = 6, 2, 3, 3, 5
    logits = [
        torch.randn(seqs * seq_len, n_experts, generator=g, dtype=torch.float64).requires_grad_()
        for _ in range(layers)
    ]
    want = sum(
        load_balancing_loss_func(
            tuple(lg[b * seq_len : (b + 1) * seq_len] for lg in logits), n_experts, top_k
        )
        for b in range(seqs)
    )
    want.backward()  # type: ignore[union-attr]

    totals = RouterTotals(n_experts, torch.device("cpu"), seqs, seq_len)
    probs = [torch.softmax(lg.detach().float(), dim=-1) for lg in logits]
    for p in probs:
        top = torch.topk(p, top_k, dim=-1).indices
        totals.add(p[: 2 * seq_len], top[: 2 * seq_len], first=0)
        totals.add(p[2 * seq_len :], top[2 * seq_len :], first=2)
    assert abs(float(totals.loss()) - float(want)) < 1e-6 * float(want)
    # each sequence's (E,) gradient row on its tokens' probabilities, through the softmax,
    # is the reference's gradient on its logits
    grad = totals.prob_grad(1.0).repeat_interleave(seq_len, dim=0)  # (B*S, E)
    for lg, p in zip(logits, probs):
        dlogits = p * (grad - (p * grad).sum(-1, keepdim=True))  # softmax backward, (T, E)
        assert torch.allclose(dlogits.double(), lg.grad, rtol=1e-5, atol=1e-7)  # fp32 sums


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_grouped_experts_equal_the_loop_on_cuda() -> None:
    g = torch.Generator(device="cuda").manual_seed(0)
    n_experts, d, f, tokens = 8, 256, 128, 512
    kw = dict(device="cuda", dtype=torch.bfloat16, generator=g)
    x = torch.randn(tokens, d, **kw)
    w_gate, w_up = (torch.randn(n_experts, f, d, **kw) * 0.05 for _ in range(2))
    w_down = torch.randn(n_experts, d, f, **kw) * 0.05
    router = torch.randn(n_experts, d, **kw)
    _, top_idx, top_w = route(x, router, 2, True)
    grouped = experts(x, top_idx, top_w, w_gate, w_up, w_down)  # stacked: one grouped GEMM
    loop = experts(x, top_idx, top_w, list(w_gate), list(w_up), list(w_down))
    assert float((grouped.float() - loop.float()).norm() / loop.float().norm()) < 1e-2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_lean_moe_matches_autograd_in_bf16_on_cuda() -> None:
    """Level 2's lean MoE set (grouped GEMMs, explicit backward) against autograd through
    the same block at the same precision: output, dL/dh and every weight gradient. (The fp32
    working-set tests check the same code against transformers exactly; in bf16 both paths
    differ from fp32 by several percent at these sizes, and from each other by < 1%.)"""
    from dataclasses import replace

    from wstrain.contracts.model_dims import PRESETS
    from wstrain.worker.models.dense import moe_block
    from wstrain.worker.ops.lean_moe import lean_moe_backward, lean_moe_forward
    from wstrain.worker.runtime.working_set.arena import LayerLayout

    dims = replace(PRESETS["tiny-qwen3-moe"], hidden_size=256, moe_intermediate_size=128)
    layout = LayerLayout.decoder(dims)
    g = torch.Generator(device="cuda").manual_seed(0)
    flat = torch.randn(layout.numel, device="cuda", generator=g) * 0.05
    w = layout.views(flat.to(torch.bfloat16))
    w["post_attention_layernorm.weight"].fill_(1.0)
    h = torch.randn(2, 64, dims.hidden_size, device="cuda", generator=g).bfloat16()
    dy = torch.randn_like(h)
    aux = torch.rand(2, dims.num_experts, device="cuda", generator=g) * 1e-2  # per sequence

    leaves = {n: v.detach().clone().requires_grad_() for n, v in w.items()}
    h_ref = h.clone().requires_grad_()
    y_ref, probs, _ = moe_block(h_ref, leaves, dims)
    torch.autograd.backward((y_ref, probs), (dy, aux.repeat_interleave(64, dim=0)))

    y, _, _, saved = lean_moe_forward(h, w, dims)
    dh, dw = lean_moe_backward(dy, h, *saved, w, dims, aux)

    def rel(a: torch.Tensor, b: torch.Tensor) -> float:
        return float((a.float() - b.float()).norm() / b.float().norm())

    assert rel(y, y_ref) < 1e-2 and rel(dh, h_ref.grad) < 2e-2
    assert set(dw) == set(leaves) - {
        n for n in leaves if "self_attn" in n or n == "input_layernorm.weight"
    }
    for name, grad in dw.items():
        assert rel(grad, leaves[name].grad) < 2e-2, name
