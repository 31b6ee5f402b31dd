"""Where a layer's saved activations live between its forward and its backward.

The runtime runs each decoder layer's forward under `saved_tensors_hooks` made here, so
every tensor autograd saves is either
- a weight (it lives in a device weight slot): saved as a reference and re-bound in backward
  to whichever slot then holds that layer — layer modules are stateless templates;
- a resident constant (RoPE tables): kept as is;
- an activation: kept on the device (the window of last layers) or sent home into the host
  activation store and fetched back when backward unpacks it.

    hooks = SavedTensorPolicy(streams, store, ...).hooks(home=True)   # store: host_store.py
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import torch

from wstrain.contracts.calibration import WRITE_BUFFER_BYTES
from wstrain.worker.runtime.working_set import fp8_saves
from wstrain.worker.runtime.working_set.fp8_saves import Fp8Home
from wstrain.worker.runtime.working_set.host_store import HostActivationStore, HostRoom
from wstrain.worker.runtime.working_set.rings import Streams


def tensor_key(t: torch.Tensor) -> tuple[object, ...]:
    """Which tensor this is: address and layout (views can share an address)."""
    return t.data_ptr(), tuple(t.shape), tuple(t.stride())


@dataclass(frozen=True)
class _WeightRef:
    offset: int
    size: tuple[int, ...]
    stride: tuple[int, ...]


@dataclass
class HostCopy:
    host: HostRoom
    done: torch.cuda.Event | None  # its copy home finished
    device: torch.Tensor | None = None  # back on the device for backward (kept until freed)
    arrived: torch.cuda.Event | None = None  # its prefetch finished
    used: bool = False  # backward has taken it (prefetched or not)
    rebuilt: bool = False  # a long context window's rebuild has taken it (fetch_transient)
    kept: bool = False  # backward claimed it in flight for the rebuild: it stays on the device
    fp8: Fp8Home | None = None  # went home in fp8 (fp8_saves.py): `device` holds it decoded

    @property
    def decoded_bytes(self) -> int:
        """Device bytes it holds once taken: fp8 data decoded to its own dtype, twice the
        bytes that crossed the link."""
        if self.fp8 is None:
            return self.host.nbytes
        return self.host.numel() * self.fp8.layout.dtype.itemsize


class SavedTensorPolicy:
    """Pack/unpack hooks for one (layer, chunk) forward."""

    def __init__(
        self,
        streams: Streams,
        store: HostActivationStore,
        weight_storage: Callable[[], torch.Tensor],
        resident: list[torch.Tensor],
        counters: dict[str, int],
        fp8: bool = False,
    ) -> None:
        self.streams, self.store, self.fp8 = streams, store, fp8
        self.weight_storage = weight_storage  # the slot holding this layer *now*
        self.resident_ptrs = {t.untyped_storage().data_ptr() for t in resident}
        self.counters = counters

    def hooks(
        self, home: bool, packed: dict[tuple[object, ...], HostCopy] | None = None
    ) -> torch.autograd.graph.saved_tensors_hooks:
        """Hooks for the forward; what goes home is also entered in `packed` by tensor_key
        (the runtime finds the attention output's copy there and prefetches all)."""
        forward_slot = self.weight_storage()
        slot_ptr = forward_slot.untyped_storage().data_ptr()

        def pack(t: torch.Tensor) -> object:
            ptr = t.untyped_storage().data_ptr()
            if ptr == slot_ptr:
                return _WeightRef(int(t.storage_offset()), tuple(t.shape), tuple(t.stride()))
            # resident constants and scalars (SDPA's RNG seed and offset) stay where they are
            # (device types: the streams' "cuda" and a tensor's "cuda:0" are not equal)
            if (
                ptr in self.resident_ptrs
                or not home
                or t.dim() == 0
                or t.device.type != self.streams.device.type
            ):
                return t
            copy = self.send_home(t, fp8=False)  # the kernel's set: see send_home
            if packed is not None:
                packed[tensor_key(t)] = copy
            return copy

        def unpack(obj: object) -> torch.Tensor:
            if isinstance(obj, _WeightRef):
                return torch.as_strided(self.weight_storage(), obj.size, obj.stride, obj.offset)
            if isinstance(obj, HostCopy):
                return self.fetch(obj)
            assert isinstance(obj, torch.Tensor)
            return obj

        return torch.autograd.graph.saved_tensors_hooks(pack, unpack)

    def send_home(self, t: torch.Tensor, fp8: bool = True) -> HostCopy:
        """Copy t home on the saves stream (in fp8 with its scales, when the job asked, t is
        eligible (fp8_saves.py) and `fp8`: not for an attention kernel's own saved set,
        whose q and k must match the log-sum-exp it saved with them; at 8 bits they moved
        Llama layers' K-projection gradients by 10%)."""
        parts, home = [t], None
        if fp8 and self.fp8 and fp8_saves.eligible(t):
            data, scales, layout = fp8_saves.encode(t)  # on the compute stream
            parts = [data, scales]
        hosts = [self.store.take(p) for p in parts]
        s = self.streams
        nbytes = sum(p.nbytes for p in parts)
        if s.cuda:
            self.store.admit(nbytes, s)
        ready = s.record("comp")
        s.wait("saves", ready)
        for read in self.store.pop_waits():  # its room's last reader, where compute took none
            s.wait("saves", read)
        with s.on("saves"):
            for host, p in zip(hosts, parts):
                host.copy_from(p)
                # the device tensor must outlive the copy: keep the caching allocator from
                # reusing its memory until the saves stream is past it
                if s.cuda:
                    p.record_stream(s.saves)
        self.counters["d2h_bytes"] += nbytes
        done = s.record("saves")  # None on CPU
        if done is not None:
            self.store.track(done, nbytes)
        if len(parts) == 2:
            home = fp8_saves.Fp8Home(hosts[1], layout)
        return HostCopy(hosts[0], done, fp8=home)

    def fetch(self, copy: HostCopy) -> torch.Tensor:
        """The saved tensor back on the device: its prefetch, or a copy on the compute stream
        now. Taken again (the attention output: by the runtime, then by the kernel's
        backward) it is the same tensor."""
        s = self.streams
        copy.used = True
        if copy.device is None:
            s.compute_waits("activations", copy.done)
            copy.device = copy.host.empty_on(s.device)
            copy.host.copy_to(copy.device)
            self.counters["h2d_bytes"] += copy.host.nbytes
            # backward found it not prefetched: the compute stream waits for the whole copy
            self.counters["h2d_on_demand_bytes"] += copy.host.nbytes
            if copy.fp8 is not None:
                copy.fp8.scales_device = copy.fp8.scales.empty_on(s.device)
                copy.fp8.scales.copy_to(copy.fp8.scales_device)
                self.counters["h2d_bytes"] += copy.fp8.scales.nbytes
        elif copy.arrived is not None:  # prefetched
            s.compute_waits("activations", copy.arrived)
            copy.arrived = None
        if copy.fp8 is not None and copy.fp8.scales_device is not None:  # decode, once
            copy.device = fp8_saves.decode(copy.device, copy.fp8.scales_device, copy.fp8.layout)
            copy.fp8.scales_device = None
        return copy.device

    def fetch_transient(self, saved: object) -> torch.Tensor:
        """A saved tensor on the device for a use before backward's own (long context's
        window rebuild): the copy lets its device tensor go after this use and may be
        prefetched again for backward, unless backward claimed it on its way here
        (BackwardPrefetch.top_up): then backward takes this same device tensor."""
        if isinstance(saved, torch.Tensor):  # kept on the device
            return saved
        assert isinstance(saved, HostCopy)
        t = self.fetch(saved)
        if saved.kept:
            saved.used, saved.rebuilt = False, True
            return t
        saved.device, saved.arrived, saved.used, saved.rebuilt = None, None, False, True
        if saved.fp8 is not None:
            saved.fp8.scales_device = None
        return t


class BackwardPrefetch:
    """Stashed sets on their way back for backward: every set a round sent home, queued in
    the order backward takes them and kept up to `cap_bytes` ahead on the inbound stream.
    Topped up before each chunk's backward and again as its backward takes each tensor, so
    the next set starts while this one computes: a 32K-token sequence's set (0.94 GB) is
    most of the default 1 GiB cap, and topped up between chunks alone each layer's backward
    would wait for its own set (0.56 s of a 5.4 s step on an H100). One is copied in on the
    compute stream (a `fetch` without prefetch) only when the inbound link fell behind. The
    cap is the plan's write buffer bytes, idle in backward; `outgoing` (the forward's sets
    still going home, as the store counts them) past the default buffer comes off it, so
    at the turn from forward to backward the two directions together hold at most the
    plan's buffer plus the default, as at the default; planning/memory_model.py charges
    the buffer alone, so up to the default's 1 GiB of the turn is uncharged."""

    def __init__(
        self,
        streams: Streams,
        counters: dict[str, int],
        cap_bytes: int,
        outgoing: Callable[[], int] | None = None,
    ) -> None:
        self.streams, self.counters, self.cap_bytes = streams, counters, cap_bytes
        self.outgoing = outgoing
        # (copy, for the window's rebuild): an input is queued twice with long context,
        # once for the rebuild and once for its piece's backward
        self.queue: deque[tuple[HostCopy, bool]] = deque()
        self.started: list[HostCopy] = []  # prefetched, not yet taken

    def add(self, stashed: object, rebuild: bool = False) -> None:
        if isinstance(stashed, HostCopy):  # on CPU too, so the test suite runs this path
            self.queue.append((stashed, rebuild))

    def top_up(self) -> None:
        """Start the queued sets that fit the cap. A set taken before its turn (fetched on
        demand: the link fell behind) leaves the queue here too, so the queue never holds
        a taken set's device copy: at 512K a layer's 128 pieces' sets held that way were
        37 GiB past a 24 GiB budget. A piece's input still on the device for the rebuild
        when its backward entry comes up is kept there for that backward."""
        # a rebuild's input is let go once taken (fetch_transient), unless kept for backward
        self.started = [c for c in self.started if not c.used and c.device is not None]
        # device bytes; a kept input counts as it will be held, decoded, until its backward
        ahead = sum(self._held(c) for c in self.started)
        if self.outgoing is not None:
            ahead += max(0, self.outgoing() - WRITE_BUFFER_BYTES)
        while self.queue:
            copy, rebuild = self.queue[0]
            if not (copy.rebuilt if rebuild else copy.used):  # not taken yet
                if copy.device is None:
                    if ahead + copy.host.nbytes > self.cap_bytes:
                        return
                    self._start(copy)
                    self.started.append(copy)
                    ahead += copy.host.nbytes
                elif not rebuild and not copy.rebuilt:
                    # a piece's input on its way for the rebuild, counted in the cap:
                    # backward takes it from there. Let go instead, with a cap of a layer's
                    # inputs (1 GiB: 16 pieces at 128K) each one was copied a second time on
                    # the compute stream, 1 GiB a layer with the GPU idle. An fp8 input
                    # doubles when the rebuild decodes it: past the cap, it waits for the
                    # rebuild to let it go and comes back in its turn
                    grows = copy.decoded_bytes - copy.host.nbytes
                    if ahead + grows > self.cap_bytes:
                        return
                    copy.kept = True
                    ahead += grows
            self.queue.popleft()

    @staticmethod
    def _held(copy: HostCopy) -> int:
        assert copy.device is not None
        return copy.decoded_bytes if copy.kept else copy.device.nbytes

    def _start(self, copy: HostCopy) -> None:
        s = self.streams
        # allocated in the compute stream's pool: the inbound copy must not start before
        # compute queued so far is past whatever used this memory before
        out = copy.host.empty_on(s.device)
        s.wait("inbound", s.record("comp"))
        s.wait("inbound", copy.done)
        with s.on("inbound"):
            copy.host.copy_to(out)
            if copy.fp8 is not None:  # its scales beside it (1/128 of its elements)
                scales = copy.fp8.scales.empty_on(s.device)
                copy.fp8.scales.copy_to(scales)
                copy.fp8.scales_device = scales
                self.counters["h2d_bytes"] += scales.nbytes
        copy.device, copy.arrived = out, s.record("inbound")
        self.counters["h2d_bytes"] += copy.host.nbytes
