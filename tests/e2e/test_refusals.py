"""A worker's policy refusal fails its job at once, end to end on real Redis, a real API, a
real agent and real workers: jobs whose data file was swapped for a symlink into the state
dir, or out of the data roots, after they were accepted, end `failed` on their first attempt
with no automatic retry (a crash would be retried, up to max_retries), the error naming the
field, and nothing of the file it pointed at.

    pytest -m slow tests/e2e/test_refusals.py
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import CORPUS, REPO, make_stack, tiny_spec, wait_terminal

pytestmark = pytest.mark.slow

MARKER = "WSTRAIN-REFUSAL-MARKER-41c9"


def test_a_data_path_swapped_into_the_state_dir_fails_at_once_without_retries(
    redis_url: str, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # no agent yet: the jobs wait in the queue while their files are swapped; a 1 s back-off
    # so that a retry, were there one, would show within the test
    stack = make_stack(
        redis_url, tmp_path, "refusal", with_agent=False, extra_env={"WSTRAIN_RETRY_BACKOFF_S": "1"}
    )
    agent = None
    try:
        secret = stack.state_dir / "secret.txt"
        secret.parent.mkdir(parents=True, exist_ok=True)
        secret.write_text(f"{MARKER} another job's secrets\n" * 500)
        elsewhere = tmp_path_factory.mktemp("elsewhere") / "outside.txt"  # under no root
        elsewhere.write_text(f"{MARKER} outside the roots\n" * 500)
        targets = {"state dir": secret, "outside the data roots": elsewhere}
        with stack.client() as c:
            jobs = {}
            for why, target in targets.items():
                data = tmp_path / f"data-{len(jobs)}.txt"
                data.write_bytes(CORPUS.read_bytes())
                spec = tiny_spec(f"swapped-{len(jobs)}", max_retries=2)
                spec["data"]["path"] = str(data)
                r = c.post("/v1/jobs", json=spec)
                assert r.status_code == 201, r.text
                jobs[why] = r.json()["id"]
                data.unlink()
                data.symlink_to(target)  # after the API checked it, before the worker opens
            agent = subprocess.Popen(
                [sys.executable, "-m", "wstrain.scheduler.agent.agent"], env=stack.env, cwd=REPO
            )
            for why, job_id in jobs.items():
                done = wait_terminal(c, job_id)
                assert done["state"] == "failed", done
                assert done["attempt"] == 1 and done["retries"] == 0, done
                assert "data.path" in done["error"] and why in done["error"], done["error"]
                assert "not retried" in done["error"], done["error"]
                assert MARKER not in done["error"]
                events = c.get(f"/v1/jobs/{job_id}/events", params={"limit": 1000}).json()
                states = [e["data"]["state"] for e in events if e["kind"] == "state"]
                assert states == ["queued", "planning", "running", "failed"], states
                assert not any("retry" in e["message"] for e in events)
                assert all(MARKER not in e["message"] for e in events)
            # the agent is unharmed: the next job trains
            ok = c.post("/v1/jobs", json=tiny_spec("after", steps=5)).json()
            after = wait_terminal(c, ok["id"])
            assert after["state"] == "succeeded" and after["error"] is None, after
    finally:
        if agent is not None:
            agent.terminate()
            agent.wait(60)
        stack.stop()
