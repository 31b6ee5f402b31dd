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
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import torch

from wstrain.contracts.calibration import ACTIVATION_CHUNK_BYTES, GIB, WRITE_BUFFER_BYTES
from wstrain.contracts.errors import BudgetExceeded
from wstrain.worker.runtime.working_set.arena import HostArena, Tile
from wstrain.worker.runtime.working_set.rings import Streams

Tag = tuple[int, int]  # (pass of the step, layer)

# A chunk the store lacks is made with spares of its size, up to STORE_FILL_CHUNKS chunks and
# STORE_FILL_BYTES in all, page-locked together on the arena's threads (arena.py
# FILL_THREADS): the first step fills the store, up to 173 GiB at 240 GiB of host, at 5.3-8.9
# GiB/s instead of 2.3-2.7 a chunk at a time (an H200 host; bench/results/host-memory/). At
# most this much a size goes unused until the next step's reset gives it back.
STORE_FILL_CHUNKS: Final = 16
STORE_FILL_BYTES: Final = GIB


def memory_order(t: torch.Tensor) -> torch.Tensor | None:
    """A dense tensor's elements as one flat view in the order they lie in memory (a
    permuted contiguous tensor too: SDPA's transposed q/k/v and output); None if not dense."""
    order = sorted(range(t.dim()), key=lambda d: -t.stride()[d])  # outermost first
    inner = t.permute(order)
    return inner.view(-1) if inner.is_contiguous() else None


@dataclass(frozen=True)
class HostRoom:
    """Host bytes for one saved tensor: one view with its layout, or, with the overlap, flat
    parts of its memory order, one a page of its tag (HostActivationStore._take_paged)."""

    parts: tuple[torch.Tensor, ...]
    shape: tuple[int, ...]
    stride: tuple[int, ...]

    @classmethod
    def whole(cls, view: torch.Tensor) -> HostRoom:
        return cls((view,), tuple(view.shape), tuple(view.stride()))

    @property
    def dtype(self) -> torch.dtype:
        return self.parts[0].dtype

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.parts)

    def numel(self) -> int:
        return sum(p.numel() for p in self.parts)

    def empty_on(self, device: torch.device) -> torch.Tensor:
        """A tensor of the saved one's shape and strides on `device`, for its copy back."""
        return torch.empty_strided(self.shape, self.stride, dtype=self.dtype, device=device)

    def copy_from(self, t: torch.Tensor) -> None:
        """Copy `t` (the saved tensor) in, asynchronously on the current stream."""
        if len(self.parts) == 1:
            self.parts[0].copy_(t, non_blocking=True)
            return
        self._each(t, lambda part, flat: part.copy_(flat, non_blocking=True))

    def copy_to(self, out: torch.Tensor) -> None:
        """Copy the saved tensor into `out` (from empty_on), asynchronously."""
        if len(self.parts) == 1:
            out.copy_(self.parts[0], non_blocking=True)
            return
        self._each(out, lambda part, flat: flat.copy_(part, non_blocking=True))

    def cpu(self) -> torch.Tensor:
        """The contents as one host tensor (a view when in one part)."""
        if len(self.parts) == 1:
            return self.parts[0]
        out = self.empty_on(torch.device("cpu"))
        self.copy_to(out)
        return out

    def _each(self, t: torch.Tensor, fn: Callable[[torch.Tensor, torch.Tensor], object]) -> None:
        """fn(part, its elements of t in memory order) for each part (a tensor that is not
        dense: of its contiguous copy, the room's layout)."""
        flat = memory_order(t)
        if flat is None:
            flat = t.contiguous().view(-1)
        offset = 0
        for part in self.parts:
            fn(part, flat[offset : offset + part.numel()])
            offset += part.numel()


