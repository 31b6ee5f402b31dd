"""What a lab sees through a real Prometheus scraping a real `wstrain serve` (its private
Redis, the API and one agent with real workers), with the shipped rules loaded:

- a job that fails before its first step is in `wstrain_job_info` with its owner, name and
  model, and `wstrain_job_state` says `failed`; it never had a throughput series;
- a running job whose worker is SIGSTOPped fires `WstrainJobNoProgress` once its window
  (10x its step time, at least a floor, after its last report) has passed, and not before;
  the shipped rule's expression with its 60 s floor made 10 s (see RULE_FLOOR_S);
- once a job ends its counters are gone from the next scrape: no throughput, no MFU, no
  stalls are shown for a job that runs no more, while its info and state stay.

    pytest -m slow tests/observability/test_alerts_live.py
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
    CORPUS,
    REPO,
    _wait_http,
    seed_node_profile,
    tiny_spec,
    wait_job,
    wait_terminal,
)
from tests.observability import prometheus_server
from tests.observability.prometheus_server import alerts, prometheus, query, wait_for

pytestmark = pytest.mark.slow

WS = {"runtime": "working_set", "micro_batch": 2, "window": 1, "r_param": 2, "r_grad": 1}
# The rule's window: 10 step times, at least 60 s (deploy/prometheus/rules.yml).
SHIPPED_NO_PROGRESS = (
    "time() - wstrain_job_last_progress_timestamp_seconds"
    " > clamp_min(10 * wstrain_job_step_seconds, 60)"
)
# This Prometheus loads the shipped rules.yml with one change: WstrainJobNoProgress's 60 s
# floor is 10 s, so the stopped worker fires it 50 s sooner. The floor's value is held by
# `promtool test rules` (deploy/prometheus/rules_test.yml: silent 60 s does not fire, 120 s
# does); what only a live Prometheus shows is the expression over the series a real agent
# exports, and that needs a floor well past the job's gaps, not 60 s: a tiny job reports
# every 0.2 s and Prometheus scrapes and evaluates every 1 s, so 10 s is 50 reports and ten
# scrapes (the shipped 60 s is six 10 s scrapes), still far past the spread of a running
# job's reports, and still the floor (10x its ~5 ms steps is 0.05 s).
RULE_FLOOR_S = 10
WINDOW_STEPS, WINDOW_MIN_S = 10, float(RULE_FLOOR_S)
# Firing may lag the window by a scrape and an evaluation (1 s each here) and the poll.
FIRE_SLACK_S = 5.0


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, int]]:
    """`wstrain serve` on loopback: (API URL, agent metrics port)."""
    from tests.ports import free_port

    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "WSTRAIN_REDIS_URL")}
    env.update(
        WSTRAIN_CPU_SLOTS="2",
        WSTRAIN_WORKER_THREADS="1",
        WSTRAIN_NODE_NAME="node-lab",
        WSTRAIN_DATA_ROOTS=json.dumps([str(REPO), str(tmp_path)]),
        WSTRAIN_HEARTBEAT_S="0.5",
        PYTHONPATH=str(REPO),
    )
    port, metrics_port = free_port(), free_port()
    cmd = [sys.executable, "-m", "wstrain.cli.main", "serve", "--port", str(port)]
    seed_node_profile(tmp_path / "state")  # measured once by this test process
    cmd += ["--state-dir", str(tmp_path / "state"), "--metrics-port", str(metrics_port)]
    proc = subprocess.Popen(cmd, env=env, cwd=REPO, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_http(f"{url}/readyz", proc, timeout_s=90)
        yield url, metrics_port
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(120)


@pytest.fixture
def rules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The shipped rules.yml, byte for byte but for WstrainJobNoProgress's floor, loaded by
    this test's Prometheus."""
    shipped = prometheus_server.RULES.read_text()
    assert shipped.count(SHIPPED_NO_PROGRESS) == 1, "the shipped rule changed: update the test"
    floored = SHIPPED_NO_PROGRESS.removesuffix(", 60)") + f", {RULE_FLOOR_S})"
    derived = tmp_path / "rules.yml"
    derived.write_text(shipped.replace(SHIPPED_NO_PROGRESS, floored))
    monkeypatch.setattr(prometheus_server, "RULES", derived)
    return derived


def _one(url: str, expr: str) -> float:
    result = query(url, expr)
    assert len(result) == 1, (expr, result)
    return float(result[0]["value"][1])


