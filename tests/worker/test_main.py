"""Budgets change speed, never the result: one fp32 job built by the worker (build_runtime,
TokenStream) under four plans — resident and working set, 1 to 8 rounds, micro-batches of 1
to 8, every saved-activation level, the device or split optimizer — trains the same
sequences at each step and computes the same loss at each of 20 steps and the same final
weights, to 1e-5 relative.

    pytest tests/worker/test_main.py
"""

from __future__ import annotations

from typing import Any

import torch

from tests.conftest import tiny_spec
from wstrain.scheduler.contracts.hardware import DEFAULT_PROFILE
from wstrain.scheduler.contracts.jobs import JobSpec
from wstrain.scheduler.contracts.model_dims import resolve_dims
from wstrain.scheduler.planning.planner import make_plan
from wstrain.worker.io.data import TokenStream
from wstrain.worker.main import build_runtime

STEPS = 20
PLANS: dict[str, dict[str, Any]] = {
    "resident, 1 round of 8": {"runtime": "resident", "micro_batch": 8},
    "resident, 4 rounds of 2": {"runtime": "resident", "micro_batch": 2},
    "working set, 2 rounds of 4, recompute all": {
        "runtime": "working_set",
        "micro_batch": 4,
        "window": 0,
        "level": 0,
    },
    "working set, 8 rounds of 1, keep all, split AdamW": {
        "runtime": "working_set",
        "micro_batch": 1,
        "window": 2,
        "level": 3,
        "optimizer": "split",
    },
}


def _train(overrides: dict[str, Any]) -> tuple[list[float], dict[str, torch.Tensor], str]:
    spec = JobSpec.model_validate(
        tiny_spec(
            "same-result",
            global_batch=8,
            steps=STEPS,
            optimizer={"lr": 3e-3, "warmup_steps": 3, "grad_clip": 0.5},
            overrides={**overrides, "device": "cpu"},
        )
    )
    dims = resolve_dims(spec.model)
    plan = make_plan(spec, dims, DEFAULT_PROFILE)
    assert (plan.runtime, plan.micro_batch) == (overrides["runtime"], overrides["micro_batch"])
    data = TokenStream.open(spec.data, dims.vocab_size, spec.seq_len, spec.seed, global_batch=8)
    runtime = build_runtime(spec, plan)
    losses = [runtime.train_step(data, step).loss for step in range(STEPS)]
    weights = {k: v.detach().clone() for k, v in runtime.state_tensors().items()}
    runtime.finish()
    return losses, weights, f"{plan.runtime} mb={plan.micro_batch} rounds={plan.rounds}"


def test_every_plan_trains_the_same_losses_and_weights() -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one summation order inside each matmul, as the worker runs
    try:
        runs = {name: _train(over) for name, over in PLANS.items()}
    finally:
        torch.set_num_threads(threads)
    base_losses, base_weights, _ = runs.pop("resident, 1 round of 8")
    assert base_losses[-1] < base_losses[0]  # it learns, so the weights move
    for name, (losses, weights, plan) in runs.items():
        for step, (a, b) in enumerate(zip(losses, base_losses)):
            assert abs(a - b) <= 1e-5 * abs(b), f"{name} ({plan}) step {step}: {a} vs {b}"
        assert weights.keys() == base_weights.keys()
        for k, w in weights.items():
            ref = base_weights[k]
            err = ((w - ref).norm() / ref.norm()).item()
            assert err <= 1e-5, f"{name} ({plan}): {k} differs by {err:.2e} relative"
