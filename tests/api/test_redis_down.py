"""The API while Redis is away: every route that needs the store answers 503 with
Retry-After (never a 500), the liveness probe and /metrics (wstrain_redis_up 0) still
answer, readiness says why not, and the API serves again as soon as Redis is back, without
a restart.

    pytest tests/api/test_redis_down.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx

from tests.conftest import REPO, _wait_http, tiny_spec


def test_redis_away_is_a_503_with_retry_after(tmp_path: Path) -> None:
    from tests.ports import free_port
    from wstrain.cli.serve import start_redis

    api_port, redis_port = free_port(), free_port()  # nothing listens on redis_port yet
    env = dict(os.environ)
    env.update(
        WSTRAIN_REDIS_URL=f"redis://127.0.0.1:{redis_port}/0",
        WSTRAIN_KEY_PREFIX="away",
        WSTRAIN_DATA_ROOTS=json.dumps([str(REPO)]),
        WSTRAIN_LISTEN_PORT=str(api_port),
    )
    api = subprocess.Popen([sys.executable, "-m", "wstrain.api.app"], env=env, cwd=REPO)
    redis_proc = None
    try:
        url = f"http://127.0.0.1:{api_port}"
        _wait_http(f"{url}/healthz", api)
        with httpx.Client(base_url=url, timeout=30) as c:
            for method, path in (
                ("GET", "/v1/jobs"),
                ("GET", "/v1/jobs/abc"),
                ("POST", "/v1/jobs"),
                ("POST", "/v1/plans"),
                ("POST", "/v1/jobs/abc/cancel"),
                ("GET", "/v1/nodes"),
            ):
                body = tiny_spec("away") if method == "POST" and "jobs/" not in path else None
                r = c.request(method, path, json=body)
                assert r.status_code == 503, (method, path, r.status_code, r.text)
                assert r.headers["Retry-After"] == "2"
                assert "Redis" in r.json()["detail"]
            assert c.get("/healthz").status_code == 200
            # /metrics answers: that Redis is down is what it has to say (WstrainRedisDown)
            down = c.get("/metrics")
            assert down.status_code == 200 and "wstrain_redis_up 0.0" in down.text
            ready = c.get("/readyz")
            assert ready.status_code == 503 and "redis unreachable" in ready.json()["status"]

            redis_proc = start_redis(tmp_path, redis_port)
            r = c.get("/v1/jobs")
            assert r.status_code == 200 and r.json()["total"] == 0
            # the request metrics counted the 503s
            metrics = c.get("/metrics").text
            assert 'code="503",method="GET",route="/v1/jobs"' in metrics
    finally:
        api.terminate()
        api.wait(30)
        if redis_proc is not None:
            redis_proc.terminate()
            redis_proc.wait(10)
