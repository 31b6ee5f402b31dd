"""The scheduling policy's Done-when, through bench/queue_sim.py: a 24-hour trace of 332
jobs from 4 owners on a modelled 8 × 141 GiB node replayed through the real `policy.decide`
on a virtual clock (a few seconds). Definitions in bench/queue_sim.py's docstring; the
figures are in bench/RESULTS.md.

    pytest tests/policy/test_simulation.py
"""

from __future__ import annotations

from typing import Any

import pytest

from bench.queue_sim import OWNERS, QUOTAS, simulate
from wstrain.contracts.calibration import GIB


@pytest.fixture(scope="module")
def rows() -> dict[str, dict[str, Any]]:
    return {r["row"]: r for r in simulate()}


def test_the_trace_is_a_day_of_at_least_200_jobs_from_4_owners(
    rows: dict[str, dict[str, Any]],
) -> None:
    jobs = [r for name, r in rows.items() if name.startswith("job:")]
    assert len(jobs) >= 200
    assert {j["owner"] for j in jobs} == set(OWNERS) and len(OWNERS) == 4
    assert max(j["submit_s"] for j in jobs) <= 86400
    assert {j["device_gib"] for j in jobs} >= {12, 20, 40, 80, 141}
    assert any(j["exclusive"] for j in jobs) and any(j["priority"] > 0 for j in jobs)
    assert rows["packed"]["preemptions"] > 0 and rows["packed"]["sim_wall_s"] < 60


def test_each_owner_gets_its_fair_share_within_10_percent_once_all_are_backlogged(
    rows: dict[str, dict[str, Any]],
) -> None:
    assert rows["packed"]["backlogged_window_h"] >= 20  # most of the day, not a moment
    for owner in OWNERS:
        row = rows[f"owner:{owner}"]
        assert row["fair_share"] == 0.25
        assert abs(row["delivered_share"] - row["fair_share"]) <= 0.10 * row["fair_share"], row


def test_no_job_waits_past_its_reason(rows: dict[str, dict[str, Any]]) -> None:
    for run in ("packed", "whole-gpu"):
        assert rows[run]["violations"] == 0, rows[run]["violation_samples"]
        assert rows[run]["rounds"] > 500
    kinds = rows["packed"]["reason_rounds"]
    assert {"quota", "dependency", "back-off", "resources", "priority", "preemption"} <= set(kinds)
    # the job crashing past its retries and the cancelled one leave their dependents failed
    assert rows["packed"]["failed"] == 3 and rows["packed"]["cancelled"] == 1


def test_quotas_are_never_exceeded(rows: dict[str, dict[str, Any]]) -> None:
    for owner, quota in QUOTAS.items():
        row = rows[f"owner:{owner}"]
        assert quota.max_jobs is not None and row["peak_jobs"] <= quota.max_jobs
        assert quota.max_device_bytes is not None
        assert row["peak_device_gib"] * GIB <= quota.max_device_bytes
        assert quota.max_host_bytes is not None
        assert row["peak_host_gib"] * GIB <= quota.max_host_bytes
    assert rows["packed"]["reason_rounds"]["quota"] > 0  # it bound


def test_packing_uses_at_least_one_and_a_half_times_the_whole_gpu_slots(
    rows: dict[str, dict[str, Any]],
) -> None:
    assert rows["whole-gpu"]["mean_jobs_running_24h"] <= 8.0
    assert rows["packed"]["packing_vs_whole_gpu"] >= 1.5
