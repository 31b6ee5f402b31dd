"""The node's one shared copy (working_set/node_share.py) without processes: two ranks'
views of a tile are one memory, which outlives its unlinked file; a rank waits for its
peers' update counters; a tmpfs too small is an error that names the fix, at start.

    pytest tests/worker/runtime/working_set/test_node_share.py
"""

from __future__ import annotations

import errno
import os
import threading
import time
from pathlib import Path

import pytest
import torch

from wstrain.contracts.errors import BudgetExceeded
from wstrain.worker.runtime.working_set.arena import HostArena
from wstrain.worker.runtime.working_set.node_share import NodeShare, UpdateCounters


def _ranks(directory: Path, world: int = 2) -> list[NodeShare]:
    return [NodeShare(rank, world, directory, "t0k3n-n0") for rank in range(world)]


def test_two_ranks_map_one_tile_that_outlives_its_file(tmp_path: Path) -> None:
    a, b = (HostArena(pin=False, share=s) for s in _ranks(tmp_path))
    ta = a.alloc("layer0.weights", 1000, torch.float32, "weights", shared=True)
    tb = b.alloc("layer0.weights", 1000, torch.float32, "weights", shared=True)
    private = b.alloc("acts0", 1000, torch.float32, "activations")  # not shared
    ta.copy_(torch.arange(1000.0))
    assert torch.equal(tb, torch.arange(1000.0)) and not private.any()
    assert a.share is not None and b.share is not None
    assert [p.name for p in a.share.paths] == ["wstrain-t0k3n-n0-layer0.weights"]
    assert b.share.paths == []  # rank 0 owns the files
    a.share.unlink()
    assert list(tmp_path.iterdir()) == []
    tb.mul_(2)  # still one memory, with no file left
    assert torch.equal(ta, 2 * torch.arange(1000.0))


def test_a_rank_waits_for_its_peers_updates(tmp_path: Path) -> None:
    zero, one = (UpdateCounters(3, s) for s in _ranks(tmp_path))
    zero.mark(1)
    done = threading.Event()

    def wait() -> None:
        zero.wait_peers(1)
        done.set()

    threading.Thread(target=wait, daemon=True).start()
    time.sleep(0.05)
    assert not done.is_set()  # rank 1 has not updated group 1 yet
    one.mark(1)
    assert done.wait(5.0)
    one.wait_peers(2)  # nobody updated group 2: nothing to wait for


def test_a_full_tmpfs_is_an_error_at_start_naming_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "posix_fallocate", full)  # the kernel's answer on a full tmpfs
    arena = HostArena(pin=False, share=_ranks(tmp_path)[0])
    with pytest.raises(BudgetExceeded, match="WSTRAIN_SHM_DIR"):
        arena.alloc("layer0.weights", 1 << 20, torch.bfloat16, "weights", shared=True)
