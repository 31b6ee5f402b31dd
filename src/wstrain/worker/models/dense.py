"""A Llama-style decoder (RMSNorm, RoPE from worker/models/rope.py, GQA attention through
SDPA or, where its wheel runs, FlashAttention-3 (kernels/fa3.py), SwiGLU MLP, untied LM
head) whose parameter names are exactly Hugging Face `LlamaForCausalLM`'s, so checkpoints
load in `transformers` and tests compare against it — and its variants: Qwen3's per-head
q/k RMSNorm, OLMoE's q/k RMSNorm over whole projections, Qwen2's q/k/v biases, and
mixture-of-experts MLPs (worker/models/moe.py; Qwen2-MoE's gated shared expert) named as
OLMoE / Qwen3-MoE / Qwen2-MoE checkpoints name them on the Hub.

    from wstrain.worker.models.dense import LlamaModel; m = LlamaModel(PRESETS["tiny-llama"])
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from wstrain.contracts.model_dims import ModelDims
from wstrain.worker.kernels import fused as fused_ops
from wstrain.worker.kernels.fa3 import fa3_causal_attention, fa3_takes
from wstrain.worker.models import moe
from wstrain.worker.models.rope import apply_rope, rope_tables


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, S, D)
        return rms_norm(x, self.weight, self.eps)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Hugging Face's LlamaRMSNorm: normalise in fp32, scale in the input dtype (one fused
    kernel each way on CUDA: worker/kernels/fused.py). (B, S, D)"""
    if fused_ops.available(x, weight):
        return fused_ops.rms_norm_fused(x, weight, eps)
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


class Attention(nn.Module):
    def __init__(self, dims: ModelDims) -> None:
        super().__init__()
        d, hd = dims.hidden_size, dims.head_dim
        self.n_heads, self.n_kv, self.head_dim = dims.num_heads, dims.num_kv_heads, hd
        self.q_proj = nn.Linear(d, dims.num_heads * hd, bias=dims.qkv_bias)
        self.k_proj = nn.Linear(d, dims.num_kv_heads * hd, bias=dims.qkv_bias)
        self.v_proj = nn.Linear(d, dims.num_kv_heads * hd, bias=dims.qkv_bias)
        self.o_proj = nn.Linear(dims.num_heads * hd, d, bias=False)
        self.eps = dims.rms_norm_eps
        if dims.qk_norm:  # Qwen3: per head; OLMoE: over the whole projection
            per_head = dims.qk_norm_per_head
            self.q_norm = RMSNorm(hd if per_head else dims.num_heads * hd, dims.rms_norm_eps)
            self.k_norm = RMSNorm(hd if per_head else dims.num_kv_heads * hd, dims.rms_norm_eps)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        qk = (self.q_norm.weight, self.k_norm.weight) if hasattr(self, "q_norm") else None
        bias = (
            (self.q_proj.bias, self.k_proj.bias, self.v_proj.bias)
            if self.q_proj.bias is not None
            else None
        )
        return attention(
            x,
            self.q_proj.weight,
            self.k_proj.weight,
            self.v_proj.weight,
            self.o_proj.weight,
            cos,
            sin,
            self.n_heads,
            self.n_kv,
            qk,
            self.eps,
            bias,
            mask,
        )


