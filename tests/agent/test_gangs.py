"""Jobs on several GPUs with a real agent and real workers on a CPU machine whose agent
models GPUs out of host memory (WSTRAIN_CPU_DEVICES_GIB): a gang of two starts on two
distinct "GPUs" at once (Job.gpu "0,1"), a second gang waits with its reason and holds no
GPU until the first ends, then runs.

    pytest -m slow tests/agent/test_gangs.py
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.conftest import make_stack, tiny_spec, wait_job, wait_terminal
from wstrain.contracts.jobs import gpu_indices

pytestmark = pytest.mark.slow


def test_a_gang_takes_two_modelled_gpus_and_a_second_waits(redis_url: str, tmp_path: Path) -> None:
    # three 2.5 GiB "GPUs": a 2 GiB rank fills one, so only one gang of two fits at a time
    stack = make_stack(
        redis_url,
        tmp_path,
        "gangs",
        with_agent=True,
        extra_env={"WSTRAIN_CPU_DEVICES_GIB": "[2.5, 2.5, 2.5]"},
    )
    budget = {"device_gib": 2, "host_gib": 2}
    try:
        with stack.client() as c:
            first = c.post(
                "/v1/jobs", json=tiny_spec("gang-1", gpus=2, budget=budget, steps=100000)
            )
            assert first.status_code == 201, first.text
            a = first.json()["id"]
            running = wait_job(c, a, lambda j: j["state"] == "running")
            held = gpu_indices(running["gpu"])
            assert len(held) == 2 and len(set(held)) == 2, running["gpu"]
            assert c.get(f"/v1/jobs/{a}/plan").json()["ranks"] == 2

            second = c.post("/v1/jobs", json=tiny_spec("gang-2", gpus=2, budget=budget, steps=5))
            b = second.json()["id"]
            waiting = wait_job(c, b, lambda j: bool(j["state_reason"]))
            assert waiting["state"] == "queued" and waiting["gpu"] is None
            assert waiting["state_reason"].startswith(
                "resources: needs 2 GPUs with 2.0 GiB free on one node; 1 has it"
            ), waiting["state_reason"]
            time.sleep(2)  # rounds go by: still nothing claimed for it
            assert c.get(f"/v1/jobs/{b}").json()["state"] == "queued"

            c.post(f"/v1/jobs/{a}/cancel")
            assert wait_terminal(c, a)["state"] == "cancelled"
            started = wait_job(c, b, lambda j: j["state"] != "queued")
            assert len(gpu_indices(started["gpu"])) == 2
            c.post(f"/v1/jobs/{b}/cancel")
            wait_terminal(c, b)
    finally:
        stack.stop()
