"""A ranged job end to end, on real Redis, a real API, agent and worker: the agent's policy
chooses the point of its range at the start, the job's record and its `budget` event say
which, and the worker trains under that point's plan (agent/scheduling.py,
store/scheduling.py choose_budget). A ranged job whose worker runs out of its host budget
(the worker's arena short by what a plan that under-counted would leave,
worker/build.py's fault setting) is re-planned higher in its range and resumed, and ends
with the weights of a run that never ran out (agent/outcomes.py out_of_memory); one whose
range cannot hold it fails naming the budget that would.

    pytest -m slow tests/e2e/test_ranged_jobs.py
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import Stack, make_stack, tiny_spec, wait_terminal
from tests.helpers.jobs import assert_same_weights
from wstrain.contracts.calibration import GIB, host_reserve_bytes
from wstrain.contracts.model_dims import PRESETS
from wstrain.worker.build import FAULT_HOST_SHORTFALL_ENV

pytestmark = pytest.mark.slow

RANGED = {"device_gib": {"min": 1, "max": 40}, "host_gib": 2}


def test_a_ranged_job_runs_at_the_point_the_policy_chose(stack: Stack) -> None:
    with stack.client() as c:
        r = c.post("/v1/jobs", json=tiny_spec("ranged-e2e", budget=RANGED, steps=4))
        assert r.status_code == 201, r.text
        job_id = r.json()["id"]
        job = wait_terminal(c, job_id)
        events = c.get(f"/v1/jobs/{job_id}/events", params={"limit": 1000}).json()
    assert job["state"] == "succeeded", job
    chosen = [e["data"] for e in events if e["kind"] == "budget"]
    assert len(chosen) == 1, events
    point = (chosen[0]["device_gib"], chosen[0]["host_gib"])
    assert 1 <= point[0] <= 40 and point[1] == 2 and chosen[0]["tokens_per_s"] > 0
    budget = job["spec"]["budget"]
    assert budget["device_gib"] == {"min": 1.0, "max": 40.0}
    assert (budget["chosen"]["device_gib"], budget["chosen"]["host_gib"]) == point
    assert (job["plan"]["device_gib"], job["plan"]["host_gib"]) == point  # as it trained


def test_a_job_out_of_its_host_budget_is_replanned_in_its_range_and_resumed(
    redis_url: str, tmp_path: Path
) -> None:
    """Host range 1-3 GiB (points 1, 1.5, ... 3): the policy starts it at its min, where the
    fault leaves its arena 64 KiB, under the ~0.5 MiB micro-llama's state takes; the worker
    exits out of memory naming 1.5 GiB, and the agent requeues it from there, a retry."""
    reserve = host_reserve_bytes(PRESETS["micro-llama"].params, "fp32", "cpu")
    shortfall = int(1 * GIB - reserve - 64 * 1024)  # 64 KiB of arena left at 1 GiB of host
    stack = make_stack(
        redis_url,
        tmp_path,
        "oom-replan",
        with_agent=True,
        extra_env={FAULT_HOST_SHORTFALL_ENV: str(shortfall)},
    )
    ranged = {"device_gib": 1, "host_gib": {"min": 1, "max": 3}}
    try:
        with stack.client() as c:
            straight = c.post("/v1/jobs", json=tiny_spec("straight", steps=8)).json()
            job = c.post("/v1/jobs", json=tiny_spec("oom", budget=ranged, steps=8)).json()
            narrow = {"device_gib": 1, "host_gib": {"min": 1, "max": 1.25}}
            stuck = c.post("/v1/jobs", json=tiny_spec("stuck", budget=narrow, steps=8)).json()
            done, failed = wait_terminal(c, job["id"]), wait_terminal(c, stuck["id"])
            events = c.get(f"/v1/jobs/{job['id']}/events", params={"limit": 1000}).json()
            assert done["state"] == "succeeded", done
            assert done["retries"] == 1 and done["attempt"] == 2, done
            chosen = [
                (e["data"]["device_gib"], e["data"]["host_gib"])
                for e in events
                if e["kind"] == "budget"
            ]
            assert chosen == [(1, 1), (1, 1.5)], chosen  # its min, then the floor it measured
            replan = [e["message"] for e in events if "re-planned in its range" in e["message"]]
            assert replan and "needs at least host 1.5 GiB" in replan[0], replan
            assert done["plan"]["host_gib"] == 1.5  # the plan it finished under
            assert_same_weights(done, wait_terminal(c, straight["id"]))
            # 1-1.25 GiB holds no point of 1.5: failed, naming the budget that fits
            assert failed["state"] == "failed" and failed["retries"] == 0, failed
            assert "budget.host_gib" in failed["error"] and "1.5" in failed["error"], failed
    finally:
        stack.stop()
