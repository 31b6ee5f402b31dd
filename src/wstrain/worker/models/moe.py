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
(worker/models/dense.py's `moe_block` puts them behind the layer's RMSNorm.)
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

ROUTER = "mlp.gate.weight"
# a layer's experts, stacked (E, ., .) under these names in working_set/arena.py's layout
EXPERTS = (
    "mlp.experts.*.gate_proj.weight",
    "mlp.experts.*.up_proj.weight",
    "mlp.experts.*.down_proj.weight",
)
# Qwen2-MoE's shared expert (every token, gated by a sigmoid of one linear unit)
SHARED = (
    "mlp.shared_expert.gate_proj.weight",
    "mlp.shared_expert.up_proj.weight",
    "mlp.shared_expert.down_proj.weight",
)
SHARED_GATE = "mlp.shared_expert_gate.weight"


def route(
    x: torch.Tensor, w_router: torch.Tensor, top_k: int, norm_topk: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(probs (T, E) fp32, top_idx (T, k), top_w (T, k) in x's dtype) for x: (T, D)."""
    logits = F.linear(x, w_router)  # (T, E)
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
    top_w, top_idx = torch.topk(probs, top_k, dim=-1)
    if norm_topk:
        top_w = top_w / top_w.sum(dim=-1, keepdim=True)
    return probs, top_idx, top_w.to(x.dtype)


class Groups:
    """A batch's (token, slot) pairs grouped by expert: the gather order and group sizes."""

    def __init__(self, top_idx: torch.Tensor, n_experts: int) -> None:
        self.k = top_idx.shape[-1]
        flat = top_idx.reshape(-1)  # (T*k,)
        self.order = torch.argsort(flat, stable=True)  # pairs grouped by expert
        self.token = self.order // self.k  # (T*k,) the token of each grouped pair
        self.counts = torch.bincount(flat, minlength=n_experts)  # (E,)
        self.offs = torch.cumsum(self.counts, 0).to(torch.int32)
        self._sizes: list[int] | None = None

    @property
    def sizes(self) -> list[int]:
        """Group sizes on the host (one device sync, only on the expert-by-expert path)."""
        if self._sizes is None:
            self._sizes = self.counts.tolist()
        return self._sizes


def _grouped_ok(x: torch.Tensor, w: object) -> bool:
    """torch's grouped GEMM (one kernel for all experts, no host sync) serves bf16 on CUDA
    with the experts stacked in one tensor; elsewhere the experts run one by one."""
    return (
        x.is_cuda
        and x.dtype == torch.bfloat16
        and isinstance(w, torch.Tensor)
        and hasattr(torch, "_grouped_mm")
    )


def grouped_linear(
    x: torch.Tensor,
    w: torch.Tensor | Sequence[torch.Tensor],
    groups: Groups,
    transpose: bool = True,
) -> torch.Tensor:
    """Each group's rows of x (N, in) times its expert's weight: w[e]^T (w[e]: (out, in)),
    or w[e] itself when not `transpose` (w[e]: (in, out)); `w` the experts stacked (E, ., .)
    or one tensor each. -> (N, out)"""
    if isinstance(w, torch.Tensor) and _grouped_ok(x, w):
        wt = w.transpose(-2, -1) if transpose else w
        return torch._grouped_mm(x, wt, offs=groups.offs)
    # experts with no rows multiply too: their weights get a zero gradient, as transformers'
    # fused experts give them (so AdamW still decays them), instead of none
    return torch.cat(
        [part @ (w[e].t() if transpose else w[e]) for e, part in enumerate(x.split(groups.sizes))]
    )


def grouped_outer(a: torch.Tensor, b: torch.Tensor, groups: Groups) -> torch.Tensor:
    """Per expert a_e^T @ b_e over its group's rows: (N, p), (N, q) -> (E, p, q)."""
    if _grouped_ok(a, a):
        return torch._grouped_mm(a.t(), b, offs=groups.offs)
    return torch.stack([x.t() @ y for x, y in zip(a.split(groups.sizes), b.split(groups.sizes))])


def experts(
    x: torch.Tensor,
    top_idx: torch.Tensor,
    top_w: torch.Tensor,
    w_gate: torch.Tensor | Sequence[torch.Tensor],
    w_up: torch.Tensor | Sequence[torch.Tensor],
    w_down: torch.Tensor | Sequence[torch.Tensor],
) -> torch.Tensor:
    """sum over each token's k experts of top_w · down(silu(gate(x)) * up(x)), differentiable.
    x: (T, D); w_gate/w_up: E of (I, D), w_down: E of (D, I), stacked (E, ., .) or a list."""
    groups = Groups(top_idx, len(w_gate))
    xs = x[groups.token]  # (T*k, D)
    p = F.silu(grouped_linear(xs, w_gate, groups)) * grouped_linear(xs, w_up, groups)
    ys = grouped_linear(p, w_down, groups) * top_w.reshape(-1)[groups.order, None]  # (T*k, D)
    return x.new_zeros(x.shape).index_add(0, groups.token, ys)


class RouterTotals:
    """Per sequence and expert, sums over the layers and the sequence's tokens: routed-token
    counts and router probabilities — what `load_balancing_loss_func` needs, sequence by
    sequence. `loss()` is the sum over the batch's sequences of each one's load-balancing
    loss (its own routed fractions and mean probabilities, over all layers, as
    transformers computes it for a batch of one); the runtimes divide by the global batch's
    sequences, so the term is a mean over sequences, the same however a plan cuts the step
    into micro-batches. (transformers pools one batch's tokens, so its value moves with the
    per-device batch size.) Probabilities added with their graph keep it: the resident
    runtime backpropagates `loss()` directly.

        totals = RouterTotals(n_experts, device, sequences=B, seq_len=S)
        totals.add(probs, top_idx, first=0)    # (b*S, E), (b*S, k): sequences first..first+b
    """

    def __init__(self, n_experts: int, device: torch.device, sequences: int, seq_len: int) -> None:
        self.counts = torch.zeros(sequences, n_experts, device=device, dtype=torch.float32)
        self.probs = torch.zeros(sequences, n_experts, device=device, dtype=torch.float32)
        self.rows = torch.zeros(sequences, 1, device=device, dtype=torch.float32)
        self.seq_len = seq_len

    def add(self, probs: torch.Tensor, top_idx: torch.Tensor, first: int = 0) -> None:
        """One layer's routing of sequences [first, first + b): probs (b*S, E), top_idx
        (b*S, k)."""
        b, e = probs.shape[0] // self.seq_len, probs.shape[1]
        at = torch.arange(first, first + b, device=probs.device)
        ones = torch.ones(top_idx.numel(), device=probs.device, dtype=torch.float32)
        routed = torch.zeros(b, e, device=probs.device).scatter_add_(
            1, top_idx.reshape(b, -1), ones.view(b, -1)
        )  # (b, E) top-k picks per expert
        self.counts[first : first + b] += routed
        self.probs = self.probs.index_add(0, at, probs.view(b, self.seq_len, e).sum(1))
        self.rows[first : first + b] += self.seq_len

    def loss(self) -> torch.Tensor:
        """Σ_b E · Σ_e (counts_be / rows_b) · (probs_be / rows_b)"""
        e = self.counts.shape[1]
        return e * torch.sum((self.counts / self.rows) * (self.probs / self.rows))

    def prob_grad(self, weight: float) -> torch.Tensor:
        """d(weight · loss)/d probs[t, e] for each (layer, token) row of sequence b: a
        (sequences, E) table, row b for every row of sequence b."""
        return weight * self.counts.shape[1] * self.counts / self.rows**2
