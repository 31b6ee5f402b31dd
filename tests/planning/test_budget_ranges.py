"""A ranged budget planned at one point: make_plan plans the fixed budget of the spec's
chosen point (its max until one is chosen) and records it on the plan; a spec resolved
at a point plans exactly as the fixed budget there (same digest), so the agent launches
the submitted plan; the worker's spec is the plan's point.

    pytest tests/planning/test_budget_ranges.py
"""

from __future__ import annotations

from tests.conftest import tiny_spec
from wstrain.contracts.hardware import DEFAULT_PROFILE
from wstrain.contracts.model_dims import resolve_dims
from wstrain.contracts.plan import at_plan_budget
from wstrain.contracts.spec import JobSpec
from wstrain.planning.planner import launch_plan, make_plan

RANGED = {"device_gib": {"min": 0.5, "max": 2}, "host_gib": {"min": 1, "max": 4}}


def _spec(budget: dict[str, object]) -> JobSpec:
    return JobSpec.model_validate(tiny_spec("ranged", budget=budget))


def test_a_ranged_plan_records_its_chosen_point() -> None:
    spec = _spec(RANGED)
    dims = resolve_dims(spec.model)
    unchosen = make_plan(spec, dims, DEFAULT_PROFILE)
    assert (unchosen.device_gib, unchosen.host_gib) == (2.0, 4.0)  # the max before a choice
    chosen = spec.choosing(1.5, 3)
    plan = make_plan(chosen, dims, DEFAULT_PROFILE)
    assert (plan.device_gib, plan.host_gib) == (1.5, 3.0)
    fixed = make_plan(spec.at_budget(1.5, 3), dims, DEFAULT_PROFILE)
    assert plan == fixed  # the same inputs, the same plan and digest
    assert launch_plan(plan, chosen, dims, DEFAULT_PROFILE) is plan  # not planned again


def test_a_fixed_plan_records_its_budget_and_the_worker_enforces_the_plans_point() -> None:
    spec = _spec({"device_gib": 1, "host_gib": 2})
    plan = make_plan(spec, resolve_dims(spec.model), DEFAULT_PROFILE)
    assert (plan.device_gib, plan.host_gib) == (1.0, 2.0)
    assert at_plan_budget(spec, plan) == spec
    ranged = _spec(RANGED).choosing(2, 4)  # the spec says 2, the plan was made at 1
    at = at_plan_budget(
        ranged, make_plan(ranged.at_budget(1, 4), resolve_dims(spec.model), DEFAULT_PROFILE)
    )
    assert (at.budget.device_gib, at.budget.host_gib, at.budget.ranged) == (1.0, 4.0, False)
