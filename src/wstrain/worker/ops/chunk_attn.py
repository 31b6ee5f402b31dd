"""The attention block of a decoder layer over a long sequence, one chunk of tokens at a
time: h = x + o_proj(attention(q, K, V)) for the chunk's rows [s0, s1), where K and V are
the layer's keys and values of the whole sequence so far, held in a context window on the
device (AdaWS §3.3; GQA keeps it small: 4 KiB a token at Llama-3-8B dims, 2 GiB at 512K).

Forward, chunks in order: each chunk's k and v go into the window, its queries attend to
[0, s1) (ops/prefix_attn.py); saved for backward are the chunk's input x and, when the plan
keeps them, the attention output and its log-sum-exp (the chunk's own size, never the
prefix's). Backward, chunks in reverse order: first `put` refills the window's K and V
from every chunk's input (the norm and the two thin K/V projections, ~4% of the layer's
GEMM FLOPs), then each chunk's backward adds its keys' and values' gradients for the whole
prefix into the window's fp32 dK/dV, so when a chunk's turn comes its own rows of dK/dV
hold every later chunk's part and it can finish the gradient through its projections.

    win = ContextWindow.like(dims, batch, seq_len, dtype, device)  # or ops/host_window.py's
    h, out, lse = chunk_attn_forward(x, w, dims, cos[s0:s1], sin[s0:s1], win, s0)  # no graph
    # backward of a layer: every chunk's K, V back in the window, then chunks reversed
    for each chunk: win.put(x, w, dims, cos_c, sin_c, s0, want_queries=False)
    win.zero_grads()
    dx = chunk_attn_backward(dh, x, out, lse, w, dims, cos_c, sin_c, win, s0, dw)  # grads into dw
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from wstrain.contracts.model_dims import ModelDims
from wstrain.worker.models.blocks import GradViews, keys_values, out_proj, queries
from wstrain.worker.models.dense import rms_norm
from wstrain.worker.ops.document_attn import (
    Runs,
    document_attention,
    document_attention_backward,
)
from wstrain.worker.ops.lean_attn import NORM, out_proj_backward, qkv_backward
from wstrain.worker.ops.prefix_attn import prefix_attention, prefix_attention_backward


class Window(ABC):
    """A layer's keys and values of the sequences in pieces, on the device (ContextWindow)
    or on the host a block at a time (ops/host_window.py): what a piece's attention asks."""

    def put(
        self,
        x: torch.Tensor,
        w: dict[str, torch.Tensor],
        dims: ModelDims,
        cos: torch.Tensor,
        sin: torch.Tensor,
        s0: int,
        want_queries: bool = True,
    ) -> torch.Tensor | None:
        """Project chunk x (B, c, D) at rows [s0, s0+c): its k and v into the window; returns
        its queries (B, H, c, hd), or None without `want_queries` (backward's rebuild: the
        queries' projection is then not computed). No graph."""
        k, v, q = project(x, w, dims, cos, sin, want_queries)
        self.store(k, v, s0, forward=want_queries)
        return q

    @abstractmethod
    def store(self, k: torch.Tensor, v: torch.Tensor, s0: int, forward: bool) -> None:
        """The rows [s0, s0+c) of k, v (B, KV, c, hd) into the window; `forward`: the
        piece's attention follows."""

    @abstractmethod
    def attention(
        self, q: torch.Tensor, s0: int, runs: Runs | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(out (B, H, c, hd), lse (B, H, c) fp32) of the queries q (B, H, c, hd) at rows
        [s0, s0+c) over the window's keys [0, s0+c) (of q's B sequences)."""

    @abstractmethod
    def backward(
        self,
        d_out: torch.Tensor,
        q: torch.Tensor,
        out: torch.Tensor,
        lse: torch.Tensor,
        s0: int,
        runs: Runs | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(dq (B, H, c, hd) fp32, dK and dV of the rows [s0, s0+c) (B, KV, c, hd) in q's
        dtype, complete) of the attention at rows [s0, s0+c); the gradients of the earlier
        keys are added into the window's sums."""

    @abstractmethod
    def zero_grads(self) -> None:
        """Before a chunk's backward through a layer: every gradient sum zero."""


