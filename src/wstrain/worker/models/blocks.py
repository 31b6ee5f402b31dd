"""A decoder layer's two halves as functions of a weight dict (the views of one tile, on a
device slot or leaves of autograd): the attention block and the MLP block, dense or
mixture-of-experts. The working-set runtime (working_set/schedule.py) composes them per
saved-activation level; worker/profile/layer.py times them.

    h = attn_block(x, w, dims, cos, sin); y, probs = ffn_block(h, w, dims, router)
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F

from wstrain.contracts.model_dims import ModelDims
from wstrain.worker.models.dense import causal_attention, moe_block, project, rms_norm, swiglu
from wstrain.worker.models.moe import RouterTotals


def leaves(views: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Autograd leaves sharing the views' storage (gradients land in .grad)."""
    return {n: v.detach().requires_grad_() for n, v in views.items()}


def flat_tokens(t: torch.Tensor) -> torch.Tensor:
    """(B, S, X) -> (B*S, X): the token axis for weight-gradient GEMMs."""
    return t.reshape(-1, t.shape[-1])


def _part(w: dict[str, torch.Tensor], dims: ModelDims, p: str, suffix: str) -> torch.Tensor | None:
    """The layer's q/k/v bias or q/k norm weight named self_attn.{p}_{suffix}, where the
    model has them."""
    has = dims.qkv_bias if suffix == "proj.bias" else dims.qk_norm and p in "qk"
    return w[f"self_attn.{p}_{suffix}"] if has else None


def queries(
    n: torch.Tensor,
    w: dict[str, torch.Tensor],
    dims: ModelDims,
    cos: torch.Tensor,
    sin: torch.Tensor,
) -> torch.Tensor:
    """The layer's queries with RoPE from the normalised input n (B, S, D): (B, H, S, hd)."""
    norm, bias = _part(w, dims, "q", "norm.weight"), _part(w, dims, "q", "proj.bias")
    wq = w["self_attn.q_proj.weight"]
    return project(n, wq, dims.num_heads, cos, sin, norm, dims.rms_norm_eps, bias)


def keys_values(
    n: torch.Tensor,
    w: dict[str, torch.Tensor],
    dims: ModelDims,
    cos: torch.Tensor,
    sin: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The layer's keys (with RoPE) and values from n (B, S, D): (B, KV, S, hd) x2."""
    norm, bias = _part(w, dims, "k", "norm.weight"), _part(w, dims, "k", "proj.bias")
    wk, wv = w["self_attn.k_proj.weight"], w["self_attn.v_proj.weight"]
    kv, eps, hd = dims.num_kv_heads, dims.rms_norm_eps, cos.shape[-1]
    k = project(n, wk, kv, cos, sin, norm, eps, bias)
    return k, project(n, wv, kv, None, None, bias=_part(w, dims, "v", "proj.bias"), head_dim=hd)


def qkv(
    n: torch.Tensor,
    w: dict[str, torch.Tensor],
    dims: ModelDims,
    cos: torch.Tensor,
    sin: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The layer's queries, keys (with RoPE) and values from the normalised input n (B, S, D):
    (B, H, S, hd), (B, KV, S, hd) x2."""
    return (queries(n, w, dims, cos, sin), *keys_values(n, w, dims, cos, sin))


def out_proj(x: torch.Tensor, out: torch.Tensor, w: dict[str, torch.Tensor]) -> torch.Tensor:
    """h = x + o_proj(attention output). x: (B, S, D), out: (B, H, S, hd)"""
    b, s, _ = x.shape
    return x + F.linear(out.transpose(1, 2).reshape(b, s, -1), w["self_attn.o_proj.weight"])


def attn_block(
    x: torch.Tensor,
    w: dict[str, torch.Tensor],
    dims: ModelDims,
    cos: torch.Tensor,
    sin: torch.Tensor,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    n = rms_norm(x, w["input_layernorm.weight"], dims.rms_norm_eps)
    return out_proj(x, causal_attention(*qkv(n, w, dims, cos, sin), mask), w)  # (B, S, D)


def mlp_block(h: torch.Tensor, w: dict[str, torch.Tensor], dims: ModelDims) -> torch.Tensor:
    m = swiglu(
        rms_norm(h, w["post_attention_layernorm.weight"], dims.rms_norm_eps),
        w["mlp.gate_proj.weight"],
        w["mlp.up_proj.weight"],
        w["mlp.down_proj.weight"],
    )
    return h + m  # (B, S, D)


def ffn_block(
    h: torch.Tensor,
    w: dict[str, torch.Tensor],
    dims: ModelDims,
    router: RouterTotals | None = None,
    first: int = 0,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The layer's MLP half, dense or MoE: (h + MLP(norm(h)), router probs (T, E) or None);
    a MoE layer's routing goes into `router` (without its graph) as sequences first.. of its
    batch."""
    if not dims.is_moe:
        return mlp_block(h, w, dims), None
    y, probs, top_idx = moe_block(h, w, dims)
    if router is not None:
        router.add(probs.detach(), top_idx, first)
    return y, probs


class GradViews(Protocol):
    """A gradient slot's views by parameter name (a dict, or working_set/streamer.py's
    LazyGradViews, which takes its slot at the first lookup)."""

    def __getitem__(self, name: str) -> torch.Tensor: ...


def accumulate_grads(dw: GradViews, leaf_grads: dict[str, torch.Tensor]) -> None:
    """Add each leaf's gradient into the gradient slot's view of the same name."""
    add_grads(dw, {n: leaf.grad for n, leaf in leaf_grads.items() if leaf.grad is not None})


def add_grads(dw: GradViews, grads: dict[str, torch.Tensor]) -> None:
    """Add gradients by parameter name into the gradient slot's views."""
    for n, grad in grads.items():
        dw[n].add_(grad)


def add_weight_grad(dw: GradViews, name: str, d_out: torch.Tensor, inp: torch.Tensor) -> None:
    """dw[name] += d_out^T @ inp over the token axis, as one GEMM that accumulates in its
    epilogue (beta = 1): no (out, in) temporary and no separate add, which at Llama-3-8B
    dims and 8K tokens read and wrote 1.3 GB a (layer, sequence) in backward, 512 times a
    step at 16 layers and 32 sequences. d_out (..., out), inp (..., in)."""
    dw[name].addmm_(flat_tokens(d_out).t(), flat_tokens(inp))
