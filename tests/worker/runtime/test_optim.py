"""The optimizer's pieces: the squared gradient norm in bounded fp32 pieces equals the norm
torch computes over the whole tensor."""

from __future__ import annotations

import pytest
import torch

from wstrain.worker.runtime import optim


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_sq_norm_in_pieces_equals_torch(
    monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype
) -> None:
    monkeypatch.setattr(optim, "NORM_CHUNK_ELEMS", 1000)  # many pieces, one ragged
    t = (torch.randn(37, 301, generator=torch.Generator().manual_seed(0)) * 3).to(dtype)
    want = torch.linalg.vector_norm(t.float()) ** 2
    got = optim.sq_norm_fp32(t)
    assert got.dtype == torch.float32 and got.shape == ()
    assert abs(float(got) - float(want)) < 1e-5 * float(want)


@pytest.mark.parametrize("fused", [False, True], ids=["foreach", "fused"])
def test_host_step_with_clipping_matches_torch(fused: bool) -> None:
    """HostState.step_group (the fused kernel clips through its grad_scale) against
    clip_grad_norm_'s factor applied to the gradient and torch's AdamW, over two steps with
    and without clipping."""
    from wstrain.contracts.model_dims import PRESETS
    from wstrain.contracts.spec import OptimizerSpec
    from wstrain.worker.runtime.working_set.state import HostState

    host = HostState.create(PRESETS["tiny-llama"], "fp32", pin=False, fused_adamw=fused)
    spec = OptimizerSpec(lr=1e-2, weight_decay=0.1)
    g = torch.Generator().manual_seed(0)
    w0 = torch.randn(host.params[0].numel(), generator=g)
    ref = torch.nn.Parameter(w0.clone())
    ref_opt = torch.optim.AdamW([ref], lr=1e-2, betas=spec.betas, eps=spec.eps, weight_decay=0.1)
    host.params[0].data.copy_(w0)
    for coef in (0.3, 1.0):
        grad = torch.randn(w0.shape, generator=g)
        host.params[0].grad.copy_(grad)
        host.step_group(0, 1e-2, coef, spec)
        ref.grad = grad * coef
        ref_opt.step()
        err = (host.params[0].data - ref.data).norm() / ref.data.norm()
        assert err < 1e-6, (coef, float(err))
