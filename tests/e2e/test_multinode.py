"""Jobs on several nodes, end to end on a CPU machine: two real agents on loopback (node
names mn-a and mn-b, one Redis, one state dir, one CPU slot each), a real API and real
workers (gpus=1 a node: 1 rank each, gloo over 127.0.0.1).

- a 2-node job is gang-scheduled over both agents (one worker each); SIGKILL to the
  worker of node 1 (the non-leader) stops the gang (node 0's worker is gone too), and the
  job is retried (attempt 2) from its checkpoint: it resumes at the last checkpoint's step
  and ends succeeded;
- two 2-node jobs on the two agents do not deadlock: one runs, the other waits holding
  nothing (no member joined its gang), then runs, and both succeed.

    pytest -m slow tests/e2e/test_multinode.py
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from tests.conftest import REPO, Stack, make_stack, tiny_spec, wait_job, wait_terminal

pytestmark = pytest.mark.slow

PREFIX = "multinode"
NODES = ("mn-a", "mn-b")
# the runtime pinned: node 0 plans each attempt on its own profile, and a retry whose node 0
# is the other agent could otherwise pick the other runtime, whose checkpoint state differs
SPEC: dict[str, Any] = {
    "nodes": 2,
    "gpus": 1,
    "max_retries": 2,
    "overrides": {"runtime": "working_set"},
}


@pytest.fixture(scope="module")
def two_nodes(
    redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Stack, list[subprocess.Popen[bytes]]]]:
    from tests.ports import free_port

    env = {
        "WSTRAIN_CPU_SLOTS": "1",
        "WSTRAIN_RETRY_BACKOFF_S": "0.5",
        "WSTRAIN_GANG_ASSEMBLY_S": "20",
        # exec'd workers, whose command line and environment name their job and node
        # rank in /proc (_workers); the rest of the suite runs zygote-forked ones
        "WSTRAIN_WORKER_ZYGOTE": "false",
    }
    stack = make_stack(redis_url, tmp_path_factory.mktemp("mn"), PREFIX, False, env)
    agents: list[subprocess.Popen[bytes]] = []
    for name in NODES:
        agent_env = {
            **stack.env,
            "WSTRAIN_NODE_NAME": name,
            "WSTRAIN_METRICS_PORT": str(free_port()),
        }
        agents.append(
            subprocess.Popen([sys.executable, "-m", "wstrain.agent.agent"], env=agent_env, cwd=REPO)
        )
        # one at a time: the second reads the hardware profile the first cached
        deadline = time.monotonic() + 60
        with stack.client() as c:
            while len(c.get("/v1/nodes").json()["nodes"]) < len(agents):
                assert all(a.poll() is None for a in agents), "an agent exited during start-up"
                assert time.monotonic() < deadline, "the agents did not register in 60 s"
                time.sleep(0.2)
    yield stack, agents
    for a in agents:
        a.terminate()
    for a in agents:
        try:
            a.wait(60)
        except subprocess.TimeoutExpired:
            a.kill()
    stack.stop()


def _workers(job_id: str) -> dict[int, int]:
    """The job's worker processes on this machine: node rank -> pid (by /proc)."""
    out = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().split(b"\0")
            env = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"wstrain.worker.main" not in cmd or not any(job_id.encode() in a for a in cmd):
            continue
        ranks = [e.split(b"=", 1)[1] for e in env if e.startswith(b"NODE_RANK=")]
        if ranks:
            out[int(ranks[0])] = int(entry.name)
    return out


def _events(c: httpx.Client, job_id: str) -> list[dict[str, Any]]:
    got: list[dict[str, Any]] = c.get(f"/v1/jobs/{job_id}/events", params={"limit": 1000}).json()
    return got


