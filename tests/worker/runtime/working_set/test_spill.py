"""working_set/spill.py: the spill file round-trips bytes over direct I/O (where the file
system takes O_DIRECT) and over the buffered fallback (forced by a parameter: which file
systems take O_DIRECT depends on the kernel, tmpfs since Linux 6.6), in blocks across
records, with reads chained after writes; a file past the disk budget is refused naming
budget.disk_gib; an I/O error surfaces on the waiting thread with the path and the offset.

    pytest tests/worker/runtime/working_set/test_spill.py
"""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
import torch

from wstrain.contracts.errors import BudgetExceeded
from wstrain.worker.runtime.working_set import spill
from wstrain.worker.runtime.working_set.arena import HostArena
from wstrain.worker.runtime.working_set.spill import (
    SPILL_FILE,
    RawFile,
    RecordLayout,
    SpillFile,
    SpillIOError,
)


def buffers(arena: HostArena, name: str, numel: int) -> tuple[torch.Tensor, ...]:
    m = arena.alloc(f"{name}.m", numel, torch.bfloat16, "spill_buffer")
    v = arena.alloc(f"{name}.v", numel, torch.bfloat16, "spill_buffer")
    return m, v


@pytest.mark.parametrize("buffered", [False, True], ids=["direct", "buffered"])
def test_records_round_trip(
    tmp_path: Path, buffered: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # blocks of 8 KiB: one record's moment (5000 bf16, 10000 bytes) takes 2 blocks
    monkeypatch.setattr(spill, "SPILL_IO_BLOCK_BYTES", 8192)
    numel = 5000
    layout = RecordLayout.of(numel, torch.bfloat16)
    assert layout.v_offset == 12288 and layout.record_bytes == 24576
    f = SpillFile.create(
        tmp_path, 3, layout, disk_limit_bytes=3 * layout.record_bytes, buffered=buffered
    )
    assert (tmp_path / SPILL_FILE).stat().st_size == 3 * layout.record_bytes
    if buffered:
        assert not f.direct
    arena = HostArena(pin=False)
    n = layout.v_offset if f.direct else layout.moment_bytes
    slots = []
    for i in range(2):
        m, v = buffers(arena, f"slot{i}", numel)
        slots.append((m, v, [arena.page_view(f"slot{i}.{s}")[:n] for s in ("m", "v")]))
    g = torch.Generator().manual_seed(0)
    want = {r: (torch.randn(numel, generator=g), torch.randn(numel, generator=g)) for r in range(3)}
    m, v, views = slots[0]
    # a fresh file reads as zeros (the moments' start)
    f.read(f.offset(1), views).wait()
    assert not m.any() and not v.any()
    op = None
    for r in range(3):
        m.copy_(want[r][0])
        v.copy_(want[r][1])
        op = f.write(f.offset(r), views)
        op.wait()
    m2, v2, views2 = slots[1]
    for r in (2, 0, 1):
        f.read(f.offset(r), views2).wait()
        assert torch.equal(m2, want[r][0].bfloat16()) and torch.equal(v2, want[r][1].bfloat16())
    # a read chained after a write of the same slot sees what the write sent
    m.fill_(3.0)
    w = f.write(f.offset(1), views)
    r = f.read(f.offset(1), views2, after=w)
    r.wait()
    assert w.done() and torch.equal(m2, m)
    f.remove()
    assert not (tmp_path / SPILL_FILE).exists()


def test_a_spill_past_the_disk_budget_is_refused(tmp_path: Path) -> None:
    layout = RecordLayout.of(4096, torch.float32)  # 16 KiB a moment, 32 KiB a record
    with pytest.raises(
        BudgetExceeded, match=r"budget.disk_gib allows 65536 bytes.*room for 2 layers"
    ) as e:
        SpillFile.create(tmp_path, 3, layout, disk_limit_bytes=65536)
    assert "98304 bytes" in e.value.message and "raise budget.disk_gib" in e.value.message
    assert not (tmp_path / SPILL_FILE).exists()


def test_io_errors_name_the_path_and_offset(tmp_path: Path) -> None:
    layout = RecordLayout.of(1024, torch.float32)
    path = tmp_path / "short.bin"
    path.write_bytes(b"\0" * 4096)  # a record of 8 KiB cannot be read from 4 KiB
    f = RawFile(path, 2 * layout.record_bytes, create=False, buffered=True)
    arena = HostArena(pin=False)
    m = arena.alloc("m", 1024, torch.float32, "spill_buffer")
    with pytest.raises(
        SpillIOError, match=rf"spill read of {path} at offset 4096.*short read"
    ) as e:
        f.read(4096, [arena.page_view("m")[: m.nbytes]]).wait()
    assert e.value.errno == errno.EIO
    # what was ordered after the failed read fails with it
    failed = f.read(4096, [arena.page_view("m")[: m.nbytes]])
    with pytest.raises(SpillIOError):
        f.read(0, [arena.page_view("m")[: m.nbytes]], after=failed).wait()
    f.close()
