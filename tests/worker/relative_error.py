"""The relative L2 error the worker's tests compare tensors by."""

from __future__ import annotations

import torch


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """|a - b| / |b| (L2 over every element); b of norm zero counts as 1e-30."""
    return float((a - b).detach().norm() / b.detach().norm().clamp_min(1e-30))