def _gone(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
            stat = Path(f"/proc/{pid}/stat").read_text()
            if stat.rsplit(")", 1)[1].split()[0] == "Z":  # exited, not yet reaped
                return True
        except (ProcessLookupError, FileNotFoundError):
            return True
        time.sleep(0.05)
    return False


def test_a_killed_member_stops_the_gang_and_the_job_resumes_from_its_checkpoint(
    two_nodes: tuple[Stack, list[subprocess.Popen[bytes]]],
) -> None:
    stack, _ = two_nodes
    with stack.client() as c:
        # 200 steps: the kill lands just after the first checkpoint (step 10), 190 steps
        # before the end, ~27 s of a 2-node gang at the ~7 steps/s it runs on a busy 2-core
        # machine (400 steps took 53 s there, the retry alone 14 CPU-s in each worker)
        spec = tiny_spec("mn-retry", steps=200, checkpoint_every=10, **SPEC)
        made = c.post("/v1/jobs", json=spec)
        assert made.status_code == 201, made.text
        jid = made.json()["id"]
        running = wait_job(c, jid, lambda j: j["last_checkpoint"] is not None, timeout_s=120)
        assert running["attempt"] == 1 and running["plan"]["nodes"] == 2
        workers = _workers(jid)
        assert sorted(workers) == [0, 1], workers  # one worker a node
        assert running["worker_pid"] == workers[0]  # node 0's agent supervises the job
        os.kill(workers[1], signal.SIGKILL)  # the non-leader's worker
        assert _gone(workers[0], 30), "node 0's worker kept running without its peer"
        done = wait_terminal(c, jid, timeout_s=240)
        assert done["state"] == "succeeded", done["error"]
        assert done["attempt"] == 2 and done["retries"] == 1 and done["step"] == 200
        events = _events(c, jid)
        starts = [i for i, e in enumerate(events) if e["kind"] == "started"]
        assert len(starts) == 2, [e["message"] for e in events]
        resumed = events[starts[1]]["data"]["step"]
        saved = [e["data"]["step"] for e in events[: starts[1]] if e["kind"] == "checkpoint"]
        assert resumed > 0 and resumed == saved[-1]  # at the last checkpoint before the retry
        assert any(e["message"].startswith("retry 1 of 2") for e in events)
        # nothing left behind on either node: a member may still be exiting as the leader
        # reports success (seen once in CI on a loaded 2-core machine), so within 30 s
        left = _workers(jid)
        assert all(_gone(pid, 30) for pid in left.values()), left


def test_two_multi_node_jobs_do_not_deadlock(
    two_nodes: tuple[Stack, list[subprocess.Popen[bytes]]], redis_url: str
) -> None:
    stack, _ = two_nodes
    r = redis.Redis.from_url(redis_url, decode_responses=True)
    with stack.client() as c:
        ids = []
        for name in ("mn-first", "mn-second"):
            made = c.post("/v1/jobs", json=tiny_spec(name, steps=150, **SPEC))
            assert made.status_code == 201, made.text
            ids.append(made.json()["id"])
        first = wait_job(c, ids[0], lambda j: j["state"] == "running" and j["step"] > 0)
        # the second waits holding nothing: no member joined its gang while the first runs
        # (each look counts only if the first still runs after it: on a loaded machine the
        # first's 150 steps can end within the looks, and then the second may assemble)
        watched = 0
        for _ in range(20):
            assembling = r.get(f"{PREFIX}:gang-assembly")
            waiting = c.get(f"/v1/jobs/{ids[1]}").json()
            if c.get(f"/v1/jobs/{ids[0]}").json()["state"] != "running":
                break
            assert waiting["state"] == "queued", waiting
            assert assembling != ids[1]
            watched += 1
            time.sleep(0.1)
        assert first["state"] == "running" and watched >= 1
        for jid in ids:
            done = wait_terminal(c, jid, timeout_s=240)
            assert done["state"] == "succeeded", done["error"]
            assert done["attempt"] == 1
        ends = [
            next(e["ts"] for e in _events(c, jid) if e["message"] == "training finished")
            for jid in ids
        ]
        second_start = next(e["ts"] for e in _events(c, ids[1]) if e["kind"] == "started")
        assert second_start >= ends[0]  # one gang at a time on two one-slot nodes
    r.close()
