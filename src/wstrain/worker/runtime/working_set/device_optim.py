"""AdamW on the device over streamed moments, deferred into the next step's forward.

At the end of step t the global gradient norm is known (the runtime sums it on the device as
gradients go home) but no layer is updated yet. In step t+1's first forward pass, layer k's update
runs right where its weights arrive: its gradient and moments stream in beside the weights
(prefetched on the inbound stream), one fused AdamW kernel updates the slot in place, and
the new weights and moments stream home on the outbound stream while the layer computes.
The CPU optimizer (HostState.optimizer_step) then never sits on the critical path.
Embedding and head groups (resident on the device) update at the end of step t in slices
staged through the moment slots. `flush()` applies whatever is pending (checkpoints). The
runtime may give it only the first layers (and the embedding) and the host the rest
(working_set/schedule.py device_opt_layers).

    opt.start(update, layers, [(embed_w, embed_g, L)])   # at the end of step `update.step`
    if opt.needs(k): opt.apply(k, slot, weights, upcoming)   # where layer k's weights arrive
"""

from __future__ import annotations

import torch
from torch.optim.adamw import adamw as functional_adamw

from wstrain.contracts.spec import OptimizerSpec
from wstrain.worker.runtime.optim import StepUpdate
from wstrain.worker.runtime.working_set.rings import Slot, Streams
from wstrain.worker.runtime.working_set.state import HostState
from wstrain.worker.runtime.working_set.streamer import SlotStreamer


