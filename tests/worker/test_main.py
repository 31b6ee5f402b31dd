"""Budgets change speed, never the result: one fp32 job built by the worker (build_runtime,
TokenStream) under five plans — resident and working set, 1 to 8 rounds, micro-batches of 1
to 8, every saved-activation level, the device or split optimizer, the cross-round
overlap — trains the same
sequences at each step and computes the same loss at each of 20 steps and the same final
weights, to 1e-5 relative; in bf16 within the tolerance BF16_REL states; and with targets
ignored unevenly across the micro-batches, the same again (the loss is a mean over the
global batch's targets, not of micro-batch means). And the worker process's MFU: none on
CPU unless the agent passes a peak, the chip table's peak on a known GPU, the measured one
on an unknown GPU.

    pytest tests/worker/test_main.py
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.conftest import CORPUS, tiny_spec
from tests.worker import forked
from tests.worker.launch import worker_argv, write_job
from wstrain.contracts.chips import peak_flops
from wstrain.contracts.hardware import DEFAULT_PROFILE
from wstrain.contracts.jobs import WorkerMessage
from wstrain.contracts.model_dims import resolve_dims
from wstrain.contracts.spec import JobSpec
from wstrain.planning.planner import make_plan
from wstrain.worker.build import build_runtime, mfu_peak
from wstrain.worker.io.data import TokenStream
from wstrain.worker.runtime.base import IGNORE_INDEX

STEPS = 20
WS_4_2 = {"runtime": "working_set", "micro_batch": 2, "window": 1, "level": 1}
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
    "working set, 4 rounds of 2, cross-round overlap": {
        "runtime": "working_set",
        "micro_batch": 2,
        "window": 1,
        "overlap": True,
    },
}


class IgnoringSome:
    """The job's token stream with the targets after every token id divisible by 3 ignored:
    a different count in every sequence, so micro-batches hold unequal numbers of targets."""

    def __init__(self, inner: TokenStream) -> None:
        self.inner, self.seq_len = inner, inner.seq_len

    def batch(
        self, step: int, round_idx: int, micro_batch: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        inputs, targets = self.inner.batch(step, round_idx, micro_batch)
        return inputs, targets.masked_fill(inputs % 3 == 0, IGNORE_INDEX)

    def target_tokens(self, step: int, sequences: int) -> int:
        _, targets = self.batch(step, 0, sequences)  # the whole global batch at once
        return int((targets != IGNORE_INDEX).sum())


def _train(
    overrides: dict[str, Any],
    precision: str = "fp32",
    ignore: bool = False,
    steps: int = STEPS,
    **spec_fields: Any,
) -> tuple[list[float], dict[str, torch.Tensor], str]:
    spec = JobSpec.model_validate(
        tiny_spec(
            "same-result",
            global_batch=8,
            steps=steps,
            precision=precision,
            optimizer={"lr": 3e-3, "warmup_steps": 3, "grad_clip": 0.5},
            overrides={**overrides, "device": "cpu"},
            **spec_fields,
        )
    )
    dims = resolve_dims(spec.model)
    plan = make_plan(spec, dims, DEFAULT_PROFILE)
    assert (plan.runtime, plan.micro_batch) == (overrides["runtime"], overrides["micro_batch"])
    data: Any = TokenStream.open(
        spec.data, dims.vocab_size, spec.seq_len, spec.seed, global_batch=8
    )
    if ignore:
        data = IgnoringSome(data)
    runtime = build_runtime(spec, plan)
    losses = [runtime.train_step(data, step).loss for step in range(steps)]
    runtime.finish()
    weights = {k: v.detach().float().clone() for k, v in runtime.state_tensors().items()}
    return losses, weights, f"{plan.runtime} mb={plan.micro_batch} rounds={plan.rounds}"


def _compare(
    precision: str = "fp32",
    ignore: bool = False,
    steps: int = STEPS,
    plans: dict[str, dict[str, Any]] = PLANS,
    **spec_fields: Any,
) -> dict[str, tuple[float, float]]:
    """Each plan against the first: (largest relative loss difference over the steps,
    largest relative weight difference over the tensors)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one summation order inside each matmul, as the worker runs
    try:
        runs = {
            name: _train(over, precision, ignore, steps, **spec_fields)
            for name, over in plans.items()
        }
    finally:
        torch.set_num_threads(threads)
    base_losses, base_weights, _ = runs.pop("resident, 1 round of 8")
    assert base_losses[-1] < base_losses[0]  # it learns, so the weights move
    out = {}
    for name, (losses, weights, plan) in runs.items():
        assert weights.keys() == base_weights.keys()
        loss_err = max(abs(a - b) / abs(b) for a, b in zip(losses, base_losses))
        weight_err = max(
            ((w - base_weights[k]).norm() / base_weights[k].norm()).item()
            for k, w in weights.items()
        )
        out[f"{name} ({plan})"] = (loss_err, weight_err)
    return out


