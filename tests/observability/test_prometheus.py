"""Every dashboard query against a real Prometheus (tests/observability/prometheus_server.py,
the shipped config and rules) scraping a real wstrain (API + agent, CPU slots) and a real
prometheus-node-exporter, with three jobs in the store: a working-set job training on CPU,
a job that failed at once (its data file deleted right after submit) and a job left queued
(its host budget fits the node but not beside the running job).

Every target of every panel, with $job the running job and $__rate_interval substituted,
must return data, except the panels dashboards/build.py marks as needing a GPU (NVML) or a
peak FLOP/s (MFU); those must still be accepted by Prometheus, and must be exactly the
panels without data, so an unmarked panel can never hide among them. The job board's
variable offers both the running and the failed job.

    pytest -m slow tests/observability/test_prometheus.py
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import httpx
import pytest

from tests.conftest import CORPUS, REPO, Stack, tiny_spec, wait_job, wait_terminal
from tests.observability.prometheus_server import prometheus, query, wait_for

WS = {
    "runtime": "working_set",
    "micro_batch": 2,
    "window": 1,
    "r_param": 2,
    "r_grad": 1,
    "level": 1,
}
# Grafana sets $__rate_interval to max(4 x scrape interval, step + scrape interval); the
# helper scrapes every second, so 10 s holds ~10 samples, and a rate needs 2.
RATE_INTERVAL = "10s"
MIN_SAMPLES = 3
GIB = 1 << 30
# node-exporter's collectors the dashboards read (node_cpu_*, node_memory_*, node_pressure_*);
# the rest stay off: in a container some fail every scrape (systemd: no D-Bus) and each
# scrape of all ~40 costs CPU on a 2-core machine. A panel reading another collector's
# series shows up here without data: add its collector.
NODE_COLLECTORS = ("cpu", "meminfo", "pressure")


def _build_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("dashboards_build", REPO / "dashboards/build.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


BUILD = _build_module()


@dataclass(frozen=True)
class Target:
    board: str
    title: str
    ref: str
    expr: str
    needs: str | None  # build.GPU_ONLY, build.NEEDS_PEAK or None

    def __str__(self) -> str:
        return f"{self.board} / {self.title} / {self.ref}: {self.expr}"


def panel_targets() -> list[Target]:
    """Every target of every panel of every dashboard, with the marker of its panel."""
    out = []
    for path in sorted((REPO / "dashboards").glob("*.json")):
        for panel in json.loads(path.read_text())["panels"]:
            description = panel.get("description", "")
            needs = next((m for m in BUILD.MARKERS if description.startswith(m)), None)
            for t in panel.get("targets", []):
                out.append(Target(path.name, panel["title"], t["refId"], t["expr"], needs))
    return out


@pytest.fixture
def node_exporter(tmp_path: Path) -> Iterator[str]:
    """prometheus-node-exporter (Debian's package) on a free loopback port: host:port."""
    from tests.ports import free_port

    exe = shutil.which("prometheus-node-exporter")
    if exe is None:
        pytest.fail("prometheus-node-exporter is not installed; scripts/setup.sh installs it")
    port = free_port()
    log = tmp_path / "node-exporter.log"
    cmd = [exe, f"--web.listen-address=127.0.0.1:{port}", "--collector.disable-defaults"]
    cmd += [f"--collector.{c}" for c in NODE_COLLECTORS]
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.DEVNULL,
        stderr=open(log, "wb"),  # noqa: SIM115 - the child owns it
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None, log.read_text()[-2000:]
            assert time.monotonic() < deadline, "node-exporter did not answer in 30 s"
            time.sleep(0.1)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(30)


def _concrete(expr: str, job: str) -> str:
    return expr.replace("$job", job).replace("$__rate_interval", RATE_INTERVAL)


def _enough_samples(prom: str, selector: str) -> None:
    wait_for(prom, f"count_over_time({selector}[{RATE_INTERVAL}]) >= {MIN_SAMPLES}")


@pytest.mark.slow
def test_every_dashboard_query_returns_data(
    stack: Stack, node_exporter: str, tmp_path: Path
) -> None:
    targets = panel_targets()
    assert len(targets) >= 40, "dashboards lost their panels"
    marked = [t for t in targets if t.needs]
    assert {t.needs for t in marked} == {BUILD.GPU_ONLY, BUILD.NEEDS_PEAK}
    scrape = {
        "wstrain-api": f"127.0.0.1:{stack.port}",
        "wstrain-agent": f"127.0.0.1:{stack.metrics_port}",
        "node": node_exporter,
    }
    # inside the stack's data roots (tests/conftest.py: the repo and the stack's directory)
    doomed = stack.state_dir.parent / f"gone-{uuid.uuid4().hex[:8]}.txt"
    doomed.write_text(CORPUS.read_text())
    with prometheus(tmp_path / "prom", scrape) as prom, stack.client() as c:
        # fails at once: its data is deleted before its worker opens it (no retries: each
        # would wait its back-off, 30 s then 60 s, to fail the same way)
        spec = tiny_spec("dash-fails", steps=100, max_retries=0)
        spec["data"]["path"] = str(doomed)
        fid = c.post("/v1/jobs", json=spec, headers={"X-Wstrain-Owner": "ada"}).json()["id"]
        doomed.unlink()
        spec = tiny_spec(
            "dash",
            steps=100000,
            overrides=WS,
            eval={"heldout_fraction": 0.1, "every_steps": 5, "sequences": 2},
        )
        jid = c.post("/v1/jobs", json=spec, headers={"X-Wstrain-Owner": "grace"}).json()["id"]
        assert wait_terminal(c, fid)["state"] == "failed"
        wait_job(c, jid, lambda j: j["state"] == "running")
        # stays queued behind the running job: within the node's memory (so accepted), above
        # what the running job's 1 + 2 GiB of budgets leave of it
        host_total = max(n["host_total_bytes"] for n in c.get("/v1/nodes").json()["nodes"])
        spec = tiny_spec("dash-waits", budget={"device_gib": 1, "host_gib": host_total / GIB - 1})
        qid = c.post("/v1/jobs", json=spec, headers={"X-Wstrain-Owner": "hopper"}).json()["id"]
        try:
            assert c.get(f"/v1/jobs/{qid}").json()["state"] == "queued"
            wait_for(prom, 'wstrain_queue_pending_jobs{owner="hopper"} == 1')
            wait_for(prom, f'wstrain_job_state{{job="{fid}",state="failed"}} == 1')
            wait_for(prom, f'wstrain_job_eval_loss{{job="{jid}"}}')
            for counter in (
                f'wstrain_job_stall_seconds_total{{job="{jid}"}}',
                f'wstrain_job_model_flops_total{{job="{jid}"}}',
                "wstrain_api_request_duration_seconds_count",
                "wstrain_queue_wait_seconds_count",
                "node_cpu_seconds_total",
                "node_pressure_memory_stalled_seconds_total",
            ):
                _enough_samples(prom, counter)
            empty = [t for t in targets if not query(prom, _concrete(t.expr, jid))]
            offered = httpx.get(
                f"{prom}/api/v1/label/job/values",
                params={"match[]": "wstrain_job_info"},
                timeout=10,
            ).json()["data"]
            (info,) = [t for t in targets if t.board == "job.json" and t.title == "Job"]
            failed_row = query(prom, _concrete(info.expr, fid))
            gpus = query(prom, "wstrain_gpu_info")
            peak = query(prom, f'wstrain_job_peak_flops_per_second{{job="{jid}"}}')
        finally:
            c.post(f"/v1/jobs/{qid}/cancel")  # first: it would start once the other ends
            assert wait_terminal(c, qid)["state"] == "cancelled"
            c.post(f"/v1/jobs/{jid}/cancel")
            assert wait_terminal(c, jid)["state"] == "cancelled"

    # what a CPU machine cannot show: NVML without GPUs, MFU without a peak FLOP/s
    expected = [
        t
        for t in marked
        if (t.needs == BUILD.GPU_ONLY and not gpus) or (t.needs == BUILD.NEEDS_PEAK and not peak)
    ]
    unexpected = [str(t) for t in empty if t not in expected]
    assert not unexpected, "panels without data:\n" + "\n".join(unexpected)
    assert empty == expected, "marked panels with data:\n" + "\n".join(
        str(t) for t in expected if t not in empty
    )
    assert {jid, fid} <= set(offered), offered  # the job variable lists the failed job too
    assert [r["metric"]["state"] for r in failed_row] == ["failed"], failed_row
    assert failed_row[0]["metric"]["owner"] == "ada"
