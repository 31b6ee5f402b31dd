"""Both /metrics outputs (the API's, and the agent's with a live working-set job's telemetry
in it) pass `promtool check metrics`, Prometheus's own linter: base units, _total counters,
HELP text."""

from __future__ import annotations

import shutil
import subprocess

import httpx
import pytest

from tests.conftest import Stack, tiny_spec, wait_job, wait_terminal

WS = {"runtime": "working_set", "micro_batch": 2, "window": 1, "r_param": 2, "r_grad": 1}


@pytest.mark.slow
def test_promtool_accepts_metrics_with_live_telemetry(stack: Stack) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is not installed; scripts/setup.sh installs the prometheus package")
    with stack.client() as c:
        job = c.post("/v1/jobs", json=tiny_spec("lint", steps=3000, overrides=WS)).json()
        wait_job(c, job["id"], lambda j: j["telemetry"].get("transfer_bytes_total.d2h"))
        api_text = c.get("/metrics").text
        agent_text = httpx.get(stack.metrics_url).text
        c.post(f"/v1/jobs/{job['id']}/cancel")
        wait_terminal(c, job["id"])
    assert "wstrain_job_stall_seconds_total" in agent_text
    assert "wstrain_job_host_rss_bytes" in agent_text
    assert "wstrain_queue_depth" in api_text
    for text in (api_text, agent_text):
        result = subprocess.run(
            [promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60
        )
        assert result.returncode == 0, result.stdout + result.stderr
