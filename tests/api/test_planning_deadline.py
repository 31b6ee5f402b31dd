"""Submission checks and planning run in planner processes under WSTRAIN_PLAN_TIMEOUT_S: a spec
that plans too slowly answers 422 at once and the API keeps answering meanwhile. Real Redis,
and the API started the way `wstrain-api` starts it (app.main, settings from WSTRAIN_*).

    pytest tests/api/test_planning_deadline.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.conftest import REPO, _wait_http
from tests.helpers.specs import slow_plan_spec
from wstrain.api.settings import ServiceSettings
from wstrain.api.validation import validate_and_plan
from wstrain.contracts.access import DataAccess
from wstrain.contracts.spec import JobSpec

# A 1 us deadline: no check and plan can finish inside it (the hand-off to a planner alone takes
# longer), so the 422 below never depends on how fast this machine is.
TINY_TIMEOUT_S = 1e-6


@pytest.fixture(scope="module")
def impatient_api(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`python -m wstrain.api.app` (main) with host, port and the deadline from the env."""
    from tests.ports import free_port

    port = free_port()
    env = dict(os.environ)
    env.update(
        WSTRAIN_REDIS_URL=redis_url,
        WSTRAIN_KEY_PREFIX="impatient",
        WSTRAIN_DATA_ROOTS=json.dumps([str(REPO), str(tmp_path_factory.mktemp("impatient"))]),
        WSTRAIN_LISTEN_HOST="127.0.0.1",
        WSTRAIN_LISTEN_PORT=str(port),
        WSTRAIN_PLAN_TIMEOUT_S=str(TINY_TIMEOUT_S),
    )
    proc = subprocess.Popen([sys.executable, "-m", "wstrain.api.app"], env=env, cwd=REPO)
    try:
        _wait_http(f"http://127.0.0.1:{port}/healthz", proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(60)  # the lifespan's end kills its planner processes
        except subprocess.TimeoutExpired:
            proc.kill()


def test_slow_plan_answers_422_while_the_api_keeps_answering(impatient_api: str) -> None:
    spec = slow_plan_spec()
    start = time.perf_counter()
    assert validate_and_plan(JobSpec.model_validate(spec), [], DataAccess.of([REPO], None)).runtime
    took = time.perf_counter() - start  # what the check costs with no deadline
    with httpx.Client(base_url=impatient_api, timeout=30) as c:
        before = c.get("/v1/jobs", params={"limit": 1}).json()["total"]
        start = time.perf_counter()
        for path in ("/v1/plans", "/v1/jobs"):
            r = c.post(path, json=spec)
            assert r.status_code == 422, r.text
            detail = r.json()["detail"]
            assert detail.startswith(f"planning took too long (over {TINY_TIMEOUT_S} s); "), detail
            assert "raise WSTRAIN_PLAN_TIMEOUT_S" in detail
            assert c.get("/healthz").json() == {"status": "ok"}
        answered = time.perf_counter() - start
        # Both 422s and both /healthz came back before the first check could have finished
        # (its planner process is killed at the deadline; the second 422 is the refusal of
        # a spec that overran, answered without planning): the event loop never waited.
        assert answered < took, (answered, took)
        # Redis answers, but no agent heartbeats under this key prefix: not ready
        assert c.get("/readyz").json() == {"status": "no scheduler agent is heartbeating"}
        assert c.get("/v1/jobs", params={"limit": 1}).json()["total"] == before
        metrics = c.get("/metrics").text
    assert 'code="422",method="POST",route="/v1/plans"' in metrics


def test_settings_read_host_port_and_deadline_from_the_env(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("WSTRAIN_LISTEN_HOST", "WSTRAIN_LISTEN_PORT", "WSTRAIN_PLAN_TIMEOUT_S"):
        monkeypatch.delenv(name, raising=False)
    defaults = ServiceSettings()
    assert (defaults.listen_host, defaults.listen_port, defaults.plan_timeout_s) == (
        "127.0.0.1",
        8000,
        2.0,
    )
    monkeypatch.setenv("WSTRAIN_LISTEN_HOST", "0.0.0.0")
    monkeypatch.setenv("WSTRAIN_LISTEN_PORT", "8123")
    monkeypatch.setenv("WSTRAIN_PLAN_TIMEOUT_S", "0.5")
    s = ServiceSettings()
    assert (s.listen_host, s.listen_port, s.plan_timeout_s) == ("0.0.0.0", 8123, 0.5)
    monkeypatch.setenv("WSTRAIN_PLAN_TIMEOUT_S", "0")
    with pytest.raises(ValueError, match="plan_timeout_s"):
        ServiceSettings()
