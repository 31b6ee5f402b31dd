"""working_set/streamer.py's ordering, read off the waits it asks of the streams (a
recording stand-in for CUDA's, whose events are plain objects here): a slot is refilled
only after its last contents' copy home, and a prefetch stops at a layer whose host tile is
still being updated instead of blocking before the layer in hand is launched.

    pytest tests/worker/runtime/working_set/test_streamer.py
"""

from __future__ import annotations

import torch

from wstrain.worker.runtime.working_set.rings import SlotRing, Streams
from wstrain.worker.runtime.working_set.streamer import SlotStreamer


class RecordingStreams(Streams):
    """CPU streams that hand out an event per record and log who waits for which."""

    def __init__(self) -> None:
        super().__init__(torch.device("cpu"))
        self.waits: list[tuple[str, object]] = []
        self.recorded = 0

    def record(self, stream: str) -> object:  # type: ignore[override]
        self.recorded += 1
        return (stream, self.recorded)

    def wait(self, stream: str, event: object) -> None:  # type: ignore[override]
        if event is not None:
            self.waits.append((stream, event))


def _streamer(slots: int, layers: int = 4) -> tuple[SlotStreamer, RecordingStreams]:
    streams = RecordingStreams()
    tiles = [torch.full((8,), float(k)) for k in range(layers)]
    ring = SlotRing.allocate(slots, 8, torch.float32, torch.device("cpu"))
    return SlotStreamer(ring, tiles, streams, "weights", {"h2d_bytes": 0, "d2h_bytes": 0}), streams


def test_a_slot_is_refilled_only_after_its_copy_home() -> None:
    """A device-updated layer goes home (send_home) and is then released by the compute that
    read it: the release's event replaces the slot's, and the next load into that slot must
    still wait for the copy home, or it overwrites weights the outbound stream is reading."""
    weights, streams = _streamer(slots=2)
    slot = weights.consume(0, [])
    weights.send_home(slot)
    home = weights.home_ready[0]
    weights.release(slot)
    assert slot.free != home
    weights.release(weights.consume(1, []))  # the other slot
    streams.waits.clear()
    assert weights.consume(2, []) is slot  # layer 0's slot, refilled
    assert ("inbound", home) in streams.waits


def test_a_prefetch_stops_at_a_layer_the_host_is_still_updating() -> None:
    weights, _ = _streamer(slots=3)
    updated = {0, 1}
    waited: list[int] = []
    weights.ready_to_load = lambda layer: layer in updated
    weights.before_load = waited.append
    weights.consume(0, [1, 2, 3])
    assert weights.ring.find(1) is not None  # updated: prefetched
    assert weights.ring.find(2) is None and waited == [0, 1]  # no wait for layer 2 yet
    updated.add(2)
    slot = weights.consume(2, [3])  # loaded where it is used
    assert slot.layer == 2 and waited == [0, 1, 2]
    assert torch.equal(slot.flat, torch.full((8,), 2.0))


def test_a_layer_loaded_where_it_is_used_spares_the_slot_in_use() -> None:
    """Two slots, nothing prefetched: layer 2, loaded at its consume, goes into the slot the
    compute stream is not still reading (layer 1's, consumed last), whatever the slots'
    order, so its copy need not wait for layer 1's forward to end."""
    weights, _ = _streamer(slots=2)
    for layer in (0, 1):
        weights.release(weights.consume(layer, []))
    busy = weights.ring.find(1)
    assert weights.consume(2, []) is not busy
    assert weights.ring.find(1) is busy
