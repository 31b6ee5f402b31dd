"""Data parallelism over torch.distributed, for the runtimes: which slice of each step's
global batch a rank trains on, and the gradient sum across ranks. NCCL between GPUs, gloo on
CPU; one process per rank, launched as torchrun launches (RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT in the environment).

The math does not move with the rank count. Step k's global batch is the same G sequences
in the same order as on one GPU (worker/io/data.py); rank r of N trains on the r-th run of
G/N of them, cut into its rounds. Each rank's loss is its summed cross entropy over the
*global* batch's target count (RankSlice.target_tokens), so the SUM of the ranks' gradients
is the one-GPU gradient, and every rank then clips and steps the same AdamW on the same
sum: weights stay identical across ranks without a broadcast.

    group = ProcessGroup.from_env()                       # None: one process, no group
    data = RankSlice(stream, group.rank, group.world, rounds_per_rank, micro_batch)
    ... backward ...
    group.sum_gradients(model.parameters())               # before clipping and the step
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from wstrain.worker.runtime.base import Batches

# Gradients go across in flat buckets of this many bytes: one collective per bucket instead
# of one per parameter (DDP's default bucket is 25 MiB).
BUCKET_BYTES = 25 << 20


# Rank 0 writes a checkpoint while the others already wait in the next step's first
# collective: a Llama-8B checkpoint with its moments is ~64 GB, minutes on a slow disk, past
# NCCL's 10-minute default.
COLLECTIVE_TIMEOUT = timedelta(minutes=60)


@dataclass(frozen=True)
class ProcessGroup:
    rank: int
    world: int
    device: torch.device  # where this group's collectives take their tensors
    local_rank: int = 0  # among the ranks of this node (torchrun's LOCAL_RANK)
    local_world: int = 1  # ranks on this node (LOCAL_WORLD_SIZE); world / local_world nodes

    @classmethod
    def from_env(cls, device: str) -> ProcessGroup | None:
        """The default group from torchrun's environment (NCCL for "cuda" on GPU
        LOCAL_RANK, gloo for "cpu"), or None where WORLD_SIZE is unset or 1."""
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world <= 1:
            return None
        on = torch.device("cpu")
        if device == "cuda":
            on = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
            torch.cuda.set_device(on)
        if not dist.is_initialized():
            backend = "nccl" if device == "cuda" else "gloo"
            dist.init_process_group(backend, timeout=COLLECTIVE_TIMEOUT)
        rank, world = dist.get_rank(), dist.get_world_size()
        local_rank = int(os.environ.get("LOCAL_RANK", str(rank)))
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
        return cls(rank, world, on, local_rank, local_world)

    def sum_(self, t: torch.Tensor) -> None:
        """`t` becomes its sum over ranks, in place (identical on every rank)."""
        dist.all_reduce(t)

    def barrier(self) -> None:
        dist.barrier()

    def close(self) -> None:
        """Leave the group when every rank is done: a barrier first, so no rank closes its
        connections while a peer still reads from them, then the group's destruction while
        the interpreter is whole. A group left to the interpreter's exit can abort it
        (SIGABRT: gloo's threads outlive the teardown, pytorch/pytorch#179291), and a
        finished job's worker would then exit failed."""
        dist.barrier()
        dist.destroy_process_group()

    def broadcast_token(self, token: str) -> str:
        """Rank 0's `token` on every rank."""
        box = [token]
        dist.broadcast_object_list(box, src=0)
        return str(box[0])

    def any(self, flag: bool) -> bool:
        """Whether `flag` is set on any rank (every rank gets the same answer)."""
        t = torch.tensor([int(flag)], device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return bool(t.item())

    def sum_gradients(self, params: Iterable[torch.nn.Parameter]) -> None:
        """Each parameter's .grad becomes the sum over ranks, in buckets of BUCKET_BYTES."""
        grads = [p.grad for p in params if p.grad is not None]
        bucket: list[torch.Tensor] = []
        size = 0
        for g in grads:
            if bucket and (size + g.nbytes > BUCKET_BYTES or g.dtype != bucket[0].dtype):
                _sum_flat(bucket)
                bucket, size = [], 0
            bucket.append(g)
            size += g.nbytes
        if bucket:
            _sum_flat(bucket)

    def sum_scalar(self, value: torch.Tensor) -> torch.Tensor:
        """A 0-d tensor summed over ranks (the step's loss)."""
        out = value.detach().clone()
        dist.all_reduce(out)
        return out


def _sum_flat(tensors: list[torch.Tensor]) -> None:
    flat = torch.cat([t.reshape(-1) for t in tensors])  # one collective for the bucket
    dist.all_reduce(flat)
    offset = 0
    for t in tensors:
        t.copy_(flat[offset : offset + t.numel()].view_as(t))
        offset += t.numel()


class RankSlice:
    """The Batches of one rank: round r of this rank is round rank·rounds + r of the global
    batch (positions rank·rounds·micro_batch + r·micro_batch of step k's G sequences), and
    its target count is the whole global batch's."""

    def __init__(self, data: Batches, rank: int, world: int, rounds: int) -> None:
        self.data, self.rank, self.world, self.rounds = data, rank, world, rounds
        self.seq_len = data.seq_len

    def batch(
        self, step: int, round_idx: int, micro_batch: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self.data.batch(step, self.rank * self.rounds + round_idx, micro_batch)

    def documents(
        self, step: int, round_idx: int, micro_batch: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self.data.documents(step, self.rank * self.rounds + round_idx, micro_batch)

    def target_tokens(self, step: int, sequences: int) -> int:
        """`sequences`: this rank's; the count is over all ranks' (the global batch)."""
        return self.data.target_tokens(step, sequences * self.world)
