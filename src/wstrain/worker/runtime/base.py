"""The one interface the worker process drives: a Runtime trains a step, evaluates, and
hands its state to checkpoints. Both runtimes (resident, working_set) implement it, so the
process never asks which one it holds.

    runtime: Runtime = build_runtime(spec, plan)      # wstrain.worker.main
    stats = runtime.train_step(batches, step)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch

from wstrain.worker.runtime.stats import StepStats


class Batches(Protocol):
    """A source of training batches, a pure function of (step, round): the token stream of
    a job, or random tokens in a benchmark."""

    seq_len: int

    def batch(
        self, step: int, round_idx: int, micro_batch: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and next-token targets, each (micro_batch, seq_len) int64."""
        ...


@dataclass(frozen=True)
class HostMemory:
    """Host memory a runtime holds for the training state (its arena; 0 for the resident
    runtime, whose state is on the device)."""

    arena_bytes: int = 0
    pinned_bytes: int = 0


class Runtime(Protocol):
    def train_step(self, data: Batches, step: int) -> StepStats:
        """One optimizer step (0-based `step`) over the plan's rounds."""
        ...

    def eval_loss(self, inputs: torch.Tensor, targets: torch.Tensor) -> float:
        """Mean next-token loss of (B, S) inputs and targets, without training."""
        ...

    def state_tensors(self) -> dict[str, torch.Tensor]:
        """The weights by Hugging Face parameter name (current: no update pending)."""
        ...

    def optimizer_state(self) -> dict[str, object]:
        """AdamW moments, step counts and the LR schedule, for a checkpoint."""
        ...

    def load_state(self, weights: dict[str, torch.Tensor] | Path, extra: dict[str, object]) -> None:
        """Weights by name, or a checkpoint directory to stream them from, and the
        optimizer state `optimizer_state` returned."""
        ...

    def host_memory(self) -> HostMemory:
        """What the training state holds of host memory now."""
        ...

    def finish(self) -> None:
        """Apply any deferred work (the working set's deferred optimizer update)."""
        ...
