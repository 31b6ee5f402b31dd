"""A frozen worker is noticed, end to end on real Redis, a real API, a real agent and real
workers: a worker SIGSTOPped mid-run reports nothing, and once its no-progress window
(WSTRAIN_HANG_FLOOR_S here: its steps take milliseconds) has passed the agent SIGKILLs it,
writes a `hung` event saying how long it was silent and the window, and retries the job from
its last checkpoint per max_retries (it then succeeds); with max_retries 0 it fails with the
hung cause. The window's arithmetic: tests/agent/test_hang.py.

    pytest -m slow tests/e2e/test_hang.py
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import Stack, make_stack, tiny_spec, wait_job, wait_terminal
from wstrain.agent.processes import is_running, start_ticks

pytestmark = pytest.mark.slow

# 6 s: a tiny CPU job reports every 0.2 s, so only a stopped worker is silent that long, even
# on 2 busy cores; 2x its ~5 ms steps is far below it. Start-up (importing torch on a busy
# machine) gets 120 s: it must not be the window that fires.
FLOOR_S = 6.0
SLACK_S = 5.0  # the agent's wake-up and the event write on a loaded CI machine
# The stop lands just after the first checkpoint (step 25) and the retry trains the rest, 25
# steps and a checkpoint every ~2 s on a busy 2-core machine: 300 steps keep that short, and
# the 275 after the checkpoint (1.4 s even at 5 ms a step) are still far more than the test's
# 0.05 s poll and the SIGSTOP take, so the stop lands mid-run.
STEPS = 300


@pytest.fixture(scope="module")
def hang_stack(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = make_stack(
        redis_url,
        tmp_path_factory.mktemp("hang"),
        "hang",
        with_agent=True,
        extra_env={
            "WSTRAIN_HANG_FLOOR_S": str(FLOOR_S),
            "WSTRAIN_HANG_STEP_FACTOR": "2",
            "WSTRAIN_HANG_STARTUP_S": "120",
            "WSTRAIN_RETRY_BACKOFF_S": "1",
        },
    )
    yield s
    s.stop()


def _freeze_mid_run(c: httpx.Client, job_id: str) -> tuple[int, int, float]:
    """SIGSTOP the job's worker once it has a checkpoint: its pid, start ticks and when."""
    running = wait_job(c, job_id, lambda j: j["last_checkpoint"] is not None and j["worker_pid"])
    pid = running["worker_pid"]
    ticks = start_ticks(pid)
    assert ticks is not None, f"worker pid {pid} is gone before the test could stop it"
    stopped_at = time.time()
    os.kill(pid, signal.SIGSTOP)
    return pid, ticks, stopped_at


def _hung_event(c: httpx.Client, job_id: str) -> dict[str, Any]:
    events = c.get(f"/v1/jobs/{job_id}/events", params={"limit": 1000}).json()
    hung = [e for e in events if e["kind"] == "hung"]
    assert len(hung) == 1, [(e["kind"], e["message"]) for e in events]
    return dict(hung[0])


def _assert_noticed_in_window(event: dict[str, Any], stopped_at: float) -> None:
    # silent from its last report (at most one 0.2 s report interval before the stop) until
    # the window ran out: never before the window, and not much after it
    took_s = event["ts"] - stopped_at
    assert FLOOR_S - 1.0 <= took_s <= FLOOR_S + SLACK_S, (took_s, event)
    assert event["data"]["window_s"] == FLOOR_S
    assert event["data"]["silent_s"] >= FLOOR_S
    assert f"window {FLOOR_S:.0f} s" in event["message"], event["message"]
    assert event["message"].startswith("hung: no progress reported for "), event["message"]


def test_a_stopped_worker_is_killed_and_its_job_retried_to_success(hang_stack: Stack) -> None:
    with hang_stack.client() as c:
        spec = tiny_spec("frozen", steps=STEPS, seed=5, checkpoint_every=25, max_retries=2)
        job = c.post("/v1/jobs", json=spec).json()
        pid, ticks, stopped_at = _freeze_mid_run(c, job["id"])
        try:
            retried = wait_job(c, job["id"], lambda j: j["attempt"] == 2, FLOOR_S + 60)
            assert retried["retries"] == 1
            event = _hung_event(c, job["id"])
            _assert_noticed_in_window(event, stopped_at)
            assert event["data"]["pid"] == pid
            assert not is_running(pid, ticks), "the hung worker must be killed, not left"
        finally:
            if is_running(pid, ticks):
                os.kill(pid, signal.SIGKILL)
        done = wait_terminal(c, job["id"])
        assert done["state"] == "succeeded", done["error"]
        assert done["attempt"] == 2 and done["retries"] == 1 and done["step"] == STEPS
        events = c.get(f"/v1/jobs/{job['id']}/events", params={"limit": 1000}).json()
        retry = [e["message"] for e in events if e["message"].startswith("retry 1 of 2")]
        assert retry and "hung: no progress" in retry[0], [e["message"] for e in events]
        starts = [e["data"]["step"] for e in events if e["kind"] == "started"]
        assert starts[0] == 0 and starts[1] >= 25  # the retry resumed from its checkpoint


def test_a_stopped_worker_without_retries_fails_with_the_hung_cause(hang_stack: Stack) -> None:
    with hang_stack.client() as c:
        spec = tiny_spec("frozen-once", steps=STEPS, seed=5, checkpoint_every=25, max_retries=0)
        job = c.post("/v1/jobs", json=spec).json()
        pid, ticks, stopped_at = _freeze_mid_run(c, job["id"])
        try:
            failed = wait_terminal(c, job["id"], FLOOR_S + 60)
        finally:
            if is_running(pid, ticks):
                os.kill(pid, signal.SIGKILL)
        assert failed["state"] == "failed" and failed["retries"] == 0, failed
        assert failed["error"].startswith("hung: no progress reported for "), failed["error"]
        assert "WSTRAIN_HANG_FLOOR_S" in failed["error"]  # the fix, where the window is wrong
        assert failed["step"] < STEPS, "the stop must land mid-run for this test to mean much"
        _assert_noticed_in_window(_hung_event(c, job["id"]), stopped_at)
        assert not is_running(pid, ticks)
