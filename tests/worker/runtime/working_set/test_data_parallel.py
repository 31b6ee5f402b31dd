"""Data parallel on the working-set runtime with gloo (working_set/data_parallel.py,
node_share.py): 2 and 4 ranks of real processes over one shared host copy train the same
job as one rank to the same losses and final weights (fp32, 1e-5), dense and MoE, several
rounds a rank; a checkpoint two ranks save resumes on one and on four; the job's host
memory (PSS summed over its processes, shared pages counted once) on two ranks is within
1.15x of one rank's.

    pytest tests/worker/runtime/working_set/test_data_parallel.py
"""

from __future__ import annotations

import faulthandler
import itertools
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tests.ports import free_port
from tests.worker.runtime.rank_data import GLOBAL_BATCH, OPT, SEQ, Pool, spawn_ranks
from wstrain.contracts.model_dims import PRESETS, ModelDims
from wstrain.worker.io import checkpoint
from wstrain.worker.models.initial import initial_weights
from wstrain.worker.runtime.distributed import ProcessGroup
from wstrain.worker.runtime.working_set.config import WorkingSetConfig
from wstrain.worker.runtime.working_set.node_share import NodeShare, shard_span
from wstrain.worker.runtime.working_set.schedule import WorkingSetRuntime
from wstrain.worker.runtime.working_set.state import HostState

SHM = Path("/dev/shm")
# two steps (the second reads the first's deferred update): OLMoE's q/k projections move
# ~5e-6 apart a step wherever the summation order changes, as far as the resident and the
# working-set runtime on one rank do (5.1e-6 after one step), so a third step reaches 1.03e-5
STEPS = 2
POOL_STEPS = STEPS + 2  # the resumed runs' two more steps


def build(
    dims: ModelDims,
    world: int,
    group: ProcessGroup | None,
    precision: str = "fp32",
    overlap: bool = False,
    shm: Path = SHM,
) -> WorkingSetRuntime:
    """A working-set runtime on this rank: rank 0 loads the seed's weights into the shared
    copy, the others wait for it."""
    share = NodeShare.create(group, shm) if group and group.local_world > 1 else None
    host = HostState.create(dims, precision, pin=False, share=share)
    if group is None or group.local_rank == 0:
        host.load_tensors(initial_weights(dims, 5))
    if group is not None:
        group.barrier()  # every rank has mapped every tile, and the weights are in
        if share is not None:
            share.unlink()
    # two rounds a rank at every world size: a rank's span of the host gradients comes back
    # for the second (and on several nodes, from one node only)
    rounds, micro_batch = 2, GLOBAL_BATCH // world // 2
    L = dims.num_layers
    cfg = WorkingSetConfig(
        precision=precision,
        device="cpu",
        micro_batch=micro_batch,
        chunk=1,
        rounds=rounds,
        steps=6,
        seed=5,
        seq_len=SEQ,
        window=1,
        levels=tuple(tuple((k + c) % 4 for c in range(micro_batch)) for k in range(L)),
        overlap=overlap,
    )
    return WorkingSetRuntime(dims, cfg, OPT, host, group)


def _weights(rt: WorkingSetRuntime) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in rt.state_tensors().items()}


def _rank(
    rank: int,
    world: int,
    port: int,
    preset: str,
    out: str,
    resume: str,
    steps: int,
    local: int,
    shm: str,
) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank % local),  # `local` ranks a node, each node its own host copy
        LOCAL_WORLD_SIZE=str(local),
    )
    faulthandler.enable()  # a native abort in a rank prints its Python stacks
    torch.set_num_threads(1)
    group = ProcessGroup.from_env("cpu")
    assert group is not None
    preset, _, mode = preset.partition(":")  # "micro-llama:mixed", "micro-llama:overlap"
    precision = "mixed" if mode == "mixed" else "fp32"
    rt = build(PRESETS[preset], world, group, precision, mode == "overlap", Path(shm))
    pool, start = Pool(rt.dims.vocab_size, POOL_STEPS), 0
    if resume:  # every rank loads its span of the moments; rank 0 the weights
        state, extra = checkpoint.load_meta(Path(resume))
        rt.load_state(Path(resume), extra)
        start = state.step
    losses = [rt.train_step(pool, s).loss for s in range(start, steps)]
    weights = _weights(rt)
    if rank == 0 and not resume:
        checkpoint.save(
            Path(out + ".ckpt"),
            checkpoint.TrainerState(steps, steps * GLOBAL_BATCH),
            weights,
            rt.optimizer_state(),
            rt.dims.to_hf_config(),
        )
    rt.finish()
    torch.save((losses, weights), f"{out}.{rank}")
    group.close()


def _spawn(
    world: int,
    preset: str,
    out: str,
    resume: str = "",
    steps: int = STEPS,
    local: int = 0,
    shm: Path = SHM,
) -> list[tuple[list[float], dict]]:  # type: ignore[type-arg]
    """Each rank's (losses, weights); the ranks share their host copy's tiles in `shm`."""
    args = (world, free_port(), preset, out, resume, steps, local or world, str(shm))
    spawn_ranks(_rank, args, world)
    return [torch.load(f"{out}.{rank}") for rank in range(world)]


