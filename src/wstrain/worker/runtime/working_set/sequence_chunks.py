"""Long context in the working-set runtime: each chunk's sequences pass through a layer one
piece of `seq_chunk` tokens at a time (AdaWS §3.3), so what a layer holds on the device is a
piece's activations plus the layer's context window of K and V (ops/chunk_attn.py), never
the whole sequence's, and the schedule of working_set/schedule.py is otherwise the same with
a (chunk, piece) unit where it had a chunk.

Saved per (layer, unit), at the plan's level: the piece's input x always; + the attention
output and its log-sum-exp (levels 1, 3: backward then runs no attention forward); + the
MLP's gate and up (levels 2, 3: worker/ops/lean_mlp.py). Backward of a layer takes a chunk's
pieces in reverse after `rebuild` has put every piece's K and V back into the window from the
inputs (each fetched once more, or kept on the device from the rebuild for its piece's
backward where the prefetch reached its backward entry while the rebuild's copy came in).

Packed documents (document_mask): RoPE positions per token and each piece's attention
within its documents (ops/document_attn.py), the runs read from the segments once a pass.
Dense models only (MoE routing is per sequence).

    pieces = PieceLayers(dims, cfg.chunk, cfg.seq_len, cfg.seq_chunk, dtype, device,
                         arena if cfg.window_home else None)
    at = PieceRows(s0, cos[s0:s1], sin[s0:s1])              # a unit's rows (+ runs: documents)
    y, g = pieces.forward(x, w, level, stash, at)           # per unit, in order
    pieces.rebuild([(x, at) ...], w)                         # per chunk, before backward
    dx = pieces.backward(g, dy, w, unstash, at, dw)          # per unit, reversed
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from wstrain.contracts.model_dims import ModelDims
from wstrain.worker.models.blocks import GradViews, ffn_block, out_proj
from wstrain.worker.ops.chunk_attn import (
    ContextWindow,
    Window,
    chunk_attn_backward,
    chunk_attn_forward,
)
from wstrain.worker.ops.document_attn import Runs
from wstrain.worker.ops.host_window import HostWindow
from wstrain.worker.ops.lean_mlp import lean_backward, lean_forward
from wstrain.worker.ops.prefix_attn import kernel_for
from wstrain.worker.runtime.working_set.arena import HostArena

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PieceRows:
    """Where a (chunk, piece) unit sits: its first row s0 in the sequences, its rows of the
    RoPE tables ((c, hd), or (b, c, hd) per token with documents) and, with documents, the
    chunk's sequences' document runs."""

    s0: int
    cos: torch.Tensor
    sin: torch.Tensor
    runs: Runs | None = None


@dataclass
class PieceGraph:
    """What one (layer, unit) forward left for backward: device tensors or HostCopy's."""

    x: object
    out: object = None  # levels 1, 3: the attention output (B, H, c, hd) and its lse
    lse: object = None
    lean: tuple[object, ...] | None = None  # levels 2, 3: the MLP's gate and up

    def stashed(self) -> tuple[object, ...]:
        """Everything it saved, in the order backward takes it."""
        return (self.x, self.out, self.lse, *(self.lean or ()))


class PieceLayers:
    def __init__(
        self,
        dims: ModelDims,
        batch: int,
        seq_len: int,
        piece: int,
        dtype: torch.dtype,
        device: torch.device,
        home: HostArena | None = None,
    ) -> None:
        """`home`: the host arena to keep the window in (the plan's window_home), or None to
        keep it on the device."""
        if dims.is_moe:
            raise ValueError(
                f"long context by pieces (seq_chunk) is for dense models; {dims.model_type} "
                "is a mixture of experts: set seq_chunk=0"
            )
        self.dims = dims
        self.win: Window = (
            HostWindow(
                dims,
                batch,
                seq_len,
                piece,
                dtype,
                torch.device(device),
                lambda name, numel, dt: home.alloc(name, numel, dt, "window"),
            )
            if home is not None
            else ContextWindow.like(dims, batch, seq_len, dtype, device)
        )
        # the plan names the kernel it expects; this is the one this GPU runs
        log.info(
            "long context: a window of %d x %d tokens on the %s, attention kernel %s",
            batch,
            seq_len,
            "host" if home is not None else "device",
            kernel_for(torch.device(device), dtype, False, dims.head_dim),
        )

    def forward(
        self,
        x: torch.Tensor,
        w: dict[str, torch.Tensor],
        level: int,
        stash: Callable[[torch.Tensor], object],
        at: PieceRows,
    ) -> tuple[torch.Tensor, PieceGraph]:
        """The layer's output for the piece x (B, c, D) at rows [s0, s0+c), whose sequences'
        earlier pieces went through this layer just before it; what it saved."""
        g = PieceGraph(x=stash(x))
        h, out, lse = self._attention(x, w, at)
        if level in (1, 3):
            g.out, g.lse = stash(out), stash(lse)
        del out, lse
        if level in (2, 3):
            y, *rest = lean_forward(h, w, self.dims.rms_norm_eps)
            g.lean = tuple(stash(t) for t in rest)
        else:
            with torch.no_grad():
                y, _ = ffn_block(h, w, self.dims)
        return y, g

    def eval_forward(
        self,
        x: torch.Tensor,
        w: dict[str, torch.Tensor],
        at: PieceRows,
    ) -> torch.Tensor:
        """The layer's output for a piece, saving nothing."""
        h, _, _ = self._attention(x, w, at)
        with torch.no_grad():
            return ffn_block(h, w, self.dims)[0]

    def _attention(
        self, x: torch.Tensor, w: dict[str, torch.Tensor], at: PieceRows
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return chunk_attn_forward(x, w, self.dims, at.cos, at.sin, self.win, at.s0, at.runs)

    def rebuild(
        self, pieces: Iterable[tuple[torch.Tensor, PieceRows]], w: dict[str, torch.Tensor]
    ) -> None:
        """Before a chunk's backward through a layer: each piece's K and V into the window
        from its input, (x, rows) in order; the gradient sums zeroed."""
        for x, at in pieces:
            self.win.put(x, w, self.dims, at.cos, at.sin, at.s0, want_queries=False)
        self.win.zero_grads()

    def backward(
        self,
        g: PieceGraph,
        dy: torch.Tensor,
        w: dict[str, torch.Tensor],
        unstash: Callable[[object], torch.Tensor],
        at: PieceRows,
        dw: GradViews,
    ) -> torch.Tensor:
        """dL/dx of the piece (B, c, D) from dy = dL/dy, its weight gradients into dw; the
        chunk's later pieces have run theirs (their parts of this piece's dK, dV are in)."""
        x = unstash(g.x)  # (B, c, D)
        if g.out is not None:
            out, lse = unstash(g.out), unstash(g.lse)
            with torch.no_grad():
                h = out_proj(x, out, w)
        else:  # the attention forward again, with the window as it stands (K, V rebuilt)
            h, out, lse = self._attention(x, w, at)
        saved = tuple(unstash(t) for t in g.lean) if g.lean is not None else None
        dh = lean_backward(dy, h, saved, w, self.dims.rms_norm_eps, dw)  # type: ignore[arg-type]
        del saved, h
        return chunk_attn_backward(
            dh, x, out, lse, w, self.dims, at.cos, at.sin, self.win, at.s0, dw, at.runs
        )
