"""Faults under a running job, end to end on a private Redis (with its AOF), a real API, a
real agent and a real worker: Redis stopped and restarted mid-job, and the job still ends
`succeeded` at its last step, once, with the same agent.

    pytest -m slow tests/e2e/test_faults.py
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from tests.conftest import make_stack, tiny_spec, wait_job, wait_terminal

pytestmark = pytest.mark.slow


def test_a_redis_restart_mid_job_loses_nothing(tmp_path: Path) -> None:
    from wstrain.service.serve import free_port, start_redis

    port = free_port()
    data = tmp_path / "redis"
    data.mkdir()
    redis_proc = start_redis(data, port)
    url = f"redis://127.0.0.1:{port}/0"
    stack = make_stack(url, tmp_path, "faults", with_agent=True)
    try:
        with stack.client() as c:
            job = c.post("/v1/jobs", json=tiny_spec("through-a-restart", steps=400)).json()
            wait_job(c, job["id"], lambda j: j["state"] == "running" and j["step"] >= 5)
            # SIGTERM: Redis writes its AOF and exits, as `systemctl restart redis` does
            redis_proc.send_signal(signal.SIGTERM)
            redis_proc.wait(30)
            down_at = time.monotonic()
            r = c.get("/v1/jobs")
            assert r.status_code == 503 and r.headers["Retry-After"]  # the API meanwhile
            time.sleep(3)
            assert stack.agent is not None and stack.agent.poll() is None  # it waits
            redis_proc = start_redis(data, port)  # the same AOF, the same port
            assert time.monotonic() - down_at >= 3
            done = wait_terminal(c, job["id"], timeout_s=300)
            assert done["state"] == "succeeded", done["error"]
            assert done["step"] == 400 and done["attempt"] == 1
            events = c.get(f"/v1/jobs/{job['id']}/events", params={"limit": 1000}).json()
            states = [e["data"]["state"] for e in events if e["kind"] == "state"]
            assert states == ["queued", "planning", "running", "succeeded"]
            assert stack.agent.poll() is None  # the agent lived through it
    finally:
        stack.stop()
        redis_proc.terminate()
        redis_proc.wait(10)
