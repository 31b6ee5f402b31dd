"""Mixture-of-experts MLP as OLMoE and Qwen3-MoE compute it (Hugging Face `OlmoeSparseMoeBlock`,
`Qwen3MoeSparseMoeBlock`): a linear router, softmax in fp32, the top-k experts per token
(weights renormalised when `norm_topk_prob`), SwiGLU experts, and the Switch-Transformer
load-balancing loss exactly as `load_balancing_loss_func` computes it over all layers.

The aux loss couples the layers only through two (E,) sums — routed-token counts and router
probabilities over every layer and token of a batch — and the counts carry no gradient, so
its gradient reaches each layer's probabilities as one (E,) vector known once the forward
has seen every layer: `aux_prob_grad`. The working-set runtime applies it in each layer's
backward without keeping anything else of the forward.

    probs, top_idx, top_w = route(x, w_router, top_k, norm_topk)       # x: (T, D)
    m = experts(x, top_idx, top_w, w_gate, w_up, w_down)                # (T, D)
(worker/model.py's `moe_block` puts them behind the layer's RMSNorm.)
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

ROUTER = "mlp.gate.weight"
# a layer's experts, stacked (E, ., .) under these names in worker/arena.py's layout
EXPERTS = ("mlp.experts.*.gate_proj.weight", "mlp.experts.*.up_proj.weight",
           "mlp.experts.*.down_proj.weight")


def route(x: torch.Tensor, w_router: torch.Tensor, top_k: int,
          norm_topk: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(probs (T, E) fp32, top_idx (T, k), top_w (T, k) in x's dtype) for x: (T, D)."""
    logits = F.linear(x, w_router)  # (T, E)
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
    top_w, top_idx = torch.topk(probs, top_k, dim=-1)
    if norm_topk:
        top_w = top_w / top_w.sum(dim=-1, keepdim=True)
    return probs, top_idx, top_w.to(x.dtype)


def _grouped(xs: torch.Tensor, counts: torch.Tensor, w: Sequence[torch.Tensor]) -> bool:
    """torch's grouped GEMM (one kernel for all experts, no host sync) serves bf16 on CUDA
    with the experts stacked in one tensor; elsewhere the experts run one by one."""
    return (xs.is_cuda and xs.dtype == torch.bfloat16 and isinstance(w, torch.Tensor)
            and hasattr(torch, "_grouped_mm"))


def experts(x: torch.Tensor, top_idx: torch.Tensor, top_w: torch.Tensor,
            w_gate: Sequence[torch.Tensor], w_up: Sequence[torch.Tensor],
            w_down: Sequence[torch.Tensor]) -> torch.Tensor:
    """sum over each token's k experts of top_w · down(silu(gate(x)) * up(x)). x: (T, D);
    w_gate/w_up: E of (I, D), w_down: E of (D, I), stacked (E, ., .) or a list."""
    n_experts, k = len(w_gate), top_idx.shape[-1]
    flat = top_idx.reshape(-1)  # (T*k,)
    order = torch.argsort(flat, stable=True)  # (token, slot) pairs grouped by expert
    token = order // k
    counts = torch.bincount(flat, minlength=n_experts)  # (E,)
    xs = x[token]  # (T*k, D)
    if _grouped(xs, counts, w_gate):
        offs = torch.cumsum(counts, 0).to(torch.int32)
        g = torch._grouped_mm(xs, w_gate.transpose(-2, -1), offs=offs)  # type: ignore[union-attr]
        u = torch._grouped_mm(xs, w_up.transpose(-2, -1), offs=offs)  # type: ignore[union-attr]
        ys = torch._grouped_mm(F.silu(g) * u, w_down.transpose(-2, -1),  # type: ignore[union-attr]
                               offs=offs)
    else:
        parts = [F.linear(F.silu(F.linear(part, w_gate[e])) * F.linear(part, w_up[e]), w_down[e])
                 for e, part in enumerate(xs.split(counts.tolist())) if part.shape[0]]
        ys = torch.cat(parts) if parts else xs.new_zeros(0, x.shape[-1])
    ys = ys * top_w.reshape(-1)[order, None]  # (T*k, D)
    return x.new_zeros(x.shape).index_add(0, token, ys)


class RouterTotals:
    """Per-expert sums over the layers and tokens of one batch: routed-token counts and
    router probabilities — all `load_balancing_loss_func` needs. Probabilities added with
    their graph keep it (the resident runtime backpropagates `loss()` directly)."""

    def __init__(self, n_experts: int, device: torch.device) -> None:
        self.counts = torch.zeros(n_experts, device=device, dtype=torch.float32)
        self.probs = torch.zeros(n_experts, device=device, dtype=torch.float32)
        self.rows = 0  # (layer, token) pairs seen

    def add(self, probs: torch.Tensor, top_idx: torch.Tensor) -> None:
        self.counts += torch.bincount(top_idx.reshape(-1), minlength=self.counts.numel())
        self.probs = self.probs + probs.sum(0)
        self.rows += probs.shape[0]

    def loss(self) -> torch.Tensor:
        """E · Σ_e (counts_e / rows) · (probs_e / rows)"""
        e = self.counts.numel()
        return e * torch.sum((self.counts / self.rows) * (self.probs / self.rows))

    def prob_grad(self, weight: float) -> torch.Tensor:
        """d(weight · loss)/d probs[t, e] for every (layer, token) row: an (E,) vector."""
        return weight * self.counts.numel() * self.counts / self.rows ** 2
