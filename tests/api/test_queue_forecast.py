"""The queue forecast through the API, on a real uvicorn and Redis with no agent (a node
registered as an agent heartbeats it, so jobs stay queued): GET /v1/queue and GET
/v1/jobs/{id} carry a queued job's predicted start and end.

    pytest tests/api/test_queue_forecast.py
"""

from __future__ import annotations

import time

import pytest

from tests.conftest import Stack, tiny_spec
from tests.helpers.cli import run_main as _run

pytestmark = pytest.mark.usefixtures("leave_the_queue_as_found")


def test_a_queued_job_has_a_predicted_start_and_end(api_only: Stack) -> None:
    with api_only.client() as c:
        before = time.time()
        r = c.post("/v1/jobs", json=tiny_spec("forecast", steps=40))
        assert r.status_code == 201, r.text
        job_id = r.json()["id"]
        step_s = c.get(f"/v1/jobs/{job_id}/plan").json()["predicted"]["step_seconds"]
        entries = {e["id"]: e for e in c.get("/v1/queue").json()["jobs"]}
        job = c.get(f"/v1/jobs/{job_id}").json()
    mine = entries[job_id]
    assert mine["predicted_start"] is not None and mine["predicted_start"] >= before
    assert mine["predicted_end"] == pytest.approx(mine["predicted_start"] + 40 * step_s)
    assert mine["predicted_reason"] is None
    # the job's own view replays the queue again a moment later: the same start, give or take
    assert job["predicted_start"] == pytest.approx(mine["predicted_start"], abs=5.0)
    assert job["predicted_end"] - job["predicted_start"] == pytest.approx(40 * step_s)


def test_the_cli_prints_when_a_queued_job_starts(
    api_only: Stack, capsys: pytest.CaptureFixture[str]
) -> None:
    with api_only.client() as c:
        r = c.post("/v1/jobs", json=tiny_spec("forecast-cli", steps=40))
        assert r.status_code == 201, r.text
        job_id = r.json()["id"]
    server = ("--server", api_only.url)
    code, out, _ = _run(capsys, *server, "queue")
    assert code == 0 and "starts in" in out and job_id in out
    code, out, _ = _run(capsys, *server, "status", job_id)
    assert code == 0, out
    assert "predicted start" in out and "predicted end" in out


def test_metrics_export_each_owners_predicted_wait(api_only: Stack) -> None:
    with api_only.client() as c:
        r = c.post("/v1/jobs", json=tiny_spec("forecast-metric", steps=40))
        assert r.status_code == 201, r.text
        owner = r.json()["owner"]
        text = c.get("/metrics").text
    series = f'wstrain_queue_predicted_wait_seconds{{owner="{owner}"}}'
    (line,) = [ln for ln in text.splitlines() if ln.startswith(series + " ")]
    assert float(line.split()[-1]) >= 0.0
