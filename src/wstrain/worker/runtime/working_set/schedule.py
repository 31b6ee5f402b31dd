"""The working-set runtime: only a window of decoder layers lives on the device; host memory
holds the whole training state. The step reads like AdaWS Algorithms 1-2:

    for each round (a group of `chunks`, micro_batch sequences in all; the step's first
    pass may carry `lead_rounds` rounds, so each layer's weights, held back by last step's
    deferred update, serve more compute):
      forward:  for k = 0..L-1: consume W_k from the weight ring (prefetching the next);
                for each chunk c: T[c] = fwd(W_k, T[c]), saving (layer, chunk)'s
                activations at its level, on device (last `window` layers) or sent home
      head:     chunked LM-head loss per chunk; T[c] = dLoss/dx_L
      backward: for k = L-1..0: consume W_k; for each chunk c (reverse): top up the
                saved sets coming home ahead of their chunks, T[c] = bwd(W_k, T[c]),
                grads into dW_k (accumulated grads, taken at the first accumulate);
                send dW_k home
    optimizer:  global-norm clip (norm summed on the device as gradients go home), then
                AdamW per group, deferred into the next step's first forward: layers
                0..device_opt_layers-1 on the device over streamed moments, where their
                weights arrive (working_set/device_optim.py), the others in a host thread
                (working_set/host_optim.py) that starts at once, so it is that many layers
                ahead when the forward first waits for it

Saved-activation levels per (layer, chunk), each keeping the layer's input: 0 nothing more
(backward recomputes attention with its graph, then the MLP's gate/up — never the down
projection, whose output backward does not need), 1 + the attention kernel's own saved set
(q, k, v, output, log-sum-exp: worker/ops/lean_attn.py; backward recomputes the output
projection for h and the MLP's gate/up, no QKV GEMM, no attention forward), 2 + the MLP's lean
set (gate and up, worker/ops/lean_mlp.py; MoE: routing and grouped gate/up, worker/ops/lean_moe.py;
backward recomputes attention), 3 both. MoE layers add their routing to the round's router
totals, and the load-balancing loss's gradient (worker/models/moe.py) enters each layer's MLP
backward.
Long context (cfg.seq_chunk, working_set/sequence_chunks.py): each chunk's sequences are cut
into pieces and a (chunk, piece) unit takes the chunk's place above; a layer's pieces run in
order against a context window of the sequence's K and V, and its backward first puts every
piece's K and V back from the inputs, then takes the pieces in reverse.
It never touches Redis; on CPU streams are no-ops and the same schedule runs.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from wstrain.scheduler.contracts.calibration import LEVELS
from wstrain.scheduler.contracts.model_dims import ModelDims
from wstrain.scheduler.contracts.spec import OptimizerSpec
from wstrain.worker.models.blocks import (
    GradViews,
    accumulate_grads,
    add_grads,
    attn_block,
    ffn_block,
    leaves,
    out_proj,
)
from wstrain.worker.models.dense import (
    document_mask,
    rms_norm,
    rope_tables,
)
from wstrain.worker.models.moe import RouterTotals
from wstrain.worker.ops.document_attn import document_runs
from wstrain.worker.ops.lean_attn import CoreGraph, lean_attn_backward, lean_attn_forward
from wstrain.worker.ops.lean_mlp import lean_backward, lean_forward
from wstrain.worker.ops.lean_moe import lean_moe_backward, lean_moe_forward, lean_moe_saved
from wstrain.worker.runtime.base import Batches, HostMemory
from wstrain.worker.runtime.distributed import ProcessGroup
from wstrain.worker.runtime.optim import StepUpdate, sq_norm_fp32
from wstrain.worker.runtime.stats import StepStats
from wstrain.worker.runtime.working_set.config import WorkingSetConfig
from wstrain.worker.runtime.working_set.data_parallel import RankShards
from wstrain.worker.runtime.working_set.device_optim import DeviceOptimizer
from wstrain.worker.runtime.working_set.host_optim import HostOptimizerPipeline
from wstrain.worker.runtime.working_set.rings import Slot, Streams
from wstrain.worker.runtime.working_set.saved_acts import (
    BackwardPrefetch,
    HostActivationStore,
    HostCopy,
    SavedTensorPolicy,
    tensor_key,
)
from wstrain.worker.runtime.working_set.sequence_chunks import PieceLayers, PieceRows
from wstrain.worker.runtime.working_set.state import DTYPES, HostState
from wstrain.worker.runtime.working_set.streamer import LazyGradViews, SlotStreamer


@dataclass
class _Graph:
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


class WorkingSetRuntime:
    def __init__(
        self,
        dims: ModelDims,
        cfg: WorkingSetConfig,
        opt: OptimizerSpec,
        host: HostState,
        group: ProcessGroup | None = None,
    ) -> None:
        """`group`: data parallel over its ranks, `host` their one shared copy
        (working_set/data_parallel.py); cfg.rounds is per rank."""
        assert cfg.micro_batch % cfg.chunk == 0, "chunk must divide micro_batch"
        assert cfg.r_param >= 2 and cfg.r_grad >= 1 and 0 <= cfg.window <= dims.num_layers
        assert all(0 <= lv < LEVELS for row in cfg.levels for lv in row)
        assert 1 <= cfg.lead_rounds <= cfg.rounds
        assert 0 <= cfg.device_opt_layers <= dims.num_layers
        # lead passes are planned for dense models only: the MoE path is not tested under one
        assert cfg.lead_rounds == 1 or not dims.is_moe
        self.dims, self.cfg, self.opt_spec, self.host = dims, cfg, opt, host
        self.device = torch.device(cfg.device)
        self.streams = Streams(self.device)
        self.counters = {"h2d_bytes": 0, "d2h_bytes": 0}
        dtype = DTYPES[cfg.precision]
        L = dims.num_layers
        assert host.precision == cfg.precision
        if cfg.precision == "mixed" and cfg.device_opt_layers:
            raise ValueError(
                "mixed precision updates its fp32 master on the host only; set device_opt_layers=0"
            )
        self.shards = RankShards(group, host)
        if self.shards.world > 1 and cfg.device_opt_layers:
            raise ValueError(
                "data parallel ranks update their spans on the host only; set device_opt_layers=0"
            )
        self.weights = SlotStreamer.for_tiles(
            cfg.r_param, host.weights, self.streams, self.device, "weights", self.counters
        )
        self.grads = SlotStreamer.for_tiles(
            cfg.r_grad, host.grads, self.streams, self.device, "gradients", self.counters
        )
        self.grads.span = self.shards.layer_span
        self.grads.load_span = self.shards.layer_load_span
        # Embedding and head group stay resident on the device for the whole step.
        self.embed = host.embed_w.to(self.device)
        self.head = host.head_w.to(self.device)
        self.embed_grad = torch.zeros_like(self.embed)
        self.head_grad = torch.zeros_like(self.head)
        self.acts = HostActivationStore(host.arena, cfg.write_buffer_bytes)
        self.device_groups, self.host_groups = cfg.optimizer_groups(L)
        self.dopt = (
            DeviceOptimizer(host, opt, self.streams, self.device, self.grads, self.counters)
            if self.device_groups
            else None
        )
        self.hopt = HostOptimizerPipeline(host, opt, self.device) if self.host_groups else None
        if self.hopt is not None:
            self.weights.before_load = self._await_host_update  # layer k's tile: updated
        self._stale: set[int] = set()  # embedding (L) / head (L + 1) awaiting a host update
        # the global gradient norm, squared, summed in fp32 as final gradients go home
        self.sq_norm = torch.zeros((), device=self.device, dtype=torch.float32)
        self.cos, self.sin = rope_tables(dims, cfg.seq_len, self.device, dtype)
        self.spans = cfg.spans()  # each piece's rows of a sequence (one span: whole ones)
        self.pieces = (
            PieceLayers(dims, cfg.chunk, cfg.seq_len, dtype, self.device)
            if cfg.pieces > 1
            else None
        )
        # this pass's (cos, sin, attention mask) per chunk: the shared tables and plain
        # causal attention, or per token and per document with document_mask; with pieces
        # each (chunk, piece) unit's rows instead
        self._where: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]] = []
        self._at: list[PieceRows] = []
        self._fwd_order = list(range(L))
        self._bwd_order = list(range(L - 1, -1, -1))
        self.router: RouterTotals | None = None  # this round's MoE routing
        self._aux_grad: torch.Tensor | None = None  # (sequences, E): d loss / d router probs

    # ---------------------------------------------------------------- state for checkpoints

    def _apply_pending(self) -> None:
        if self.streams.cuda:  # copies home may be in flight (the resident groups' moments)
            torch.cuda.synchronize(self.device)
        if self.dopt is not None and self.dopt.todo:
            self.dopt.flush(self.weights)
            self.weights.invalidate()
        if self.hopt is not None and self.hopt.pending:
            self.hopt.flush()
            for group in sorted(self._stale):
                self._refresh_resident(group)

    def _refresh_resident(self, group: int) -> None:
        """Before the embedding (group L) or head (L + 1) is read: wait for its deferred host
        update and copy it to the device."""
        if group in self._stale:
            self._await_host_update(group)
            L = self.dims.num_layers
            dev, tile = (
                (self.embed, self.host.embed_w) if group == L else (self.head, self.host.head_w)
            )
            dev.copy_(tile)
            self._stale.discard(group)

    def _await_host_update(self, group: int) -> None:
        """Block until the host thread has updated `group` (an optimizer stall where the
        compute stream runs dry meanwhile)."""
        assert self.hopt is not None
        if self.hopt.is_done(group):
            self.hopt.wait(group)  # raises the thread's error, if any
            return
        with self.streams.host_waits("optimizer"):
            self.hopt.wait(group)

    def finish(self) -> None:
        """Apply any deferred optimizer update (before the process ends or hands off)."""
        self._apply_pending()

    def host_memory(self) -> HostMemory:
        return HostMemory(self.host.arena.total_bytes, self.host.arena.pinned_bytes)

    def state_tensors(self) -> dict[str, torch.Tensor]:
        """Weight views into the host tiles (a checkpoint copies them out shard by shard)."""
        self._apply_pending()
        return self.host.weight_views()

    def optimizer_state(self) -> dict[str, object]:
        self._apply_pending()
        return self.host.optimizer_state()

    def load_state(self, weights: dict[str, torch.Tensor] | Path, extra: dict[str, object]) -> None:
        """Weights by name, or a checkpoint directory to stream them from into the tiles."""
        self._apply_pending()  # no update in flight may write the tiles being loaded
        if self.dopt is not None:  # nothing pending, and no moment slot is current
            self.dopt.todo.clear()
            self.dopt.m.invalidate()
            self.dopt.v.invalidate()
        if self.shards.local_rank == 0:  # the node's one copy of the weights
            if isinstance(weights, Path):
                self.host.stream_from(weights)
            else:
                self.host.load_state_dict(weights)
        self.host.load_optimizer_state(extra)  # each rank its span
        self.shards.barrier()
        if self.dopt is not None:
            self.dopt.load_steps()
        self.weights.invalidate()
        self.grads.invalidate()
        self.embed.copy_(self.host.embed_w)
        self.head.copy_(self.host.head_w)

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
        return obj if isinstance(obj, torch.Tensor) else policy.fetch(obj)  # type: ignore[arg-type]

    def _forward_layer(
        self, k: int, c: int, x: torch.Tensor, slot: Slot
    ) -> tuple[torch.Tensor, _Graph]:
        dims = self.dims
        level, home = self.cfg.placement(k, c, dims.num_layers)
        policy = self._policy(k)
        w = self.host.layout.views(slot.flat)
        if self.pieces is not None:  # c is a (chunk, piece) unit
            stash = lambda t: self._stash(t, home, policy)
            return self.pieces.forward(x, w, level, stash, self._at[c])  # type: ignore[return-value]
        g = _Graph(x=self._stash(x, home, policy))
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
        self, k: int, c: int, g: _Graph, dy: torch.Tensor, slot: Slot, dw: GradViews
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
        else:
            dh, dws = lean_backward(dy, h, saved, w, dims.rms_norm_eps)  # type: ignore[arg-type]
        del saved
        add_grads(dw, dws)
        if g.core is not None:
            cos, sin, _ = self._where[c]
            dx, dws = lean_attn_backward(dh, x, out, g.core, w, dims, cos, sin)
            add_grads(dw, dws)
            return dx
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

    # ---------------------------------------------------------------- one step

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

    def _round(
        self,
        tokens: torch.Tensor,
        targets: torch.Tensor,
        first: bool,
        last: bool,
        scale: float,
        documents: tuple[torch.Tensor, ...] | None = None,
    ) -> torch.Tensor:
        """Forward, head and backward of one pass: a round's sequences, or the lead pass's
        (cfg.lead_rounds rounds'). tokens/targets and documents' parts: (sequences, S)"""
        cfg, L = self.cfg, self.dims.num_layers
        self.acts.reset()
        self._set_where(documents)
        self._refresh_resident(L)
        if self.dims.is_moe:
            self.router = RouterTotals(
                self.dims.num_experts, self.device, tokens.shape[0], cfg.seq_len
            )
        units_in = self._units(tokens)  # (b, c) token ids of each (chunk, piece) unit
        table = self.host.embed_layout.views(self.embed)["model.embed_tokens.weight"]  # (V, D)
        T = [F.embedding(t, table) for t in units_in]  # transition table, (b, c, D) each
        graphs: list[list[_Graph]] = [[] for _ in range(L)]
        for k in self._fwd_order:
            slot = self.weights.consume(k, self._fwd_order[k + 1 :] + self._bwd_order)
            if self.dopt is not None and self.dopt.needs(k):  # last step's update, deferred
                self.dopt.apply(k, slot, self.weights, self._fwd_order[k + 1 :])
            for c in range(len(T)):
                T[c], g = self._forward_layer(k, c, T[c], slot)
                graphs[k].append(g)
            self.weights.release(slot)
        loss = torch.zeros((), device=self.device, dtype=torch.float32)
        if not first:  # the first backward layers' accumulated gradients come in beside the head
            self.grads.prefetch(self._bwd_order)
        self._refresh_resident(L + 1)
        for c, tgt in enumerate(self._units(targets)):
            part, T[c] = self._head_loss(T[c], tgt, scale)
            loss += part
        if last:  # the head's gradient is final: home beside the backward, not after it
            self._send_home(self.head_grad, self.host.head_g, L + 1)
        coef = self.dims.router_aux_loss_coef
        if self.router is not None and coef > 0:  # + coef x the mean over the step's sequences
            sequences = cfg.rounds * cfg.micro_batch * self.shards.world
            self._aux_grad = self.router.prob_grad(coef / sequences)
            loss += coef * self.router.loss() / (sequences * scale)  # x scale later
        # saved sets come back ahead of the chunks that take them
        # (with seq_chunk, a chunk's inputs first, in order, for rebuilding its K and V)
        P = cfg.pieces
        groups = [range(c, c + P) for c in reversed(range(0, len(T), P))]  # backward's order
        ahead = BackwardPrefetch(self.streams, self.counters, cfg.write_buffer_bytes)
        for k in self._bwd_order:
            for units in groups:
                if self.pieces is not None:
                    for c in units:
                        ahead.add(graphs[k][c].x)
                for c in reversed(units):
                    for stashed in graphs[k][c].stashed():
                        ahead.add(stashed)
        for i, k in enumerate(self._bwd_order):
            slot = self.weights.consume(k, self._bwd_order[i + 1 :] + self._fwd_order)
            dw = LazyGradViews(self.grads, k, self._bwd_order[i + 1 :], first, self.host.layout)
            for units in groups:
                if self.pieces is not None:
                    self._rebuild_window(k, units, graphs[k], slot, ahead)
                for c in reversed(units):
                    ahead.top_up()
                    T[c] = self._backward_layer(k, c, graphs[k][c], T[c], slot, dw)
                    graphs[k][c] = None  # type: ignore[call-overload]  # free its saved tensors
            self.weights.release(slot)
            gslot = dw.take()
            own = self.shards.reduce(gslot.flat, k)  # (span,) summed over ranks
            if last:
                self.sq_norm += sq_norm_fp32(own)
            self.grads.send_home(gslot)
        dtable = self.host.embed_layout.views(self.embed_grad)["model.embed_tokens.weight"]
        for t, dx in zip(units_in, T):
            dtable.index_add_(0, t.reshape(-1), dx.reshape(-1, dx.shape[-1]).to(dtable.dtype))
        if self.dims.pad_token_id is not None:  # as Hugging Face's padding_idx
            dtable[self.dims.pad_token_id].zero_()
        return loss

    def _rebuild_window(
        self, k: int, units: range, graphs: list[_Graph], slot: Slot, ahead: BackwardPrefetch
    ) -> None:
        """Layer k's K and V of a chunk's sequences back in the window, from each piece's
        input, fetched for the purpose and let go (backward fetches it again)."""
        assert self.pieces is not None
        policy, w = self._policy(k), self.host.layout.views(slot.flat)

        def inputs() -> Iterator[tuple[torch.Tensor, PieceRows]]:
            for c in units:  # one piece's input on the device at a time
                ahead.top_up()
                yield policy.fetch_transient(graphs[c].x), self._at[c]

        self.pieces.rebuild(inputs(), w)

    def _send_home(self, grad: torch.Tensor, tile: torch.Tensor, group: int) -> None:
        """A resident group's final device gradient, summed over ranks, to its host tile
        (this rank's span) on the outbound stream (grads.flush() waits)."""
        own = self.shards.reduce(grad, group)
        s = self.streams
        s.wait("outbound", s.record("comp"))
        with s.on("outbound"):
            self.shards.own(tile, group).copy_(own, non_blocking=True)
        self.counters["d2h_bytes"] += own.nbytes

    def forward_backward(self, data: Batches, step: int) -> float:
        """All rounds of step `step`: the mean loss; gradients end up in the host tiles."""
        cfg = self.cfg
        data = self.shards.batches(data, cfg.rounds)
        self.embed_grad.zero_()
        self.head_grad.zero_()
        scale = 1.0 / max(
            data.target_tokens(step, cfg.rounds * cfg.micro_batch), 1
        )  # the global batch's mean (base.py)
        loss = torch.zeros((), device=self.device, dtype=torch.float32)
        passes = [
            range(cfg.lead_rounds),
            *(range(r, r + 1) for r in range(cfg.lead_rounds, cfg.rounds)),
        ]
        for i, rounds in enumerate(passes):
            batches = [data.batch(step, r, cfg.micro_batch) for r in rounds]
            tokens, targets = (torch.cat(parts).to(self.device) for parts in zip(*batches))
            docs = None
            if cfg.document_mask:  # (positions, segments) of the pass's sequences
                parts = [data.documents(step, r, cfg.micro_batch) for r in rounds]
                docs = tuple(torch.cat(p) for p in zip(*parts))
            loss += self._round(tokens, targets, i == 0, i == len(passes) - 1, scale, docs)
        self._send_home(self.embed_grad, self.host.embed_g, self.dims.num_layers)
        self.grads.flush()  # the layers' gradients, the head's and the embedding's are home
        return float(self.shards.total(loss).item()) * scale

    def _start_optimizer(self, step: int) -> None:
        """Gradients of `step` are home: clip and schedule once, then the host thread starts
        on its groups while the device updates its resident ones now and leaves its layers
        to the next forward."""
        L = self.dims.num_layers
        own = self.shards.own
        self.sq_norm += sq_norm_fp32(own(self.embed_grad, L)) + sq_norm_fp32(
            own(self.head_grad, L + 1)
        )
        norm = math.sqrt(float(self.shards.sq_norm(self.sq_norm)))  # waits for the backward
        self.sq_norm.zero_()
        update = StepUpdate.of(step, norm, self.opt_spec, self.cfg.steps)
        if self.hopt is not None:  # first: the host thread runs beside the device's work
            self.hopt.start(update, self.host_groups)
            self._stale = {g for g in self.host_groups if g >= L}
        if self.dopt is not None:
            resident = {L: (self.embed, self.embed_grad), L + 1: (self.head, self.head_grad)}
            self.dopt.start(
                update,
                [g for g in self.device_groups if g < L],
                [(*resident[g], g) for g in self.device_groups if g >= L],
            )

    def train_step(self, data: Batches, step: int) -> StepStats:
        """One optimizer step (0-based `step`) over cfg.rounds rounds."""
        cfg = self.cfg
        start = time.perf_counter()
        self.counters.update(h2d_bytes=0, d2h_bytes=0)
        loss = self.forward_backward(data, step)
        with self.streams.host_waits("optimizer"):  # the norm's sync drains the queue
            self._start_optimizer(step)
        self.weights.invalidate()
        self.grads.invalidate()
        stalls = self.streams.collect_stalls()
        return StepStats(
            loss,
            time.perf_counter() - start,
            self.shards.world * cfg.rounds * cfg.micro_batch * cfg.seq_len,  # the global batch's
            stalls,
            self.counters["h2d_bytes"],
            self.counters["d2h_bytes"],
        )
