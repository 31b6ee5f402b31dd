"""worker/kernels/fp8_blocks.py's Triton casts against fp8_saves.py's eager ones, on the GPU:
the same e4m3 bytes, the same scales and the same decoded tensor, bit for bit, for blocks of
every magnitude (an all-zero block, values near e4m3's smallest and largest), and through
fp8_saves for a tensor laid out transposed.

    pytest -m gpu tests/worker/kernels/test_fp8_blocks.py
"""

from __future__ import annotations

import pytest
import torch

from wstrain.worker.kernels import fused as fused_ops
from wstrain.worker.runtime.working_set import fp8_saves

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not (torch.cuda.is_available() and fused_ops.triton), reason="needs CUDA and Triton"
    ),
]


def _casts(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    data, scales, layout = fp8_saves.encode(t)
    return data.view(torch.uint8), scales, fp8_saves.decode(data, scales, layout)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_triton_casts_equal_the_eager_casts_bit_for_bit(dtype: torch.dtype) -> None:
    g = torch.Generator(device="cpu").manual_seed(0)
    rows = 70_001  # not a multiple of the rows a program takes
    x = torch.randn(rows, 128, generator=g) * torch.logspace(-6, 3, rows)[:, None]
    x[5] = 0.0  # an all-zero block keeps a finite scale
    x[7, :3] = torch.tensor([448.0, -448.0, 1e-9])
    x = x.to("cuda", dtype)
    fused = _casts(x)
    fused_ops.ENABLED = False
    try:
        eager = _casts(x)
    finally:
        fused_ops.ENABLED = True
    for name, a, b in zip(("data", "scales", "decoded"), fused, eager):
        assert torch.equal(a, b), name
    assert torch.equal(fused[2][5], torch.zeros_like(x[5]))


def test_a_transposed_tensor_comes_back_with_its_strides() -> None:
    t = torch.randn(4, 256, 384, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    data, scales, layout = fp8_saves.encode(t)
    back = fp8_saves.decode(data, scales, layout)
    assert back.shape == t.shape and back.stride() == t.stride()
    rel = ((back.float() - t.float()).norm() / t.float().norm()).item()
    assert rel < 0.04  # e4m3's 3 mantissa bits: ~2.6% RMS on Gaussian data
