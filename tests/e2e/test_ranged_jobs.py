"""A ranged job end to end, on real Redis, a real API, agent and worker: the agent's policy
chooses the point of its range at the start, the job's record and its `budget` event say
which, and the worker trains under that point's plan (agent/scheduling.py,
store/scheduling.py choose_budget).

    pytest -m slow tests/e2e/test_ranged_jobs.py
"""

from __future__ import annotations

import pytest

from tests.conftest import Stack, tiny_spec, wait_terminal

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
