"""A worker that runs out of a memory budget (worker/budget_exits.py): it exits 5 (not a
crash to retry) and names the budget that fits; a real worker whose host arena is refused a
tile, run again at the budget it named, trains."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import tiny_spec
from tests.worker import forked
from tests.worker.launch import worker_argv, write_job
from wstrain.contracts.calibration import GIB, host_reserve_bytes
from wstrain.contracts.errors import BudgetExceeded
from wstrain.contracts.hardware import DEFAULT_PROFILE
from wstrain.contracts.jobs import WorkerExit, WorkerMessage
from wstrain.contracts.model_dims import resolve_dims
from wstrain.contracts.spec import JobSpec
from wstrain.planning.planner import make_plan
from wstrain.worker.budget_exits import device_needs, host_needs, refused_bytes

CUDA_TEXT = (
    "CUDA out of memory. Tried to allocate 2.50 GiB. GPU 0 has a total capacity of 79.19 GiB "
    "of which 1.20 GiB is free."
)


def test_the_refused_allocation_is_read_from_cudas_message() -> None:
    assert refused_bytes(CUDA_TEXT) == int(2.5 * GIB)
    assert refused_bytes("Tried to allocate 512.00 MiB") == 512 << 20
    assert refused_bytes("out of memory") == 0


def test_a_device_budget_that_fits_is_what_was_held_and_asked_rounded_up() -> None:
    text, needs = device_needs(CUDA_TEXT, int(11.2 * GIB), 12)
    assert needs == {"device_gib": 14.0}  # 11.2 + 2.5 = 13.7 -> 14
    assert "budget.device_gib to 14" in text and "device budget of 12 GiB" in text
    _, needs = device_needs("out of memory", int(11.9 * GIB), 12)
    assert needs == {"device_gib": 12.5}  # never the budget it ran out of


def test_a_host_budget_that_fits_covers_the_refused_tile() -> None:
    exc = BudgetExceeded(
        "tile refused.", arena_bytes=3 * GIB, tile_bytes=2 * GIB, limit_bytes=4 * GIB
    )
    text, needs = host_needs(exc, 6)
    assert needs == {"host_gib": 7.0}  # 1 GiB short of 6
    assert "budget.host_gib to 7" in text


def _at_host(spec: JobSpec, host_gib: float) -> JobSpec:
    return JobSpec.model_validate(
        {**spec.model_dump(), "budget": {"device_gib": 1, "host_gib": host_gib}}
    )


def _run(tmp_path: Path, spec: JobSpec, plan_spec: JobSpec) -> tuple[int, list[WorkerMessage]]:
    """The worker of `spec` under the plan made for `plan_spec`, recorded at `spec`'s
    budget (the worker enforces the point its plan records)."""
    plan = make_plan(plan_spec, resolve_dims(plan_spec.model), DEFAULT_PROFILE)
    plan = plan.model_copy(
        update={"device_gib": spec.budget.device_gib, "host_gib": spec.budget.host_gib}
    )
    job_dir = write_job(tmp_path, spec, plan)
    code, out, _ = forked.run(worker_argv(job_dir), job_dir / "worker.log", 120)
    return code, [WorkerMessage.model_validate_json(x) for x in out.splitlines()]


def test_a_worker_refused_a_host_tile_exits_5_naming_a_budget_that_trains(
    tmp_path: Path,
) -> None:
    """The plan is made at 2 GiB of host; the worker is given 4 KiB past its reserve (as a
    plan that under-counted would leave it)."""
    planned = JobSpec.model_validate(
        tiny_spec("oom", steps=2, overrides={"runtime": "working_set"})
    )
    reserve = host_reserve_bytes(resolve_dims(planned.model).params, "fp32", "cpu")
    starved = _at_host(planned, (reserve + 4096) / GIB)
    code, msgs = _run(tmp_path / "starved", starved, planned)
    assert code == WorkerExit.out_of_memory
    error = next(m for m in msgs if m.kind == "error")
    needs = error.needs_gib["host_gib"]
    assert needs > starved.budget.host_gib and "budget.host_gib" in (error.message or "")
    fits = _at_host(planned, needs)
    code, msgs = _run(tmp_path / "fits", fits, planned)
    assert code == WorkerExit.succeeded and msgs[-1].kind in ("step", "checkpoint", "log")
