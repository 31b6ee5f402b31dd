"""Saved activations stored at 8 bits (opt-in, JobSpec.activation_precision = "fp8"): a
16-bit tensor on its way home is cast on the device to float8 e4m3 with one fp32 scale per
block of 128 consecutive elements (the block's absolute maximum over 448, e4m3's largest
value), so the link and the host carry 1 + 4/128 bytes an element instead of 2, and
backward takes back the block-scaled values in the tensor's own dtype, shape and strides.
Lossy: e4m3 keeps 3 mantissa bits (relative rounding error up to 2^-4, ~2.6% RMS on
Gaussian data); PyAO and COAT report near-lossless training with per-block scaled fp8
activations. What stays exact: fp32 tensors (the attention's log-sum-exp), anything whose
size is not a multiple of a block.

    if eligible(t): data, scales, layout = encode(t)     # on the device, then home
    t2 = decode(data, scales, layout)                    # back on the device in backward
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from wstrain.contracts.calibration import FP8_BLOCK_ELEMENTS
from wstrain.worker.kernels import fp8_blocks
from wstrain.worker.kernels.fused import available
from wstrain.worker.runtime.working_set.host_store import HostRoom

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # e4m3fn's largest finite value
BLOCK = FP8_BLOCK_ELEMENTS  # elements per scale: 4 bytes of scale per 128 bytes of data
SCALE_FLOOR = 1e-30  # an all-zero block keeps a finite scale (its values decode to 0)
ENCODE_ROWS = 1 << 16  # blocks cast at once: a 16K-token gate/up pair is 0.9 GiB in fp32


@dataclass(frozen=True)
class Fp8Layout:
    """How to give a decoded tensor back its shape, dtype and strides."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    order: tuple[int, ...]  # the dimensions outermost first: permute(order) is contiguous


def _order(t: torch.Tensor) -> tuple[int, ...]:
    return tuple(sorted(range(t.dim()), key=lambda d: -t.stride()[d]))


def eligible(t: torch.Tensor) -> bool:
    """A 16-bit float tensor laid out densely (any permutation), whole blocks."""
    return (
        t.dtype in (torch.bfloat16, torch.float16)
        and t.numel() >= BLOCK
        and t.numel() % BLOCK == 0
        and t.permute(_order(t)).is_contiguous()
    )


def encode(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, Fp8Layout]:
    """(data fp8 (N/128, 128), scales fp32 (N/128,), layout) of an eligible tensor."""
    order = _order(t)
    rows = t.permute(order).reshape(-1, BLOCK)  # (N/128, 128), memory order
    layout = Fp8Layout(tuple(t.shape), t.dtype, order)
    if available(rows):  # one read, one write (kernels/fp8_blocks.py)
        return (*fp8_blocks.encode_rows(rows, FP8, FP8_MAX, SCALE_FLOOR), layout)
    data = torch.empty(rows.shape, dtype=FP8, device=t.device)
    scales = torch.empty(rows.shape[0], dtype=torch.float32, device=t.device)
    for r0 in range(0, rows.shape[0], ENCODE_ROWS):  # an fp32 temporary of 32 MiB at most
        part = rows[r0 : r0 + ENCODE_ROWS].float()
        sc = part.abs().amax(1).mul_(1.0 / FP8_MAX).clamp_min_(SCALE_FLOOR)
        scales[r0 : r0 + ENCODE_ROWS] = sc
        data[r0 : r0 + ENCODE_ROWS] = part.div_(sc[:, None]).to(FP8)
    return data, scales, layout


def decode(data: torch.Tensor, scales: torch.Tensor, layout: Fp8Layout) -> torch.Tensor:
    """The tensor encode() took, block-rounded, with its dtype, shape and strides."""
    x = torch.empty(data.shape, dtype=layout.dtype, device=data.device)  # (N/128, 128)
    if available(data):
        fp8_blocks.decode_rows(data, scales, x)
    else:  # in blocks of rows, as encode: the fp32 temporary stays at 32 MiB
        for r0 in range(0, data.shape[0], ENCODE_ROWS):
            part = data[r0 : r0 + ENCODE_ROWS].float().mul_(scales[r0 : r0 + ENCODE_ROWS, None])
            x[r0 : r0 + ENCODE_ROWS] = part
    x = x.view([layout.shape[d] for d in layout.order])
    inverse = sorted(range(len(layout.order)), key=lambda i: layout.order[i])
    return x.permute(inverse)


@dataclass
class Fp8Home:
    """A HostCopy's scales and layout when its data went home in fp8."""

    scales: HostRoom  # on the host, fp32 (N/128,)
    layout: Fp8Layout
    scales_device: torch.Tensor | None = None  # prefetched beside the data
