"""Faults under a running job, end to end on real Redis, a real API, real agents and real
workers. Each ends with every job in a correct state, none lost, never two workers on one
job, and a job that was running resumed from its last checkpoint bit-exactly:

- Redis stopped and restarted (AOF) mid-job: the job ends `succeeded`, once, same agent;
- the agent SIGKILLed and started again: the new agent stops the old worker (it
  checkpoints), requeues the job, and it ends with the weights of an uninterrupted run;
- the worker SIGKILLed: retried from its checkpoint (its `error` says why while it waits,
  and is cleared once the retry runs), or with no retries left fails with the reason;
  either way it ends bit-exact;
- Ctrl-C to `wstrain serve`: it stops the API, the agent (which requeues with a
  checkpoint), then Redis; the next `wstrain serve` finishes the job.

A second agent with a live agent's node name is refused: tests/agent/test_agent.py.

    pytest -m slow tests/e2e/test_faults.py
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import (
    REPO,
    Stack,
    _wait_http,
    make_stack,
    seed_node_profile,
    tiny_spec,
    wait_job,
    wait_terminal,
)
from tests.helpers.cli import as_a_foreground_job
from tests.helpers.jobs import assert_same_weights, job_states
from wstrain.agent.processes import is_running, start_ticks

pytestmark = pytest.mark.slow


def test_a_redis_restart_mid_job_loses_nothing(tmp_path: Path) -> None:
    from tests.ports import free_port
    from wstrain.cli.serve import start_redis

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


def _start_agent(stack: Stack) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "wstrain.agent.agent"], env=stack.env, cwd=REPO)


SPEC = dict(steps=300, seed=11)
# A worker SIGKILLed just after its first checkpoint (step 25): 150 steps leave the resumed
# run 125 steps to match the straight run bit-exactly, and the kill 125 steps to land
# mid-run (0.6 s even at an idle machine's 5 ms a step; the test's 0.05 s poll and the kill
# take a fraction of that; ~7 s on a busy 2-core machine, which runs both jobs at ~55 ms).
KILL_STEPS = 150
KILL_SPEC = dict(steps=KILL_STEPS, seed=11)


def test_a_sigkilled_agent_is_replaced_and_its_job_resumes_bit_exact(
    redis_url: str, tmp_path: Path
) -> None:
    stack = make_stack(redis_url, tmp_path, "agentkill", with_agent=True)
    try:
        assert stack.agent is not None
        with stack.client() as c:
            straight = c.post("/v1/jobs", json=tiny_spec("straight", **SPEC)).json()
            straight = wait_terminal(c, straight["id"])
            assert straight["state"] == "succeeded", straight["error"]
            job = c.post("/v1/jobs", json=tiny_spec("victim", **SPEC)).json()
            running = wait_job(c, job["id"], lambda j: j["worker_pid"] and j["step"] >= 20)
            old_pid = running["worker_pid"]
            old_start = start_ticks(old_pid)
            assert old_start is not None

            stack.agent.send_signal(signal.SIGKILL)
            stack.agent.wait(10)
            stack.agent = _start_agent(stack)
            # the new worker appears only once the old one is gone: never two on one job
            moved = wait_job(c, job["id"], lambda j: j["worker_pid"] not in (None, old_pid))
            assert not is_running(old_pid, old_start)
            assert moved["attempt"] == 2

            done = wait_terminal(c, job["id"])
            assert done["state"] == "succeeded", done["error"]
            assert done["step"] == 300 and done["attempt"] == 2
            assert job_states(c, job["id"]) == [
                "queued", "planning", "running", "queued", "planning", "running", "succeeded"
            ]  # fmt: skip
            events = c.get(f"/v1/jobs/{job['id']}/events", params={"limit": 1000}).json()
            requeued = [e["message"] for e in events if "restarted" in e["message"]]
            assert requeued and f"worker pid {old_pid}" in requeued[0], requeued
            starts = [e["data"]["step"] for e in events if e["kind"] == "started"]
            assert starts[0] == 0 and starts[1] >= 20  # resumed at the old worker's checkpoint
            assert_same_weights(done, straight)
            assert stack.agent.poll() is None
    finally:
        stack.stop()


@pytest.fixture(scope="module")
def shared(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """One stack for the tests that kill or time out a worker but leave its agent and API
    be, each waiting out its own jobs: an API, a planner pool and an agent fewer to start
    for two of them (about 4 CPU-s each on CI's 2 cores). A retry waits 1 s; a time limit
    warns 2 s before it (only the time-limited job has one)."""
    env = {"WSTRAIN_RETRY_BACKOFF_S": "1", "WSTRAIN_TIME_LIMIT_GRACE_S": "2"}
    tmp = tmp_path_factory.mktemp("faults")
    stack = make_stack(redis_url, tmp, "faultshared", with_agent=True, extra_env=env)
    yield stack
    stack.stop()


def test_a_sigkilled_worker_without_retries_fails_and_resumes_bit_exact(shared: Stack) -> None:
    stack = shared
    with stack.client() as c:
        straight = c.post("/v1/jobs", json=tiny_spec("straight", **KILL_SPEC)).json()
        spec = tiny_spec("victim", checkpoint_every=25, max_retries=0, **KILL_SPEC)
        job = c.post("/v1/jobs", json=spec).json()
        running = wait_job(c, job["id"], lambda j: j["last_checkpoint"] is not None)
        os.kill(running["worker_pid"], signal.SIGKILL)
        failed = wait_terminal(c, job["id"])
        assert failed["state"] == "failed" and "SIGKILL" in failed["error"]
        assert failed["retries"] == 0  # max_retries 0: no automatic retry
        assert failed["step"] < KILL_STEPS, "the kill must land mid-run for this test to mean much"
        assert c.post(f"/v1/jobs/{job['id']}/resume").status_code == 202
        done = wait_terminal(c, job["id"])
        assert done["state"] == "succeeded" and done["attempt"] == 2, done["error"]
        straight = wait_terminal(c, straight["id"])
        assert_same_weights(done, straight)


def test_a_sigkilled_worker_is_retried_from_its_checkpoint_and_finishes_bit_exact(
    shared: Stack,
) -> None:
    stack = shared
    with stack.client() as c:
        straight = c.post("/v1/jobs", json=tiny_spec("straight", **KILL_SPEC)).json()
        job = c.post("/v1/jobs", json=tiny_spec("victim", checkpoint_every=25, **KILL_SPEC)).json()
        running = wait_job(c, job["id"], lambda j: j["last_checkpoint"] is not None)
        killed_at = time.monotonic()
        os.kill(running["worker_pid"], signal.SIGKILL)
        backing_off = wait_job(c, job["id"], lambda j: j["state"] == "queued")
        assert "SIGKILL" in backing_off["error"]  # the cause, while it waits to retry
        retried = wait_job(c, job["id"], lambda j: j["attempt"] == 2 and j["worker_pid"])
        assert retried["state"] == "running" and retried["error"] is None, retried
        done = wait_terminal(c, job["id"])
        assert done["state"] == "succeeded", done["error"]
        assert done["attempt"] == 2 and done["retries"] == 1 and done["step"] == KILL_STEPS
        assert done["error"] is None  # no stale cause on a job that succeeded
        assert time.monotonic() - killed_at >= 1.0  # the back-off was waited
        events = c.get(f"/v1/jobs/{job['id']}/events", params={"limit": 1000}).json()
        retry = [e["message"] for e in events if e["message"].startswith("retry 1 of 2")]
        assert retry and "SIGKILL" in retry[0], [e["message"] for e in events]
        starts = [e["data"]["step"] for e in events if e["kind"] == "started"]
        assert starts[0] == 0 and starts[1] >= 25  # resumed at its checkpoint
        assert_same_weights(done, wait_terminal(c, straight["id"]))


def _started_steps(c: httpx.Client, job_id: str) -> list[int]:
    events = c.get(f"/v1/jobs/{job_id}/events", params={"limit": 1000}).json()
    return [e["data"]["step"] for e in events if e["kind"] == "started"]


def test_a_time_limited_job_ends_timeout_with_a_checkpoint_and_resumes(shared: Stack) -> None:
    stack = shared
    with stack.client() as c:
        # 10 s, counted from the worker's start, for a first step and a checkpoint before
        # it: a worker forked from the zygote server (tests/conftest.py) reports its first
        # step within 0.5 s on 2 idle cores, 2 s loaded; an exec'd one took over 6 s
        # loaded (torch's import: 20 s then), and the job trains the whole limit
        spec = tiny_spec("limited", steps=100000, time_limit_s=10)
        job = c.post("/v1/jobs", json=spec).json()
        ended = wait_terminal(c, job["id"])
        assert ended["state"] == "timeout", ended
        assert ended["last_checkpoint"] and 0 < ended["step"] < 100000
        events = c.get(f"/v1/jobs/{job['id']}/events", params={"limit": 1000}).json()
        kinds = [e["kind"] for e in events]
        warned = kinds.index("time_limit")
        assert "checkpoint" in kinds[warned:], kinds  # warned, then checkpointed
        r = c.post(f"/v1/jobs/{job['id']}/resume")
        assert r.status_code == 202, r.text
        deadline = time.monotonic() + 60
        while len(starts := _started_steps(c, job["id"])) < 2:
            assert time.monotonic() < deadline, "the resumed worker never started"
            time.sleep(0.2)
        # from the time limit's checkpoint (the job's `step` is its last report, a few
        # steps before the SIGTERM's step boundary)
        assert starts[1] == int(Path(ended["last_checkpoint"]).name.removeprefix("step-"))
        c.post(f"/v1/jobs/{job['id']}/cancel")
        wait_terminal(c, job["id"])


def test_ctrl_c_to_serve_requeues_the_job_and_the_next_serve_finishes_it(
    tmp_path: Path,
) -> None:
    from tests.ports import free_port

    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "WSTRAIN_REDIS_URL")}
    env.update(
        WSTRAIN_CPU_SLOTS="1",
        WSTRAIN_WORKER_THREADS="1",
        WSTRAIN_NODE_NAME="node-serve",
        WSTRAIN_DATA_ROOTS=json.dumps([str(REPO), str(tmp_path)]),
        WSTRAIN_HEARTBEAT_S="0.5",
        PYTHONPATH=str(REPO),
    )
    state = tmp_path / "state"
    seed_node_profile(state)  # the profile this test process measured: its agent reads it

    def serve() -> tuple[subprocess.Popen[bytes], str]:
        port = free_port()
        cmd = [sys.executable, "-m", "wstrain.cli.main", "serve", "--port", str(port)]
        cmd += ["--state-dir", str(state), "--metrics-port", str(free_port())]
        # its own process group, as a shell gives a foreground job: Ctrl-C signals the group
        with as_a_foreground_job():
            proc = subprocess.Popen(cmd, env=env, cwd=REPO, start_new_session=True)
        url = f"http://127.0.0.1:{port}"
        _wait_http(f"{url}/healthz", proc, timeout_s=60)
        return proc, url

    proc, url = serve()
    try:
        with httpx.Client(base_url=url, timeout=30) as c:
            job = c.post("/v1/jobs", json=tiny_spec("through-ctrl-c", steps=400)).json()
            running = wait_job(c, job["id"], lambda j: j["worker_pid"] and j["step"] >= 10)
            agent_pid = c.get("/v1/nodes").json()["nodes"][0]["agent_pid"]
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
        assert proc.wait(120) == 0
        for pid in (agent_pid, running["worker_pid"]):  # nothing left behind
            assert start_ticks(pid) is None, f"pid {pid} outlived wstrain serve"

        proc, url = serve()  # the same state dir: the same Redis data and checkpoints
        with httpx.Client(base_url=url, timeout=30) as c:
            done = wait_terminal(c, job["id"])
            assert done["state"] == "succeeded", done["error"]
            assert done["step"] == 400 and done["attempt"] == 2
            events = c.get(f"/v1/jobs/{job['id']}/events", params={"limit": 1000}).json()
            assert any("agent shut down; requeued" in e["message"] for e in events)
            assert job_states(c, job["id"]) == [
                "queued", "planning", "running", "queued", "planning", "running", "succeeded"
            ]  # fmt: skip
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(120)
