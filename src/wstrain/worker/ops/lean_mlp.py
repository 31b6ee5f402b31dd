"""The MLP block with a lean saved set: y = h + down(silu(gate(n)) * up(n)), n = RMSNorm(h).

Autograd would save n, its fp32 copies, gate, up, silu(gate) and their product — about
e·(d + 4f) + 8d bytes a token. Here the forward runs without a graph and hands back only h
and the two GEMM outputs gate and up, e·(d + 2f) bytes (a third of a Llama-8B layer's full
set); the backward recomputes just the cheap parts (the norm and the SwiGLU product) and
recomputes no GEMM. No autograd object outlives the forward, so nothing but these three
tensors holds device memory — whether they stay on the device or travel home. It is level
2's and level 3's MLP in working_set/schedule.py.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from wstrain.worker.models.blocks import GradViews, add_weight_grad
from wstrain.worker.models.dense import rms_norm, silu_mul, silu_mul_backward

NAMES = (
    "post_attention_layernorm.weight",
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
    "mlp.down_proj.weight",
)


@torch.no_grad()
def lean_forward(
    h: torch.Tensor, w: dict[str, torch.Tensor], eps: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(y, gate, up) for h: (B, S, D); gate and up are (B, S, F)."""
    w_norm, w_gate, w_up, w_down = (w[n] for n in NAMES)
    n = rms_norm(h, w_norm, eps)
    g, u = F.linear(n, w_gate), F.linear(n, w_up)
    return h + F.linear(silu_mul(g, u), w_down), g, u


def lean_backward(
    dy: torch.Tensor,
    h: torch.Tensor,
    saved: tuple[torch.Tensor, torch.Tensor] | None,
    w: dict[str, torch.Tensor],
    eps: float,
    dw: GradViews,
) -> torch.Tensor:
    """dL/dh from dy = dL/dy, the four weight gradients added into `dw`. (B, S, D) in and
    out. `saved`: the forward's (gate, up), or None to recompute them from the norm the
    backward recomputes anyway (levels 0-1: two GEMMs; the down projection's output is never
    needed)."""
    w_norm, w_gate, w_up, w_down = (w[n] for n in NAMES)
    with torch.enable_grad():
        h_, wn_ = h.detach().requires_grad_(), w_norm.detach().requires_grad_()
        n = rms_norm(h_, wn_, eps)  # (B, S, D): elementwise recompute
    g, u = (
        saved if saved is not None else (F.linear(n.detach(), w_gate), F.linear(n.detach(), w_up))
    )
    dg, du, p = silu_mul_backward(dy @ w_down, g, u)  # (B, S, F) each; p recomputed
    del g, u
    dn = dg @ w_gate + du @ w_up  # (B, S, D)
    # The weight gradients last: the first lookup in dw may wait for the gradient slot
    # (working_set/streamer.py LazyGradViews), and the three GEMMs above hide that wait.
    add_weight_grad(dw, NAMES[3], dy, p)  # (D, F)
    del p
    add_weight_grad(dw, NAMES[1], dg, n.detach())  # (F, D)
    add_weight_grad(dw, NAMES[2], du, n.detach())
    del dg, du
    dh, dw_norm = torch.autograd.grad(n, (h_, wn_), dn)
    dw[NAMES[0]].add_(dw_norm)
    return dy + dh