def test_every_plan_trains_the_same_losses_and_weights() -> None:
    for plan, (loss_err, weight_err) in _compare().items():
        assert loss_err <= 1e-5, f"{plan}: a step's loss differs by {loss_err:.2e} relative"
        assert weight_err <= 1e-5, f"{plan}: the weights differ by {weight_err:.2e} relative"


def test_ignored_targets_weigh_the_same_under_every_plan() -> None:
    for plan, (loss_err, weight_err) in _compare(ignore=True, steps=8).items():
        assert loss_err <= 1e-5, f"{plan}: a step's loss differs by {loss_err:.2e} relative"
        assert weight_err <= 1e-5, f"{plan}: the weights differ by {weight_err:.2e} relative"


def test_document_masks_train_the_same_under_every_plan(tmp_path: Path) -> None:
    """JSONL documents of 5 to 60 bytes: most sequences of 32 hold several."""
    docs = CORPUS.read_text().split()
    lines = [" ".join(docs[i : i + 1 + i % 12]) for i in range(0, 3000, 7)]
    path = tmp_path / "docs.jsonl"
    path.write_text("".join(json.dumps({"text": line}) + "\n" for line in lines))
    data = {"kind": "text", "path": str(path)}
    # + long context's pieces: 32 tokens in pieces of 12, documents across their edges
    pieces = {"working set, 4 rounds of 2, pieces of 12": {**WS_4_2, "seq_chunk": 12}}
    plans = {**PLANS, **pieces}
    compared = _compare(steps=8, plans=plans, data=data, document_mask=True)
    for plan, (loss_err, weight_err) in compared.items():
        assert loss_err <= 1e-5, f"{plan}: a step's loss differs by {loss_err:.2e} relative"
        # The gradients agree to 2e-7 relative as without the mask, but the mask leaves a
        # few elements with gradients near AdamW's eps (1e-8), where lr * g / (|g| + eps)
        # turns a 1e-10 rounding into a move of ~1% of lr: 1.3e-5 of o_proj's norm measured
        assert weight_err <= 1e-4, f"{plan}: the weights differ by {weight_err:.2e} relative"


def test_the_moe_load_balancing_term_is_the_same_under_every_plan() -> None:
    """OLMoE-shaped, router_aux_loss_coef 0.01: the term is a mean over the step's
    sequences of each one's load-balancing loss, so micro-batches do not change it. (The
    cross-round overlap runs dense models only: the planner refuses it here.)"""
    model = {"preset": "tiny-olmoe"}
    plans = {name: p for name, p in PLANS.items() if not p.get("overlap")}
    for plan, (loss_err, weight_err) in _compare(steps=6, plans=plans, model=model).items():
        assert loss_err <= 1e-5, f"{plan}: a step's loss differs by {loss_err:.2e} relative"
        assert weight_err <= 1e-5, f"{plan}: the weights differ by {weight_err:.2e} relative"


# bf16 keeps 8 significant bits: one rounding is up to 2^-9 = 0.2% relative. The plans add
# their micro-batches' gradients in another order and round them to bf16 at other points
# (the resident runtime accumulates in the bf16 .grad, the working set in fp32 tiles), so
# after 20 AdamW steps, each moving a weight by about lr = 3e-3, the weights may differ by a
# few bf16 roundings and the loss by as much: 2% relative bounds both with room, and is an
# order of magnitude below what a different data order gives (the first loss alone drops
# ~5% over these steps).
BF16_REL = 2e-2


