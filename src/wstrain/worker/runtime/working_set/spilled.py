"""The spilled layers' AdamW moments as the host AdamW sees them: SPILL_SLOTS arena slots of
one layer's (m, v) each (kind "spill_buffer"), filled from and written back to the spill file
(working_set/spill.py) around each spilled layer's update, and streamed to and from
checkpoints layer by layer, so no more than the slots is ever in host memory.

A slot is "reading" (a layer coming in), "updating" (AdamW on it) or idle; an idle slot keeps
the layer it last held, valid, until another layer's read replaces it (the read is chained
after the slot's write-back, on the I/O pool, never on the thread that drives the GPU).
`start_pass(order)` queues a pass's spilled groups; each `release` reads the next ones ahead
into the slots it frees, so with 2 slots one layer updates while the next one comes in and
the last one goes out.

    sm = SpilledMoments(arena, first=L - n, layers=n, numel, dtype, spill_dir, disk_limit)
    sm.start_pass([.., L - 2, L - 1]); m, v = sm.acquire(L - 2); ...; sm.release(L - 2)
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from wstrain.contracts.calibration import SPILL_SLOTS
from wstrain.worker.runtime.working_set.arena import HostArena
from wstrain.worker.runtime.working_set.spill import DONE, IoOp, RawFile, RecordLayout, SpillFile

log = logging.getLogger(__name__)

CHECKPOINT_FILE = "spilled_moments.bin"


@dataclass
class Slot:
    m: torch.Tensor
    v: torch.Tensor
    views: list[memoryview]  # m's and v's page-rounded mappings, for direct I/O
    layer: int | None = None  # whose moments it holds (or is reading)
    busy: bool = False  # reading ahead or updating: not for another layer
    op: IoOp = field(default_factory=lambda: DONE)  # its last read or write


class SpilledMoments:
    def __init__(
        self,
        arena: HostArena,
        first: int,
        layers: int,
        numel: int,
        dtype: torch.dtype,
        spill_dir: Path,
        disk_limit_bytes: int | None,
        buffered: bool = False,
    ) -> None:
        """Groups first..first+layers-1 spilled; `buffered` forces the fallback I/O."""
        self.first, self.layers = first, layers
        self.layout = RecordLayout.of(numel, dtype)
        self.file = SpillFile.create(spill_dir, layers, self.layout, disk_limit_bytes, buffered)
        self.slots = []
        for i in range(SPILL_SLOTS):
            m, v = (
                arena.alloc(f"spill{i}.{s}", numel, dtype, "spill_buffer", crosses_pcie=False)
                for s in ("m", "v")
            )
            views = [self._io_view(arena, f"spill{i}.{s}") for s in ("m", "v")]
            self.slots.append(Slot(m, v, views))
        self.queue: list[int] = []  # this pass's spilled groups not yet acquired, in order
        self.wait_s = 0.0  # the AdamW thread's waits on the disk, since take_wait_s
        self._wait_lock = threading.Lock()  # added to there, taken by the step's thread
        # each group's last write-back: a read of the group into another slot must not
        # overtake it (after a resume, or a backlogged disk, the write may still be going)
        self.last_write: dict[int, IoOp] = {}

    def _io_view(self, arena: HostArena, name: str) -> memoryview:
        """Whole pages (the tail past the tile is its mapping's padding), as direct I/O
        moves them, whichever way the spill file or a checkpoint's file is opened."""
        return arena.page_view(name)[: self.layout.v_offset]

    def holds(self, group: int) -> bool:
        return self.first <= group < self.first + self.layers

    @property
    def groups(self) -> list[int]:
        return list(range(self.first, self.first + self.layers))

    def _at(self, group: int) -> int:
        return self.file.offset(group - self.first)

    def _timed(self, op: IoOp) -> None:
        waited_s = op.wait()
        with self._wait_lock:
            self.wait_s += waited_s

    def take_wait_s(self) -> float:
        """Seconds the AdamW thread waited on spill reads and writes since the last call."""
        with self._wait_lock:
            out, self.wait_s = self.wait_s, 0.0
        return out

    # ---------------------------------------------------------------- slots

    def _slot_of(self, group: int) -> Slot | None:
        return next((s for s in self.slots if s.layer == group), None)

    def prefetch(self, group: int) -> bool:
        """Start reading `group` into an idle slot (after that slot's write-back): False
        when every slot is busy. A slot that still holds `group` serves it as it is."""
        if (slot := self._slot_of(group)) is not None:
            slot.busy = True
            return True
        idle = [s for s in self.slots if not s.busy]
        if not idle:
            return False
        slot = min(idle, key=lambda s: s.layer is not None)  # an empty one first
        pending = self.last_write.get(group)
        if pending is not None and pending is not slot.op and not pending.done():
            self._timed(pending)  # rare: its write went out from another slot, still going
        slot.layer, slot.busy = group, True
        slot.op = self.file.read(self._at(group), slot.views, after=slot.op)
        return True

    def _fill(self) -> None:
        for group in self.queue:
            if (slot := self._slot_of(group)) is not None and slot.busy:
                continue
            if not self.prefetch(group):
                return

    def start_pass(self, order: list[int]) -> None:
        """A pass of updates in `order` begins: read its first spilled groups ahead."""
        self.queue = [g for g in order if self.holds(g)]
        self._fill()

    def acquire(self, group: int) -> tuple[torch.Tensor, torch.Tensor]:
        """`group`'s (m, v) in a slot, read in (waited for, timed)."""
        if group in self.queue:
            self.queue.remove(group)
        if (slot := self._slot_of(group)) is None or not slot.busy:
            assert self.prefetch(group), "every spill slot is busy: acquire without release"
            slot = self._slot_of(group)
        assert slot is not None
        self._timed(slot.op)
        return slot.m, slot.v

    def release(self, group: int, dirty: bool = True) -> None:
        """`group`'s update is in its slot: write it back (unless unchanged) and read the
        pass's next spilled groups into the slots that frees."""
        slot = self._slot_of(group)
        assert slot is not None and slot.busy
        if dirty:
            slot.op = self.file.write(self._at(group), slot.views, after=slot.op)
            self.last_write[group] = slot.op
        slot.busy = False
        self._fill()

    def flush(self) -> None:
        """Every read and write finished (before a checkpoint, a load or the end)."""
        for slot in self.slots:
            self._timed(slot.op)
            slot.busy = False
        self.queue = []

    def invalidate(self) -> None:
        """The file changed under the slots (a load): they hold nothing."""
        self.flush()
        for slot in self.slots:
            slot.layer = None

    # ---------------------------------------------------------------- checkpoints

    def record(self) -> dict[str, object]:
        """How the checkpoint's raw file lays the spilled layers out."""
        return {
            "file": CHECKPOINT_FILE,
            "layers": self.groups,
            "numel": self.layout.numel,
            "dtype": str(self.layout.dtype).removeprefix("torch."),
            "v_offset": self.layout.v_offset,
            "record_bytes": self.layout.record_bytes,
        }

    @property
    def checkpoint_bytes(self) -> int:
        return self.file.size_bytes

    def write_checkpoint(self, path: Path) -> None:
        """The spilled layers' moments into `path` (a checkpoint's raw file), layer by
        layer through the slots: each layer's write out overlaps the next one's read in."""
        self.flush()
        out = RawFile(path, self.file.size_bytes, create=True, buffered=not self.file.direct)
        try:
            # whole records even where the last is written short (buffered: the exact bytes),
            # so a direct read of any record's pages stays inside the file
            os.ftruncate(out.fd, self.file.size_bytes)
            self.start_pass(self.groups)
            for i, group in enumerate(self.groups):
                self.acquire(group)
                slot = self._slot_of(group)
                assert slot is not None
                slot.op = out.write(i * self.layout.record_bytes, slot.views)
                self.release(group, dirty=False)
            self.flush()
        finally:
            out.close()

    def load_layer(self, group: int, fill: Callable[[Slot], IoOp]) -> None:
        """Put `group`'s moments into the spill file: `fill` brings them into a slot (a
        copy, or a read it returns), then the slot goes out to the file."""
        idle = [s for s in self.slots if not s.busy]
        assert idle, "load_layer with every slot busy"
        slot = idle[0]
        self._timed(slot.op)
        slot.layer = group
        self._timed(fill(slot))
        slot.op = self.file.write(self._at(group), slot.views)
        self.last_write[group] = slot.op
        slot.busy = False

    def close(self, remove: bool = False) -> None:
        for slot in self.slots:
            slot.op.wait()
        self.file.remove() if remove else self.file.close()


class SpilledCheckpoint:
    """The checkpoint's raw file of spilled moments, written when io/checkpoint.py asks
    (into its temp dir, fsynced and renamed with the rest)."""

    def __init__(self, spilled: SpilledMoments) -> None:
        self.spilled = spilled
        self.nbytes = spilled.checkpoint_bytes

    def write(self, path: Path) -> None:
        self.spilled.write_checkpoint(path)
