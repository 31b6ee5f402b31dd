"""`wstrain report` of a ranged job: its budgets are the point it ran at (the plan's, else
the spec's chosen point), never the range's mapping.

    pytest tests/cli/test_report_ranges.py
"""

from __future__ import annotations

from wstrain.cli.report import _budget_point


def test_the_report_reads_the_point_a_ranged_job_ran_at() -> None:
    budget = {"device_gib": {"min": 1.0, "max": 40.0}, "host_gib": 2.0}
    chosen = {**budget, "chosen": {"device_gib": 16.0, "host_gib": 2.0}}
    planned = {"device_gib": 12.0, "host_gib": 2.0}
    assert _budget_point({"spec": {"budget": chosen}, "plan": planned}) == planned
    assert _budget_point({"spec": {"budget": chosen}, "plan": {}}) == chosen["chosen"]
    assert _budget_point({"spec": {"budget": budget}}) == {"device_gib": 40.0, "host_gib": 2.0}
    fixed = {"device_gib": 1.0, "host_gib": 2.0}
    assert _budget_point({"spec": {"budget": fixed}, "plan": {"runtime": "resident"}}) == fixed
