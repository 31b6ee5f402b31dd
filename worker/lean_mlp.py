"""The MLP block with a lean saved set: y = h + down(silu(gate(n)) * up(n)), n = RMSNorm(h).

Autograd would save n, its fp32 copies, gate, up, silu(gate) and their product — about
e·(d + 4f) + 8d bytes a token. This Function saves only h and the two GEMM outputs gate and
up, e·(d + 2f) bytes (a third of a Llama-8B layer's full set), and in backward recomputes just
the cheap parts (the norm and the SwiGLU product); no GEMM is recomputed. It is level 2's and
level 3's MLP in worker/working_set.py, where those bytes are what travels home.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from worker.model import rms_norm


def _flat(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1, t.shape[-1])  # (B*S, X)


class LeanSwiGLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h: torch.Tensor, w_norm: torch.Tensor, w_gate: torch.Tensor,  # type: ignore[override]
                w_up: torch.Tensor, w_down: torch.Tensor, eps: float) -> torch.Tensor:
        n = rms_norm(h, w_norm, eps)  # (B, S, D)
        g, u = F.linear(n, w_gate), F.linear(n, w_up)  # (B, S, F) each
        ctx.save_for_backward(h, g, u, w_norm, w_gate, w_up, w_down)
        ctx.eps = eps
        return h + F.linear(F.silu(g) * u, w_down)

    @staticmethod
    def backward(ctx, dy: torch.Tensor):  # type: ignore[override]
        h, g, u, w_norm, w_gate, w_up, w_down = ctx.saved_tensors
        with torch.enable_grad():
            g_, u_ = g.detach().requires_grad_(), u.detach().requires_grad_()
            p = F.silu(g_) * u_  # (B, S, F), recomputed: elementwise only
            h_, wn_ = h.detach().requires_grad_(), w_norm.detach().requires_grad_()
            n = rms_norm(h_, wn_, ctx.eps)  # (B, S, D), recomputed: elementwise only
        dw_down = _flat(dy).t() @ _flat(p.detach())  # (D, F)
        dg, du = torch.autograd.grad(p, (g_, u_), dy @ w_down)
        n_flat = _flat(n.detach())
        dw_gate, dw_up = _flat(dg).t() @ n_flat, _flat(du).t() @ n_flat  # (F, D) each
        dh, dw_norm = torch.autograd.grad(n, (h_, wn_), dg @ w_gate + du @ w_up)
        return dy + dh, dw_norm, dw_gate, dw_up, dw_down, None


def lean_mlp_block(h: torch.Tensor, w: dict[str, torch.Tensor], eps: float) -> torch.Tensor:
    return LeanSwiGLU.apply(h, w["post_attention_layernorm.weight"], w["mlp.gate_proj.weight"],
                            w["mlp.up_proj.weight"], w["mlp.down_proj.weight"], eps)
