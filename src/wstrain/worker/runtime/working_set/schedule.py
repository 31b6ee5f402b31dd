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
With cfg.overlap every pass after the step's first runs its forward layer by layer beside the
previous pass's backward (working_set/pass_order.py, which holds the passes' order).
What one (layer, unit) computes is working_set/layer_passes.py's; this module holds the
state, the streams around the passes and the optimizer. It never touches Redis; on CPU streams are
no-ops and the same schedule runs.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import torch

from wstrain.contracts.calibration import LEVELS
from wstrain.contracts.model_dims import ModelDims
from wstrain.contracts.spec import OptimizerSpec
from wstrain.contracts.step_shape import step_tokens
from wstrain.worker.models.moe import RouterTotals
from wstrain.worker.models.rope import rope_tables
from wstrain.worker.runtime.base import Batches, HostMemory
from wstrain.worker.runtime.distributed import ProcessGroup
from wstrain.worker.runtime.optim import StepUpdate, sq_norm_fp32
from wstrain.worker.runtime.stats import StepStats
from wstrain.worker.runtime.working_set.config import WorkingSetConfig
from wstrain.worker.runtime.working_set.data_parallel import RankShards
from wstrain.worker.runtime.working_set.device_optim import DeviceOptimizer
from wstrain.worker.runtime.working_set.host_optim import HostOptimizerPipeline
from wstrain.worker.runtime.working_set.host_store import HostActivationStore
from wstrain.worker.runtime.working_set.pass_order import PassOrder
from wstrain.worker.runtime.working_set.rings import Streams
from wstrain.worker.runtime.working_set.saved_acts import BackwardPrefetch
from wstrain.worker.runtime.working_set.sequence_chunks import PieceLayers, PieceRows
from wstrain.worker.runtime.working_set.state import DTYPES, HostState
from wstrain.worker.runtime.working_set.streamer import SlotStreamer


class WorkingSetRuntime(PassOrder):
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
        # lead passes and the overlap are planned for dense models only: the MoE path is not
        # tested under either
        assert (cfg.lead_rounds == 1 and not cfg.overlap) or not dims.is_moe
        self.dims, self.cfg, self.opt_spec, self.host = dims, cfg, opt, host
        self.device = torch.device(cfg.device)
        self.streams = Streams(self.device)
        self.counters = {"h2d_bytes": 0, "d2h_bytes": 0, "h2d_on_demand_bytes": 0}
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
        # with overlap a forward fills what the backward beside it frees: its sets go home in
        # chunk-sized parts, so that any freed chunk takes any part (host_store.py)
        self.acts = HostActivationStore(host.arena, cfg.write_buffer_bytes, split=cfg.overlap)
        self._first_pass = True
        self.device_groups, self.host_groups = cfg.optimizer_groups(L)
        self.dopt = (
            DeviceOptimizer(host, opt, self.streams, self.device, self.grads, self.counters)
            if self.device_groups
            else None
        )
        if host.spill is not None:  # the planner spills host-updated layers only
            assert set(host.spill.groups) <= set(self.host_groups), (
                f"spilled layers {host.spill.groups} must update on the host "
                f"(device_opt_layers {cfg.device_opt_layers})"
            )
        self.hopt = HostOptimizerPipeline(host, opt, self.device) if self.host_groups else None
        if self.hopt is not None:
            self.weights.before_load = self._await_host_update  # layer k's tile: updated
            self.weights.ready_to_load = self.hopt.is_done
        self._stale: set[int] = set()  # embedding (L) / head (L + 1) awaiting a host update
        # the global gradient norm, squared, summed in fp32 as final gradients go home
        self.sq_norm = torch.zeros((), device=self.device, dtype=torch.float32)
        self.cos, self.sin = rope_tables(dims, cfg.seq_len, self.device, dtype)
        self.spans = cfg.spans()  # each piece's rows of a sequence (one span: whole ones)
        self.pieces = (
            PieceLayers(
                dims,
                cfg.chunk,
                cfg.seq_len,
                cfg.seq_chunk,
                dtype,
                self.device,
                host.arena if cfg.window_home else None,
            )
            if cfg.pieces > 1
            else None
        )
        self._where: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]] = []
        self._ahead: BackwardPrefetch | None = None  # during backward: its sets coming back
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

    # ---------------------------------------------------------------- one step

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
        self.counters.update(h2d_bytes=0, d2h_bytes=0, h2d_on_demand_bytes=0)
        loss = self.forward_backward(data, step)
        with self.streams.host_waits("optimizer"):  # the norm's sync drains the queue
            self._start_optimizer(step)
        self.weights.invalidate()
        self.grads.invalidate()
        stalls = self.streams.collect_stalls()
        if self.host.spill is not None:  # the AdamW thread's waits on the spill file
            stalls["spill"] = self.host.spill.take_wait_s()
        return StepStats(
            loss,
            time.perf_counter() - start,
            # the global batch's tokens
            step_tokens(self.shards.world * cfg.rounds * cfg.micro_batch, cfg.seq_len),
            stalls,
            self.counters["h2d_bytes"],
            self.counters["d2h_bytes"],
        )
