"""Resident planner invariants over many random specs (the autoconfigurator issue adds the
working-set ones)."""

from __future__ import annotations

from pathlib import Path

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from wstrain.contracts.calibration import GIB
from wstrain.contracts.errors import InfeasibleBudget
from wstrain.contracts.hardware import DEFAULT_PROFILE
from wstrain.contracts.model_dims import PRESETS
from wstrain.contracts.spec import JobSpec
from wstrain.planning.planner import make_plan


def _spec(preset: str, seq: int, batch: int, dev: float, host: float, prec: str) -> JobSpec:
    return JobSpec.model_validate(
        {
            "name": "p",
            "model": {"preset": preset},
            "data": {"kind": "synthetic"},
            "seq_len": seq,
            "global_batch": batch,
            "steps": 1,
            "precision": prec,
            "budget": {"device_gib": dev, "host_gib": host},
        }
    )


@settings(max_examples=150, deadline=None)
@given(
    preset=st.sampled_from(sorted(PRESETS)),
    seq=st.sampled_from([64, 128, 512, 1024]),
    batch=st.integers(1, 64),
    dev=st.floats(0.01, 200),
    host=st.floats(0.5, 200),
    prec=st.sampled_from(["bf16", "mixed", "fp32"]),
)
def test_plan_fits_budget_or_names_a_minimum_that_does(
    preset: str, seq: int, batch: int, dev: float, host: float, prec: str
) -> None:
    dims = PRESETS[preset]
    assume(seq <= dims.max_position_embeddings)
    spec = _spec(preset, seq, batch, dev, host, prec)
    try:
        plan = make_plan(spec, dims, DEFAULT_PROFILE)
    except InfeasibleBudget as exc:
        need = exc.detail["min_budget"]
        assert need["device_gib"] > dev or need["host_gib"] > host
        # The named minimum itself is feasible.
        ok = make_plan(
            _spec(preset, seq, batch, need["device_gib"], need["host_gib"], prec),
            dims,
            DEFAULT_PROFILE,
        )
        assert ok.predicted.peak_device_bytes <= need["device_gib"] * GIB
        return
    assert plan.predicted.peak_device_bytes <= spec.budget.device_bytes
    assert plan.predicted.peak_host_bytes <= spec.budget.host_bytes
    assert plan.micro_batch * plan.rounds == batch
    if plan.runtime == "working_set":
        ws = plan.working_set
        assert ws is not None and len(ws.levels) == dims.num_layers
        assert all(len(row) == plan.micro_batch // ws.chunk for row in ws.levels)
        assert 0 <= plan.window <= dims.num_layers and ws.r_param >= 2
    # More device budget never predicts a slower step or a smaller micro-batch. Equal plans
    # may sum their costs in another order: 1e-12 relative is that rounding, not a slowdown.
    bigger = make_plan(_spec(preset, seq, batch, dev * 2, host, prec), dims, DEFAULT_PROFILE)
    assert bigger.predicted.step_seconds <= plan.predicted.step_seconds * (1 + 1e-12)


def test_a_resumed_attempt_keeps_the_runtime_of_its_checkpoint(tmp_path: Path) -> None:
    """The two runtimes keep AdamW's state in different forms: an attempt requeued onto a
    node whose profile would pick the other runtime plans the checkpoint's instead."""
    from wstrain.agent.supervisor import resumed_runtime

    spec = _spec("micro-llama", 32, 4, 1.0, 2.0, "fp32")
    dims = PRESETS["micro-llama"]
    first = make_plan(spec, dims, DEFAULT_PROFILE)
    other = "working_set" if first.runtime == "resident" else "resident"
    job_dir = tmp_path / "job"
    assert resumed_runtime(job_dir) is None  # a first start
    job_dir.mkdir()
    last = first.model_copy(update={"runtime": other})  # what the last attempt ran
    (job_dir / "plan.json").write_text(last.model_dump_json())
    assert resumed_runtime(job_dir) is None  # the last attempt left no checkpoint
    (job_dir / "checkpoints").mkdir()
    (job_dir / "checkpoints" / "latest").write_text("step-2")
    assert resumed_runtime(job_dir) == other
    plan = make_plan(spec, dims, DEFAULT_PROFILE, resumed_runtime(job_dir))
    assert plan.runtime == other and "checkpoint" in plan.reasons["runtime"]


def test_an_fp8_jobs_window_keeps_its_sets_at_16_bits_on_the_device() -> None:
    """activation_precision "fp8" shrinks what goes home, not the window's sets, which stay
    on the device as the layer made them: pinned to one layout, the fp8 plan needs the bf16
    plan's device bytes (counting them at 8 bits overfilled a 20 GiB window on an H100)."""
    pins = {
        "runtime": "working_set", "micro_batch": 4, "window": 6, "level": 3,
        "r_param": 3, "r_grad": 2, "optimizer": "host", "lead_rounds": 1,
    }  # fmt: skip
    plans = {}
    for act in ("bf16", "fp8"):
        spec = _spec("llama3-8b-16l", 8192, 32, 40.0, 200.0, "bf16").model_copy(
            update={"activation_precision": act}
        )
        spec = JobSpec.model_validate({**spec.model_dump(), "overrides": pins})
        plans[act] = make_plan(spec, PRESETS["llama3-8b-16l"], DEFAULT_PROFILE)
    assert plans["fp8"].window == plans["bf16"].window == 6
    dev = {k: p.predicted.peak_device_bytes for k, p in plans.items()}
    assert dev["fp8"] == dev["bf16"] <= 40 * GIB
    assert plans["fp8"].predicted.peak_host_bytes < plans["bf16"].predicted.peak_host_bytes
