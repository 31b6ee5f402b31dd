"""working_set/arena.py: tiles asked for together are made together (zeroed, counted by
kind, page-locked on CUDA hosts), refused whole past the limit, and given back one by one.
The threaded page-locking's bookkeeping runs on CPU builds against a stand-in for the two
driver calls it makes; the page-locking itself in the CUDA test.

    pytest tests/worker/runtime/working_set/test_arena.py
"""

from __future__ import annotations

import contextlib

import pytest
import torch

from wstrain.contracts.errors import BudgetExceeded
from wstrain.worker.runtime.working_set.arena import FILL_THREADS, HostArena, Tile

MIB = 1 << 20


def _tiles(n: int, numel: int = MIB, kind: str = "weights") -> list[Tile]:
    return [Tile(f"t{i}", numel, torch.bfloat16, kind) for i in range(n)]


def test_tiles_made_together_are_zeroed_their_own_and_counted() -> None:
    arena = HostArena(pin=False)
    made = arena.alloc_many([*_tiles(3), Tile("m", 5, torch.float32, "moments")])
    assert [t.numel() for t in made] == [MIB, MIB, MIB, 5]
    assert all(bool((t == 0).all()) for t in made)
    made[0].fill_(1)  # each tile its own mapping
    assert not bool(made[1].any())
    assert arena.bytes_by_kind == {"weights": 3 * 2 * MIB, "moments": 20}
    assert arena.alloc_many([]) == []


def test_tiles_past_the_limit_are_refused_whole() -> None:
    arena = HostArena(pin=False, limit_bytes=5 * 2 * MIB)
    arena.alloc("first", MIB, torch.bfloat16, "weights")
    with pytest.raises(BudgetExceeded, match=r"t0 and 4 more .*past its limit"):
        arena.alloc_many(_tiles(5))
    assert arena.total_bytes == 2 * MIB and set(arena.tensors) == {"first"}
    arena.alloc_many(_tiles(4))  # what fits is made
    assert arena.total_bytes == 5 * 2 * MIB


def test_a_tile_given_back_leaves_the_count_and_its_room() -> None:
    arena = HostArena(pin=False, limit_bytes=2 * 2 * MIB)
    arena.alloc_many(_tiles(2, kind="activations"))
    arena.free("t0")
    assert arena.bytes_by_kind == {"activations": 2 * MIB} and set(arena.tensors) == {"t1"}
    arena.alloc("t0", MIB, torch.bfloat16, "activations")  # its name and room again
    assert arena.total_bytes == 4 * MIB


def test_a_name_asked_twice_is_a_bug() -> None:
    arena = HostArena(pin=False)
    with pytest.raises(AssertionError, match="t0 asked twice"):
        arena.alloc_many([*_tiles(1), *_tiles(1)])
    arena.alloc_many(_tiles(1))
    with pytest.raises(AssertionError, match="t0 allocated twice"):
        arena.alloc("t0", 1, torch.uint8, "weights")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="page-locking needs CUDA")
def test_tiles_made_together_are_page_locked_and_copy_both_ways() -> None:
    arena = HostArena(pin=True)
    n = 2 * FILL_THREADS + 1  # more tiles than threads
    host_only = Tile("host", MIB, torch.bfloat16, "master", crosses_pcie=False)
    made = arena.alloc_many([*_tiles(n, numel=8 * MIB), host_only])
    assert all(t.is_pinned() for t in made[:n]) and not made[n].is_pinned()
    assert arena.pinned_bytes == n * 16 * MIB
    for i, t in enumerate(made[:n]):
        t.copy_(torch.full((8 * MIB,), i, dtype=torch.bfloat16, device="cuda"), non_blocking=True)
    torch.cuda.synchronize()
    assert [int(t[-1]) for t in made[:n]] == list(range(n))
    arena.free("t0")
    assert arena.pinned_bytes == (n - 1) * 16 * MIB
    arena.close()
    assert arena.pinned_bytes == 0


class _Driver:
    """cudaHostRegister and cudaHostUnregister as the arena calls them, on a CPU build:
    records what is page-locked, and fails the registration of `fail_at` bytes."""

    def __init__(self, fail_at: int = -1) -> None:
        self.locked: dict[int, int] = {}
        self.fail_at = fail_at

    def cudaHostRegister(self, ptr: int, nbytes: int, flags: int) -> int:
        if nbytes == self.fail_at:
            return 2  # cudaErrorMemoryAllocation
        self.locked[ptr] = nbytes
        return 0

    def cudaHostUnregister(self, ptr: int) -> int:
        del self.locked[ptr]
        return 0


@pytest.fixture
def driver(monkeypatch: pytest.MonkeyPatch) -> _Driver:
    """The arena's threaded page-locking on a CPU build: the driver above in CUDA's place,
    device 0 current. A stand-in, because CI has no CUDA driver to register with and a real
    driver cannot be made to refuse one tile of a batch; the real page-locking is
    test_tiles_made_together_are_page_locked_and_copy_both_ways, run on the H200."""
    fake = _Driver()
    monkeypatch.setattr(torch.cuda, "cudart", lambda: fake)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "device", lambda _: contextlib.nullcontext())
    return fake


def test_tiles_are_locked_on_threads_and_unlocked_when_given_back(driver: _Driver) -> None:
    arena = HostArena(pin=True)
    sizes = [(i + 1) * MIB for i in range(2 * FILL_THREADS + 1)]  # more tiles than threads
    tiles = [Tile(f"t{i}", n, torch.uint8, "weights") for i, n in enumerate(sizes)]
    made = arena.alloc_many([*tiles, Tile("host", MIB, torch.uint8, "master", crosses_pcie=False)])
    assert sorted(driver.locked.values()) == sizes  # each tile once, whole; not the host's
    assert {t.data_ptr() for t in made[:-1]} == set(driver.locked)
    assert arena.pinned_bytes == sum(sizes) and all(not bool(t.any()) for t in made)
    arena.free("t3")
    assert made[3].data_ptr() not in driver.locked and arena.pinned_bytes == sum(sizes) - 4 * MIB
    arena.close()
    assert driver.locked == {}


def test_a_failed_registration_leaves_nothing_of_its_batch(driver: _Driver) -> None:
    """One tile of a batch fails to page-lock: the others, locked on other threads, are
    unlocked again, nothing is counted, and the same names can be asked for again."""
    arena = HostArena(pin=True)
    arena.alloc("kept", MIB, torch.uint8, "weights")
    driver.fail_at = 3 * MIB
    batch = [Tile(f"t{i}", (i + 1) * MIB, torch.uint8, "weights") for i in range(6)]
    with pytest.raises(RuntimeError, match=r"cudaHostRegister of t2 \(3145728 bytes\) failed"):
        arena.alloc_many(batch)
    assert list(driver.locked.values()) == [MIB] and arena.pinned_bytes == MIB
    assert set(arena.tensors) == {"kept"} and arena.total_bytes == MIB
    driver.fail_at = -1
    arena.alloc_many(batch)
    assert arena.pinned_bytes == MIB + 21 * MIB == sum(driver.locked.values())
    arena.close()
