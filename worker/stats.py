"""What one training step reports, for every runtime (resident and working set)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class StepStats:
    loss: float
    step_seconds: float
    tokens: int
    stall_s: dict[str, float] = field(default_factory=dict)  # compute waiting, by dependency
    h2d_bytes: int = 0
    d2h_bytes: int = 0
