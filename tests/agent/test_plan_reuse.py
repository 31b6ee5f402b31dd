"""A job launches with the plan it was admitted with (planning/planner.py launch_plan): on a
CPU node the agent's inputs to the planner are the API's, so the plan it writes at the
`running` transition carries the submitted plan's inputs digest and equals it; launch_plan
then hands the stored plan back without a second make_plan (tests/planning/
test_derived_once.py counts the calls). Real Redis, real uvicorn, a real agent and worker.

    pytest tests/agent/test_plan_reuse.py
"""

from __future__ import annotations

import json

import pytest

from tests.conftest import Stack, tiny_spec, wait_terminal
from wstrain.contracts.jobs import job_dir

pytestmark = pytest.mark.slow


def test_a_cpu_job_runs_with_the_plan_it_was_submitted_with(stack: Stack) -> None:
    with stack.client() as c:
        r = c.post("/v1/jobs", json=tiny_spec("plan-reuse", steps=2))
        assert r.status_code == 201, r.text
        jid, submitted = r.json()["id"], r.json()["plan"]  # as the API planned it
        done = wait_terminal(c, jid)
        assert done["state"] == "succeeded", done["error"]
        launched = c.get(f"/v1/jobs/{jid}/plan").json()
    assert submitted["inputs_digest"]
    assert launched == submitted
    # the plan the worker ran: the agent's plan.json in the job's directory
    written = json.loads((job_dir(stack.state_dir, jid) / "plan.json").read_text())
    assert written == submitted