def _one_rank(preset: str, steps: range) -> tuple[list[float], dict[str, torch.Tensor]]:
    preset, _, precision = preset.partition(":")
    rt = build(PRESETS[preset], 1, None, precision or "fp32")
    pool = Pool(rt.dims.vocab_size, POOL_STEPS)
    losses = [rt.train_step(pool, s).loss for s in steps]
    return losses, _weights(rt)


def _same(
    got: tuple[list[float], dict],  # type: ignore[type-arg]
    want: tuple[list[float], dict],  # type: ignore[type-arg]
    who: str,
    tol: float = 1e-5,
) -> None:
    for a, b in zip(got[0], want[0], strict=True):
        assert abs(a - b) < tol * abs(b), (who, got[0], want[0])
    for name, w in want[1].items():
        err = float((got[1][name] - w).norm() / w.norm().clamp_min(1e-30))
        assert err < tol, (who, name, err)


@pytest.fixture
def own_shm() -> Iterator[Path]:
    """A folder of /dev/shm for one test's tiles alone: other tests (an xdist worker beside
    this one, a worker process of test_ranks.py) map their own wstrain-* tiles in /dev/shm
    meanwhile, so only this folder tells whether this job left any."""
    path = Path(tempfile.mkdtemp(prefix="pytest-tiles-", dir=SHM))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.parametrize("preset", ["micro-llama", "tiny-olmoe"])
@pytest.mark.parametrize("world", [2, 4])
def test_ranks_over_one_host_copy_train_the_one_rank_job(
    world: int, preset: str, tmp_path: Path, own_shm: Path
) -> None:
    want = _one_rank(preset, range(STEPS))
    for rank, got in enumerate(_spawn(world, preset, str(tmp_path / "r"), shm=own_shm)):
        _same(got, want, f"rank {rank} of {world}")
    assert not list(own_shm.iterdir()), "the shared tiles outlived the job"


@pytest.mark.parametrize("local", [1, 2])
def test_nodes_each_with_their_own_copy_train_the_one_rank_job(local: int, tmp_path: Path) -> None:
    """4 ranks as 4 nodes of one rank, or 2 nodes of 2 ranks sharing each node's copy."""
    want = _one_rank("micro-llama", range(STEPS))
    for rank, got in enumerate(_spawn(4, "micro-llama", str(tmp_path / "r"), local=local)):
        _same(got, want, f"rank {rank} of 4, {local} a node")


def test_ranks_overlapping_rounds_train_the_one_rank_job(tmp_path: Path) -> None:
    """Each rank runs its second round's forward beside its first round's backward: the
    ranks' collectives keep one order, and the job trains as one rank round by round."""
    want = _one_rank("micro-llama", range(STEPS))
    for rank, got in enumerate(_spawn(2, "micro-llama:overlap", str(tmp_path / "o"))):
        _same(got, want, f"rank {rank} of 2, overlap")


def test_mixed_precision_ranks_share_one_fp32_master(tmp_path: Path) -> None:
    """bf16 weights and gradients streamed, the fp32 master and moments shared and updated
    span by span: the one-rank job within bf16's rounding (the ranks sum their bf16
    gradients in another order). A rank that skipped its span, or updated another's, would
    leave weights a whole update (lr 1e-2 on weights of ~0.02) apart."""
    want = _one_rank("micro-llama:mixed", range(STEPS))
    for rank, got in enumerate(_spawn(2, "micro-llama:mixed", str(tmp_path / "m"))):
        _same(got, want, f"rank {rank} of 2, mixed", tol=2e-2)


def test_a_checkpoint_of_two_ranks_resumes_on_one_and_on_four(tmp_path: Path) -> None:
    preset, more = "micro-llama", POOL_STEPS  # resumed runs train two steps more
    two = str(tmp_path / "two")
    _spawn(2, preset, two)  # saves at step STEPS
    ckpt = checkpoint.latest(Path(two + ".ckpt"))
    assert ckpt is not None
    whole = _one_rank(preset, range(more))
    want = (whole[0][STEPS:], whole[1])
    rt = build(PRESETS[preset], 1, None)  # one rank, resumed
    state, extra = checkpoint.load_meta(ckpt)
    rt.load_state(ckpt, extra)
    pool = Pool(rt.dims.vocab_size, POOL_STEPS)
    losses = [rt.train_step(pool, s).loss for s in range(state.step, more)]
    _same((losses, _weights(rt)), want, "1 rank, resumed")
    for rank, got in enumerate(_spawn(4, preset, str(tmp_path / "four"), str(ckpt), more)):
        _same(got, want, f"rank {rank} of 4, resumed")


def test_spans_cover_a_tile_once() -> None:
    for numel in (1, 127, 128, 1000, 4096 * 3 + 5):
        for world in (1, 2, 3, 4, 8):
            spans = [shard_span(numel, r, world) for r in range(world)]
            assert spans[0][0] == 0 and spans[-1][1] == numel
            assert all(a[1] == b[0] for a, b in itertools.pairwise(spans))
            assert all(lo % 128 == 0 or lo == numel for lo, _ in spans)
