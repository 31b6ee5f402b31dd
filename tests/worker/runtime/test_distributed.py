"""Data parallel on torch.distributed with gloo (worker/runtime/distributed.py): 2 and 4
ranks of real processes train the same job as one to the same losses and final weights
(fp32, 1e-5), dense and mixture-of-experts, on the resident runtime; a checkpoint two ranks
save resumes on one and on four to the uninterrupted job's losses and weights; a rank's
slice of the global batch is the one-rank order cut by rank.

    pytest tests/worker/runtime/test_distributed.py
"""

from __future__ import annotations

import faulthandler
import os
from pathlib import Path

import pytest
import torch

from tests.ports import free_port
from tests.worker.runtime.rank_data import (
    GLOBAL_BATCH,
    MICRO_BATCH,
    OPT,
    RESUMED_STEPS,
    SEQ,
    STEPS,
    Pool,
    spawn_ranks,
)
from wstrain.contracts.model_dims import PRESETS, ModelDims
from wstrain.worker.io import checkpoint
from wstrain.worker.runtime.distributed import ProcessGroup, RankSlice
from wstrain.worker.runtime.resident import ResidentRuntime, RuntimeConfig


def _train(
    dims: ModelDims,
    world: int,
    group: ProcessGroup | None,
    steps: range = range(STEPS),
    resume: str = "",
    save: str = "",
) -> tuple[list[float], dict]:  # type: ignore[type-arg]
    """Train `steps` (of a schedule of RESUMED_STEPS when resuming or saving), from the
    checkpoint `resume`; rank 0 saves a checkpoint to `save` at the end."""
    rounds = GLOBAL_BATCH // MICRO_BATCH // world
    total = RESUMED_STEPS if resume or save else STEPS
    cfg = RuntimeConfig("fp32", "cpu", MICRO_BATCH, rounds, total, seed=5, seq_len=SEQ)
    rt = ResidentRuntime(dims, cfg, OPT, group)
    if resume:
        _, extra = checkpoint.load_meta(Path(resume))
        rt.load_state(Path(resume), extra)
    pool = Pool(dims.vocab_size, RESUMED_STEPS)
    losses = [rt.train_step(pool, s).loss for s in steps]
    weights = {k: v.clone() for k, v in rt.state_tensors().items()}
    if save and (group is None or group.rank == 0):
        state = checkpoint.TrainerState(steps.stop, steps.stop * GLOBAL_BATCH)
        checkpoint.save(Path(save), state, weights, rt.optimizer_state(), dims.to_hf_config())
    return losses, weights


def _rank(
    rank: int,
    world: int,
    port: int,
    preset: str,
    out: str,
    steps: range = range(STEPS),
    resume: str = "",
    save: str = "",
) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world)
    )
    faulthandler.enable()  # a native abort in a rank prints its Python stacks
    torch.set_num_threads(1)
    group = ProcessGroup.from_env("cpu")
    assert group is not None and (group.rank, group.world) == (rank, world)
    result = _train(PRESETS[preset], world, group, steps, resume, save)
    torch.save(result, f"{out}.{rank}")
    group.close()


@pytest.mark.parametrize("preset", ["micro-llama", "tiny-olmoe"])
@pytest.mark.parametrize("world", [2, 4])
def test_ranks_train_the_one_rank_job(world: int, preset: str, tmp_path: Path) -> None:
    one_losses, one_weights = _train(PRESETS[preset], 1, None)
    out = str(tmp_path / "rank")
    spawn_ranks(_rank, (world, free_port(), preset, out), world)
    for rank in range(world):
        losses, weights = torch.load(f"{out}.{rank}")
        for a, b in zip(losses, one_losses):
            assert abs(a - b) < 1e-5 * abs(b), (rank, losses, one_losses)
        for name, w in one_weights.items():
            err = float((weights[name] - w).norm() / w.norm().clamp_min(1e-30))
            assert err < 1e-5, (rank, name, err)


def test_a_checkpoint_of_two_ranks_resumes_on_one_and_on_four(tmp_path: Path) -> None:
    dims, half = PRESETS["micro-llama"], range(STEPS)
    args = (2, free_port(), "micro-llama", str(tmp_path / "two"), half, "", str(tmp_path / "c"))
    spawn_ranks(_rank, args, 2)
    ckpt = checkpoint.latest(tmp_path / "c")
    assert ckpt is not None
    rest = range(STEPS, RESUMED_STEPS)
    whole = _train(dims, 1, None, range(RESUMED_STEPS), save=str(tmp_path / "unused"))
    want = (whole[0][STEPS:], whole[1])
    got = [_train(dims, 1, None, rest, resume=str(ckpt))]
    out = str(tmp_path / "four")
    spawn_ranks(_rank, (4, free_port(), "micro-llama", out, rest, str(ckpt)), 4)
    got += [torch.load(f"{out}.{rank}") for rank in range(4)]
    for who, (losses, weights) in enumerate(got):
        for a, b in zip(losses, want[0], strict=True):
            assert abs(a - b) < 1e-5 * abs(b), (who, losses, want[0])
        for name, w in want[1].items():
            err = float((weights[name] - w).norm() / w.norm().clamp_min(1e-30))
            assert err < 1e-5, (who, name, err)


def test_a_ranks_slice_is_its_run_of_the_global_batch() -> None:
    pool = Pool(50)
    whole = torch.cat([pool.batch(1, r, MICRO_BATCH)[0] for r in range(4)])  # one rank
    for world in (2, 4):
        rounds = 4 // world
        parts = [
            RankSlice(pool, rank, world, rounds).batch(1, r, MICRO_BATCH)[0]
            for rank in range(world)
            for r in range(rounds)
        ]
        assert torch.equal(torch.cat(parts), whole)
        assert RankSlice(pool, 1, world, rounds).target_tokens(1, rounds * MICRO_BATCH) == (
            pool.target_tokens(1, GLOBAL_BATCH)
        )
    assert os.environ.get("WORLD_SIZE") in (None, "1") and ProcessGroup.from_env("cpu") is None