def test_failed_and_stopped_jobs_as_prometheus_sees_them(
    served: tuple[str, int], rules: Path, tmp_path: Path
) -> None:
    api, metrics_port = served
    port = api.rsplit(":", 1)[1]
    targets = {"wstrain-api": f"127.0.0.1:{port}", "wstrain-agent": f"127.0.0.1:{metrics_port}"}
    doomed = tmp_path / "gone.txt"
    doomed.write_text(CORPUS.read_text())
    with prometheus(tmp_path / "prom", targets) as prom, httpx.Client(base_url=api) as c:
        # fails at once: its data is deleted before its worker opens it (no retries: each
        # would wait its back-off, 30 s then 60 s, to fail the same way)
        spec = tiny_spec("fails-at-once", steps=100, max_retries=0)
        spec["data"]["path"] = str(doomed)
        failing = c.post("/v1/jobs", json=spec, headers={"X-Wstrain-Owner": "ada"}).json()
        doomed.unlink()
        stopped = c.post(
            "/v1/jobs",
            json=tiny_spec("stopped", steps=100000, overrides=WS),
            headers={"X-Wstrain-Owner": "grace"},
        ).json()
        fid, sid = failing["id"], stopped["id"]
        failed = wait_terminal(c, fid)
        assert failed["state"] == "failed" and failed["step"] == 0, failed
        running = wait_job(c, sid, lambda j: j["state"] == "running" and j["step"] >= 5)

        # both in job_info with who and what; the failed one with its state
        wait_for(prom, f'count(wstrain_job_info{{job=~"{fid}|{sid}"}}) == 2')
        # the running job's series gains its node once a scrape after its claim sees it (a
        # scrape between submit and claim has the series without one: seen under load)
        wait_for(prom, f'count(wstrain_job_info{{job="{sid}",node="node-lab"}}) == 1')
        info = query(prom, f'wstrain_job_info{{job=~"{fid}|{sid}"}}')
        labels = {r["metric"]["job"]: r["metric"] for r in info}
        assert labels[fid]["owner"] == "ada" and labels[fid]["name"] == "fails-at-once"
        assert labels[sid]["owner"] == "grace" and labels[sid]["model"] == "micro-llama"
        assert labels[sid]["runtime"] == "working_set" and labels[sid]["node"] == "node-lab"
        wait_for(prom, f'wstrain_job_state{{job="{fid}",state="failed"}} == 1')
        assert query(prom, f'wstrain_job_tokens_total{{job="{fid}"}}') == []
        assert query(prom, f'wstrain_job_steps_total{{job="{fid}"}}') == []

        # the stopped worker: its counters stay (the agent serves them) but stop moving
        wait_for(prom, f'rate(wstrain_job_tokens_total{{job="{sid}"}}[5s]) > 0')
        os.kill(running["worker_pid"], signal.SIGSTOP)
        stopped_at = time.time()
        try:
            time.sleep(2)  # the last report before the stop has been scraped
            last_s = _one(prom, f'wstrain_job_last_progress_timestamp_seconds{{job="{sid}"}}')
            step_s = _one(prom, f'wstrain_job_step_seconds{{job="{sid}"}}')
            window_s = max(WINDOW_STEPS * step_s, WINDOW_MIN_S)
            fired_at = None
            deadline = last_s + window_s + FIRE_SLACK_S + 30
            while time.time() < deadline:
                firing = [
                    a
                    for a in alerts(prom)
                    if a["labels"].get("alertname") == "WstrainJobNoProgress"
                    and a["labels"].get("job") == sid
                    and a["state"] == "firing"
                ]
                if firing:
                    fired_at = time.time()
                    break
                time.sleep(0.5)
            assert fired_at is not None, f"no WstrainJobNoProgress for {sid} in {window_s} s"
            late_s = fired_at - (last_s + window_s)
            assert late_s <= FIRE_SLACK_S, f"fired {late_s:.1f} s after its window"
            assert fired_at - last_s >= window_s - 1.0, "fired before its window"
            assert stopped_at < fired_at
        finally:
            os.kill(running["worker_pid"], signal.SIGCONT)

        # once the job ends, the next scrape has none of its live series
        c.post(f"/v1/jobs/{sid}/cancel")
        assert wait_terminal(c, sid)["state"] == "cancelled"
        gone_by = time.monotonic() + 10
        live = (
            f'{{__name__=~"wstrain_job_(tokens|steps|model_flops|stall_seconds)_total'
            f'|wstrain_job_step_seconds|wstrain_job_last_progress_timestamp_seconds",'
            f'job="{sid}"}}'
        )
        while query(prom, live):
            assert time.monotonic() < gone_by, query(prom, live)
            time.sleep(0.5)
        # a rate over a window still has the last samples for that window (5 s here); the
        # dashboards guard theirs with the live counter, which is gone at once
        guarded = f'rate(wstrain_job_tokens_total{{job="{sid}"}}[5s]) and on(job) {live}'
        assert query(prom, guarded) == []
        while query(prom, f'rate(wstrain_job_tokens_total{{job="{sid}"}}[5s])'):
            assert time.monotonic() < gone_by + 5, "a rate outlived its window"
            time.sleep(0.5)
        wait_for(prom, f'wstrain_job_state{{job="{sid}",state="cancelled"}} == 1')
        # both claims counted in the queue-wait histogram (Redis counts at the claim)
        wait_for(prom, "wstrain_queue_wait_seconds_count >= 2")
        wait_for(prom, 'wstrain_queue_wait_seconds_bucket{le="+Inf"} >= 2')
        # the alert resolves with the series it watched
        resolved_by = time.monotonic() + 10
        while query(prom, f'ALERTS{{alertname="WstrainJobNoProgress",job="{sid}"}}'):
            assert time.monotonic() < resolved_by, "the alert outlived the job"
            time.sleep(0.5)
