"""The one interface the worker process drives: a Runtime trains a step, evaluates, and
hands its state to checkpoints. Both runtimes (resident, working_set) implement it, so the
process never asks which one it holds.

    runtime: Runtime = build_runtime(spec, plan)      # wstrain.worker.build
    stats = runtime.train_step(batches, step)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch

from wstrain.worker.runtime.stats import StepStats

# A target of IGNORE_INDEX counts in no loss (torch's cross_entropy default).
IGNORE_INDEX = -100


class Batches(Protocol):
    """A source of training batches, a pure function of (step, round): the token stream of
    a job, or random tokens in a benchmark.

    The loss convention of every runtime: a step's loss is the sum of the cross entropy over
    every target of its global batch divided by `target_tokens(step, G)`, the number of targets
    that are not IGNORE_INDEX in the whole step, not a mean of micro-batch means. So how a
    plan cuts the step into rounds and micro-batches changes nothing however the ignored
    targets fall (transformers fixed the same bug in its gradient accumulation in 2024)."""

    seq_len: int

    def batch(
        self, step: int, round_idx: int, micro_batch: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and next-token targets, each (micro_batch, seq_len) int64."""
        ...

    def documents(
        self, step: int, round_idx: int, micro_batch: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Positions within documents and document indices within sequences of `batch`'s
        inputs, each (micro_batch, seq_len) int64 (document_mask); ValueError if the data
        has no document boundaries."""
        ...

    def target_tokens(self, step: int, sequences: int) -> int:
        """Targets of the `sequences` sequences of step `step` (its global batch) that count
        in its loss (not IGNORE_INDEX)."""
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

    def eval_loss(
        self,
        inputs: torch.Tensor,
        targets: torch.Tensor,
        documents: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> float:
        """Mean next-token loss of (B, S) inputs and targets, without training; `documents`
        (positions, segments) as Batches.documents gives them, under document_mask."""
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