class HostActivationStore:
    """Best-fit allocator over arena chunks. A chunk is written front to back and taken back
    whole when every set placed in it is released. Best fit, not a bump cursor
    over the whole store: a level-1 set is 64+64+16+16+64+1 MiB at 8K tokens, and a cursor
    that only moves on left ~95 MiB of every set's chunk tails unused (the arena measured
    10-12 GiB over the planner's count on the H200); the small tensors go into the tails
    instead. Free chunks are reused smallest first; per round a tensor larger than a chunk
    (the 224 MiB gate and up projections) gets a chunk of its own size. With the overlap
    every chunk is a page of one tag and tensors are split at page ends (HostRoom), so any
    page a backward frees takes any of the next forward's sets, and the store holds exactly
    the pages of the live tags: mixed sizes and shared tails had grown the arena up to 15%
    past the sets in simulations of the planner's plans.

    It also bounds the write buffer: device tensors on their way home stay allocated until
    their copy finishes, so when more than `write_buffer_bytes` are in flight the host waits
    for the oldest copy instead of letting the forward run ahead of the link and the device
    budget (a `write_buffer` stall as far as the GPU runs dry meanwhile)."""

    def __init__(
        self,
        arena: HostArena,
        write_buffer_bytes: int = WRITE_BUFFER_BYTES,
        chunk_bytes: int = ACTIVATION_CHUNK_BYTES,
        split: bool = False,
    ) -> None:
        """`split` (the overlap's store): each tag's tensors go into pages of its own, whole
        chunks, split at page ends (_take_paged); per round a tensor larger than a chunk
        takes a chunk of its own size and smaller ones share chunks' tails."""
        self.arena, self.chunk_bytes, self.split = arena, chunk_bytes, split
        self.chunks: list[torch.Tensor] = []  # uint8 tiles
        # chunks made beside one asked for, by size: what the next new chunk of that size is
        self.spare: dict[int, list[int]] = {}
        self.dropped: set[int] = set()  # spares given back to the arena: empty tensors
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
        self.cursor: dict[Tag, tuple[int, int]] = {}  # split: each tag's last page, offset
        self.live_bytes = 0  # placed and not yet released
        self.peak_bytes = 0  # the most live at once since the last reset
        self.smallest = chunk_bytes  # the smallest request seen: a tail with less is full
        self.write_buffer_bytes = write_buffer_bytes
        self.in_flight: deque[tuple[torch.cuda.Event, int]] = deque()
        self.in_flight_bytes = 0

    # ------------------------------------------------------------ the write buffer

    def admit(self, nbytes: int, streams: Streams) -> None:
        """Make room for a copy of `nbytes` in the write buffer (CUDA only): wait for the
        oldest copy still going only while the buffer is full. A tensor larger than the
        buffer goes alone, once nothing else is in flight."""
        # retire finished copies before asking whether any is left to wait for
        while self.outgoing_bytes() + nbytes > self.write_buffer_bytes and self.in_flight:
            with streams.host_waits("write_buffer"):
                self.in_flight[0][0].synchronize()  # retired by outgoing_bytes next

    def outgoing_bytes(self) -> int:
        """Bytes of saved sets still on their way home, finished copies retired first."""
        while self.in_flight and self.in_flight[0][0].query():
            self.in_flight_bytes -= self.in_flight.popleft()[1]
        return self.in_flight_bytes

    def track(self, event: torch.cuda.Event, nbytes: int) -> None:
        self.in_flight.append((event, nbytes))
        self.in_flight_bytes += nbytes

    # ------------------------------------------------------------ placement

    def reset(self) -> None:
        """Every chunk free (the step's start: no pass in flight); spares the last step never
        placed go back to the arena."""
        self._drop_spares()
        self.used = [0] * len(self.chunks)
        self.live = [0] * len(self.chunks)
        self.open, self.empty, self.placed, self.cursor = [], {}, {}, {}
        self.live_bytes = self.peak_bytes = 0
        for idx in range(len(self.chunks)):
            if idx not in self.dropped:
                self._free(idx)

    def release(self, tag: Tag, reads: list[torch.cuda.Event]) -> None:
        """`tag`'s sets are taken back: their chunks are free once nothing else in them is
        live. `reads`: inbound copies of them the compute stream never waited for."""
        self.cursor.pop(tag, None)
        for idx, nbytes in self.placed.pop(tag, []):
            self.live[idx] -= nbytes
            self.live_bytes -= nbytes
            self.readers[idx] += reads
            if self.live[idx] == 0:
                if idx in self.open:
                    self.open.remove(idx)
                self.used[idx] = 0
                self._free(idx)

    @property
    def held_bytes(self) -> int:
        """Bytes of the chunks the store has placed sets in: its arena tiles less spares."""
        gone = self.dropped.union(*self.spare.values())
        return sum(c.numel() for i, c in enumerate(self.chunks) if i not in gone)

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
            idx = self._new_chunk(max(self.chunk_bytes, nbytes)) if reused is None else reused
            self.open.append(idx)
        off = self.used[idx]
        self.used[idx] = off + nbytes
        self._count(idx, nbytes)
        if self.chunks[idx].numel() - self.used[idx] < self.smallest:
            self.open.remove(idx)
        return idx, off

    def take(self, like: torch.Tensor) -> HostRoom:
        """Host room for `like` under the current tag, laid out with its strides when it is a
        permuted contiguous tensor (SDPA's transposed q/k/v and output), so the copy home is
        one plain DMA; in pages where the store splits."""
        if self.split:
            return self._take_paged(like)
        raw = self._raw(like.numel(), like.dtype)
        if memory_order(like) is None:  # not dense: contiguous room, and copy_ gathers it
            return HostRoom.whole(raw.view(like.shape))
        return HostRoom.whole(raw.as_strided(like.shape, like.stride()))

    def _raw(self, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """(numel,) of `dtype` in the store, its bytes rounded up to 256."""
        nbytes = numel * dtype.itemsize
        idx, off = self._place(max(256, -(-nbytes // 256) * 256))
        return self.chunks[idx][off : off + nbytes].view(dtype)

    def _take_paged(self, like: torch.Tensor) -> HostRoom:
        """`like` written on from where the tag's last tensor ended, 256-aligned, across as
        many of the tag's pages (whole chunks, its own) as it needs: one part a page. A
        tag's pages hold nothing else, so its release frees them all and the store holds
        exactly the pages of the tags alive (planning/memory_model.py overlap_stored_bytes)."""
        if memory_order(like) is None:  # not dense: parts of its contiguous form
            stride = tuple(torch.empty(like.shape, device="meta").stride())
        else:
            stride = tuple(like.stride())
        C, nbytes = self.chunk_bytes, like.numel() * like.element_size()
        idx, off = self.cursor.get(self.tag, (-1, C))
        parts, left = [], nbytes
        while left > 0:
            if idx < 0 or off >= C:
                idx, off = self._page(), 0
            n = min(left, C - off)
            counted = -(-n // 256) * 256 if n == left else n  # the last part: to 256
            parts.append(self.chunks[idx][off : off + n].view(like.dtype))
            self._count(idx, counted)
            off, left = off + counted, left - n
            self.used[idx] = off
        self.cursor[self.tag] = (idx, off)
        if not parts:  # no elements: no room
            return HostRoom.whole(torch.empty(like.shape, dtype=like.dtype))
        if len(parts) == 1:  # within a page: one view with the layout
            return HostRoom.whole(parts[0].as_strided(like.shape, stride))
        return HostRoom(tuple(parts), tuple(like.shape), stride)

    def _page(self) -> int:
        """A whole chunk for the current tag: a free one, else a new one."""
        reused = self._reuse(self.chunk_bytes)
        return self._new_chunk(self.chunk_bytes) if reused is None else reused

    def _new_chunk(self, nbytes: int) -> int:
        """A chunk of `nbytes` the store has not used yet: a spare of that size, else a new
        arena tile made with spares up to STORE_FILL_CHUNKS, STORE_FILL_BYTES and the
        arena's room. Where the arena refuses even one (past the host budget), the spares go
        back first and it is asked again."""
        if self.spare.get(nbytes):
            return self.spare[nbytes].pop()
        n = max(1, min(STORE_FILL_CHUNKS, STORE_FILL_BYTES // nbytes))
        share = self.arena.share
        if share is not None and share.world > 1:
            # each rank's limit is the node's budget less the shared state: the room of all
            # the ranks' stores, which spares of one rank could take from the others
            n = 1
        elif self.arena.limit_bytes is not None:
            n = max(1, min(n, (self.arena.limit_bytes - self.arena.total_bytes) // nbytes))
        try:
            made = self._make(n, nbytes)
        except BudgetExceeded:
            if not any(self.spare.values()):
                raise
            self._drop_spares()
            made = self._make(1, nbytes)
        self.spare[nbytes] = made[:0:-1]  # popped from the end: in the order made
        return made[0]

    def _make(self, n: int, nbytes: int) -> list[int]:
        first = len(self.chunks)
        tiles = [Tile(f"acts{first + i}", nbytes, torch.uint8, "activations") for i in range(n)]
        self.chunks += self.arena.alloc_many(tiles)
        self.used += [0] * n
        self.live += [0] * n
        self.readers += [[] for _ in range(n)]
        return list(range(first, first + n))

    def _drop_spares(self) -> None:
        """Give every spare back to the arena, an empty tensor in its place (chunk indices
        stay stable)."""
        for idx in (i for spares in self.spare.values() for i in spares):
            self.chunks[idx] = torch.empty(0, dtype=torch.uint8)
            self.arena.free(f"acts{idx}")
            self.dropped.add(idx)
        self.spare.clear()

    def _count(self, idx: int, nbytes: int) -> None:
        self.live[idx] += nbytes
        self.live_bytes += nbytes
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        self.placed.setdefault(self.tag, []).append((idx, nbytes))
