"""A real Prometheus, configured from deploy/prometheus.yml, scrapes a running wstrain (API +
agent + a real working-set training job on CPU); every PromQL expression of every dashboard
panel, and the job dashboard's variable query, is evaluated through Prometheus's HTTP API and
must return data."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.conftest import REPO, Stack, tiny_spec, wait_job, wait_terminal

WS = {
    "runtime": "working_set",
    "micro_batch": 2,
    "window": 1,
    "r_param": 2,
    "r_grad": 1,
    "level": 1,
}
# Grafana replaces $__rate_interval by max(4 x scrape interval, step + scrape interval).
RATE_INTERVAL = "10s"


def panel_queries() -> list[tuple[str, str, str]]:
    """(dashboard file, panel title, expr) for every target of every panel."""
    out = []
    for path in sorted((REPO / "dashboards").glob("*.json")):
        for panel in json.loads(path.read_text())["panels"]:
            for target in panel.get("targets", []):
                out.append((path.name, panel["title"], target["expr"]))
    return out


@pytest.fixture
def prometheus(stack: Stack, tmp_path: Path) -> Iterator[str]:
    from wstrain.service.serve import free_port

    exe = shutil.which("prometheus")
    if exe is None:
        pytest.fail("prometheus is not installed; scripts/setup.sh installs the package")
    config = yaml.safe_load((REPO / "deploy" / "prometheus.yml").read_text())
    config["global"]["scrape_interval"] = "1s"
    targets = {
        "wstrain-api": f"127.0.0.1:{stack.port}",
        "wstrain-agent": f"127.0.0.1:{stack.metrics_port}",
    }
    for scrape in config["scrape_configs"]:
        scrape["static_configs"] = [{"targets": [targets[scrape["job_name"]]]}]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    proc = subprocess.Popen(
        [
            exe,
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=open(tmp_path / "prometheus.log", "wb"),  # noqa: SIM115 - the child owns it
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"{url}/-/ready", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert proc.poll() is None, (tmp_path / "prometheus.log").read_text()[-2000:]
        assert time.monotonic() < deadline, "prometheus did not become ready in 60 s"
        time.sleep(0.2)
    yield url
    proc.terminate()
    proc.wait(30)


def query(url: str, expr: str) -> list[dict[str, Any]]:
    body = httpx.get(f"{url}/api/v1/query", params={"query": expr}, timeout=10).json()
    assert body["status"] == "success", (expr, body)
    return body["data"]["result"]


def wait_for(url: str, expr: str, timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while not query(url, expr):
        assert time.monotonic() < deadline, f"{expr} returned nothing for {timeout_s} s"
        time.sleep(0.5)


@pytest.mark.slow
def test_every_dashboard_query_returns_data(stack: Stack, prometheus: str) -> None:
    queries = panel_queries()
    assert len(queries) >= 20, "dashboards lost their panels"
    with stack.client() as c:
        spec = tiny_spec(
            "dash",
            steps=100000,
            overrides=WS,
            eval={"heldout_fraction": 0.1, "every_steps": 5, "sequences": 2},
        )
        job = c.post("/v1/jobs", json=spec).json()
        jid = job["id"]
        wait_job(c, jid, lambda j: j["state"] == "running")
        # Rates need two samples of the counters inside the window.
        wait_for(
            prometheus,
            f'count_over_time(wstrain_stall_seconds_total{{job="{jid}"}}[{RATE_INTERVAL}]) >= 3',
        )
        wait_for(
            prometheus,
            f"count_over_time(wstrain_api_request_duration_seconds_count[{RATE_INTERVAL}]) >= 3",
        )
        empty = []
        for board, title, expr in queries:
            concrete = expr.replace("$job", jid).replace("$__rate_interval", RATE_INTERVAL)
            if not query(prometheus, concrete):
                empty.append(f"{board} / {title}: {concrete}")
        values = httpx.get(
            f"{prometheus}/api/v1/label/job/values", params={"match[]": "wstrain_step_seconds"}
        ).json()["data"]
        c.post(f"/v1/jobs/{jid}/cancel")
        assert wait_terminal(c, jid)["state"] == "cancelled"
    assert not empty, "panels without data:\n" + "\n".join(empty)
    assert jid in values  # the job dashboard's `job` variable offers the running job
