"""The disk tier in the working-set runtime (working_set/spilled.py): spilling the last N
layers' AdamW moments changes nothing of the math — the same losses and bit-identical weights
with 0, 1 and all layers spilled, in fp32, bf16 and mixed, over direct and buffered I/O — and
a checkpoint written under one spill resumes under any other to the uninterrupted run's
weights. The host arena holds the slots and not the spilled moments.

    pytest tests/worker/runtime/working_set/test_spilled.py
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.worker.hf_models import hub_state
from tests.worker.runtime.working_set.reference_runs import DIMS, OPT, SEQ, Batches, reference
from wstrain.contracts.calibration import SPILL_SLOTS
from wstrain.worker.io import checkpoint
from wstrain.worker.runtime.working_set.config import WorkingSetConfig
from wstrain.worker.runtime.working_set.schedule import WorkingSetRuntime
from wstrain.worker.runtime.working_set.spill import SPILL_FILE
from wstrain.worker.runtime.working_set.state import HostState

L = DIMS.num_layers  # 4
KW = dict(
    micro_batch=2,
    chunk=1,
    rounds=2,
    r_param=2,
    r_grad=1,
    window=1,
    levels=tuple((2, 0) for _ in range(L)),
)


def spill_runtime(
    spill_dir: Path,
    spilled: int,
    precision: str = "fp32",
    buffered: bool = False,
    device_opt_layers: int = 0,
) -> WorkingSetRuntime:
    host = HostState.create(
        DIMS,
        precision,
        pin=False,
        spilled_layers=spilled,
        spill_dir=spill_dir,
        spill_buffered=buffered,
    )
    host.load_state_dict({k: v.detach().cpu() for k, v in hub_state(reference(DIMS)).items()})
    cfg = WorkingSetConfig(
        precision=precision,
        device="cpu",
        steps=10,
        seed=0,
        seq_len=SEQ,
        device_opt_layers=device_opt_layers,
        **KW,  # type: ignore[arg-type]
    )
    return WorkingSetRuntime(DIMS, cfg, OPT, host)


def run(rt: WorkingSetRuntime, steps: range) -> list[float]:
    data = Batches(DIMS.vocab_size)
    return [rt.train_step(data, s).loss for s in steps]


def weights(rt: WorkingSetRuntime) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in rt.state_tensors().items()}


def moments(rt: WorkingSetRuntime, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A group's (m, v) wherever it lives (read through a slot for a spilled one)."""
    host = rt.host
    rt.finish()
    mv = host.moments[group]
    if mv is not None:
        return mv[0].clone(), mv[1].clone()
    assert host.spill is not None
    host.spill.flush()
    m, v = host.spill.acquire(group)
    out = m.clone(), v.clone()
    host.spill.release(group, dirty=False)
    return out


@pytest.mark.parametrize("precision", ["fp32", "bf16", "mixed"])
def test_spilling_changes_no_loss_and_no_weight(tmp_path: Path, precision: str) -> None:
    steps = range(3)
    base = spill_runtime(tmp_path / "none", 0, precision)
    want_losses, want = run(base, steps), weights(base)
    for spilled, buffered in [(1, False), (L, False), (L, True)]:
        rt = spill_runtime(tmp_path / f"{spilled}-{buffered}", spilled, precision, buffered)
        assert run(rt, steps) == want_losses, (spilled, buffered)
        got = weights(rt)
        for name in want:
            assert torch.equal(got[name], want[name]), (spilled, buffered, name)
        for group in (L - 1, L - spilled):  # the moments came back from the disk intact
            for a, b in zip(moments(rt, group), moments(base, group)):
                assert torch.equal(a, b), (spilled, group)
                assert a.abs().sum() > 0  # updated, not the file's zeros
        stats = rt.train_step(Batches(DIMS.vocab_size), 3)
        assert "spill" in stats.stall_s and stats.stall_s["spill"] >= 0.0


def test_the_arena_holds_slots_instead_of_spilled_moments(tmp_path: Path) -> None:
    full = HostState.create(DIMS, "bf16", pin=False)
    host = HostState.create(DIMS, "bf16", pin=False, spilled_layers=3, spill_dir=tmp_path)
    layer_mv_bytes = 2 * host.layout.numel * 2  # m + v of one layer in bf16
    assert host.arena.bytes_by_kind["spill_buffer"] == SPILL_SLOTS * layer_mv_bytes
    moments = full.arena.bytes_by_kind["moments"] - host.arena.bytes_by_kind["moments"]
    assert moments == 3 * layer_mv_bytes
    # on disk: 3 records of m and v, each 4 KiB aligned (this toy layer's moments are not)
    assert host.spill is not None
    aligned = 2 * -(-host.layout.numel * 2 // 4096) * 4096
    assert (tmp_path / SPILL_FILE).stat().st_size == 3 * aligned


def test_spilled_layers_must_update_on_the_host(tmp_path: Path) -> None:
    with pytest.raises(AssertionError, match="must update on the host"):
        spill_runtime(tmp_path, L, device_opt_layers=1)


@pytest.mark.parametrize("before,after", [(2, 0), (0, 3), (1, L), (L, 1)])
def test_a_checkpoint_resumes_under_another_spill(tmp_path: Path, before: int, after: int) -> None:
    straight = spill_runtime(tmp_path / "straight", 0)
    run(straight, range(4))
    first = spill_runtime(tmp_path / "first", before)
    run(first, range(2))
    root = tmp_path / "ckpt"
    path = checkpoint.save(
        root,
        checkpoint.TrainerState(2, 4),
        first.state_tensors(),
        first.optimizer_state(),
        DIMS.to_hf_config(),
    )
    assert (path / "spilled_moments.bin").exists() == bool(before)
    _, extra = checkpoint.load_meta(path)
    resumed = spill_runtime(tmp_path / "resumed", after)
    resumed.load_state(path, extra)
    run(resumed, range(2, 4))
    want, got = weights(straight), weights(resumed)
    for name in want:
        assert torch.equal(want[name], got[name]), (before, after, name)


@pytest.mark.parametrize("precision", ["bf16", "mixed", "fp32"])
def test_the_arena_holds_what_the_planner_counts_with_a_spill(
    tmp_path: Path, precision: str
) -> None:
    """planning/memory_model.py host_state_bytes(spilled=N) and planning/spill.py
    spill_record_bytes: the arena within the planner's host figure as without a spill (the
    tiles' alignment, under 2%), the spill file within its disk figure."""
    from wstrain.contracts.model_dims import PRESETS
    from wstrain.planning.memory_model import host_state_bytes
    from wstrain.planning.spill import spill_record_bytes

    dims = PRESETS["tiny-llama"]
    for spilled in (1, dims.num_layers):
        host = HostState.create(
            dims, precision, pin=False, spilled_layers=spilled, spill_dir=tmp_path
        )
        extra = host.arena.total_bytes - host_state_bytes(dims, precision, spilled)
        assert extra < 0.02 * host.arena.total_bytes, (spilled, extra)
        disk = (tmp_path / SPILL_FILE).stat().st_size
        assert disk <= spilled * spill_record_bytes(dims, precision), (spilled, disk)
        assert host.spill is not None
        host.spill.close(remove=True)
