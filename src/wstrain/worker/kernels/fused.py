"""Fused elementwise kernels (Triton) for the decoder's memory-bound ops: RMSNorm forward
and backward, RoPE, the SwiGLU product with its backward, and the fp32 gradient sums of a
piece's attention (ops/prefix_attn.py: dq, dk, dv added a block of keys at a time).

Eager PyTorch runs Hugging Face's RMSNorm as seven kernels over fp32 copies, RoPE as five
(two of them broadcasting, unvectorised), and SwiGLU's backward as four; at Llama-3-8B dims
and 8K tokens they took ~2.9 s of a 17.2 s working-set step (H200, bench/RESULTS.md).
Each op here reads its inputs once and writes its outputs once, computing in fp32 and
rounding where Hugging Face rounds (the normalised activations are rounded to the input
dtype before the weight scales them). worker/models/dense.py dispatches to these on CUDA
tensors when Triton is importable and
`ENABLED` is set; everywhere else (CPU, the CI) the eager code runs, so the tests against
`transformers` exercise the same model code. tests/worker/kernels/test_fused.py checks each
kernel against the eager op on the GPU.

    y = rms_norm_fused(x, w, eps)        # autograd-aware; x (..., D)
    q = rope_fused(q, cos, sin)          # (B, S, H, hd) strided in, contiguous out
    p = silu_mul_fused(g, u)             # autograd-aware; dg, du, p = swiglu_backward(dp, g, u)
    add_into(dk_sum, dk)                 # fp32 (B, H, T, E) += bf16/fp16/fp32, unit last stride
"""

from __future__ import annotations

import torch

ENABLED = True  # bench/runtime.py --eager-kernels turns it off for an A/B in one run

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs (the CI): the eager ops run instead
    triton = None


def available(*tensors: torch.Tensor) -> bool:
    """True when the fused kernels may run on these tensors (CUDA, one dtype, Triton)."""
    return (
        ENABLED
        and triton is not None
        and all(t.is_cuda for t in tensors)
        and len({t.dtype for t in tensors}) == 1
    )


