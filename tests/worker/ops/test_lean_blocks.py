"""The lean attention and MLP blocks' backwards (worker/ops/lean_attn.py, lean_mlp.py) add
their weight gradients into a gradient slot's views in place, as the working-set runtime
hands them a flat slot that already holds earlier rounds' sums: the slot afterwards equals
what it held plus autograd's gradients of the plain layer (models/blocks.py), fp32, for
GQA, q/k norms and q/k/v biases, with the MLP's set saved and recomputed.

    pytest tests/worker/ops/test_lean_blocks.py
"""

from __future__ import annotations

import pytest
import torch

from tests.worker.relative_error import rel_err
from wstrain.contracts.model_dims import ModelDims
from wstrain.worker.models.blocks import attn_block, ffn_block, leaves
from wstrain.worker.models.rope import rope_tables
from wstrain.worker.ops.lean_attn import lean_attn_backward, lean_attn_forward
from wstrain.worker.ops.lean_mlp import lean_backward, lean_forward
from wstrain.worker.runtime.working_set.arena import LayerLayout

DIMS = [
    ModelDims(97, 48, 80, 1, 4, 2, 12, 1e-5, 10000.0, 64),  # GQA 2:1
    ModelDims(97, 48, 80, 1, 4, 2, 16, 1e-6, 1000000.0, 64, model_type="qwen3"),  # q/k norms
    ModelDims(97, 64, 96, 1, 8, 2, 8, 1e-6, 1000000.0, 64, qkv_bias=True),
]


@pytest.mark.parametrize("dims", DIMS, ids=["gqa", "qk-norm", "qkv-bias"])
@pytest.mark.parametrize("mlp_saved", [True, False], ids=["mlp-saved", "mlp-recomputed"])
def test_lean_backwards_add_every_weight_gradient_into_the_slot(
    dims: ModelDims, mlp_saved: bool
) -> None:
    g = torch.Generator().manual_seed(0)
    layout = LayerLayout.decoder(dims)
    w = layout.views(0.2 * torch.randn(layout.numel, generator=g))
    for name, t in w.items():
        if name.endswith("norm.weight"):
            t.add_(1.0)
    slot = torch.randn(layout.numel, generator=g)  # earlier rounds' sums
    before = {n: t.clone() for n, t in layout.views(slot).items()}
    cos, sin = rope_tables(dims, 24, torch.device("cpu"), torch.float32)
    x = torch.randn(2, 24, dims.hidden_size, generator=g)  # (B, S, D)
    dy = torch.randn(2, 24, dims.hidden_size, generator=g)

    h, out, core = lean_attn_forward(x, w, dims, cos, sin)
    _, gate, up = lean_forward(h, w, dims.rms_norm_eps)
    dw = layout.views(slot)
    dh = lean_backward(dy, h, (gate, up) if mlp_saved else None, w, dims.rms_norm_eps, dw)
    dx = lean_attn_backward(dh, x, out, core, w, dims, cos, sin, dw)

    xa, wl = x.clone().requires_grad_(), leaves(w)
    ffn_block(attn_block(xa, wl, dims, cos, sin), wl, dims)[0].backward(dy)
    assert xa.grad is not None
    assert rel_err(dx, xa.grad) < 1e-5
    for name, leaf in wl.items():
        assert leaf.grad is not None, name
        assert rel_err(dw[name] - before[name], leaf.grad) < 1e-5, name