@dataclass
class ContextWindow(Window):
    """One layer's keys and values of the sequences being processed, and in backward the
    fp32 sums of their gradients. k, v: (B, KV, S, hd); dk, dv: fp32, allocated by the
    first zero_grads (the forward and eval need none)."""

    k: torch.Tensor
    v: torch.Tensor
    dk: torch.Tensor | None = None
    dv: torch.Tensor | None = None

    @classmethod
    def like(
        cls, dims: ModelDims, batch: int, seq_len: int, dtype: torch.dtype, device: torch.device
    ) -> ContextWindow:
        shape = (batch, dims.num_kv_heads, seq_len, dims.head_dim)
        k = torch.empty(shape, dtype=dtype, device=device)
        return cls(k, torch.empty_like(k))

    def zero_grads(self) -> None:
        if self.dk is None:
            self.dk = torch.zeros(self.k.shape, dtype=torch.float32, device=self.k.device)
            self.dv = torch.zeros_like(self.dk)
        else:
            self.dk.zero_()
            self.dv.zero_()  # type: ignore[union-attr]

    def attention(
        self, q: torch.Tensor, s0: int, runs: Runs | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        b, s1 = q.shape[0], s0 + q.shape[2]
        k, v = self.k[:b, :, :s1], self.v[:b, :, :s1]
        if runs is None:
            return prefix_attention(q, k, v, s0)
        return document_attention(q, k, v, s0, runs)

    def backward(
        self,
        d_out: torch.Tensor,
        q: torch.Tensor,
        out: torch.Tensor,
        lse: torch.Tensor,
        s0: int,
        runs: Runs | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        assert self.dk is not None and self.dv is not None, "zero_grads() before a backward"
        b, s1 = q.shape[0], s0 + q.shape[2]
        ks, vs = self.k[:b, :, :s1], self.v[:b, :, :s1]  # (B, KV, s1, hd)
        dk_sum, dv_sum = self.dk[:b, :, :s1], self.dv[:b, :, :s1]
        if runs is None:
            dq = prefix_attention_backward(d_out, q, ks, vs, out, lse, s0, dk_sum, dv_sum)
        else:
            dq = document_attention_backward(d_out, q, ks, vs, out, lse, s0, dk_sum, dv_sum, runs)
        # this piece's rows are complete: every later piece has added its part
        return dq, dk_sum[:, :, s0:].to(q.dtype), dv_sum[:, :, s0:].to(q.dtype)

    def store(self, k: torch.Tensor, v: torch.Tensor, s0: int, forward: bool) -> None:
        b, s1 = k.shape[0], s0 + k.shape[2]  # b: fewer sequences than the window holds
        self.k[:b, :, s0:s1] = k
        self.v[:b, :, s0:s1] = v


def project(
    x: torch.Tensor,
    w: dict[str, torch.Tensor],
    dims: ModelDims,
    cos: torch.Tensor,
    sin: torch.Tensor,
    want_queries: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(k, v (B, KV, c, hd), queries (B, H, c, hd) or None) of the chunk x (B, c, D): the
    attention block's norm and projections, with RoPE at the chunk's rows. No graph."""
    with torch.no_grad():
        n = rms_norm(x, w[NORM], dims.rms_norm_eps)  # (B, c, D)
        k, v = keys_values(n, w, dims, cos, sin)
        return k, v, queries(n, w, dims, cos, sin) if want_queries else None


def chunk_attn_forward(
    x: torch.Tensor,
    w: dict[str, torch.Tensor],
    dims: ModelDims,
    cos: torch.Tensor,
    sin: torch.Tensor,
    win: Window,
    s0: int,
    runs: Runs | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(h (B, c, D), attention output (B, H, c, hd), its lse (B, H, c) fp32) of the chunk x
    (B, c, D) at rows [s0, s0+c), whose earlier rows' k and v are in `win`; cos, sin are the
    chunk's rows of the RoPE tables ((c, hd), or (B, c, hd) per token with documents);
    runs: the sequences' packed documents, or None. No graph."""
    q = win.put(x, w, dims, cos, sin, s0)  # (B, H, c, hd)
    assert q is not None
    with torch.no_grad():
        out, lse = win.attention(q, s0, runs)
        return out_proj(x, out, w), out, lse


def chunk_attn_backward(
    dh: torch.Tensor,
    x: torch.Tensor,
    out: torch.Tensor | None,
    lse: torch.Tensor | None,
    w: dict[str, torch.Tensor],
    dims: ModelDims,
    cos: torch.Tensor,
    sin: torch.Tensor,
    win: Window,
    s0: int,
    dw: GradViews,
    runs: Runs | None = None,
) -> torch.Tensor:
    """dL/dx (B, c, D) of the chunk at rows [s0, s0+c) from dh = dL/dh, the block's weight
    gradients added into `dw`; `win` holds K and V of the whole sequence and, in its dk/dv
    rows [s0, s0+c), the gradient every later chunk sent there. out/lse: the forward's, or
    None to recompute them (one attention forward more); runs: as the forward's."""
    with torch.no_grad():
        q = queries(rms_norm(x, w[NORM], dims.rms_norm_eps), w, dims, cos, sin)  # (B, H, c, hd)
        if out is None or lse is None:
            out, lse = win.attention(q, s0, runs)
        d_out = out_proj_backward(dh, out, w, dims, dw)
        dq, dk_c, dv_c = win.backward(d_out, q, out, lse, s0, runs)  # dk_c (B, KV, c, hd)
        del d_out, q
    return dh + qkv_backward(dq.to(x.dtype), dk_c, dv_c, x, w, dims, cos, sin, dw)
