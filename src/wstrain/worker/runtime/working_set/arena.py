"""The host arena: every large host buffer of the working-set runtime, accounted in one place.

Training state lives here in layer-contiguous flat tiles (one DMA per layer): weights,
gradients and the two AdamW moments of each decoder layer, plus the embedding and the
head group (final norm + LM head). Tiles are allocated at exact size and, on a CUDA host,
page-locked with cudaHostRegister — not `pin_memory()`, whose caching allocator rounds up
to powers of two and can double host use. Page-locking is the slow part of filling the host
(the kernel faults and zeroes every page, the driver pins it), so a page-locked tile is
advised to transparent huge pages and written once a page before it is registered, and
tiles asked for together are page-locked on several threads (`alloc_many`).

    layout = LayerLayout.decoder(dims); arena = HostArena(pin=torch.cuda.is_available())
    tile = arena.alloc("layer3.weights", layout.numel, torch.bfloat16, "weights")
    tiles = arena.alloc_many([Tile(f"layer{i}.weights", layout.numel, torch.bfloat16,
                                   "weights") for i in range(32)])
"""

from __future__ import annotations

import logging
import mmap
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Final, Protocol

import torch

from wstrain.contracts.calibration import ALIGN_ELEMS, GIB
from wstrain.contracts.errors import BudgetExceeded
from wstrain.contracts.model_dims import ModelDims

log = logging.getLogger(__name__)

# Threads that page-lock the tiles of one alloc_many. On a lent H200 host (16 cores, kernel
# 6.18, THP "madvise"), 16 GiB of 64 MiB tiles page-locked at 1.4-2.4 GiB/s one tile after
# another and 3.7 GiB/s with the pages written on 8 threads first, since the driver's pinning
# is serial within a tile; 8 threads each advising, writing and registering whole tiles
# reached 10.1-11.6 GiB/s and 16 threads 17.8 (bench/results/host-memory/, bench/host_fill.py).
# Eight leaves half of a 16-core host to a second worker filling beside it.
FILL_THREADS: Final = 8
# Pages one write call touches: under torch's intra-op grain (32,768 elements), so a state
# tile of 436 MiB does not start an OpenMP team inside each of the fill threads.
TOUCH_PAGES: Final = 16_384


class SharedRegions(Protocol):
    """Memory the ranks of one node map alike (working_set/node_share.py NodeShare)."""

    rank: int
    world: int

    def map(self, name: str, nbytes: int) -> mmap.mmap: ...


@dataclass(frozen=True)
class Slice:
    # Hugging Face name relative to the group, e.g. "self_attn.q_proj.weight"; a "*" marks
    # a stack of experts, shape (E, ...), whose checkpoint names replace it with 0..E-1
    name: str
    offset: int  # elements from the tile start
    shape: tuple[int, ...]

    def hub(self, view: torch.Tensor) -> dict[str, torch.Tensor]:
        """This slice's view under checkpoint names (one per expert for a stack)."""
        if "*" not in self.name:
            return {self.name: view}
        return {self.name.replace("*", str(e)): view[e] for e in range(self.shape[0])}

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n


