"""The mixture-of-experts MLP block with a lean saved set: y = h + MoE(RMSNorm(h)).

Autograd would keep, per token, each routed copy of the input and of the expert output
(2·k·d elements), the gate, up, silu and product of every routed copy (4·k·I) and fp32 norm
copies — for OLMoE at 8K tokens about 1.2 GB a chunk. Here the forward runs without a graph
and hands back h, the routing choice and the two grouped GEMM outputs gate and up:
e·(d + 2·k·I) bytes a token (a quarter of that). The backward recomputes the norm, the router
(a (T, E) GEMM), the gather and the SwiGLU product, and recomputes no expert GEMM: the
down-projection's output is never needed, because d top_w = rowsum(dp_raw · p) with dp_raw =
dy·W_down the GEMM the backward runs anyway. A shared expert (Qwen2-MoE) is not saved: the
backward recomputes it with its graph, like a level-0 dense MLP. It is level 2's and level
3's MLP for MoE layers
in working_set/schedule.py, as worker/ops/lean_mlp.py is for dense ones.

    y, saved = lean_moe_forward(h, w, dims)                   # saved: (top_idx, gate, up)
    dh, dw = lean_moe_backward(dy, h, *saved, w, dims, aux_grad)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from wstrain.contracts.model_dims import ModelDims
from wstrain.worker.models.dense import rms_norm, shared_expert, silu_mul, silu_mul_backward
from wstrain.worker.models.moe import (
    EXPERTS,
    ROUTER,
    SHARED,
    SHARED_GATE,
    Groups,
    grouped_linear,
    grouped_outer,
    route,
)

NORM = "post_attention_layernorm.weight"


def _route_and_up(
    h: torch.Tensor, w: dict[str, torch.Tensor], dims: ModelDims
) -> tuple[
    torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, Groups, torch.Tensor, torch.Tensor
]:
    """(nf (T, D), probs (T, E), top_idx (T, k), top_w (T, k), groups, gate, up)."""
    w_gate, w_up = w[EXPERTS[0]], w[EXPERTS[1]]
    nf = rms_norm(h, w[NORM], dims.rms_norm_eps).reshape(-1, dims.hidden_size)  # (T, D)
    probs, top_idx, top_w = route(nf, w[ROUTER], dims.experts_per_token, dims.norm_topk_prob)
    groups = Groups(top_idx, dims.num_experts)
    xs = nf[groups.token]  # (T*k, D)
    return (
        nf,
        probs,
        top_idx,
        top_w,
        groups,
        grouped_linear(xs, w_gate, groups),
        grouped_linear(xs, w_up, groups),
    )


@torch.no_grad()
def lean_moe_saved(
    h: torch.Tensor, w: dict[str, torch.Tensor], dims: ModelDims
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(top_idx, gate, up): the set recomputed when it was not saved (levels 0-1), without
    the experts' down projections, which the backward never needs."""
    *_, top_idx, _, _, g, u = _route_and_up(h, w, dims)
    return top_idx, g, u


@torch.no_grad()
def lean_moe_forward(
    h: torch.Tensor, w: dict[str, torch.Tensor], dims: ModelDims
) -> tuple[
    torch.Tensor, torch.Tensor, torch.Tensor, tuple[torch.Tensor, torch.Tensor, torch.Tensor]
]:
    """(y, probs (T, E), top_idx (T, k), saved (top_idx, gate, up)); gate and up are
    (T*k, I) in expert-grouped order. h: (B, S, D)"""
    nf, probs, top_idx, top_w, groups, g, u = _route_and_up(h, w, dims)
    ys = (
        grouped_linear(silu_mul(g, u), w[EXPERTS[2]], groups)
        * top_w.reshape(-1)[groups.order, None]
    )
    m = nf.new_zeros(nf.shape).index_add(0, groups.token, ys)
    if SHARED_GATE in w:
        m = m + shared_expert(nf, w)
    return h + m.view_as(h), probs, top_idx, (top_idx, g, u)


