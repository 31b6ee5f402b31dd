"""The attention block with a lean saved set: h = x + o_proj(SDPA(q, k, v)), q/k/v the
RoPE'd projections of n = RMSNorm(x).

Autograd would keep n and its fp32 copies, q and k before and after RoPE, v, the kernel's
output, its transpose and the log-sum-exp — about 510 MB a sequence at Llama-3-8B dims and
8K tokens. Here the forward runs the norm, projections, RoPE and output projection without a
graph; only the attention kernel records one, so what is saved is the kernel's own set:
q, k, v, its output and log-sum-exp, e·(2·H + 2·KV)·hd + 4·H bytes a token (168 MB a
sequence), and it goes through the runtime's saved-tensor hooks (home, or kept on the
device). The backward recomputes the norm (elementwise) and, for h, the output projection's
forward (one GEMM), runs the kernel's own backward, and undoes RoPE exactly (a rotation: its
transpose rotates by -θ), so no QKV GEMM or attention forward is recomputed. With q/k norms
(OLMoE, Qwen3) the projections are recomputed with their graph instead: the norm's backward
needs its input. It is level 1's and level 3's attention in working_set/schedule.py.

    h, out, core = lean_attn_forward(x, w, dims, cos, sin)    # under the saved-tensor hooks
    h = out_proj(x, out, w)                                   # in backward, from the saved out
    dx = lean_attn_backward(dh, x, out, core, w, dims, cos, sin, dw)  # weight grads into dw
"""

from __future__ import annotations

import functools
import operator
from dataclasses import dataclass

import torch
from torch.autograd.graph import GradientEdge, get_gradient_edge

from wstrain.contracts.model_dims import ModelDims
from wstrain.worker.models.blocks import (
    GradViews,
    add_grads,
    add_weight_grad,
    leaves,
    out_proj,
    qkv,
)
from wstrain.worker.models.dense import causal_attention, rms_norm
from wstrain.worker.models.rope import apply_rope

NORM, O_PROJ = "input_layernorm.weight", "self_attn.o_proj.weight"
PROJ = tuple(f"self_attn.{p}_proj" for p in "qkv")


class _Entry(torch.autograd.Function):
    """q, k, v as views that require grad yet that no autograd object owns: the kernel's
    saved set is then their only owner (sent home or kept, as the hooks decide). The 0-d
    `anchor` leaf makes them require grad; gradients are taken at the entry's outputs, so its
    backward never runs."""

    @staticmethod
    def forward(ctx, anchor, q, k, v):
        return q.view_as(q), k.view_as(k), v.view_as(v)

    @staticmethod
    def backward(ctx, dq, dk, dv):
        return None, dq, dk, dv


@dataclass(frozen=True)
class CoreGraph:
    """The attention kernel's graph, held by its edges alone (no tensor)."""

    out: GradientEdge
    inputs: tuple[GradientEdge, GradientEdge, GradientEdge]


def lean_attn_forward(
    x: torch.Tensor,
    w: dict[str, torch.Tensor],
    dims: ModelDims,
    cos: torch.Tensor,
    sin: torch.Tensor,
    mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, CoreGraph]:
    """(h (B, S, D), the kernel's output (B, H, S, hd), its graph). x: (B, S, D); cos/sin
    (S, hd) or per token (B, S, hd); mask: dense.document_mask for packed documents."""
    with torch.no_grad():
        q, k, v = qkv(rms_norm(x, w[NORM], dims.rms_norm_eps), w, dims, cos, sin)
    anchor = torch.zeros((), requires_grad=True)
    with torch.enable_grad():
        qa, ka, va = _Entry.apply(anchor, q, k, v)
        out = causal_attention(qa, ka, va, mask)  # (B, H, S, hd)
    edges = (get_gradient_edge(qa), get_gradient_edge(ka), get_gradient_edge(va))
    core = CoreGraph(get_gradient_edge(out), edges)
    with torch.no_grad():
        h = out_proj(x, out, w)
    return h, out.detach(), core


