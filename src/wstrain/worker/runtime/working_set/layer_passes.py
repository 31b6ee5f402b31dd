"""What one (layer, unit) of the working-set schedule computes (working_set/schedule.py runs
them in its order): a layer's forward for a chunk of sequences, or a (chunk, piece) unit of
a long one, saving its activations at the plan's level, on the device or sent home; the
matching backward, recomputing what was not saved; the LM head and loss of a unit; the
RoPE tables and attention masks (or each piece's rows and documents) of a pass; and the
evaluation's forward, which saves nothing.

WorkingSetRuntime takes these as a mixin: they read the runtime's streams, store, slots and
tables, declared below; the training passes write no step-level state but the round's MoE
router totals, and the evaluation drives the weight ring itself.

    y, graph = rt._forward_layer(k, c, x, slot)       # (b, c, D) -> (b, c, D), what it saved
    dx = rt._backward_layer(k, c, graph, dy, slot, dw)
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from wstrain.contracts.model_dims import ModelDims
from wstrain.worker.models.blocks import (
    GradViews,
    accumulate_grads,
    add_grads,
    attn_block,
    ffn_block,
    leaves,
    out_proj,
)
from wstrain.worker.models.dense import document_mask, rms_norm
from wstrain.worker.models.moe import RouterTotals
from wstrain.worker.ops.document_attn import document_runs
from wstrain.worker.ops.lean_attn import CoreGraph, lean_attn_backward, lean_attn_forward
from wstrain.worker.ops.lean_mlp import lean_backward, lean_forward
from wstrain.worker.ops.lean_moe import lean_moe_backward, lean_moe_forward, lean_moe_saved
from wstrain.worker.runtime.working_set.config import WorkingSetConfig
from wstrain.worker.runtime.working_set.host_store import HostActivationStore
from wstrain.worker.runtime.working_set.rings import Slot, Streams
from wstrain.worker.runtime.working_set.saved_acts import (
    BackwardPrefetch,
    HostCopy,
    SavedTensorPolicy,
    tensor_key,
)
from wstrain.worker.runtime.working_set.sequence_chunks import PieceLayers, PieceRows
from wstrain.worker.runtime.working_set.state import HostState
from wstrain.worker.runtime.working_set.streamer import SlotStreamer


@dataclass
class LayerGraph:
    """What one (layer, chunk) forward left for its backward: each part a device tensor (in
    the window) or a HostCopy (sent home)."""

    x: object  # the layer input
    # levels 1 and 3: the attention kernel's graph, its output, and its saved tensors that
    # went home (worker/ops/lean_attn.py)
    core: CoreGraph | None = None
    out: object = None
    core_copies: tuple[HostCopy, ...] = ()
    # levels 2 and 3: the MLP's lean set (gate, up), or (top_idx, gate, up) for MoE
    lean: tuple[object, ...] | None = None

    def stashed(self) -> tuple[object, ...]:
        """Everything sent home, in the order backward takes it."""
        return (self.x, self.out, *(self.lean or ()), *self.core_copies)


class LayerPasses:
    """The per-(layer, unit) computations of WorkingSetRuntime (which sets these)."""

    dims: ModelDims
    cfg: WorkingSetConfig
    host: HostState
    device: torch.device
    streams: Streams
    acts: HostActivationStore
    weights: SlotStreamer
    counters: dict[str, int]
    head: torch.Tensor  # the resident head group, weights and gradients
    head_grad: torch.Tensor
    cos: torch.Tensor  # (S, hd) RoPE tables
    sin: torch.Tensor
    spans: list[tuple[int, int]]  # each piece's rows of a sequence
    pieces: PieceLayers | None
    # this pass's (cos, sin, attention mask) per chunk: the shared tables and plain causal
    # attention, or per token and per document with document_mask; with pieces each
    # (chunk, piece) unit's rows instead
    _where: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]]
    _ahead: BackwardPrefetch | None
    _at: list[PieceRows]
    router: RouterTotals | None  # this round's MoE routing
    _aux_grad: torch.Tensor | None  # (sequences, E): d loss / d router probs
    embed: torch.Tensor  # the resident embedding group
    _fwd_order: list[int]
    _first_pass: bool  # the pass is the step's first (its levels: cfg.first_levels)

    def _apply_pending(self) -> None:
        """Any deferred optimizer update applied (WorkingSetRuntime's)."""
        raise NotImplementedError

    # ---------------------------------------------------------------- forward

    def _policy(self, layer: int) -> SavedTensorPolicy:
        return SavedTensorPolicy(
            self.streams,
            self.acts,
            lambda: self.weights.storage_of(layer),
            [
                self.cos,
                self.sin,
                *(t for w in self._where for t in w if t is not None),
                *(t for at in self._at for t in (at.cos, at.sin)),
            ],
            self.counters,
            fp8=self.cfg.activation_precision == "fp8",
        )

    def _stash(self, t: torch.Tensor, home: bool, policy: SavedTensorPolicy) -> object:
        return policy.send_home(t) if home else t

    def _unstash(self, obj: object, policy: SavedTensorPolicy) -> torch.Tensor:
        if isinstance(obj, torch.Tensor):  # kept on the device
            return obj
        t = policy.fetch(obj)  # type: ignore[arg-type]
        if self._ahead is not None:  # its bytes are taken: the next sets start behind this one
            self._ahead.top_up()
        return t

    def _forward_layer(
        self, k: int, c: int, x: torch.Tensor, slot: Slot
    ) -> tuple[torch.Tensor, LayerGraph]:
        dims = self.dims
        level, home = self.cfg.placement(k, c, dims.num_layers, self._first_pass)
        policy = self._policy(k)
        w = self.host.layout.views(slot.flat)
        if self.pieces is not None:  # c is a (chunk, piece) unit
            stash = lambda t: self._stash(t, home, policy)
            return self.pieces.forward(x, w, level, stash, self._at[c])  # type: ignore[return-value]
        g = LayerGraph(x=self._stash(x, home, policy))
        if level in (1, 3):  # the attention kernel's own saved set, through the hooks
            packed: dict[tuple[object, ...], HostCopy] = {}
            with policy.hooks(home, packed):
                h, out, g.core = lean_attn_forward(x, w, dims, *self._where[c])
            g.out = packed.pop(tensor_key(out), None) or self._stash(out, home, policy)
            g.core_copies = tuple(packed.values())
        else:
            with torch.no_grad():
                h = attn_block(x, w, dims, *self._where[c])
        if level in (2, 3):
            saved: tuple[torch.Tensor, ...]
            if dims.is_moe:
                y, probs, top_idx, saved = lean_moe_forward(h, w, dims)
                if self.router is not None:
                    self.router.add(probs, top_idx, c * self.cfg.chunk)
            else:
                y, *rest = lean_forward(h, w, dims.rms_norm_eps)
                saved = tuple(rest)
            g.lean = tuple(self._stash(t, home, policy) for t in saved)
        else:
            with torch.no_grad():
                y, _ = ffn_block(h, w, dims, self.router, c * self.cfg.chunk)
        return y, g

    # ---------------------------------------------------------------- backward

    def _backward_layer(
        self, k: int, c: int, g: LayerGraph, dy: torch.Tensor, slot: Slot, dw: GradViews
    ) -> torch.Tensor:
        dims = self.dims
        policy = self._policy(k)
        w = self.host.layout.views(slot.flat)
        if self.pieces is not None:  # c is a (chunk, piece) unit
            unstash = lambda t: self._unstash(t, policy)
            return self.pieces.backward(g, dy, w, unstash, self._at[c], dw)  # type: ignore[arg-type]
        x = self._unstash(g.x, policy)  # (B, S, D)
        if g.core is not None:  # levels 1, 3: h from the saved attention output
            out = self._unstash(g.out, policy)
            with torch.no_grad():
                h = out_proj(x, out, w)
        else:  # levels 0, 2: the attention block's graph, recomputed
            xa, wa = x.detach().requires_grad_(), leaves(w)
            h_graph = attn_block(xa, wa, dims, *self._where[c])
            h = h_graph.detach()
        # the MLP's lean set, saved (levels 2, 3) or recomputed without its down projection
        saved = tuple(self._unstash(t, policy) for t in g.lean) if g.lean is not None else None
        if dims.is_moe:
            top_idx, gate, up = saved if saved is not None else lean_moe_saved(h, w, dims)
            aux = self._aux_grad
            if aux is not None:  # this chunk's sequences' rows
                aux = aux[c * self.cfg.chunk : c * self.cfg.chunk + h.shape[0]]
            dh, dws = lean_moe_backward(dy, h, top_idx, gate, up, w, dims, aux)
            del top_idx, gate, up
            add_grads(dw, dws)
        else:
            dh = lean_backward(dy, h, saved, w, dims.rms_norm_eps, dw)  # type: ignore[arg-type]
        del saved
        if g.core is not None:
            cos, sin, _ = self._where[c]
            return lean_attn_backward(dh, x, out, g.core, w, dims, cos, sin, dw)
        torch.autograd.backward(h_graph, dh)
        accumulate_grads(dw, wa)
        return xa.grad  # type: ignore[return-value]

    # ---------------------------------------------------------------- head and loss

    def _head_loss(
        self, x: torch.Tensor, targets: torch.Tensor, scale: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Loss sum and dLoss/dx for one chunk, in token blocks. x: (B, S, D), targets (B, S)"""
        dims = self.dims
        views = self.host.head_layout.views(self.head)
        gviews = self.host.head_layout.views(self.head_grad)
        w_head, g_head = views["lm_head.weight"], gviews["lm_head.weight"]  # (V, D)
        xf, tf = x.reshape(-1, dims.hidden_size), targets.reshape(-1)
        dx = torch.empty_like(xf)
        total = torch.zeros((), device=self.device, dtype=torch.float32)
        step = self.cfg.loss_tokens
        for i in range(0, xf.shape[0], step):
            xb = xf[i : i + step].detach().requires_grad_()
            norm_w = views["model.norm.weight"].detach().requires_grad_()
            h = rms_norm(xb, norm_w, dims.rms_norm_eps)  # (T, D)
            logits = F.linear(h.detach(), w_head).requires_grad_()  # (T, V)
            loss = F.cross_entropy(logits.float(), tf[i : i + step], reduction="sum")
            (loss * scale).backward()
            # The head's gradient accumulates in place: autograd would allocate a whole
            # (V, D) weight gradient per block first (1 GiB at Llama-3's vocabulary).
            assert logits.grad is not None  # the loss's backward just wrote it
            g_head.addmm_(logits.grad.t(), h.detach())
            h.backward(logits.grad @ w_head)  # (T, D)
            assert xb.grad is not None
            dx[i : i + step] = xb.grad
            gviews["model.norm.weight"].add_(norm_w.grad)  # type: ignore[arg-type]
            total += loss.detach()
        return total, dx.view_as(x)

    def _units(self, rows: torch.Tensor) -> list[torch.Tensor]:
        """(sequences, S) rows as the pass's units: chunks of cfg.chunk sequences, each cut
        into its pieces with seq_chunk (chunk-major)."""
        return [t[:, s0:s1] for t in rows.split(self.cfg.chunk) for s0, s1 in self.spans]

    def _set_where(self, documents: tuple[torch.Tensor, ...] | None) -> None:
        """Each unit's RoPE tables and attention mask for the pass over `documents`
        ((positions, segments), each (sequences, S)), or the plain causal ones (a piece's
        rows of them with seq_chunk; each unit's PieceRows with pieces)."""
        chunks = -(-self.cfg.micro_batch * self.cfg.lead_rounds // self.cfg.chunk)
        if documents is None:
            self._where = [(self.cos, self.sin, None)] * chunks
            self._at = [PieceRows(s0, self.cos[s0:s1], self.sin[s0:s1]) for s0, s1 in self.spans]
            self._at *= chunks
            return
        self._where, self._at = [], []
        for pos, seg in zip(*(d.split(self.cfg.chunk) for d in documents)):
            pos = pos.to(self.device)  # (b, S): the shared tables gathered per token
            cos, sin = self.cos[pos], self.sin[pos]  # (b, S, hd)
            if self.pieces is None:
                self._where.append((cos, sin, document_mask(seg.to(self.device))))
                continue
            runs = document_runs(seg)  # no dense mask: each piece attends document by document
            self._at += [PieceRows(s0, cos[:, s0:s1], sin[:, s0:s1], runs) for s0, s1 in self.spans]

    def _rebuild_window(
        self, k: int, units: range, graphs: list[LayerGraph], slot: Slot, ahead: BackwardPrefetch
    ) -> None:
        """Layer k's K and V of a chunk's sequences back in the window, from each piece's
        input, fetched for the purpose and let go (backward fetches it again) unless the
        prefetch claimed it for backward (saved_acts.BackwardPrefetch.top_up)."""
        assert self.pieces is not None
        policy, w = self._policy(k), self.host.layout.views(slot.flat)

        def inputs() -> Iterator[tuple[torch.Tensor, PieceRows]]:
            for c in units:  # one piece's input on the device at a time
                ahead.top_up()
                yield policy.fetch_transient(graphs[c].x), self._at[c]

        self.pieces.rebuild(inputs(), w)

    @torch.no_grad()
    def eval_loss(
        self,
        inputs: torch.Tensor,
        targets: torch.Tensor,
        documents: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> float:
        """Mean next-token loss of (B, S) inputs: a forward through the streamed layers that
        saves nothing, micro_batch sequences at a time (`documents`: as in train_step)."""
        self._apply_pending()  # a deferred device update belongs to the weights evaluated
        dims, total = self.dims, 0.0
        views = self.host.head_layout.views(self.head)
        table = self.host.embed_layout.views(self.embed)["model.embed_tokens.weight"]  # (V, D)
        mb, step = self.cfg.micro_batch, self.cfg.loss_tokens
        for i, (x_mb, y_mb) in enumerate(zip(inputs.split(mb), targets.split(mb))):
            T = [F.embedding(t.to(self.device), table) for t in self._units(x_mb)]
            self._set_where(
                None if documents is None else tuple(d[i * mb : (i + 1) * mb] for d in documents)
            )
            for k in self._fwd_order:
                slot = self.weights.consume(k, self._fwd_order[k + 1 :])
                w = self.host.layout.views(slot.flat)
                for c, h in enumerate(T):
                    if self.pieces is not None:
                        T[c] = self.pieces.eval_forward(h, w, self._at[c])
                    else:
                        T[c] = ffn_block(attn_block(h, w, dims, *self._where[c]), w, dims)[0]
                self.weights.release(slot)
            for h, y in zip(T, self._units(y_mb)):
                h = rms_norm(
                    h.reshape(-1, dims.hidden_size), views["model.norm.weight"], dims.rms_norm_eps
                )  # (tokens, D)
                y = y.to(self.device).reshape(-1)
                for j in range(0, h.shape[0], step):  # logits never whole
                    logits = F.linear(h[j : j + step], views["lm_head.weight"])
                    total += float(
                        F.cross_entropy(logits.float(), y[j : j + step], reduction="sum")
                    )
        self.weights.invalidate()
        self.streams.collect_stalls()  # an evaluation's waits are not the next step's
        return total / targets.numel()