def lean_moe_backward(
    dy: torch.Tensor,
    h: torch.Tensor,
    top_idx: torch.Tensor,
    g: torch.Tensor,
    u: torch.Tensor,
    w: dict[str, torch.Tensor],
    dims: ModelDims,
    aux_grad: torch.Tensor | None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """dL/dh and the weight gradients (router, stacked experts, norm) from dy = dL/dy and,
    with `aux_grad` (b, E), the load-balancing loss's gradient on the probabilities of each
    row of sequence b (RouterTotals.prob_grad's rows for these sequences)."""
    w_gate, w_up, w_down = (w[n] for n in EXPERTS)
    with torch.enable_grad():  # the cheap graph: norm and router, recomputed
        h_ = h.detach().requires_grad_()
        wn_, wr_ = w[NORM].detach().requires_grad_(), w[ROUTER].detach().requires_grad_()
        nf = rms_norm(h_, wn_, dims.rms_norm_eps).reshape(-1, dims.hidden_size)  # (T, D)
        probs = torch.softmax(F.linear(nf, wr_), dim=-1, dtype=torch.float32)  # (T, E)
        top_w = probs.gather(1, top_idx)  # the forward's top-k values, (T, k)
        if dims.norm_topk_prob:
            top_w = top_w / top_w.sum(dim=-1, keepdim=True)
        top_w = top_w.to(nf.dtype)
        # the shared expert (Qwen2-MoE) is recomputed with its graph: it is one dense MLP
        shared_w = {
            n: w[n].detach().requires_grad_() for n in (*SHARED, SHARED_GATE) if SHARED_GATE in w
        }
        shared = shared_expert(nf, shared_w) if shared_w else None
    groups = Groups(top_idx, dims.num_experts)
    weight = top_w.detach().reshape(-1)[groups.order, None]  # (T*k, 1)
    dy_tok = dy.reshape(-1, dims.hidden_size)[groups.token]  # (T*k, D)
    dp_raw = grouped_linear(dy_tok, w_down, groups, transpose=False)  # dy · W_down, (T*k, I)
    dg, du, p = silu_mul_backward(dp_raw * weight, g, u)  # (T*k, I) each; p recomputed
    d_weight = (dp_raw.float() * p.float()).sum(-1)  # d top_w per grouped pair, (T*k,)
    dw_down = grouped_outer(dy_tok * weight, p, groups)  # (E, D, I)
    xs = nf.detach()[groups.token]  # (T*k, D)
    dw_gate, dw_up = grouped_outer(dg, xs, groups), grouped_outer(du, xs, groups)  # (E, I, D)
    dxs = grouped_linear(dg, w_gate, groups, transpose=False) + grouped_linear(
        du, w_up, groups, transpose=False
    )  # (T*k, D)
    dnf = torch.zeros_like(nf).index_add(0, groups.token, dxs.to(nf.dtype))
    d_top_w = torch.zeros(top_idx.numel(), device=dy.device, dtype=torch.float32)
    d_top_w[groups.order] = d_weight
    outs, grads = [nf, top_w], [dnf, d_top_w.view_as(top_w).to(top_w.dtype)]
    if shared is not None:
        outs.append(shared)
        grads.append(dy.reshape(-1, dims.hidden_size))
    if aux_grad is not None:
        outs.append(probs)
        per_row = aux_grad.repeat_interleave(probs.shape[0] // aux_grad.shape[0], dim=0)
        grads.append(per_row)  # (T, E): each sequence's row for each of its tokens
    torch.autograd.backward(outs, grads)
    dws = dict(zip(EXPERTS, (dw_gate, dw_up, dw_down)))
    dws.update({NORM: _grad(wn_), ROUTER: _grad(wr_)})
    dws.update({n: _grad(leaf) for n, leaf in shared_w.items()})
    return dy + _grad(h_), dws


def _grad(leaf: torch.Tensor) -> torch.Tensor:
    """A leaf's gradient after the backward above, which reaches every leaf."""
    assert leaf.grad is not None, "the backward reaches every leaf"
    return leaf.grad
