"""The worker enforces the budget its plan was made for: a ranged job's spec.json keeps its
range and chosen point, and the attempt runs at the plan's point (worker/main.py).

    pytest tests/worker/test_budget_point.py
"""

from __future__ import annotations

from pathlib import Path

from tests.conftest import REPO, tiny_spec
from tests.worker.launch import write_job
from wstrain.contracts.access import DataAccess
from wstrain.contracts.hardware import DEFAULT_PROFILE
from wstrain.contracts.model_dims import resolve_dims
from wstrain.contracts.spec import JobSpec
from wstrain.planning.planner import make_plan
from wstrain.worker.main import Worker


def test_the_worker_runs_at_the_plans_point_of_a_range(tmp_path: Path) -> None:
    budget = {"device_gib": {"min": 0.5, "max": 4}, "host_gib": {"min": 1, "max": 4}}
    spec = JobSpec.model_validate(tiny_spec("ranged", budget=budget)).choosing(4, 4)
    plan = make_plan(spec.at_budget(1, 2), resolve_dims(spec.model), DEFAULT_PROFILE)
    job_dir = write_job(tmp_path, spec, plan)
    worker = Worker(job_dir, DataAccess.of([REPO, tmp_path], None))
    assert (worker.spec.budget.device_gib, worker.spec.budget.host_gib) == (1.0, 2.0)
    assert not worker.spec.budget.ranged