def _unrope(d: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The gradient through RoPE: (B, H, S, hd) -> (B, S, H·hd)."""
    b, _, s, _ = d.shape
    cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)  # (S, 1, hd) or (B, S, 1, hd)
    return apply_rope(d.transpose(1, 2), cos, -sin).reshape(b, s, -1)


def lean_attn_backward(
    dh: torch.Tensor,
    x: torch.Tensor,
    out: torch.Tensor,
    core: CoreGraph,
    w: dict[str, torch.Tensor],
    dims: ModelDims,
    cos: torch.Tensor,
    sin: torch.Tensor,
    dw: GradViews,
) -> torch.Tensor:
    """dL/dx from dh = dL/dh, the block's weight gradients added into `dw`. (B, S, D) in
    and out."""
    d_out = out_proj_backward(dh, out, w, dims, dw)
    dq, dk, dv = torch.autograd.grad(core.out, core.inputs, d_out)
    return dh + qkv_backward(dq, dk, dv, x, w, dims, cos, sin, dw)


def out_proj_backward(
    dh: torch.Tensor,
    out: torch.Tensor,
    w: dict[str, torch.Tensor],
    dims: ModelDims,
    dw: GradViews,
) -> torch.Tensor:
    """dL/d out (B, H, S, hd) of h = x + o_proj(out) from dh (B, S, D); o_proj's gradient
    added into `dw`."""
    b, _, s, _ = out.shape
    d_out = (dh @ w[O_PROJ]).view(b, s, dims.num_heads, -1).transpose(1, 2)  # (B, H, S, hd)
    add_weight_grad(dw, O_PROJ, dh, out.transpose(1, 2).reshape(b, s, -1))  # (D, H·hd)
    return d_out


def qkv_backward(
    dq: torch.Tensor,
    dk: torch.Tensor,
    dv: torch.Tensor,
    x: torch.Tensor,
    w: dict[str, torch.Tensor],
    dims: ModelDims,
    cos: torch.Tensor,
    sin: torch.Tensor,
    dw: GradViews,
) -> torch.Tensor:
    """The gradient through q, k, v = qkv(RMSNorm(x)) from dq (B, H, S, hd) and dk, dv
    (B, KV, S, hd): its part of dL/dx (B, S, D); the norm's and projections' gradients
    added into `dw`. The norm is recomputed (elementwise); RoPE is undone exactly."""
    b, s, _ = x.shape
    with torch.enable_grad():
        x_, wn_ = x.detach().requires_grad_(), w[NORM].detach().requires_grad_()
        n = rms_norm(x_, wn_, dims.rms_norm_eps)  # (B, S, D): elementwise recompute
    if dims.qk_norm:  # the projections again, with their graph
        wl = leaves({n_: t for n_, t in w.items() if n_.startswith("self_attn.") and n_ != O_PROJ})
        with torch.enable_grad():
            proj = qkv(n, wl, dims, cos, sin)
        torch.autograd.backward(proj, (dq, dk, dv))
        add_grads(dw, {n_: leaf.grad for n_, leaf in wl.items()})  # type: ignore[misc]
    else:
        d_proj = (
            _unrope(dq, cos, sin),
            _unrope(dk, cos, sin),
            dv.transpose(1, 2).reshape(b, s, -1),
        )  # (B, S, H·hd), (B, S, KV·hd) x2
        # summed as they come, as sum() would: one (B, S, D) term alive at a time
        dn = functools.reduce(operator.add, (dp @ w[f"{p}.weight"] for p, dp in zip(PROJ, d_proj)))
        for p, dp in zip(PROJ, d_proj):
            add_weight_grad(dw, f"{p}.weight", dp, n.detach())  # (out, D)
            if dims.qkv_bias:
                dw[f"{p}.bias"].add_(dp.sum((0, 1)))
        torch.autograd.backward(n, dn)
    dw[NORM].add_(wn_.grad)  # type: ignore[arg-type]
    return x_.grad  # type: ignore[return-value]