class DeviceOptimizer:
    def __init__(
        self,
        host: HostState,
        spec: OptimizerSpec,
        streams: Streams,
        device: torch.device,
        grads: SlotStreamer,
        counters: dict[str, int],
    ) -> None:
        self.host, self.spec = host, spec
        self.streams, self.device, self.grads = streams, device, grads
        L = host.dims.num_layers
        states = [o.state[p] for o, p in zip(host.optimizers, host.params)]
        self.steps = [s["step"] for s in states]  # host float tensors, one per group
        # their device copies, which the fused AdamW reads: a host scalar copied in per call
        # would make the host wait for the compute stream each time (a pageable copy)
        self.dev_steps = [s.detach().clone().to(device) for s in self.steps]
        self.m = SlotStreamer.for_tiles(
            2, [s["exp_avg"] for s in states[:L]], streams, device, "optimizer", counters
        )
        self.v = SlotStreamer.for_tiles(
            2, [s["exp_avg_sq"] for s in states[:L]], streams, device, "optimizer", counters
        )
        self.pending: StepUpdate | None = None
        self.todo: set[int] = set()

    # ------------------------------------------------------------ bookkeeping

    def start(
        self,
        update: StepUpdate,
        layers: list[int],
        resident: list[tuple[torch.Tensor, torch.Tensor, int]],
    ) -> None:
        """Gradients of `update.step` are complete: update the resident groups now and leave
        `layers` pending. resident: (device weights, device grads, group)."""
        self.pending = update
        self.todo = set(layers)
        for w, g, group in resident:
            self._update_staged(w, g, group)

    def _adamw(
        self, w: torch.Tensor, g: torch.Tensor, m: torch.Tensor, v: torch.Tensor, group: int
    ) -> None:
        assert self.pending is not None
        if self.pending.clip_coef < 1.0:
            g.mul_(self.pending.clip_coef)
        # the functional AdamW increments the step tensor it is given: give it a copy
        step_t = self.dev_steps[group].clone()
        functional_adamw(
            [w],
            [g],
            [m],
            [v],
            [],
            [step_t],
            foreach=False,
            fused=self.device.type == "cuda",
            amsgrad=False,
            beta1=self.spec.betas[0],
            beta2=self.spec.betas[1],
            lr=self.pending.lr,
            weight_decay=self.spec.weight_decay,
            eps=self.spec.eps,
            maximize=False,
        )
        self.steps[group] += 1
        self.dev_steps[group] += 1

    def load_steps(self) -> None:
        """After the host state was loaded (a resumed job): the device step counts follow."""
        for dev, host in zip(self.dev_steps, self.steps):
            dev.copy_(host)

    # ------------------------------------------------------------ layers, in the forward

    def needs(self, layer: int) -> bool:
        return layer in self.todo

    def apply(self, layer: int, wslot: Slot, weights: SlotStreamer, upcoming: list[int]) -> None:
        """Update layer's weights in `wslot` and send weights and moments home."""
        ahead = [k for k in upcoming if k in self.todo]
        # this layer's gradient and both moments load before the next layer's (consumed
        # with `ahead`, one streamer after another, they would queue g, g', m, m', v)
        g = self.grads.consume(layer, [])
        m, v = self.m.consume(layer, []), self.v.consume(layer, [])
        for streamer in (self.grads, self.m, self.v):
            streamer.prefetch_after(layer, ahead)
        self._adamw(wslot.flat, g.flat, m.flat, v.flat, layer)
        g.layer = -1  # its contents were scaled by the clip factor: no longer the host's
        for streamer, slot in ((weights, wslot), (self.m, m), (self.v, v)):
            streamer.send_home(slot)
        self.grads.release(g)
        self.todo.discard(layer)

    def flush(self, weights: SlotStreamer) -> None:
        """Apply every pending layer update now (before a checkpoint or the last step ends)."""
        order = sorted(self.todo)
        for i, k in enumerate(order):
            slot = weights.consume(k, order[i + 1 :])
            self.apply(k, slot, weights, order[i + 1 :])
            weights.release(slot)
        weights.flush()
        self.m.flush()

    # ------------------------------------------------------------ resident groups

    def _update_staged(self, w: torch.Tensor, g: torch.Tensor, group: int) -> None:
        """AdamW over a resident group in slices staged through the two moment slot pairs:
        slice i+1's moments come in (inbound stream) while slice i updates, and slice i's
        moments and weights go home (outbound) while slice i+1 updates; no host wait."""
        st = self.host.optimizers[group].state[self.host.params[group]]
        m_host, v_host = st["exp_avg"], st["exp_avg_sq"]
        w_host = self.host.params[group].data
        s = self.streams
        pairs = list(zip(self.m.ring.slots, self.v.ring.slots))
        for slot in (slot for pair in pairs for slot in pair):
            s.wait("inbound", slot.free)  # its last user (a layer's update) is done
            slot.layer = -1
        home: list[torch.cuda.Event | None] = [None] * len(pairs)
        n = pairs[0][0].flat.numel()
        first_host, first_dev = self.steps[group].clone(), self.dev_steps[group].clone()
        for i, a in enumerate(range(0, w.numel(), n)):
            b, j = min(a + n, w.numel()), i % len(pairs)
            m, v = pairs[j][0].flat[: b - a], pairs[j][1].flat[: b - a]
            s.wait("inbound", home[j])  # the pair's previous slice (updated, then sent) is home
            with s.on("inbound"):
                m.copy_(m_host[a:b], non_blocking=True)
                v.copy_(v_host[a:b], non_blocking=True)
            s.compute_waits("optimizer", s.record("inbound"))
            self.steps[group].copy_(first_host)  # every slice is the same optimizer step
            self.dev_steps[group].copy_(first_dev)
            self._adamw(w[a:b], g[a:b], m, v, group)
            s.wait("outbound", s.record("comp"))
            with s.on("outbound"):
                m_host[a:b].copy_(m, non_blocking=True)
                v_host[a:b].copy_(v, non_blocking=True)
                w_host[a:b].copy_(w[a:b], non_blocking=True)
            home[j] = s.record("outbound")
        for pair, event in zip(pairs, home):
            for slot in pair:
                slot.free = event or slot.free  # a layer's load waits for the copies home