def test_every_plan_trains_the_same_in_bf16_within_its_rounding() -> None:
    for plan, (loss_err, weight_err) in _compare("bf16").items():
        assert loss_err <= BF16_REL, f"{plan}: a step's loss differs by {loss_err:.2e} relative"
        assert weight_err <= BF16_REL, f"{plan}: the weights differ by {weight_err:.2e} relative"


def _run_worker(
    tmp_path: Path, *extra: str, device: str = "cpu", precision: str = "fp32"
) -> list[WorkerMessage]:
    """The reports of a 3-step job (fp32 on the CPU unless told) run by the worker
    (`python -m wstrain.worker.main`, forked from the test zygote: tests/worker/forked.py)."""
    spec = JobSpec.model_validate(
        tiny_spec(
            "mfu",
            steps=3,
            precision=precision,
            overrides={"runtime": "resident", "device": device},
            # the planner's GPU reserve (cuDNN, allocator slack) wants more than a CPU job
            **({"budget": {"device_gib": 8, "host_gib": 16}} if device == "cuda" else {}),
        )
    )
    plan = make_plan(spec, resolve_dims(spec.model), DEFAULT_PROFILE)
    job_dir = write_job(tmp_path, spec, plan)
    code, out, err = forked.run(worker_argv(job_dir, *extra), job_dir / "worker.log", 120)
    assert code == 0, err[-2000:]
    return [WorkerMessage.model_validate_json(line) for line in out.splitlines()]


def test_a_cpu_job_reports_no_mfu_unless_given_a_peak(tmp_path: Path) -> None:
    spec = JobSpec.model_validate(tiny_spec("mfu"))
    flops_per_token = resolve_dims(spec.model).flops_per_token(spec.seq_len)
    for extra, peak in (((), None), (("--cpu-peak-flops", "1e12"), 1e12)):
        msgs = _run_worker(tmp_path / str(peak), *extra)
        started = next(m for m in msgs if m.kind == "started")
        assert started.flops_per_token == pytest.approx(flops_per_token, rel=1e-12)
        assert started.precision == "fp32"
        assert started.peak_flops == peak
        assert started.peak_source == (None if peak is None else "configured")
        steps = [m for m in msgs if m.kind == "step"]
        assert steps and steps[-1].step == 3
        for m in steps:
            assert m.tokens_per_s is not None and m.tokens_per_s > 0
            if peak is None:
                assert m.mfu is None
            else:
                assert m.mfu == pytest.approx(flops_per_token * m.tokens_per_s / peak, rel=1e-9)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_gpu_job_reports_mfu_against_its_chip(tmp_path: Path) -> None:
    """On a lent H100/H200: the chip table's bf16 peak, by torch's device name."""
    msgs = _run_worker(tmp_path, device="cuda", precision="bf16")
    started = next(m for m in msgs if m.kind == "started")
    expected = peak_flops(torch.cuda.get_device_name(), "bf16")
    assert expected is not None, f"{torch.cuda.get_device_name()} is not in the chip table"
    assert (started.peak_flops, started.peak_source) == expected
    assert started.precision == "bf16" and started.flops_per_token
    steps = [m for m in msgs if m.kind == "step"]
    assert steps
    for m in steps:
        assert m.tokens_per_s and m.mfu == pytest.approx(
            started.flops_per_token * m.tokens_per_s / expected[0], rel=1e-9
        )


def test_the_mfu_peak_by_device() -> None:
    # a known GPU: the chip table, whatever was measured
    assert mfu_peak("NVIDIA H200", "bf16", 6e14) == (989.4e12, "H200")
    assert mfu_peak("NVIDIA H100 PCIe", "fp32") == (51.2e12, "H100 PCIe")
    # an unknown GPU: the measured bf16 GEMM rate, for bf16 compute only
    assert mfu_peak("NVIDIA GeForce RTX 4090", "bf16", 1.6e14) == (1.6e14, "measured")
    assert mfu_peak("NVIDIA GeForce RTX 4090", "fp32", 1.6e14) is None
    assert mfu_peak("NVIDIA GeForce RTX 4090", "bf16") is None
    # CPU: only a configured peak
    assert mfu_peak(None, "fp32") is None
    assert mfu_peak(None, "fp32", 6e14, 0.0) is None
    assert mfu_peak(None, "bf16", None, 2e12) == (2e12, "configured")