@dataclass(frozen=True)
class LayerLayout:
    """Where each parameter of a group sits inside its flat tile."""

    slices: tuple[Slice, ...]
    numel: int  # tile length in elements, alignment padding included

    @classmethod
    def of(cls, shapes: list[tuple[str, tuple[int, ...]]]) -> LayerLayout:
        slices, offset = [], 0
        for name, shape in shapes:
            s = Slice(name, offset, shape)
            slices.append(s)
            offset += -(-s.numel // ALIGN_ELEMS) * ALIGN_ELEMS
        return cls(tuple(slices), offset)

    @classmethod
    def decoder(cls, dims: ModelDims) -> LayerLayout:
        d, f, hd = dims.hidden_size, dims.intermediate_size, dims.head_dim
        q, kv = dims.num_heads * hd, dims.num_kv_heads * hd
        per_head = dims.qk_norm_per_head
        qk_norms = (
            [
                ("self_attn.q_norm.weight", (hd if per_head else q,)),
                ("self_attn.k_norm.weight", (hd if per_head else kv,)),
            ]
            if dims.qk_norm
            else []
        )
        biases = (
            [
                ("self_attn.q_proj.bias", (q,)),
                ("self_attn.k_proj.bias", (kv,)),
                ("self_attn.v_proj.bias", (kv,)),
            ]
            if dims.qkv_bias
            else []
        )
        if dims.is_moe:  # router, then each projection of all experts stacked
            e, fe = dims.num_experts, dims.moe_intermediate_size
            mlp = [
                ("mlp.gate.weight", (e, d)),
                ("mlp.experts.*.gate_proj.weight", (e, fe, d)),
                ("mlp.experts.*.up_proj.weight", (e, fe, d)),
                ("mlp.experts.*.down_proj.weight", (e, d, fe)),
            ]
            if fs := dims.shared_expert_intermediate_size:
                mlp += [
                    ("mlp.shared_expert.gate_proj.weight", (fs, d)),
                    ("mlp.shared_expert.up_proj.weight", (fs, d)),
                    ("mlp.shared_expert.down_proj.weight", (d, fs)),
                    ("mlp.shared_expert_gate.weight", (1, d)),
                ]
        else:
            mlp = [
                ("mlp.gate_proj.weight", (f, d)),
                ("mlp.up_proj.weight", (f, d)),
                ("mlp.down_proj.weight", (d, f)),
            ]
        return cls.of(
            [
                ("input_layernorm.weight", (d,)),
                ("self_attn.q_proj.weight", (q, d)),
                ("self_attn.k_proj.weight", (kv, d)),
                ("self_attn.v_proj.weight", (kv, d)),
                ("self_attn.o_proj.weight", (d, q)),
                *qk_norms,
                *biases,
                ("post_attention_layernorm.weight", (d,)),
                *mlp,
            ]
        )

    @classmethod
    def embedding(cls, dims: ModelDims) -> LayerLayout:
        return cls.of([("model.embed_tokens.weight", (dims.vocab_size, dims.hidden_size))])

    @classmethod
    def head(cls, dims: ModelDims) -> LayerLayout:
        return cls.of(
            [
                ("model.norm.weight", (dims.hidden_size,)),
                ("lm_head.weight", (dims.vocab_size, dims.hidden_size)),
            ]
        )

    def views(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        """Named views into one flat tile (host or device) laid out by this layout; experts
        stacked (E, ., .) under their "*" names, as the runtime computes with them."""
        return {s.name: flat[s.offset : s.offset + s.numel].view(s.shape) for s in self.slices}

    def hub_views(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        """The same views under checkpoint names: one per expert, as safetensors hold them."""
        out: dict[str, torch.Tensor] = {}
        for s in self.slices:
            out.update(s.hub(flat[s.offset : s.offset + s.numel].view(s.shape)))
        return out


@dataclass(frozen=True)
class Tile:
    """One arena allocation asked for: `numel` elements of `dtype` counted under `kind`;
    page-locked when the arena pins and it `crosses_pcie`; the node's one copy when
    `shared` and the arena has a share."""

    name: str
    numel: int
    dtype: torch.dtype
    kind: str
    crosses_pcie: bool = True
    shared: bool = False

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize


class HostArena:
    """Exact-size host allocations, optionally page-locked, with a byte count per purpose.

    Each tile is its own anonymous mapping (page-aligned, zero-filled, rounded up to a page
    only), so page-locking one tile never touches memory another allocation shares, and
    freeing the arena leaves no registered pages behind for the allocator to hand out.
    With `share` (data parallel on one node), tiles allocated `shared` map the node's one
    copy (working_set/node_share.py); the others stay this process's own."""

    def __init__(
        self, pin: bool, limit_bytes: int | None = None, share: SharedRegions | None = None
    ) -> None:
        self.pin, self.limit_bytes, self.share = pin, limit_bytes, share
        self.tensors: dict[str, torch.Tensor] = {}
        self.bytes_by_kind: dict[str, int] = {}
        self._registered: dict[int, int] = {}  # page-locked tiles: data pointer -> bytes
        self._maps: dict[str, mmap.mmap] = {}
        self._kind_of: dict[str, str] = {}

    def alloc(
        self,
        name: str,
        numel: int,
        dtype: torch.dtype,
        kind: str,
        crosses_pcie: bool = True,
        shared: bool = False,
    ) -> torch.Tensor:
        """A zeroed tile; page-locked when the arena pins and the tile crosses PCIe; one
        copy for the node's ranks when `shared` and the arena has a share."""
        return self.alloc_many([Tile(name, numel, dtype, kind, crosses_pcie, shared)])[0]

    def alloc_many(self, tiles: list[Tile]) -> list[torch.Tensor]:
        """Zeroed tiles, as `alloc` makes each, page-locked on up to FILL_THREADS threads;
        refused whole, before any is mapped, when together they would pass the limit."""
        if not tiles:
            return []
        names = [tile.name for tile in tiles]
        for name in names:
            assert name not in self.tensors, f"arena tile {name} allocated twice"
            assert names.count(name) == 1, f"{name} asked twice"
        more = f" and {len(tiles) - 1} more" if len(tiles) > 1 else ""
        self._check_limit(tiles[0].name + more, tiles[0].kind, sum(t.nbytes for t in tiles))
        views = [self._map(tile) for tile in tiles]
        locked = [
            (tile, t)
            for tile, t in zip(tiles, views)
            if self.pin and tile.crosses_pcie and t.numel()
        ]
        try:
            self._lock_all(locked)
        except BaseException:  # nothing of the batch stays mapped or page-locked
            for _, t in locked:
                if self._registered.pop(t.data_ptr(), None) is not None:
                    torch.cuda.cudart().cudaHostUnregister(t.data_ptr())
            for tile in tiles:
                self._maps.pop(tile.name, None)
            raise
        for tile, t in zip(tiles, views):
            self.tensors[tile.name] = t
            self._kind_of[tile.name] = tile.kind
            self.bytes_by_kind[tile.kind] = self.bytes_by_kind.get(tile.kind, 0) + t.nbytes
        return views

    def _map(self, tile: Tile) -> torch.Tensor:
        """The tile's own anonymous mapping (or its share's), page-rounded, as a tensor."""
        pages = max(1, -(-tile.nbytes // mmap.PAGESIZE))
        region = (
            self.share.map(tile.name, pages * mmap.PAGESIZE)
            if tile.shared and self.share is not None
            else mmap.mmap(-1, pages * mmap.PAGESIZE)
        )
        self._maps[tile.name] = region
        if not tile.numel:
            return torch.zeros(0, dtype=tile.dtype)
        return torch.frombuffer(region, dtype=tile.dtype, count=tile.numel)

    def _lock_all(self, locked: list[tuple[Tile, torch.Tensor]]) -> None:
        """Page-lock each (tile, view): on up to FILL_THREADS threads where there are more."""
        if len(locked) <= 1:
            for pair in locked:
                self._lock(*pair)
            return
        # registered in the caller's device's context: memory registered without the
        # portable flag is page-locked for that context only, and a new thread's is GPU 0's
        device = torch.cuda.current_device()

        def lock(pair: tuple[Tile, torch.Tensor]) -> None:
            with torch.cuda.device(device):
                self._lock(*pair)

        with ThreadPoolExecutor(min(FILL_THREADS, len(locked))) as pool:
            list(pool.map(lock, locked))  # the pool's exit waits for every task first

    def _lock(self, tile: Tile, t: torch.Tensor) -> None:
        """Page-lock one tile: huge pages where THP allows, its pages written here first
        (a fault a page on this thread, not inside the driver's pinning), then registered.
        A shared tile is left as it is: another rank may already be filling it, and THP
        over shared memory is the host's shmem setting, not an advice."""
        if not (tile.shared and self.share is not None):
            if hasattr(mmap, "MADV_HUGEPAGE"):
                self._maps[tile.name].madvise(mmap.MADV_HUGEPAGE)
            pages = t.view(torch.uint8)[:: mmap.PAGESIZE]  # zero already: no-op writes
            for lo in range(0, pages.numel(), TOUCH_PAGES):  # each call on this thread alone
                pages[lo : lo + TOUCH_PAGES].fill_(0)
        rc = torch.cuda.cudart().cudaHostRegister(t.data_ptr(), t.numel() * t.element_size(), 0)
        if int(rc) != 0:
            raise RuntimeError(f"cudaHostRegister of {tile.name} ({t.nbytes} bytes) failed: {rc}")
        self._registered[t.data_ptr()] = t.nbytes  # one key a thread: safe under the GIL

    def free(self, name: str) -> None:
        """Give tile `name` back: unpinned, uncounted, its mapping dropped with the last
        view of it (the caller drops its own)."""
        t = self.tensors.pop(name)
        if self._registered.pop(t.data_ptr(), None) is not None:
            torch.cuda.cudart().cudaHostUnregister(t.data_ptr())
        kind = self._kind_of.pop(name)
        self.bytes_by_kind[kind] -= t.nbytes
        if not self.bytes_by_kind[kind]:
            del self.bytes_by_kind[kind]
        del self._maps[name]

    def _check_limit(self, name: str, kind: str, nbytes: int) -> None:
        """The host budget is a contract: refuse a tile that would take the arena past it."""
        if self.limit_bytes is None or self.total_bytes + nbytes <= self.limit_bytes:
            return
        held = ", ".join(f"{k} {v / GIB:.2f}" for k, v in self.bytes_by_kind.items())
        raise BudgetExceeded(
            f"host arena tile {name} ({kind}, {nbytes / GIB:.3f} GiB) would take the arena to "
            f"{(self.total_bytes + nbytes) / GIB:.2f} GiB, past its limit of "
            f"{self.limit_bytes / GIB:.2f} GiB (the host budget less the process's reserve; "
            f"held: {held} GiB). The plan under-counted host memory: raise budget.host_gib "
            "or lower overrides.level, and report the plan",
            arena_bytes=self.total_bytes,
            tile_bytes=nbytes,
            limit_bytes=self.limit_bytes,
        )

    def page_view(self, name: str) -> memoryview:
        """Tile `name`'s whole mapping as bytes: page-aligned and page-rounded, as direct
        I/O wants its buffers (working_set/spill.py); the tail past the tile is padding."""
        return memoryview(self._maps[name])

    @property
    def total_bytes(self) -> int:
        return sum(self.bytes_by_kind.values())

    @property
    def pinned_bytes(self) -> int:
        return sum(self._registered.values())

    def close(self) -> None:
        """Unpin every tile; the memory itself goes when the last tensor view is dropped."""
        if self._registered:
            cudart = torch.cuda.cudart()
            for ptr in self._registered:
                cudart.cudaHostUnregister(ptr)
        self._registered.clear()

    def __del__(self) -> None:
        self.close()
