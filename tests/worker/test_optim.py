"""The optimizer's pieces: the squared gradient norm in bounded fp32 pieces equals the norm
torch computes over the whole tensor."""

from __future__ import annotations

import pytest
import torch

from worker import optim


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_sq_norm_in_pieces_equals_torch(monkeypatch: pytest.MonkeyPatch,
                                        dtype: torch.dtype) -> None:
    monkeypatch.setattr(optim, "NORM_CHUNK_ELEMS", 1000)  # many pieces, one ragged
    t = (torch.randn(37, 301, generator=torch.Generator().manual_seed(0)) * 3).to(dtype)
    want = torch.linalg.vector_norm(t.float()) ** 2
    got = optim.sq_norm_fp32(t)
    assert got.dtype == torch.float32 and got.shape == ()
    assert abs(float(got) - float(want)) < 1e-5 * float(want)
