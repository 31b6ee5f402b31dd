"""A real Prometheus (Debian's package) for the tests, configured from the shipped
deploy/prometheus/prometheus.yml and rules.yml with the targets a test started, scraping and
evaluating every second; and helpers to query it over its HTTP API."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.conftest import REPO

CONFIG = REPO / "deploy" / "prometheus" / "prometheus.yml"
RULES = REPO / "deploy" / "prometheus" / "rules.yml"
INTERVAL = "1s"  # scrape and rule evaluation: alerts fire within a second of their condition


@contextmanager
def prometheus(tmp: Path, targets: dict[str, str]) -> Iterator[str]:
    """Prometheus's URL, scraping `targets` ({scrape job name: host:port}); scrape jobs of the
    shipped config without a target here (node, dcgm) are left out, so are Alertmanagers."""
    from tests.ports import free_port

    exe = shutil.which("prometheus")
    if exe is None:
        pytest.fail("prometheus is not installed; scripts/setup.sh installs the package")
    config = yaml.safe_load(CONFIG.read_text())
    config["global"]["scrape_interval"] = INTERVAL
    config["global"]["evaluation_interval"] = INTERVAL
    config.pop("alerting", None)
    config["rule_files"] = [str(RULES)]
    config["scrape_configs"] = [  # the shipped target labels (a host's `host`) stay
        {
            **scrape,
            "static_configs": [
                {**scrape["static_configs"][0], "targets": [targets[scrape["job_name"]]]}
            ],
        }
        for scrape in config["scrape_configs"]
        if scrape["job_name"] in targets
    ]
    assert {s["job_name"] for s in config["scrape_configs"]} == set(targets), "unknown target"
    for scrape in config["scrape_configs"]:  # the test stacks run without tokens
        scrape.pop("authorization", None)
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    log = tmp / "prometheus.log"
    proc = subprocess.Popen(
        [
            exe,
            f"--config.file={tmp / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=open(log, "wb"),  # noqa: SIM115 - the child owns it
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/-/ready", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None, log.read_text()[-2000:]
            assert time.monotonic() < deadline, "prometheus did not become ready in 60 s"
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(30)


def query(url: str, expr: str) -> list[dict[str, Any]]:
    """The instant vector of `expr` now."""
    body = httpx.get(f"{url}/api/v1/query", params={"query": expr}, timeout=10).json()
    assert body["status"] == "success", (expr, body)
    return list(body["data"]["result"])


def wait_for(url: str, expr: str, timeout_s: float = 90) -> list[dict[str, Any]]:
    """Poll `expr` until it returns data; that data."""
    deadline = time.monotonic() + timeout_s
    while not (result := query(url, expr)):
        assert time.monotonic() < deadline, f"{expr} returned nothing for {timeout_s} s"
        time.sleep(0.5)
    return result


def alerts(url: str) -> list[dict[str, Any]]:
    """Active alerts (pending and firing) with their labels."""
    body = httpx.get(f"{url}/api/v1/alerts", timeout=10).json()
    assert body["status"] == "success", body
    return list(body["data"]["alerts"])
