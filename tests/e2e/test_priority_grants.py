"""Preemption only by a class the owner holds, with real processes (API with tokens, agent,
workers) on a CPU machine whose agent models one 1.5 GiB "GPU": a job queued under bob's
grant whose grant is revoked before a scheduling round sees it waits like any class-0 job,
and alice's running job is not touched; granted again, it preempts her job at once.

    pytest -m slow tests/e2e/test_priority_grants.py
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import REPO, make_stack, tiny_spec, wait_job, wait_terminal

pytestmark = pytest.mark.slow

TOKENS = {
    "tok-alice": {"owner": "alice", "role": "user"},
    "tok-bob": {"owner": "bob", "role": "user"},
    "tok-root": {"owner": "ops", "role": "admin"},
}
# Scheduling rounds run every WSTRAIN_HEARTBEAT_S / 4 = 0.125 s in the test stack: 3 s is
# 24 rounds in which a class-10 job would have preempted (it does within 1 s once granted).
ROUNDS_WATCHED_S = 3.0


def _as(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_a_revoked_grant_does_not_preempt_and_a_held_one_does(
    redis_url: str, tmp_path: Path
) -> None:
    stack = make_stack(
        redis_url,
        tmp_path,
        "grantpreempt",
        with_agent=False,  # started below: make_stack's wait for it sends no token
        extra_env={
            "WSTRAIN_API_TOKENS": json.dumps(TOKENS),
            "WSTRAIN_CPU_DEVICES_GIB": "[1.5]",  # one 1 GiB job fits, a second does not
        },
    )
    agent = subprocess.Popen([sys.executable, "-m", "wstrain.agent.agent"], env=stack.env, cwd=REPO)
    stack.agent = agent
    grant = {"max_priority": 10, "max_jobs": 1}
    stopped = False
    try:
        # an admin's client: the waits read every owner's jobs
        with httpx.Client(base_url=stack.url, headers=_as("tok-root"), timeout=30) as c:
            deadline = time.monotonic() + 60
            while not c.get("/v1/nodes").json()["nodes"]:
                assert agent.poll() is None and time.monotonic() < deadline, "no agent"
                time.sleep(0.2)
            low = c.post("/v1/jobs", json=tiny_spec("low", steps=100000), headers=_as("tok-alice"))
            low_id = low.json()["id"]
            wait_job(c, low_id, lambda j: j["state"] == "running" and j["step"] >= 5)
            r = c.put("/v1/grants/bob", json=grant, headers=_as("tok-root"))
            assert r.status_code == 200, r.text

            # no round runs between bob's admission and the revocation
            os.kill(agent.pid, signal.SIGSTOP)
            stopped = True
            high = c.post(
                "/v1/jobs", json=tiny_spec("high", steps=20, priority=10), headers=_as("tok-bob")
            )
            assert high.status_code == 201, high.text
            high_id = high.json()["id"]
            assert c.delete("/v1/grants/bob", headers=_as("tok-root")).status_code == 204
            os.kill(agent.pid, signal.SIGCONT)
            stopped = False

            waiting = wait_job(c, high_id, lambda j: bool(j["state_reason"]), timeout_s=30)
            time.sleep(ROUNDS_WATCHED_S)
            waiting = c.get(f"/v1/jobs/{high_id}", headers=_as("tok-bob")).json()
            running = c.get(f"/v1/jobs/{low_id}", headers=_as("tok-alice")).json()
            assert waiting["state"] == "queued", waiting
            assert waiting["state_reason"].startswith("resources: "), waiting["state_reason"]
            assert (running["state"], running["attempt"]) == ("running", 1), running

            # granted again: the held class preempts her job, which requeues (not fails)
            assert c.put("/v1/grants/bob", json=grant, headers=_as("tok-root")).status_code == 200
            wait_job(c, low_id, lambda j: j["attempt"] == 2, timeout_s=60)
            assert wait_terminal(c, high_id)["state"] == "succeeded"
            # the agent may be moving her job (planning -> running) as this lands
            r = c.post(f"/v1/jobs/{low_id}/cancel", headers=_as("tok-alice"))
            assert r.status_code == 202, r.text
            assert wait_terminal(c, low_id)["state"] == "cancelled"
    finally:
        if stopped:
            os.kill(agent.pid, signal.SIGCONT)
        stack.stop()
