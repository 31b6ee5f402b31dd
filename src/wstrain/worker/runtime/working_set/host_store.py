"""The host activation store: pinned host bytes for the saved sets a forward sends home, until
their backward has taken them back (working_set/saved_acts.py sends and fetches them).

A pass's layers place their sets under a tag, (pass, layer); the backward releases each
layer's tag as soon as its units are done, so with the cross-round overlap
(working_set/pass_order.py) the next pass's forward fills what the previous pass's backward
frees: one store holds about one pass's sets, not two (planning/memory_model.py
overlap_stored_bytes).

    store = HostActivationStore(arena)
    store.tag = (0, k); host = store.take(t)     # forward of layer k
    store.release((0, k), reads)                 # its backward is done
"""

from __future__ import annotations

from collections import deque

import torch

from wstrain.scheduler.contracts.calibration import ACTIVATION_CHUNK_BYTES, WRITE_BUFFER_BYTES
from wstrain.worker.runtime.working_set.arena import HostArena
from wstrain.worker.runtime.working_set.rings import Streams

Tag = tuple[int, int]  # (pass of the step, layer)


class HostActivationStore:
    """Best-fit allocator over arena chunks. A chunk is written front to back and taken back
    whole when every set placed in it is released. Best fit, not a bump cursor over the
    whole store: a level-1 set is 64+64+16+16+64+1 MiB at 8K tokens, and a cursor that only
    moves on left ~95 MiB of every set's chunk tails unused (the arena measured 10-12 GiB
    over the planner's count on the H200); the small tensors go into the tails instead.
    Whole free chunks are reused by size, smallest first, so a 224 MiB chunk freed by one
    pass's gate projection waits for the next pass's, not for 64 MiB pieces that would make
    the arena grow a chunk for it.

    It also bounds the write buffer: device tensors on their way home stay allocated until
    their copy finishes, so when more than `write_buffer_bytes` are in flight the host waits
    for the oldest copy instead of letting the forward run ahead of the link and the device
    budget (a `write_buffer` stall as far as the GPU runs dry meanwhile)."""

    def __init__(
        self,
        arena: HostArena,
        write_buffer_bytes: int = WRITE_BUFFER_BYTES,
        chunk_bytes: int = ACTIVATION_CHUNK_BYTES,
    ) -> None:
        self.arena, self.chunk_bytes = arena, chunk_bytes
        self.chunks: list[torch.Tensor] = []  # uint8 tiles
        self.used: list[int] = []  # each chunk's write cursor, bytes
        self.live: list[int] = []  # each chunk's bytes not yet released
        self.open: list[int] = []  # part-used chunks with room left
        self.empty: dict[int, list[int]] = {}  # chunk bytes -> its free chunks
        self.placed: dict[Tag, list[tuple[int, int]]] = {}  # (chunk, bytes) of each tag
        # per chunk: inbound copies still reading it when it was released (prefetched and
        # never taken); a copy home into it waits for them (pop_waits)
        self.readers: list[list[torch.cuda.Event]] = []
        self.waits: list[torch.cuda.Event] = []
        self.tag: Tag = (0, 0)  # what take() places now
        self.live_bytes = 0  # placed and not yet released
        self.peak_bytes = 0  # the most live at once since the last reset
        self.smallest = chunk_bytes  # the smallest request seen: a tail with less is full
        self.write_buffer_bytes = write_buffer_bytes
        self.in_flight: deque[tuple[torch.cuda.Event, int]] = deque()
        self.in_flight_bytes = 0

    # ------------------------------------------------------------ the write buffer

    def admit(self, nbytes: int, streams: Streams) -> None:
        """Make room for a copy of `nbytes` in the write buffer (CUDA only)."""
        while self.in_flight:
            event, size = self.in_flight[0]
            if not event.query():  # the oldest copy is still going: wait only if full
                if self.in_flight_bytes + nbytes <= self.write_buffer_bytes:
                    return
                with streams.host_waits("write_buffer"):
                    event.synchronize()
            self.in_flight.popleft()
            self.in_flight_bytes -= size

    def track(self, event: torch.cuda.Event, nbytes: int) -> None:
        self.in_flight.append((event, nbytes))
        self.in_flight_bytes += nbytes

    # ------------------------------------------------------------ placement

    def reset(self) -> None:
        """Every chunk free (the step's start: no pass in flight)."""
        self.used = [0] * len(self.chunks)
        self.live = [0] * len(self.chunks)
        self.open, self.empty, self.placed = [], {}, {}
        self.live_bytes = self.peak_bytes = 0
        for idx in range(len(self.chunks)):
            self._free(idx)

    def release(self, tag: Tag, reads: list[torch.cuda.Event]) -> None:
        """`tag`'s sets are taken back: their chunks are free once nothing else in them is
        live. `reads`: inbound copies of them the compute stream never waited for."""
        for idx, nbytes in self.placed.pop(tag, []):
            self.live[idx] -= nbytes
            self.live_bytes -= nbytes
            self.readers[idx] += reads
            if self.live[idx] == 0:
                if idx in self.open:
                    self.open.remove(idx)
                self.used[idx] = 0
                self._free(idx)

    def pop_waits(self) -> list[torch.cuda.Event]:
        """Reads the next copy home must wait for (its room was read by them)."""
        waits, self.waits = self.waits, []
        return waits

    def _free(self, idx: int) -> None:
        self.empty.setdefault(self.chunks[idx].numel(), []).append(idx)

    def _reuse(self, nbytes: int) -> int | None:
        """The smallest free chunk that holds `nbytes`, taken from the free lists."""
        sizes = [size for size, free in self.empty.items() if free and size >= nbytes]
        if not sizes:
            return None
        idx = self.empty[min(sizes)].pop()
        self.waits += self.readers[idx]
        self.readers[idx] = []
        return idx

    def _place(self, nbytes: int) -> tuple[int, int]:
        """(chunk, byte offset) for `nbytes`: the tail with the least room that holds it,
        else a free chunk, else a new one."""
        self.smallest = min(self.smallest, nbytes)
        fits = [i for i in self.open if self.chunks[i].numel() - self.used[i] >= nbytes]
        if fits:
            idx = min(fits, key=lambda i: self.chunks[i].numel() - self.used[i])
        else:
            reused = self._reuse(nbytes)
            if reused is None:
                reused, size = len(self.chunks), max(self.chunk_bytes, nbytes)
                tile = self.arena.alloc(f"acts{reused}", size, torch.uint8, "activations")
                self.chunks.append(tile)
                self.used.append(0)
                self.live.append(0)
                self.readers.append([])
            idx = reused
            self.open.append(idx)
        off = self.used[idx]
        self.used[idx] = off + nbytes
        self.live[idx] += nbytes
        self.live_bytes += nbytes
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        self.placed.setdefault(self.tag, []).append((idx, nbytes))
        if self.chunks[idx].numel() - self.used[idx] < self.smallest:
            self.open.remove(idx)
        return idx, off

    def take(self, like: torch.Tensor) -> torch.Tensor:
        """Host room for `like` under the current tag, laid out with its strides when it is a
        permuted contiguous tensor (SDPA's transposed q/k/v and output), so the copy home is
        one plain DMA."""
        nbytes = -(-like.numel() * like.element_size() // 256) * 256
        idx, off = self._place(nbytes)
        raw = self.chunks[idx][off : off + like.numel() * like.element_size()].view(like.dtype)
        order = sorted(range(like.dim()), key=lambda d: -like.stride()[d])  # outermost first
        if not like.permute(order).is_contiguous():
            return raw.view(like.shape)
        inverse = sorted(range(like.dim()), key=lambda i: order[i])
        return raw.view([like.shape[d] for d in order]).permute(inverse)