def project(
    x: torch.Tensor,
    w: torch.Tensor,
    heads: int,
    cos: torch.Tensor | None,
    sin: torch.Tensor | None,
    norm: torch.Tensor | None = None,
    eps: float = 1e-6,
    bias: torch.Tensor | None = None,
    head_dim: int | None = None,
) -> torch.Tensor:
    """One of the attention's projections in SDPA's layout (B, heads, S, hd), a transposed
    view of (B, S, heads, hd): x·wᵀ (+ bias), RMS-normalised by `norm` (per head when it is
    head_dim wide, as Qwen3; over the whole projection otherwise, as OLMoE), with RoPE when
    cos/sin are given (queries and keys; not values). x: (B, S, D), already normalised."""
    b, s, _ = x.shape
    hd = head_dim or (cos.shape[-1] if cos is not None else w.shape[0] // heads)
    t = F.linear(x, w, bias)  # (B, S, heads*hd)
    if norm is not None and norm.shape[-1] != hd:
        t = rms_norm(t, norm, eps)
    t = t.view(b, s, heads, hd)  # (B, S, heads, hd)
    if norm is not None and norm.shape[-1] == hd:
        t = rms_norm(t, norm, eps)
    if cos is not None and sin is not None:
        t = apply_rope(t, cos.unsqueeze(-2), sin.unsqueeze(-2))  # (S | B,S, 1, hd) tables
    return t.transpose(1, 2)


def project_qkv(
    x: torch.Tensor,
    wq: torch.Tensor,
    wk: torch.Tensor,
    wv: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    n_heads: int,
    n_kv: int,
    qk_norm: tuple[torch.Tensor, torch.Tensor] | None = None,
    eps: float = 1e-6,
    bias: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Queries and keys with RoPE, and values, in SDPA's layout: (B, H, S, hd), (B, KV, S, hd),
    (B, KV, S, hd) — transposed views of (B, S, heads, hd) tensors. With `qk_norm` queries and
    keys are RMS-normalised before RoPE: per head when the norm weights are head_dim wide
    (Qwen3), over the whole projection otherwise (OLMoE); `bias`: q/k/v biases (Qwen2).
    x: (B, S, D), already normalised"""
    hd = cos.shape[-1]
    bq, bk, bv = bias or (None, None, None)
    nq, nk = qk_norm or (None, None)
    return (
        project(x, wq, n_heads, cos, sin, nq, eps, bq),
        project(x, wk, n_kv, cos, sin, nk, eps, bk),
        project(x, wv, n_kv, None, None, bias=bv, head_dim=hd),
    )


def document_mask(segments: torch.Tensor) -> torch.Tensor:
    """(B, 1, S, S) bool: a query attends to the keys at or before it in its own document
    (dense: S² bytes a sequence). segments: (B, S) each token's document within its sequence."""
    s = segments.shape[1]
    causal = torch.ones(s, s, dtype=torch.bool, device=segments.device).tril()
    return ((segments[:, :, None] == segments[:, None, :]) & causal)[:, None]


def causal_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """SDPA, causal, or under `mask` (document_mask: within each packed document); grouped-
    query heads go to the kernel as they are (no repeated K/V, so autograd keeps K and V at
    their own size). Causal bf16 at head dim 128 on a Hopper GPU with FA3's wheel: FA3
    (0.89x cuDNN's fwd+bwd time at 32K on an H100). (B, H, S, hd), (B, KV, S, hd) x2 ->
    (B, H, S, hd)"""
    gqa = q.shape[1] != k.shape[1]
    if mask is None and q.is_cuda and fa3_takes(q.dtype, q.shape[-1]):
        return fa3_causal_attention(q, k, v)
    if mask is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)


def attention(
    x: torch.Tensor,
    wq: torch.Tensor,
    wk: torch.Tensor,
    wv: torch.Tensor,
    wo: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    n_heads: int,
    n_kv: int,
    qk_norm: tuple[torch.Tensor, torch.Tensor] | None = None,
    eps: float = 1e-6,
    bias: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal GQA self-attention with RoPE through SDPA (project_qkv's options; `mask`:
    see causal_attention). x: (B, S, D) -> (B, S, D)"""
    b, s, _ = x.shape
    out = causal_attention(
        *project_qkv(x, wq, wk, wv, cos, sin, n_heads, n_kv, qk_norm, eps, bias), mask
    )  # (B, H, S, hd)
    return F.linear(out.transpose(1, 2).reshape(b, s, -1), wo)


def silu_mul(g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """SwiGLU's product silu(g) * u (one fused kernel each way on CUDA). g, u: same shape"""
    if fused_ops.available(g, u):
        return fused_ops.silu_mul_fused(g, u)
    return F.silu(g) * u


def silu_mul_backward(
    dp: torch.Tensor, g: torch.Tensor, u: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dL/dg, dL/du, silu(g)·u) from dp = dL/d(silu(g)·u), for explicit backwards that
    also need the product (a weight gradient's input). All the same shape."""
    if fused_ops.available(dp, g, u):
        dg, du, p = fused_ops.swiglu_backward(dp, g, u, want_p=True)
        return dg, du, p  # type: ignore[return-value]
    with torch.enable_grad():
        g_, u_ = g.detach().requires_grad_(), u.detach().requires_grad_()
        p = F.silu(g_) * u_
    dg, du = torch.autograd.grad(p, (g_, u_), dp)
    return dg, du, p.detach()


def swiglu(
    x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor
) -> torch.Tensor:
    """down(silu(gate(x)) * up(x)). x: (B, S, D) -> (B, S, D)"""
    return F.linear(silu_mul(F.linear(x, w_gate), F.linear(x, w_up)), w_down)


class MLP(nn.Module):
    def __init__(self, dims: ModelDims, width: int | None = None) -> None:
        super().__init__()
        d, f = dims.hidden_size, width or dims.intermediate_size
        self.gate_proj = nn.Linear(d, f, bias=False)
        self.up_proj = nn.Linear(d, f, bias=False)
        self.down_proj = nn.Linear(f, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return swiglu(x, self.gate_proj.weight, self.up_proj.weight, self.down_proj.weight)


def moe_block(
    h: torch.Tensor, w: dict[str, torch.Tensor], dims: ModelDims
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """h + MoE(RMSNorm(h)), with the router's probs (T, E) and choices (T, k). h: (B, S, D);
    w holds the router and the stacked experts under worker/models/moe.py's names."""
    n = rms_norm(h, w["post_attention_layernorm.weight"], dims.rms_norm_eps)
    nf = n.reshape(-1, dims.hidden_size)  # (T, D)
    probs, top_idx, top_w = moe.route(
        nf, w[moe.ROUTER], dims.experts_per_token, dims.norm_topk_prob
    )
    m = moe.experts(nf, top_idx, top_w, *(w[name] for name in moe.EXPERTS))
    if moe.SHARED_GATE in w:  # Qwen2-MoE: + sigmoid(gate(x)) * shared_expert(x)
        m = m + shared_expert(nf, w)
    return h + m.view_as(h), probs, top_idx


def shared_expert(x: torch.Tensor, w: dict[str, torch.Tensor]) -> torch.Tensor:
    """sigmoid(x · w_gate) * SwiGLU_shared(x), every token. x: (T, D) -> (T, D)"""
    return torch.sigmoid(F.linear(x, w[moe.SHARED_GATE])) * swiglu(
        x, *(w[name] for name in moe.SHARED)
    )


class SparseMoE(nn.Module):
    """Router `gate` and `experts.{e}.{gate,up,down}_proj`: the Hub checkpoints' names."""

    def __init__(self, dims: ModelDims) -> None:
        super().__init__()
        d, f = dims.hidden_size, dims.moe_intermediate_size
        self.gate = nn.Linear(d, dims.num_experts, bias=False)
        self.experts = nn.ModuleList(MLP(dims, f) for _ in range(dims.num_experts))
        if dims.shared_expert_intermediate_size:  # Qwen2-MoE
            self.shared_expert = MLP(dims, dims.shared_expert_intermediate_size)
            self.shared_expert_gate = nn.Linear(d, 1, bias=False)

    def weights(self) -> dict[str, object]:
        gate, up, down = (
            [getattr(e, n).weight for e in self.experts]
            for n in ("gate_proj", "up_proj", "down_proj")
        )
        out = dict(zip((moe.ROUTER, *moe.EXPERTS), (self.gate.weight, gate, up, down)))
        if hasattr(self, "shared_expert"):
            se = self.shared_expert
            out.update(
                zip(
                    (*moe.SHARED, moe.SHARED_GATE),
                    (
                        se.gate_proj.weight,
                        se.up_proj.weight,
                        se.down_proj.weight,
                        self.shared_expert_gate.weight,
                    ),
                )
            )
        return out


class DecoderLayer(nn.Module):
    def __init__(self, dims: ModelDims) -> None:
        super().__init__()
        self.dims = dims
        self.input_layernorm = RMSNorm(dims.hidden_size, dims.rms_norm_eps)
        self.self_attn = Attention(dims)
        self.post_attention_layernorm = RMSNorm(dims.hidden_size, dims.rms_norm_eps)
        self.mlp = SparseMoE(dims) if dims.is_moe else MLP(dims)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        router: moe.RouterTotals | None = None,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask)
        if isinstance(self.mlp, SparseMoE):
            w = {
                "post_attention_layernorm.weight": self.post_attention_layernorm.weight,
                **self.mlp.weights(),
            }
            y, probs, top_idx = moe_block(x, w, self.dims)  # type: ignore[arg-type]
            if router is not None:
                router.add(probs, top_idx)
            return y
        return x + self.mlp(self.post_attention_layernorm(x))


class Backbone(nn.Module):
    def __init__(self, dims: ModelDims) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(
            dims.vocab_size, dims.hidden_size, padding_idx=dims.pad_token_id
        )
        self.layers = nn.ModuleList(DecoderLayer(dims) for _ in range(dims.num_layers))
        self.norm = RMSNorm(dims.hidden_size, dims.rms_norm_eps)


class LlamaModel(nn.Module):
    """Parameter names match `LlamaForCausalLM.state_dict()` exactly (and
    `Qwen3ForCausalLM`'s when dims.qk_norm)."""

    def __init__(self, dims: ModelDims) -> None:
        super().__init__()
        self.dims = dims
        self.model = Backbone(dims)
        self.lm_head = nn.Linear(dims.hidden_size, dims.vocab_size, bias=False)

    def forward(
        self,
        tokens: torch.Tensor,
        router: moe.RouterTotals | None = None,
        documents: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """(B, S) -> logits (B, S, V); MoE layers add their routing to `router`. With
        `documents` (positions, segments), each (B, S): RoPE at the positions and attention
        within each segment (packed documents kept apart)."""
        x = self.model.embed_tokens(tokens)  # (B, S, D)
        cos, sin = rope_tables(self.dims, tokens.shape[1], x.device, x.dtype)  # (S, hd)
        mask = None
        if documents is not None:  # per token, (B, S, hd): positions restart per document
            cos, sin = cos[documents[0]], sin[documents[0]]
            mask = document_mask(documents[1])
        for layer in self.model.layers:
            x = layer(x, cos, sin, router, mask)
        return self.lm_head(self.model.norm(x))


def causal_lm_loss(
    logits: torch.Tensor, targets: torch.Tensor, reduction: str = "mean"
) -> torch.Tensor:
    """Next-token cross entropy in fp32 (mean or sum over the targets that are not -100);
    targets are already shifted. (B, S, V), (B, S)"""
    return F.cross_entropy(
        logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction=reduction
    )
