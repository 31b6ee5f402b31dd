"""What the data-parallel tests share (runtime/test_distributed.py,
working_set/test_data_parallel.py): the batch shape, the optimizer, a fixed token pool cut
as TokenStream cuts it, a free loopback port for a gang's rendezvous, and the ranks' start."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.multiprocessing as mp

from wstrain.contracts.spec import OptimizerSpec

# what a rank imports, once, in this test process's fork server (a rank forks from it)
_RANK_IMPORTS = [
    "torch",
    "torch.distributed",
    "wstrain.worker.runtime.resident",
    "wstrain.worker.runtime.working_set.schedule",
    "wstrain.worker.io.checkpoint",
]

GLOBAL_BATCH, MICRO_BATCH, SEQ, STEPS = 8, 2, 16, 3
RESUMED_STEPS = STEPS + 2  # a checkpoint at STEPS resumed for two more
# eps 1e-4: AdamW moves a weight by ~lr·sign(g) where |g| >> eps, so gradients of ~1e-7,
# whose sign the fp32 summation order decides (ranks sum in another order than one rank),
# set an error floor; at eps 1e-6 OLMoE's embedding ended 6.4e-5 apart after three steps
# with the losses equal to 1e-5 (one step: within 1e-5)
OPT = OptimizerSpec(lr=1e-2, weight_decay=0.1, eps=1e-4, grad_clip=0.5, warmup_steps=1)


class Pool:
    """Batches over a fixed pool; round r of step k is positions k·G + r·n, as TokenStream.
    Every fourth target is ignored (-100), so the global target count matters."""

    def __init__(self, vocab: int, steps: int = STEPS) -> None:
        g = torch.Generator().manual_seed(0)
        self.rows = torch.randint(0, vocab, (steps * GLOBAL_BATCH, SEQ + 1), generator=g)
        self.seq_len = SEQ

    def batch(self, step: int, round_idx: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        start = step * GLOBAL_BATCH + round_idx * n
        rows = self.rows[start : start + n]
        targets = rows[:, 1:].clone()
        targets[:, ::4] = -100
        return rows[:, :-1], targets

    def documents(self, step: int, round_idx: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        raise ValueError("no documents")

    def target_tokens(self, step: int, sequences: int) -> int:
        return int(sum((self.batch(step, r, 1)[1] != -100).sum() for r in range(sequences)))


def spawn_ranks(fn: Callable[..., None], args: tuple[Any, ...], nprocs: int) -> None:
    """`fn(rank, *args)` in `nprocs` processes, joined, as mp.spawn; the processes fork from
    a server that imported torch and the runtime once, not each from a fresh interpreter
    (~2.7 CPU-s a rank on CI's 2 cores, ~50 ranks in these tests)."""
    mp.set_forkserver_preload(_RANK_IMPORTS)
    mp.start_processes(fn, args=args, nprocs=nprocs, join=True, start_method="forkserver")