if triton is not None:

    @triton.jit
    def _rms_fwd(X, W, Y, stride_x, D, eps, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        mask = cols < D
        x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.rsqrt(tl.sum(x * x, axis=0) / D + eps)
        xhat = (x * rstd).to(Y.dtype.element_ty)  # rounded as Hugging Face rounds
        w = tl.load(W + cols, mask=mask, other=0.0)
        tl.store(
            Y + row * D + cols,
            (w.to(tl.float32) * xhat.to(tl.float32)).to(Y.dtype.element_ty),
            mask=mask,
        )

    @triton.jit
    def _rms_bwd(DY, X, W, DX, DW_PART, stride_x, rows, D, eps, BLOCK: tl.constexpr):
        # a persistent grid: each program walks rows pid, pid + G, ... and sums its share
        # of the weight gradient in fp32; the host side adds the G partial rows
        pid = tl.program_id(0)
        progs = tl.num_programs(0)
        cols = tl.arange(0, BLOCK)
        mask = cols < D
        w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
        dw = tl.zeros([BLOCK], dtype=tl.float32)
        for row in range(pid, rows, progs):
            r = tl.cast(row, tl.int64)
            x = tl.load(X + r * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
            dy = tl.load(DY + r * D + cols, mask=mask, other=0.0).to(tl.float32)
            rstd = tl.rsqrt(tl.sum(x * x, axis=0) / D + eps)
            xhat = x * rstd
            dw += dy * xhat.to(DX.dtype.element_ty).to(tl.float32)
            dxhat = (dy * w).to(DX.dtype.element_ty).to(tl.float32)
            mean_dot = tl.sum(dxhat * xhat, axis=0) / D
            tl.store(
                DX + r * D + cols,
                ((dxhat - xhat * mean_dot) * rstd).to(DX.dtype.element_ty),
                mask=mask,
            )
        tl.store(DW_PART + pid.to(tl.int64) * D + cols, dw, mask=mask)

    @triton.jit
    def _rope(
        X,
        COS,
        SIN,
        Y,
        S,
        ROWS,
        H,
        sxb,
        sxs,
        sxh,
        HALF: tl.constexpr,
        BLOCK_H: tl.constexpr,
        BLOCK_D: tl.constexpr,
    ):
        # one program per token (b, s): all its heads, both halves of each head; its table
        # row is s (ROWS = S, shared tables) or the token itself (ROWS = B·S, per token)
        tok = tl.program_id(0).to(tl.int64)
        b, s = tok // S, tok % S
        row = tok % ROWS
        heads = tl.arange(0, BLOCK_H)[:, None]
        d = tl.arange(0, BLOCK_D)[None, :]
        mask = (heads < H) & (d < HALF)
        src = X + b * sxb + s * sxs + heads * sxh + d
        x1 = tl.load(src, mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(src + HALF, mask=mask, other=0.0).to(tl.float32)
        dmask = d < HALF
        c1 = tl.load(COS + row * 2 * HALF + d, mask=dmask, other=0.0).to(tl.float32)
        c2 = tl.load(COS + row * 2 * HALF + HALF + d, mask=dmask, other=0.0).to(tl.float32)
        s1 = tl.load(SIN + row * 2 * HALF + d, mask=dmask, other=0.0).to(tl.float32)
        s2 = tl.load(SIN + row * 2 * HALF + HALF + d, mask=dmask, other=0.0).to(tl.float32)
        dst = Y + tok * H * 2 * HALF + heads * 2 * HALF + d
        tl.store(dst, (x1 * c1 - x2 * s1).to(Y.dtype.element_ty), mask=mask)
        tl.store(dst + HALF, (x2 * c2 + x1 * s2).to(Y.dtype.element_ty), mask=mask)

    @triton.jit
    def _silu_mul(G, U, P, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        g = tl.load(G + offs, mask=mask, other=0.0).to(tl.float32)
        u = tl.load(U + offs, mask=mask, other=0.0).to(tl.float32)
        tl.store(P + offs, (g * tl.sigmoid(g) * u).to(P.dtype.element_ty), mask=mask)

    @triton.jit
    def _silu_mul_bwd(DP, G, U, DG, DU, P, n, WRITE_P: tl.constexpr, BLOCK: tl.constexpr):
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        dp = tl.load(DP + offs, mask=mask, other=0.0).to(tl.float32)
        g = tl.load(G + offs, mask=mask, other=0.0).to(tl.float32)
        u = tl.load(U + offs, mask=mask, other=0.0).to(tl.float32)
        sig = tl.sigmoid(g)
        silu = g * sig
        tl.store(DU + offs, (dp * silu).to(DU.dtype.element_ty), mask=mask)
        tl.store(
            DG + offs, (dp * u * sig * (1.0 + g * (1.0 - sig))).to(DG.dtype.element_ty), mask=mask
        )
        if WRITE_P:
            tl.store(P + offs, (silu * u).to(P.dtype.element_ty), mask=mask)

    @triton.jit
    def _add_into(
        DST, SRC, T, H, sdb, sdh, sdt, ssb, ssh, sst, E: tl.constexpr, BLOCK_T: tl.constexpr
    ):
        # one program per BLOCK_T rows of one (b, h): E contiguous elements a row on both sides
        bh = tl.program_id(1).to(tl.int64)
        b, h = bh // H, bh % H
        t = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)[:, None]
        e = tl.arange(0, E)[None, :]
        mask = t < T
        dst = DST + b * sdb + h * sdh + t * sdt + e
        src = tl.load(SRC + b * ssb + h * ssh + t * sst + e, mask=mask, other=0.0)
        tl.store(dst, tl.load(dst, mask=mask, other=0.0) + src.to(tl.float32), mask=mask)


ELEMENTWISE_BLOCK = 4096
ADD_ROWS = 32  # rows of a (b, h) a program: 32 x 128 elements, 16 KiB of fp32 sums in and out
ADD_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
GRID_Y_MAX = 65535  # CUDA's limit on a grid's second dimension: the (b, h) pairs
RMS_BWD_PROGRAMS = 264  # two per H100/H200 multiprocessor; the partial sums are G x D fp32


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x as (rows, D) with unit stride along D (a view where the layout allows)."""
    x2 = x.reshape(-1, x.shape[-1])
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


def _block(d: int) -> tuple[int, int]:
    block = triton.next_power_of_2(d)
    return block, max(1, min(16, block // 512))  # (BLOCK, num_warps)


def rms_norm_forward(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    x2 = _rows(x)
    y = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    block, warps = _block(x2.shape[1])
    _rms_fwd[(x2.shape[0],)](x2, w, y, x2.stride(0), x2.shape[1], eps, BLOCK=block, num_warps=warps)
    return y.view(x.shape)


def rms_norm_backward(
    dy: torch.Tensor, x: torch.Tensor, w: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(dL/dx, dL/dw) of y = w * RMSNorm(x); dw summed in fp32, returned in w's dtype."""
    x2, dy2 = _rows(x), dy.reshape(-1, dy.shape[-1]).contiguous()
    rows, d = x2.shape
    progs = min(rows, RMS_BWD_PROGRAMS)
    dx = torch.empty((rows, d), dtype=x.dtype, device=x.device)
    part = torch.empty((progs, d), dtype=torch.float32, device=x.device)
    block, warps = _block(d)
    _rms_bwd[(progs,)](
        dy2, x2, w, dx, part, x2.stride(0), rows, d, eps, BLOCK=block, num_warps=warps
    )
    return dx.view(x.shape), part.sum(0).to(w.dtype)


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, eps):
        ctx.save_for_backward(x, w)
        ctx.eps = eps
        return rms_norm_forward(x, w, eps)

    @staticmethod
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        dx, dw = rms_norm_backward(dy, x, w, ctx.eps)
        return dx, dw, None


def rms_norm_fused(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """w * RMSNorm(x) over the last dim, one kernel each way. x: (..., D), w: (D,)"""
    return _RMSNorm.apply(x, w, eps)


def rope_fused(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x·cos + rotate_half(x)·sin for x: (B, S, H, hd), any strides with a unit last stride;
    cos, sin: (S, hd) shared by the batch, or (B·S, hd) one row per token (packed
    documents' positions), contiguous. Returns a contiguous (B, S, H, hd) tensor. The
    backward of RoPE is this with -sin (a rotation's transpose)."""
    b, s, h, hd = x.shape
    rows = cos.shape[0]
    if rows not in (s, b * s) or cos.shape != sin.shape:
        raise ValueError(f"RoPE tables of {rows} rows for x {tuple(x.shape)}: want S or B·S")
    if x.stride(-1) != 1:
        x = x.contiguous()
    y = torch.empty((b, s, h, hd), dtype=x.dtype, device=x.device)
    half = hd // 2
    _rope[(b * s,)](
        x,
        cos,
        sin,
        y,
        s,
        rows,
        h,
        x.stride(0),
        x.stride(1),
        x.stride(2),
        HALF=half,
        BLOCK_H=triton.next_power_of_2(h),
        BLOCK_D=triton.next_power_of_2(half),
        num_warps=4,
    )
    return y


class _RoPE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, cos, sin):
        ctx.save_for_backward(cos, sin)
        return rope_fused(x, cos, sin)

    @staticmethod
    def backward(ctx, dy):
        cos, sin = ctx.saved_tensors
        return rope_fused(dy, cos, -sin), None, None


def rope_autograd(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """rope_fused with its backward (cos, sin: (S, hd) or (B·S, hd), no gradient)."""
    return _RoPE.apply(x, cos, sin)


def _flat_pair(g: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return g.contiguous().view(-1), u.contiguous().view(-1)


def silu_mul(g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """silu(g) * u, one kernel, no graph. g, u: same shape."""
    gf, uf = _flat_pair(g, u)
    p = torch.empty(g.shape, dtype=g.dtype, device=g.device)
    n = gf.numel()
    _silu_mul[(triton.cdiv(n, ELEMENTWISE_BLOCK),)](
        gf, uf, p, n, BLOCK=ELEMENTWISE_BLOCK, num_warps=8
    )
    return p


def swiglu_backward(
    dp: torch.Tensor, g: torch.Tensor, u: torch.Tensor, want_p: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(dL/dg, dL/du, and silu(g)·u when `want_p`) from dp = dL/d(silu(g)·u), one pass."""
    gf, uf = _flat_pair(g, u)
    dpf = dp.contiguous().view(-1)
    dg, du = (torch.empty(g.shape, dtype=g.dtype, device=g.device) for _ in range(2))
    p = torch.empty(g.shape, dtype=g.dtype, device=g.device) if want_p else dg
    n = gf.numel()
    _silu_mul_bwd[(triton.cdiv(n, ELEMENTWISE_BLOCK),)](
        dpf, gf, uf, dg, du, p, n, WRITE_P=want_p, BLOCK=ELEMENTWISE_BLOCK, num_warps=8
    )
    return dg, du, p if want_p else None


class _SiluMul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, g, u):
        ctx.save_for_backward(g, u)
        return silu_mul(g, u)

    @staticmethod
    def backward(ctx, dp):
        g, u = ctx.saved_tensors
        dg, du, _ = swiglu_backward(dp, g, u)
        return dg, du


def silu_mul_fused(g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """silu(g) * u with its fused backward (autograd saves g and u only)."""
    return _SiluMul.apply(g, u)


def add_into(dst: torch.Tensor, src: torch.Tensor) -> None:
    """dst += src, dst fp32 (B, H, T, E), src the same shape in bf16, fp16 or fp32, any strides
    with a unit last stride (FA3's gradients come back as (B, T, H, E) memory seen as
    (B, H, T, E)). Eager PyTorch adds a strided bf16 tensor into fp32 with its generic
    casting kernel, one element a thread; this reads each row's E elements once on both
    sides and writes them once. Off CUDA, without Triton, or for shapes it does not take:
    the eager add."""
    e = dst.shape[-1]
    if not (
        ENABLED
        and triton is not None
        and dst.is_cuda
        and src.is_cuda
        and dst.device == src.device
        and dst.dtype == torch.float32
        and src.dtype in ADD_DTYPES
        and dst.dim() == 4
        and dst.shape == src.shape
        and dst.stride(-1) == 1
        and src.stride(-1) == 1
        and 0 not in dst.stride()  # an expanded sum: programs would race on its elements
        and e == triton.next_power_of_2(e)
        and e <= 256
        and dst.shape[0] * dst.shape[1] <= GRID_Y_MAX
    ):
        dst += src
        return
    b, h, t, _ = dst.shape
    _add_into[(triton.cdiv(t, ADD_ROWS), b * h)](
        dst, src, t, h, *dst.stride()[:3], *src.stride()[:3], E=e, BLOCK_T=ADD_ROWS, num_warps=4
    )
