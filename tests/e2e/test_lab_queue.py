"""The lab queue's policy with real processes on a CPU machine whose agent models GPUs out of
host memory (WSTRAIN_CPU_DEVICES_GIB): two jobs whose device budgets fit one "GPU" run on it
at once while a third waits with its reason; a higher-priority job preempts a lower one,
which checkpoints, is requeued (not failed), resumes later and ends with the weights of an
uninterrupted run; a job over its owner's quota waits, never fails.

    pytest -m slow tests/e2e/test_lab_queue.py
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.conftest import Stack, make_stack, tiny_spec, wait_job, wait_terminal
from tests.helpers.jobs import assert_same_weights, job_states

pytestmark = pytest.mark.slow


def _owner(name: str) -> dict[str, str]:
    return {"X-Wstrain-Owner": name}


def test_two_jobs_share_a_modelled_gpu_and_a_third_waits(redis_url: str, tmp_path: Path) -> None:
    # one 2.5 GiB "GPU": two 1 GiB device budgets fit, a third does not
    stack = make_stack(
        redis_url,
        tmp_path,
        "packing",
        with_agent=True,
        extra_env={"WSTRAIN_CPU_DEVICES_GIB": "[2.5]"},
    )
    try:
        with stack.client() as c:
            ids = [
                c.post("/v1/jobs", json=tiny_spec(f"packed-{i}", steps=100000)).json()["id"]
                for i in range(3)
            ]
            deadline = time.monotonic() + 60
            while True:
                jobs = [c.get(f"/v1/jobs/{j}").json() for j in ids]
                running = [j for j in jobs if j["state"] == "running"]
                if len(running) == 2:
                    break
                assert time.monotonic() < deadline, [(j["state"], j["state_reason"]) for j in jobs]
                time.sleep(0.2)
            assert {j["gpu"] for j in running} == {"0"}  # both on the one "GPU"
            (waiting,) = [j for j in jobs if j["state"] == "queued"]
            waiting = wait_job(c, waiting["id"], lambda j: bool(j["state_reason"]))
            assert waiting["state_reason"].startswith("resources: "), waiting["state_reason"]
            assert "1.0 GiB" in waiting["state_reason"]  # names what it needs
            for j in ids:
                c.post(f"/v1/jobs/{j}/cancel")
            for j in ids:
                wait_terminal(c, j)
    finally:
        stack.stop()


def test_a_higher_class_preempts_and_the_victim_resumes_bit_exact(
    redis_url: str, tmp_path: Path
) -> None:
    stack = make_stack(
        redis_url,
        tmp_path,
        "preempt",
        with_agent=True,
        extra_env={"WSTRAIN_CPU_DEVICES_GIB": "[1.5]"},
    )
    low_spec = tiny_spec("low", steps=300, seed=7)
    try:
        with stack.client() as c:
            straight = c.post("/v1/jobs", json=tiny_spec("straight", steps=300, seed=7)).json()
            straight = wait_terminal(c, straight["id"])
            assert straight["state"] == "succeeded", straight["error"]

            low = c.post("/v1/jobs", json=low_spec, headers=_owner("ana")).json()
            wait_job(c, low["id"], lambda j: j["state"] == "running" and j["step"] >= 20)
            high_spec = tiny_spec("high", steps=40, priority=10)
            high = c.post("/v1/jobs", json=high_spec, headers=_owner("ben")).json()
            requeued = wait_job(c, low["id"], lambda j: j["attempt"] == 2)
            assert high["id"] not in json.dumps(requeued)  # ben's job id is not ana's to see
            assert wait_terminal(c, high["id"])["state"] == "succeeded"
            done = wait_terminal(c, low["id"])
            assert done["state"] == "succeeded", done["error"]
            assert done["attempt"] == 2 and done["retries"] == 0  # requeued, not retried
            assert job_states(c, low["id"]) == [
                "queued", "planning", "running", "queued", "planning", "running", "succeeded"
            ]  # fmt: skip
            events = c.get(
                f"/v1/jobs/{low['id']}/events", params={"limit": 1000}, headers=_owner("ana")
            ).json()
            msgs = [e["message"] for e in events]
            # another owner's preemptor by its class only (the same owner's by id:
            # tests/agent/test_hang.py)
            why = "preempted by another owner's job of priority 10"
            assert any(m.startswith(why) for m in msgs), msgs
            assert high["id"] not in json.dumps(events), msgs
            starts = [e["data"]["step"] for e in events if e["kind"] == "started"]
            assert starts[0] == 0 and starts[1] >= 20  # resumed from its preemption checkpoint
            assert_same_weights(done, straight)
    finally:
        stack.stop()


def test_a_job_over_its_owners_quota_waits_with_the_reason(redis_url: str, tmp_path: Path) -> None:
    quotas = {"ana": {"max_jobs": 1}}
    stack = make_stack(
        redis_url,
        tmp_path,
        "quota",
        with_agent=True,
        extra_env={"WSTRAIN_OWNER_QUOTAS": json.dumps(quotas)},
    )
    try:
        with stack.client() as c:
            first = c.post("/v1/jobs", json=tiny_spec("q1", steps=100000), headers=_owner("ana"))
            second = c.post("/v1/jobs", json=tiny_spec("q2", steps=20), headers=_owner("ana"))
            a, b = first.json()["id"], second.json()["id"]
            wait_job(c, a, lambda j: j["state"] == "running")
            held = wait_job(c, b, lambda j: bool(j["state_reason"]))
            assert held["state"] == "queued"
            assert held["state_reason"] == "quota: 1 of 1 jobs running"
            queue = c.get("/v1/queue").json()  # `wstrain queue`: the order and each reason
            assert [(j["id"], j["position"]) for j in queue["jobs"]] == [(b, 1)]
            assert queue["jobs"][0]["state_reason"] == "quota: 1 of 1 jobs running"
            c.post(f"/v1/jobs/{a}/cancel")
            assert wait_terminal(c, b)["state"] == "succeeded"  # it ran once room was made
    finally:
        stack.stop()


def test_a_dependent_job_waits_for_its_dependency_to_succeed(stack: Stack) -> None:
    with stack.client() as c:
        first = c.post("/v1/jobs", json=tiny_spec("dep-first", steps=300)).json()
        then = c.post("/v1/jobs", json=tiny_spec("dep-then", steps=20, after=[first["id"]]))
        then = then.json()
        waiting = wait_job(c, then["id"], lambda j: bool(j["state_reason"]))
        assert waiting["state"] == "queued"
        assert waiting["state_reason"].startswith(f"dependency: waiting on {first['id']}")
        done = wait_terminal(c, then["id"])
        assert done["state"] == "succeeded"
        first_done = c.get(f"/v1/jobs/{first['id']}").json()
        assert first_done["state"] == "succeeded"
        events = c.get(f"/v1/jobs/{then['id']}/events", params={"limit": 1000}).json()
        planned_at = next(e["ts"] for e in events if e["data"].get("state") == "planning")
        assert planned_at >= first_done["updated_at"]  # claimed only after it succeeded
