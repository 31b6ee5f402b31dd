"""The fused attention kernels a CUDA test runs a piece on, each a parameter that skips
cleanly where it cannot run (no CUDA; FA3 without its wheel or off Hopper), and the switch
that makes ops/prefix_attn.py choose it."""

from __future__ import annotations

import pytest
import torch

from wstrain.worker.kernels import fa3
from wstrain.worker.kernels.fa3 import fa3_present
from wstrain.worker.ops import prefix_attn

_CUDA = torch.cuda.is_available()
FUSED = [
    pytest.param(
        prefix_attn.FA3,
        marks=pytest.mark.skipif(
            not (_CUDA and fa3_present()), reason="needs FA3's wheel on a Hopper GPU"
        ),
    ),
    *(
        pytest.param(k, marks=pytest.mark.skipif(not _CUDA, reason="needs CUDA"))
        for k in (prefix_attn.CUDNN, prefix_attn.FLASH)
    ),
]


def use_kernel(kernel: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make prefix_attention take `kernel` (FA3 first where present, then cuDNN, then FA2)."""
    monkeypatch.setattr(fa3, "ENABLED", kernel == prefix_attn.FA3)
    monkeypatch.setattr(prefix_attn, "USE_CUDNN", kernel == prefix_attn.CUDNN)
