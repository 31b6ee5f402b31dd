"""A long sequence's window of keys and values kept in page-locked host memory, staged on the
device a block at a time: what lets a million tokens run under a 24 GiB device budget. At
Llama-3-8B dims the window (ops/chunk_attn.py ContextWindow) is K and V in bf16 (4 KiB a
token) and their fp32 gradient sums for backward (8 KiB a token): 12 GiB at 1M tokens on
the device. Here the device holds two staging slots of a key block each (64K keys: 0.75 GiB
with the sums), and the window's bytes live on the host (the planner's Layout.window_home).

Forward of a piece [s0, s1): its K and V go home (on the compute stream, 4 KiB a token);
its queries attend to their own keys (causal) on the device and to the keys [0, s0) one
block at a time (no mask), merged by log-sum-exp (ops/prefix_attn.py
streamed_prefix_attention). Backward: each key block of ops/prefix_attn.py key_blocks comes
in with its dK and dV sums, gets the piece's share added (blocks_backward), and its rows
before the piece go home; the piece's own rows are complete then and feed its projections'
gradients. Sums past every row written since zero_grads are zeros, made on the device
(backward's first piece, the last, writes every earlier row: nothing is zeroed on the host).

A copy stream overlaps each block's copies with the previous block's kernels: the next block
comes in (and the last goes home) while the compute stream works. Block i's slot is refilled
only after the compute stream has queued everything that reads it (wait_stream), and the
compute stream waits for each block's arrival (an event). On the CPU the same code runs with
plain copies (the tests).

    win = HostWindow(dims, batch, seq_len, piece, dtype, device, alloc)  # as ContextWindow
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator

import torch

from wstrain.contracts.model_dims import ModelDims
from wstrain.worker.ops import prefix_attn
from wstrain.worker.ops.chunk_attn import Window
from wstrain.worker.ops.document_attn import Runs
from wstrain.worker.ops.prefix_attn import KeyBlock, blocks_backward, streamed_prefix_attention

SLOTS = 2  # one block computed while the next comes in
# (name, elements, dtype) -> a flat host tensor: the runtime's host arena, at exact size,
# page-locked and counted in the host budget (working_set/arena.py)
HostAlloc = Callable[[str, int, torch.dtype], torch.Tensor]


class HostWindow(Window):
    """ops/chunk_attn.py's Window with K, V and their fp32 gradient sums on the host."""

    def __init__(
        self,
        dims: ModelDims,
        batch: int,
        seq_len: int,
        piece: int,
        dtype: torch.dtype,
        device: torch.device,
        alloc: HostAlloc | None = None,
    ) -> None:
        """`alloc`: where the host tensors come from (default: torch's pinned memory, whose
        caching allocator rounds up to powers of two)."""
        # the backward's key blocks' length (ops/prefix_attn.py key_blocks), read here so a
        # test that shortens it shortens both
        block = prefix_attn.ATTENTION_KEY_BLOCK_TOKENS
        self.device, self.dtype, self.block = device, dtype, block
        # (B, S, KV, hd): a sequence's rows are one contiguous run, one copy each way
        self.shape = (batch, seq_len, dims.num_kv_heads, dims.head_dim)
        self.alloc = alloc or self._pinned
        # all of it now, as the planner counts it: a host short of the sums (8 GiB at 1M)
        # fails at the start, not when the first backward comes after the whole forward
        self.k, self.v = self._host("k", dtype), self._host("v", dtype)
        self.dk, self.dv = self._host("dk", torch.float32), self._host("dv", torch.float32)
        self.written = 0  # rows [0, written) of dk, dv hold sums; the rest are zeros
        # a slot holds a prefix block, or the last block of a backward: up to a piece (as
        # memory_model.context_window_bytes counts it)
        rows = min(seq_len, max(block, piece))
        slot = (batch, rows, dims.num_kv_heads, dims.head_dim)  # (B, rows, KV, hd)
        self.sk = [torch.empty(slot, dtype=dtype, device=device) for _ in range(SLOTS)]
        self.sv = [torch.empty_like(t) for t in self.sk]
        self.sdk = [torch.empty(slot, dtype=torch.float32, device=device) for _ in range(SLOTS)]
        self.sdv = [torch.empty_like(t) for t in self.sdk]
        self.copy = torch.cuda.Stream(device) if device.type == "cuda" else None
        self.own: tuple[int, torch.Tensor, torch.Tensor] | None = None  # the last put's
        self.last: KeyBlock | None = None  # the last staged block of a backward
        self.last_start = 0

    def _host(self, name: str, dtype: torch.dtype) -> torch.Tensor:
        return self.alloc(f"window.{name}", math.prod(self.shape), dtype).view(self.shape)

    def _pinned(self, name: str, numel: int, dtype: torch.dtype) -> torch.Tensor:
        return torch.empty(numel, dtype=dtype, pin_memory=self.device.type == "cuda")

    def zero_grads(self) -> None:
        self.written = 0  # no host write: rows past `written` are staged as zeros

    def store(self, k: torch.Tensor, v: torch.Tensor, s0: int, forward: bool) -> None:
        """The rows home (on the compute stream, 2 KiB a token each); the forward keeps them
        on the device for the piece's own diagonal."""
        s1 = s0 + k.shape[2]
        for host, t in ((self.k, k), (self.v, v)):
            rows = t.transpose(1, 2).contiguous()  # (B, c, KV, hd)
            for i in range(k.shape[0]):
                host[i, s0:s1].copy_(rows[i], non_blocking=True)
        self.own = (s0, k, v) if forward else None

    def attention(
        self, q: torch.Tensor, s0: int, runs: Runs | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """ContextWindow.attention, the earlier keys streamed in blocks."""
        assert runs is None, "packed documents keep the window on the device"
        b, s1 = q.shape[0], s0 + q.shape[2]
        if self.own is not None and self.own[0] == s0:
            k, v = self.own[1], self.own[2]
        else:  # backward's recomputation: the piece's own keys from the host
            k, v, *_ = next(self._staged(b, [(s0, s1)], grads=False, s0=s0))
        self.own = None
        ranges = [(a, min(a + self.block, s0)) for a in range(0, s0, self.block)]
        prefix = ((kb, vb) for kb, vb, *_ in self._staged(b, ranges, grads=False, s0=s0))
        return streamed_prefix_attention(q, k, v, prefix)

    def backward(
        self,
        d_out: torch.Tensor,
        q: torch.Tensor,
        out: torch.Tensor,
        lse: torch.Tensor,
        s0: int,
        runs: Runs | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """ContextWindow.backward, each key block staged with its sums."""
        assert runs is None, "packed documents keep the window on the device"
        b = q.shape[0]
        dq = blocks_backward(
            d_out, q, out, lse, s0, lambda ranges: self._staged(b, ranges, grads=True, s0=s0)
        )
        assert self.last is not None
        own = slice(s0 - self.last_start, None)  # the piece's rows of the last block
        dk, dv = (t[:, :, own].to(q.dtype, memory_format=torch.contiguous_format)
                  for t in self.last[2:])  # fmt: skip
        self.last = None
        return dq, dk, dv

    def _stream(self) -> contextlib.AbstractContextManager[object]:
        return torch.cuda.stream(self.copy) if self.copy is not None else contextlib.nullcontext()

    def _copy_after_compute(self) -> torch.cuda.Stream | None:
        """The compute stream, the copy stream made to wait for all it has queued (None on
        the CPU)."""
        if self.copy is None:
            return None
        compute = torch.cuda.current_stream(self.device)
        self.copy.wait_stream(compute)
        return compute

    def _fetch(self, slot: int, b: int, a: int, e: int, grads: bool) -> torch.cuda.Event | None:
        """Rows [a, e) of the window into `slot` on the copy stream; with `grads` their sums
        too (zeros past the rows written); the event of their arrival (None on the CPU)."""
        pairs = [(self.k, self.sk[slot]), (self.v, self.sv[slot])]
        have = max(0, min(e, self.written) - a)  # rows with sums; zeros after them
        if grads:
            pairs += [(self.dk, self.sdk[slot]), (self.dv, self.sdv[slot])]
        with self._stream():
            for j, (host, staged) in enumerate(pairs):
                rows = e - a if j < 2 else have
                for i in range(b):
                    staged[i, :rows].copy_(host[i, a : a + rows], non_blocking=True)
                    if rows < e - a:
                        staged[i, rows : e - a].zero_()
            if self.copy is None:
                return None
            event = torch.cuda.Event()
            event.record(self.copy)
            return event

    def _staged(
        self, b: int, ranges: list[tuple[int, int]], grads: bool, s0: int
    ) -> Iterator[KeyBlock]:
        """Each range's block on the device, in order, as (k, v, dk, dv) (the sums only with
        `grads`: else k and v twice); after the consumer has queued its work on a block, the
        block's rows before s0 go home with `grads`, and its slot takes the block after next."""
        compute = self._copy_after_compute()  # puts home, and any reader of the slots, first
        arrived = [self._fetch(i, b, *ranges[i], grads) for i in range(min(SLOTS, len(ranges)))]
        for i, (a, e) in enumerate(ranges):
            slot, n = i % SLOTS, e - a
            event = arrived[i]
            if event is not None and compute is not None:
                compute.wait_event(event)
            # (B, KV, n, hd) views of the (B, n, KV, hd) slots; without grads k, v twice
            views = [t[:b, :n].transpose(1, 2) for t in (self.sk[slot], self.sv[slot])]
            if grads:
                views += [t[:b, :n].transpose(1, 2) for t in (self.sdk[slot], self.sdv[slot])]
            block: KeyBlock = (views[0], views[1], views[-2], views[-1])
            self.last, self.last_start = block, a
            yield block
            self._copy_after_compute()  # the block's kernels are queued: its slot is free
            keep = min(e, s0) - a  # the rows before the piece; its own are final
            if grads and keep > 0:
                with self._stream():
                    for host, staged in ((self.dk, self.sdk[slot]), (self.dv, self.sdv[slot])):
                        for j in range(b):
                            host[j, a : a + keep].copy_(staged[j, :keep], non_blocking=True)
            if i + SLOTS < len(ranges):
                arrived.append(self._fetch(slot, b, *ranges[i + SLOTS], grads))
        if grads:
            self.written = max(self.written, s0)
