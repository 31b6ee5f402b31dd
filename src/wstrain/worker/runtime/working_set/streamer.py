"""Streaming host tiles through a device `SlotRing`: just-in-time prefetch of the layers the
schedule visits next (weights, and accumulated gradients after the first round), and
gradients sent home on the outbound stream. Per-slot events order copies and compute.

    weights = SlotStreamer.for_tiles(3, host_tiles, streams, device, "weights", counters)
    slot = weights.consume(k, upcoming); ...compute...; weights.release(slot)
    dw = LazyGradViews(grads, k, upcoming, first_round, layout)  # taken at first dw[name]
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from wstrain.worker.runtime.working_set.arena import LayerLayout
from wstrain.worker.runtime.working_set.rings import Slot, SlotRing, Streams


class SlotStreamer:
    def __init__(
        self,
        ring: SlotRing,
        tiles: list[torch.Tensor],
        streams: Streams,
        dependency: str,
        counters: dict[str, int],
    ) -> None:
        self.ring, self.tiles, self.streams = ring, tiles, streams
        self.dependency, self.counters = dependency, counters
        # per layer: the outbound copy that last wrote its host tile; loads wait for it
        self.home_ready: dict[int, torch.cuda.Event | None] = {}
        # called with a layer before its host tile is read (a deferred host update waits)
        self.before_load: Callable[[int], None] | None = None
        # whether a layer's host tile may be read now; a prefetch stops at one that may not
        # (its deferred host update is running) and its consume loads it, so the host waits
        # for that update only after the layers before it are launched
        self.ready_to_load: Callable[[int], bool] | None = None
        self.last: int | None = None  # the layer consumed last
        # data parallel gradients (working_set/data_parallel.py): only this rank's [lo, hi)
        # of a tile goes home (`span`) and comes back in (`load_span`, the rest of the slot
        # zeroed; empty on a multi-node job's other nodes, whose copies hold the same sums)
        self.span: tuple[int, int] | None = None
        self.load_span: tuple[int, int] | None = None

    @classmethod
    def for_tiles(
        cls,
        count: int,
        tiles: list[torch.Tensor],
        streams: Streams,
        device: torch.device,
        dependency: str,
        counters: dict[str, int],
    ) -> SlotStreamer:
        ring = SlotRing.allocate(count, tiles[0].numel(), tiles[0].dtype, device)
        return cls(ring, tiles, streams, dependency, counters)

    def storage_of(self, layer: int) -> torch.Tensor:
        slot = self.ring.find(layer)
        assert slot is not None, f"layer {layer} is not on the device"
        return slot.flat

    def _load(self, layer: int, keep: set[int]) -> Slot:
        slot = self.ring.victim(keep)
        s = self.streams
        if self.before_load is not None:
            self.before_load(layer)
        start = time.perf_counter()
        s.wait("inbound", slot.free)
        if slot.layer >= 0:  # its contents' copy home, which a release's event replaced
            s.wait("inbound", self.home_ready.get(slot.layer))
        s.wait("inbound", self.home_ready.get(layer))
        whole = (0, slot.flat.numel())
        lo, hi = self.load_span or self.span or whole
        with s.on("inbound"):
            if (lo, hi) != whole:
                slot.flat[:lo].zero_()
                slot.flat[hi:].zero_()
            slot.flat[lo:hi].copy_(self.tiles[layer][lo:hi], non_blocking=True)
        slot.ready, slot.layer = s.record("inbound"), layer
        s.time_host(self.dependency, start)
        self.counters["h2d_bytes"] += slot.flat[lo:hi].nbytes
        return slot

    def prefetch_after(self, current: int, upcoming: list[int]) -> None:
        """Load the next distinct layers of `upcoming` into the slots `current` leaves (what
        consume(current, upcoming) prefetches; called apart, a layer's own loads go ahead of
        those the next layers need)."""
        wanted: list[int] = []
        for layer in upcoming:
            if len(wanted) == len(self.ring.slots) - 1:
                break
            if layer != current and layer not in wanted:
                wanted.append(layer)
        keep = {current, *wanted}
        for layer in wanted:
            if self.ring.find(layer) is None:
                if self.ready_to_load is not None and not self.ready_to_load(layer):
                    break
                self._load(layer, keep)

    def prefetch(self, upcoming: list[int]) -> None:
        """Start loading the first layers of `upcoming` before any is used, into all but one
        slot (as a consume would prefetch)."""
        wanted = list(dict.fromkeys(upcoming))[: len(self.ring.slots) - 1]
        for layer in wanted:
            if self.ring.find(layer) is None:
                self._load(layer, set(wanted))

    def consume(self, layer: int, upcoming: list[int]) -> Slot:
        # loaded here (not prefetched): not into the slot consumed last, which the compute
        # stream may still be reading, while another slot can take it
        keep = {layer} if self.last is None or len(self.ring.slots) < 2 else {layer, self.last}
        slot = self.ring.find(layer) or self._load(layer, keep)
        self.last = layer
        self.prefetch_after(layer, upcoming)
        self.streams.compute_waits(self.dependency, slot.ready)
        return slot

    def release(self, slot: Slot) -> None:
        slot.free = self.streams.record("comp")

    def invalidate(self) -> None:
        """Host tiles changed (optimizer step): no slot's contents are current any more."""
        for slot in self.ring.slots:
            slot.layer = -1

    # ------------------------------------------------------------ gradient accumulation

    def consume_for_accumulate(self, layer: int, upcoming: list[int], zero: bool) -> Slot:
        """A slot holding layer's accumulated gradient: zeros in the first round, else the
        host tile's contents (prefetched when possible)."""
        if not zero:
            return self.consume(layer, upcoming)
        slot = self.ring.find(layer) or self.ring.victim({layer})
        self.streams.compute_waits(self.dependency, slot.free)
        slot.flat.zero_()
        slot.layer, slot.ready = layer, None
        return slot

    def send_home(self, slot: Slot) -> None:
        s = self.streams
        done = s.record("comp")
        s.wait("outbound", done)
        lo, hi = self.span or (0, slot.flat.numel())
        with s.on("outbound"):
            self.tiles[slot.layer][lo:hi].copy_(slot.flat[lo:hi], non_blocking=True)
        slot.free = s.record("outbound")
        self.home_ready[slot.layer] = slot.free
        self.counters["d2h_bytes"] += slot.flat[lo:hi].nbytes

    def flush(self) -> None:
        """Wait until every gradient sent home has arrived."""
        if self.streams.cuda:
            self.streams.outbound.synchronize()


class LazyGradViews:
    """Layer k's gradient-slot views, taken at the layer's first accumulate instead of before
    its backward: the wait for a free slot (the layer above's gradients going home) and for
    k's accumulated gradients coming in overlaps the first chunk's MLP backward. With one
    gradient slot that wait was the whole transfer, every layer of every round."""

    def __init__(
        self, grads: SlotStreamer, layer: int, upcoming: list[int], first: bool, layout: LayerLayout
    ) -> None:
        self.grads, self.layer, self.upcoming, self.first = grads, layer, upcoming, first
        self.layout = layout
        self.slot: Slot | None = None
        self.views: dict[str, torch.Tensor] = {}

    def take(self) -> Slot:
        if self.slot is None:
            self.slot = self.grads.consume_for_accumulate(
                self.layer, self.upcoming, zero=self.first
            )
            self.views = self.layout.views(self.slot.flat)
        return self.slot

    def __getitem__(self, name: str) -> torch.Tensor:
        self.take()
        return self.views[name]
