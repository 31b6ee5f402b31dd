"""Block-scaled fp8 casts (Triton) for saved activations on their way home and back
(working_set/fp8_saves.py): rows of 128 elements, each with one fp32 scale (the row's
absolute maximum over 448, e4m3's largest value, floored so an all-zero row stays finite).

The eager casts in fp8_saves.py make fp32 copies and run six kernels a block of rows on the
way out and three on the way back; on an H100 they cost a 16-layer, 8K-token, 32-sequence
step at 12 GiB 2.4 s (17.6 s against 15.2 s in bf16, bench/RESULTS.md). Here each way
reads its input once and writes its output once, with the same arithmetic: the scale as
the absolute maximum times fp32(1/448) (torch divides a tensor by a number so), the scaled
value by IEEE division, rounded to nearest-even into e4m3, and the decoded value as the
fp32 product rounded to the tensor's dtype, so they equal the eager casts bit for bit
(tests/worker/kernels/test_fp8_blocks.py, on a GPU).

    data, scales = encode_rows(rows)          # rows (N, 128) 16-bit contiguous, on CUDA
    decode_rows(data, scales, out)            # out (N, 128) 16-bit contiguous
"""

from __future__ import annotations

import torch

from wstrain.worker.kernels.fused import available, triton

ROWS_PER_PROGRAM = 32  # 4,096 elements a program: 8 KiB of bf16 in, 4 KiB of e4m3 out

if triton is not None:
    import triton.language as tl

    @triton.jit
    def _encode(x_ptr, data_ptr, scale_ptr, n_rows, INV_MAX: tl.constexpr,
                FLOOR: tl.constexpr, COLS: tl.constexpr, ROWS: tl.constexpr):  # fmt: skip
        rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
        offs = rows[:, None] * COLS + tl.arange(0, COLS)[None, :]
        live = rows < n_rows
        x = tl.load(x_ptr + offs, mask=live[:, None], other=0.0).to(tl.float32)
        amax = tl.max(tl.abs(x), axis=1)
        scale = tl.maximum(amax * INV_MAX, FLOOR)
        tl.store(scale_ptr + rows, scale, mask=live)
        y = tl.math.div_rn(x, scale[:, None])
        tl.store(data_ptr + offs, y.to(data_ptr.dtype.element_ty), mask=live[:, None])

    @triton.jit
    def _decode(data_ptr, scale_ptr, out_ptr, n_rows, COLS: tl.constexpr, ROWS: tl.constexpr):
        rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
        offs = rows[:, None] * COLS + tl.arange(0, COLS)[None, :]
        live = rows < n_rows
        d = tl.load(data_ptr + offs, mask=live[:, None], other=0.0).to(tl.float32)
        scale = tl.load(scale_ptr + rows, mask=live, other=0.0)
        y = d * scale[:, None]
        tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask=live[:, None])


def encode_rows(
    rows: torch.Tensor, fp8: torch.dtype, fp8_max: float, floor: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(data (N, C) in `fp8`, scales (N,) fp32) of rows (N, C) 16-bit, contiguous, CUDA."""
    assert available(rows) and rows.is_contiguous() and rows.dim() == 2, rows.shape
    n, cols = rows.shape
    data = torch.empty(rows.shape, dtype=fp8, device=rows.device)
    scales = torch.empty(n, dtype=torch.float32, device=rows.device)
    grid = (triton.cdiv(n, ROWS_PER_PROGRAM),)
    _encode[grid](
        rows, data, scales, n, INV_MAX=1.0 / fp8_max, FLOOR=floor, COLS=cols, ROWS=ROWS_PER_PROGRAM
    )
    return data, scales


def decode_rows(data: torch.Tensor, scales: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """out (N, C) 16-bit = data (N, C) fp8 x scales (N,) fp32, rounded to out's dtype."""
    assert available(data) and scales.is_cuda and out.is_contiguous() and out.shape == data.shape
    n, cols = data.shape
    grid = (triton.cdiv(n, ROWS_PER_PROGRAM),)
    _decode[grid](data, scales, out, n, COLS=cols, ROWS=ROWS_PER_PROGRAM)
    return out
