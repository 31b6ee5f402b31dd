"""AdamW with decoupled weight decay, linear warm-up and cosine decay, as a JobSpec's
`optimizer` describes it. The LR multiplier is a pure function of the step so every runtime
(and a resumed run) uses the same schedule.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from wstrain.contracts.spec import OptimizerSpec


def lr_multiplier(step: int, spec: OptimizerSpec, total_steps: int) -> float:
    """Multiplier of spec.lr for 0-based optimizer step `step`."""
    if spec.warmup_steps and step < spec.warmup_steps:
        return (step + 1) / spec.warmup_steps
    if spec.schedule == "constant":
        return 1.0
    decay_steps = max(1, total_steps - spec.warmup_steps)
    progress = min(1.0, (step - spec.warmup_steps) / decay_steps)
    cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
    return spec.min_lr_ratio + (1.0 - spec.min_lr_ratio) * cosine


def learning_rate(step: int, spec: OptimizerSpec, total_steps: int) -> float:
    return spec.lr * lr_multiplier(step, spec, total_steps)


def clip_coefficient(grad_norm: float, spec: OptimizerSpec) -> float:
    """The factor global-norm clipping scales gradients by (1.0: no clipping), as
    torch.nn.utils.clip_grad_norm_ computes it."""
    if spec.grad_clip is None:
        return 1.0
    return min(1.0, spec.grad_clip / (grad_norm + 1e-6))


@dataclass(frozen=True)
class StepUpdate:
    """One optimizer step's schedule and clipping, fixed once its gradients are complete;
    the host and device AdamW apply it group by group."""

    step: int  # 0-based optimizer step whose gradients are in the host tiles
    lr: float
    clip_coef: float  # global-norm clipping factor (1.0: none)

    @classmethod
    def of(cls, step: int, grad_norm: float, spec: OptimizerSpec, total_steps: int) -> StepUpdate:
        return cls(step, learning_rate(step, spec, total_steps), clip_coefficient(grad_norm, spec))


def make_adamw(
    params: Iterable[torch.nn.Parameter], spec: OptimizerSpec, total_steps: int, fused: bool = False
) -> tuple[torch.optim.AdamW, torch.optim.lr_scheduler.LambdaLR]:
    opt = torch.optim.AdamW(
        params,
        lr=spec.lr,
        betas=spec.betas,
        eps=spec.eps,
        weight_decay=spec.weight_decay,
        fused=fused or None,
    )
    schedule = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda step: lr_multiplier(step, spec, total_steps)
    )
    return opt, schedule


NORM_CHUNK_ELEMS = 1 << 24  # fp32 elements cast at a time: 64 MiB


def sq_norm_fp32(t: torch.Tensor) -> torch.Tensor:
    """Squared L2 norm accumulated in fp32, as a 0-d tensor on t's device, casting at most
    NORM_CHUNK_ELEMS elements at a time: a bf16 Llama-3 embedding gradient cast whole would
    be a 2 GiB transient no memory model counts."""
    total = torch.zeros((), device=t.device, dtype=torch.float32)
    for part in t.reshape(-1).split(NORM_CHUNK_ELEMS):
        total += torch.linalg.vector_norm(part, dtype=torch.float32).square()
    return total
