"""The order of a step's passes in the working-set runtime (working_set/schedule.py holds the
rest of the step). A pass is a forward over the layers, the LM head and a backward over the
layers, for one round's sequences (the step's first pass: cfg.lead_rounds rounds'). Per round
(AdaWS's schedule) the passes run one after another. With cfg.overlap (cross-round overlap,
RoundPipe-like) every pass after the step's first runs its forward layer by layer beside the
previous pass's backward:

    pass 0:  F0 F1 .. F(L-1) head
    pass 1:  F0 B(L-1) F1 B(L-2) .. F(L-1) B0   head     (F: pass 1's forward, B: pass 0's backward)
    ...
    last:    .. head  B(L-1) .. B0

so the previous pass's saved sets come back and its gradients go home while this pass's sets
go out: the link carries saved sets through the backwards too, and a round can keep more of
them (bench/bound.py, bench/overlap_plan.py).

    loss = rt.forward_backward(data, step)

Interleaved, each pass keeps what the layer passes read of it (attention tables, backward
prefetch, MoE routing, whether it is the step's first) in a Pass, entered before each of its
layers. The passes share one host activation store (host_store.py): each layer's sets are
released as its backward ends, so the forward beside it fills what that backward frees.
Every op and every accumulation keeps its order per layer and per resident group, so the
math is the per-round schedule's, bit for bit
(tests/worker/runtime/working_set/test_pass_order.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from wstrain.worker.models.moe import RouterTotals
from wstrain.worker.runtime.base import Batches
from wstrain.worker.runtime.optim import sq_norm_fp32
from wstrain.worker.runtime.working_set.data_parallel import RankShards
from wstrain.worker.runtime.working_set.device_optim import DeviceOptimizer
from wstrain.worker.runtime.working_set.layer_passes import LayerGraph, LayerPasses
from wstrain.worker.runtime.working_set.saved_acts import BackwardPrefetch, HostCopy
from wstrain.worker.runtime.working_set.sequence_chunks import PieceRows
from wstrain.worker.runtime.working_set.streamer import LazyGradViews, SlotStreamer


@dataclass
class Pass:
    """One pass in flight: what its layers read and what its forward leaves its backward."""

    index: int  # of the step's passes: its sets' tags in the store are (index, layer)
    first: bool  # the step's first pass: zeroed gradient slots, cfg.first_levels
    last: bool  # the step's last: final gradients (norm, head home)
    scale: float  # 1 / the global batch's target tokens
    units_in: list[torch.Tensor]  # (b, c) token ids of each unit
    targets: torch.Tensor  # (sequences, S)
    where: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]]
    at: list[PieceRows]
    router: RouterTotals | None
    T: list[torch.Tensor]  # transitions (b, c, D): activations forward, gradients backward
    graphs: list[list[LayerGraph]] = field(default_factory=list)  # [layer][unit]
    ahead: BackwardPrefetch | None = None
    aux_grad: torch.Tensor | None = None  # (sequences, E): d loss / d router probs
    # the weight ring's next layers while interleaved (None: this pass's own order)
    upcoming: list[int] | None = None


class PassOrder(LayerPasses):
    """The step's passes, in order (WorkingSetRuntime sets what LayerPasses declares)."""

    grads: SlotStreamer
    dopt: DeviceOptimizer | None
    shards: RankShards
    sq_norm: torch.Tensor  # () fp32: the global gradient norm, squared
    embed_grad: torch.Tensor
    _bwd_order: list[int]

    def _refresh_resident(self, group: int) -> None:
        """The embedding or head on the device, updated (WorkingSetRuntime's)."""
        raise NotImplementedError

    def _enter(self, p: Pass) -> None:
        """Make `p` the pass the layer passes read."""
        self._where, self._at = p.where, p.at
        self.router, self._aux_grad, self._ahead = p.router, p.aux_grad, p.ahead
        self._first_pass = p.first

    def _begin(
        self,
        index: int,
        tokens: torch.Tensor,
        targets: torch.Tensor,
        last: bool,
        scale: float,
        documents: tuple[torch.Tensor, ...] | None,
    ) -> Pass:
        """Pass `index` of the step: its store, tables and embedded inputs. tokens/targets
        and documents' parts: (sequences, S)"""
        cfg, L = self.cfg, self.dims.num_layers
        self._set_where(documents)
        self._refresh_resident(L)
        router = None
        if self.dims.is_moe:
            router = RouterTotals(self.dims.num_experts, self.device, tokens.shape[0], cfg.seq_len)
        units_in = self._units(tokens)
        table = self.host.embed_layout.views(self.embed)["model.embed_tokens.weight"]  # (V, D)
        T = [F.embedding(t, table) for t in units_in]  # (b, c, D) each
        return Pass(
            index, index == 0, last, scale, units_in, targets, self._where, self._at, router, T
        )

    def _forward(self, p: Pass) -> Iterator[None]:
        """p's forward, a layer at a time (yields after each)."""
        p.graphs = [[] for _ in self._fwd_order]
        for k in self._fwd_order:
            self._enter(p)
            self.acts.tag = (p.index, k)
            upcoming = self._fwd_order[k + 1 :] + self._bwd_order
            ahead = p.upcoming if p.upcoming is not None else upcoming
            if self.dopt is not None and self.dopt.needs(k):  # last step's update, deferred
                # its gradient and moments load ahead of the next layers' weights, else the
                # step's first update waits behind two more layers' (on an H200, 4 layers:
                # 67 ms idle at the step's start, where w, g, m, v alone take 32)
                slot = self.weights.consume(k, [])
                self.dopt.apply(k, slot, self.weights, self._fwd_order[k + 1 :])
                self.weights.prefetch_after(k, ahead)
            else:
                slot = self.weights.consume(k, ahead)
            for c in range(len(p.T)):
                p.T[c], graph = self._forward_layer(k, c, p.T[c], slot)
                p.graphs[k].append(graph)
                # backward frees each graph after its unit: no other name may hold one (the
                # last one held here kept a whole chunk's set on the device through backward)
                del graph
            self.weights.release(slot)
            yield

    def _head(self, p: Pass) -> torch.Tensor:
        """p's LM head and loss; the transitions become d loss / d x_L."""
        cfg, L = self.cfg, self.dims.num_layers
        self._enter(p)
        loss = torch.zeros((), device=self.device, dtype=torch.float32)
        if not p.first:  # the first backward layers' accumulated gradients come in beside it
            self.grads.prefetch(self._bwd_order)
        self._refresh_resident(L + 1)
        for c, tgt in enumerate(self._units(p.targets)):
            part, p.T[c] = self._head_loss(p.T[c], tgt, p.scale)
            loss += part
        if p.last:  # the head's gradient is final: home beside the backward, not after it
            self._send_home(self.head_grad, self.host.head_g, L + 1)
        coef = self.dims.router_aux_loss_coef
        if p.router is not None and coef > 0:  # + coef x the mean over the step's sequences
            sequences = cfg.rounds * cfg.micro_batch * self.shards.world
            p.aux_grad = p.router.prob_grad(coef / sequences)
            loss += coef * p.router.loss() / (sequences * p.scale)  # x scale later
        return loss

    def _backward(self, p: Pass) -> Iterator[None]:
        """p's backward, a layer at a time (yields after each); then the embedding's
        gradient."""
        self._enter(p)
        P, graphs, T = self.cfg.pieces, p.graphs, p.T
        groups = [range(c, c + P) for c in reversed(range(0, len(T), P))]  # backward's order
        # saved sets come back ahead of the chunks that take them
        # (with seq_chunk, a chunk's inputs first, in order, for rebuilding its K and V)
        # with the overlap a forward's sets go home beside this backward by design (the
        # memory model charges both): the cap is the backward's own
        outgoing = None if self.cfg.overlap else self.acts.outgoing_bytes
        ahead = p.ahead = BackwardPrefetch(
            self.streams, self.counters, self.cfg.write_buffer_bytes, outgoing
        )
        for k in self._bwd_order:
            for units in groups:
                if self.pieces is not None:
                    for c in units:
                        ahead.add(graphs[k][c].x, rebuild=True)
                for c in reversed(units):
                    for stashed in graphs[k][c].stashed():
                        ahead.add(stashed)
        for i, k in enumerate(self._bwd_order):
            self._enter(p)
            upcoming = self._bwd_order[i + 1 :] + self._fwd_order
            slot = self.weights.consume(k, p.upcoming if p.upcoming is not None else upcoming)
            dw = LazyGradViews(self.grads, k, self._bwd_order[i + 1 :], p.first, self.host.layout)
            unread = []  # prefetched sets backward did not take: their host room is still read
            for units in groups:
                if self.pieces is not None:
                    self._rebuild_window(k, units, graphs[k], slot, ahead)
                for c in reversed(units):
                    ahead.top_up()
                    T[c] = self._backward_layer(k, c, graphs[k][c], T[c], slot, dw)
                    unread += [
                        s.arrived
                        for s in graphs[k][c].stashed()
                        if isinstance(s, HostCopy) and s.arrived is not None
                    ]
                    graphs[k][c] = None  # type: ignore[call-overload]  # free its saved tensors
            self.acts.release((p.index, k), unread)  # the forward beside it may fill them
            self.weights.release(slot)
            gslot = dw.take()
            own = self.shards.reduce(gslot.flat, k)  # (span,) summed over ranks
            if p.last:
                self.sq_norm += sq_norm_fp32(own)
            self.grads.send_home(gslot)
            yield
        p.ahead = self._ahead = None
        dtable = self.host.embed_layout.views(self.embed_grad)["model.embed_tokens.weight"]
        for t, dx in zip(p.units_in, T):
            dtable.index_add_(0, t.reshape(-1), dx.reshape(-1, dx.shape[-1]).to(dtable.dtype))
        if self.dims.pad_token_id is not None:  # as Hugging Face's padding_idx
            dtable[self.dims.pad_token_id].zero_()
        # the pass is done: its gradient transitions (X x S x D) go now, not when the next
        # pass's replace them (the memory model counts one pass's, or two with overlap)
        p.T.clear()
        p.graphs.clear()

    def _interleave(
        self, p: Pass, forward: Iterator[None], q: Pass, backward: Iterator[None]
    ) -> None:
        """p's forward beside q's backward, a layer of each in turn; the weight ring is told
        the merged order (then the next pass's pair, or p's backward alone after the last)."""
        order = [k for pair in zip(self._fwd_order, self._bwd_order) for k in pair]
        after = self._bwd_order if p.last else order
        for i, _ in enumerate(self._fwd_order):
            p.upcoming = order[2 * i + 1 :] + after
            next(forward)
            q.upcoming = order[2 * i + 2 :] + after
            next(backward)
        for _ in forward:  # both end: q's embedding gradient
            pass
        for _ in backward:
            pass
        p.upcoming = q.upcoming = None

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
        self.acts.reset()  # no pass in flight
        scale = 1.0 / max(
            data.target_tokens(step, cfg.rounds * cfg.micro_batch), 1
        )  # the global batch's mean (base.py)
        loss = torch.zeros((), device=self.device, dtype=torch.float32)
        passes = [
            range(cfg.lead_rounds),
            *(range(r, r + 1) for r in range(cfg.lead_rounds, cfg.rounds)),
        ]
        behind: tuple[Pass, Iterator[None]] | None = None  # a backward still to run
        for i, rounds in enumerate(passes):
            batches = [data.batch(step, r, cfg.micro_batch) for r in rounds]
            tokens, targets = (torch.cat(parts).to(self.device) for parts in zip(*batches))
            docs = None
            if cfg.document_mask:  # (positions, segments) of the pass's sequences
                parts = [data.documents(step, r, cfg.micro_batch) for r in rounds]
                docs = tuple(torch.cat(d) for d in zip(*parts))
            p = self._begin(i, tokens, targets, i == len(passes) - 1, scale, docs)
            if behind is None:
                for _ in self._forward(p):
                    pass
            else:
                self._interleave(p, self._forward(p), *behind)
            loss += self._head(p)
            behind = None
            if cfg.overlap and not p.last:
                behind = (p, self._backward(p))
                continue
            for _ in self._backward(p):
                pass
        self._send_home(self.embed_grad, self.host.embed_g, self.dims.num_layers)
        self.grads.flush()  # the layers' gradients, the head's and the embedding's are home
        return float(self.shards.total(loss).item()) * scale
