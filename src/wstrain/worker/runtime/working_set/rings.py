"""Device-side rings and streams of the working-set runtime.

`Streams` holds the compute, inbound (H2D) and two outbound (D2H) CUDA streams — `outbound`
for bulk state (gradients, the device optimizer's weights and moments) and `saves` for saved
activations, so a forward's activations never queue behind a layer's optimizer traffic
(RoundPipe's point about transfer priority, met with separate queues, not stream
priorities) — and makes every operation a plain synchronous one on
CPU, so the test suite runs the same schedule.
`SlotRing` is R device slots of one flat tile size; each slot remembers which layer it
holds and carries two events: `ready` (its inbound copy finished) and `free` (the last
compute that read it finished), so copies and compute order per slot, never device-wide.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch


class Streams:
    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        if self.cuda:
            self.comp = torch.cuda.current_stream(device)
            self.inbound = torch.cuda.Stream(device)
            self.outbound = torch.cuda.Stream(device)
            self.saves = torch.cuda.Stream(device)
        # seconds the compute stream waited, by dependency (CPU: host-side copy time)
        self.stall_s: dict[str, float] = {}
        self._pending: list[tuple[str, torch.cuda.Event, torch.cuda.Event]] = []

    def event(self) -> torch.cuda.Event | None:
        return torch.cuda.Event(enable_timing=True) if self.cuda else None

    @contextlib.contextmanager
    def on(self, which: str) -> Iterator[None]:
        """Run the block's copies on the 'inbound', 'outbound' or 'saves' stream."""
        if not self.cuda:
            yield
            return
        with torch.cuda.stream(getattr(self, which)):
            yield

    def wait(self, stream: str, event: torch.cuda.Event | None) -> None:
        """Make `stream` wait for `event` (recorded on another stream)."""
        if self.cuda and event is not None:
            getattr(self, stream).wait_event(event)

    def compute_waits(self, dependency: str, event: torch.cuda.Event | None) -> None:
        """The compute stream waits for `event`; the wait is timed as a stall of `dependency`."""
        if not self.cuda or event is None:
            return
        before = self._record_now("comp")
        self.comp.wait_event(event)
        self._pending.append((dependency, before, self._record_now("comp")))

    @contextlib.contextmanager
    def host_waits(self, dependency: str) -> Iterator[None]:
        """The host blocks in the block (on a copy, on the optimizer thread): timed as the
        compute stream's idle while it does, not as the host's wait. Two compute-stream
        events bracket the block; the GPU reaches the first once the work queued so far is
        done and the second only after the host has resumed, so their distance is the idle
        the block caused (0 while the queue still held work). CPU: the host's wall time."""
        if not self.cuda:
            start = time.perf_counter()
            yield
            self.time_host(dependency, start)
            return
        before = self._record_now("comp")
        yield
        self._pending.append((dependency, before, self._record_now("comp")))

    def record(self, stream: str) -> torch.cuda.Event | None:
        """An event recorded on `stream` now; None on CPU, where streams are no-ops."""
        return self._record_now(stream) if self.cuda else None

    def _record_now(self, stream: str) -> torch.cuda.Event:
        ev = torch.cuda.Event(enable_timing=True)
        ev.record(getattr(self, stream))
        return ev

    def collect_stalls(self) -> dict[str, float]:
        """Sum the timed waits of the step (synchronises on their events) and reset."""
        for dep, before, after in self._pending:
            after.synchronize()
            self.stall_s[dep] = self.stall_s.get(dep, 0.0) + before.elapsed_time(after) / 1e3
        self._pending.clear()
        out, self.stall_s = self.stall_s, {}
        return out

    def time_host(self, dependency: str, start: float) -> None:
        """CPU path: count host-side copy time as the stall it would be on a GPU."""
        if not self.cuda:
            waited = time.perf_counter() - start
            self.stall_s[dependency] = self.stall_s.get(dependency, 0.0) + waited


@dataclass
class Slot:
    flat: torch.Tensor  # (numel,) device buffer
    layer: int = -1  # which layer's data it holds; -1: none
    ready: torch.cuda.Event | None = None
    free: torch.cuda.Event | None = None


@dataclass
class SlotRing:
    slots: list[Slot] = field(default_factory=list)

    @classmethod
    def allocate(cls, count: int, numel: int, dtype: torch.dtype, device: torch.device) -> SlotRing:
        return cls([Slot(torch.empty(numel, dtype=dtype, device=device)) for _ in range(count)])

    def find(self, layer: int) -> Slot | None:
        return next((s for s in self.slots if s.layer == layer), None)

    def victim(self, keep: set[int]) -> Slot:
        """A slot whose layer is not needed soon (not in `keep`)."""
        for s in self.slots:
            if s.layer not in keep:
                return s
        raise AssertionError(f"ring of {len(self.slots)} slots cannot hold {sorted(keep)}")

    @property
    def nbytes(self) -> int:
        return sum(s.flat.nbytes for s in self.slots)
