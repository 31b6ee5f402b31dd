"""Cross-round overlap (working_set/pass_order.py): every pass after the step's first runs its
forward beside the previous pass's backward. Against transformers and torch AdamW, and bit for
bit against the per-round schedule with the same plan (every op and accumulation keeps its
order per layer), on CPU; with real streams on a GPU. Random plans with the overlap:
test_schedule.py's property test.

    pytest tests/worker/runtime/working_set/test_pass_order.py
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tests.worker.runtime.working_set.reference_runs import (
    BIG_VOCAB,
    DIMS,
    Batches,
    DocBatches,
    check_grads,
    check_weights_after_steps,
    fp32_spec,
    make_runtime,
    reference,
)
from wstrain.planning.memory_model import overlap_live_bytes, saved_bytes
from wstrain.worker.runtime.working_set.config import WorkingSetConfig
from wstrain.worker.runtime.working_set.host_store import HostActivationStore
from wstrain.worker.runtime.working_set.schedule import WorkingSetRuntime


def _levels(seed: int, units: int) -> tuple[tuple[int, ...], ...]:
    g = torch.Generator().manual_seed(seed)
    return tuple(
        tuple(int(v) for v in torch.randint(0, 4, (units,), generator=g))
        for _ in range(DIMS.num_layers)
    )


def _in_small_parts(rt: WorkingSetRuntime) -> None:
    """The overlap's store with 1 KiB chunks: the tiny model's sets go home in many parts
    (host_store.HostRoom), as Llama's gate and up projections do in 64 MiB chunks."""
    rt.acts = HostActivationStore(rt.host.arena, chunk_bytes=1024, split=True)


@pytest.mark.parametrize(
    "device_layers", [0, 4, 2], ids=["host-adamw", "device-adamw", "split-adamw"]
)
def test_overlap_trains_as_torch_adamw(device_layers: int) -> None:
    """Three steps of three rounds, a lead pass of two, the first pass's own levels and a
    window layer: the weights torch AdamW reaches on transformers (fp32, 1e-5)."""
    dims = BIG_VOCAB if device_layers else DIMS
    ref, data = reference(dims), Batches(dims.vocab_size)
    rt = make_runtime(
        ref,
        dims=dims,
        micro_batch=2,
        chunk=1,
        rounds=3,
        r_param=3,
        r_grad=2,
        window=1,
        levels=_levels(0, 2),
        first_levels=_levels(1, 2),
        device_opt_layers=device_layers,
        lead_rounds=2,
        overlap=True,
    )
    _in_small_parts(rt)
    check_weights_after_steps(rt, data, 3, 1e-5)


@pytest.mark.parametrize(
    "documents,device_layers",
    [(False, 0), (True, 0), (False, 4)],
    ids=["sequences", "documents", "device-adamw"],
)
def test_overlap_is_the_per_round_schedule_bit_for_bit(documents: bool, device_layers: int) -> None:
    """Same plan, same data, three steps: every loss and every weight equal, not close.
    With packed documents each pass keeps its own masks and positions. The overlap's sets
    go home in parts of 1 KiB."""
    dims = BIG_VOCAB if device_layers else DIMS
    data = DocBatches(dims.vocab_size) if documents else Batches(dims.vocab_size)
    runs = []
    for overlap in (False, True):
        rt = make_runtime(
            reference(dims),
            dims=dims,
            micro_batch=4,
            chunk=2,
            rounds=3,
            window=2,
            levels=_levels(2, 2),
            first_levels=_levels(3, 2),
            loss_tokens=7,
            document_mask=documents,
            device_opt_layers=device_layers,
            overlap=overlap,
        )
        if overlap:
            _in_small_parts(rt)
        losses = [rt.train_step(data, step).loss for step in range(3)]
        runs.append((losses, rt.state_tensors()))
    (want_losses, want), (got_losses, got) = runs
    assert got_losses == want_losses
    for name, w in want.items():
        assert torch.equal(got[name], w), name


def test_the_first_pass_takes_its_own_levels_and_the_next_fills_what_it_frees() -> None:
    """The first pass saves at first_levels (here nothing past the inputs), later passes at
    levels (everything). One store holds both passes: the second pass's layer i goes home
    while the first still holds its layers 0..L-1-i, so the most it holds is the second
    pass's sets and the first pass's layer 0 (planning/memory_model.py
    overlap_live_bytes)."""
    L = DIMS.num_layers
    rt = make_runtime(
        reference(DIMS),
        micro_batch=2,
        chunk=1,
        rounds=2,
        window=0,
        levels=tuple((3, 3) for _ in range(L)),
        first_levels=tuple((0, 0) for _ in range(L)),
        overlap=True,
    )
    rt.forward_backward(Batches(DIMS.vocab_size), 0)
    set0, set3 = (2 * saved_bytes(DIMS, fp32_spec(global_batch=4), lv) for lv in (0, 3))
    assert rt.acts.peak_bytes == L * set3 + set0
    # the planner's count takes two later passes beside each other too (here there is one)
    assert overlap_live_bytes([set0] * L, [set3] * L) == (L + 1) * set3
    assert rt.acts.live_bytes == 0  # every set released by its backward


def test_overlap_refuses_pieces_by_name() -> None:
    with pytest.raises(ValueError, match=r"overlap=True.*seq_chunk=4"):
        WorkingSetConfig(
            precision="fp32", device="cpu", micro_batch=1, chunk=1, rounds=2, steps=1,
            seed=0, seq_len=16, seq_chunk=4, overlap=True,
        )  # fmt: skip


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("level", [0, 1, 3])
def test_cuda_overlap_matches_transformers(level: int) -> None:
    """Two passes in flight on real streams, events and pinned host tiles."""
    ref = reference(DIMS).cuda()
    data = Batches(DIMS.vocab_size)
    data.pool = data.pool.cuda()
    rt = make_runtime(
        ref,
        device="cuda",
        micro_batch=4,
        chunk=2,
        rounds=3,
        r_param=3,
        r_grad=2,
        window=1,
        levels=tuple((level,) * 2 for _ in range(DIMS.num_layers)),
        first_levels=tuple((0,) * 2 for _ in range(DIMS.num_layers)),
        loss_tokens=24,
        lead_rounds=2,
        overlap=True,
    )
    check_grads(rt, data, tol=1e-4, ref=ref)


def test_overlap_config_round_trips() -> None:
    cfg = WorkingSetConfig(
        precision="fp32", device="cpu", micro_batch=1, chunk=1, rounds=2, steps=1, seed=0,
        seq_len=16, overlap=True, first_levels=((0,),), levels=((3,),), window=0,
    )  # fmt: skip
    assert cfg.placement(0, 0, 1, first=True) == (0, True)
    assert cfg.placement(0, 0, 1) == (3, True)
    assert dataclasses.replace(cfg, first_levels=()).placement(0, 0, 1, first=True) == (3, True)
