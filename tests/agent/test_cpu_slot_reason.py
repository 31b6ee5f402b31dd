"""A job waiting behind a CPU node's busy slots says so: a real agent with one CPU
slot runs one job, and the next one, which the node's memory would fit, shows
`resources: 1 of 1 CPU slots busy` in GET /v1/jobs/ID and in `wstrain queue`, not null and
`-`. Real Redis, real uvicorn, a real agent and worker.

    pytest tests/agent/test_cpu_slot_reason.py
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import Stack, make_stack, tiny_spec, wait_job, wait_terminal
from tests.helpers.cli import cli_process

pytestmark = pytest.mark.slow

BUSY = "resources: 1 of 1 CPU slots busy (WSTRAIN_CPU_SLOTS)"


@pytest.fixture(scope="module")
def one_slot(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = make_stack(
        redis_url,
        tmp_path_factory.mktemp("slot"),
        "slotreason",
        with_agent=True,
        extra_env={"WSTRAIN_CPU_SLOTS": "1"},
    )
    yield s
    s.stop()


def test_a_job_behind_busy_cpu_slots_shows_why_it_waits(one_slot: Stack) -> None:
    with one_slot.client() as c:
        # 100000 steps: the first job holds the one slot until it is cancelled below
        first = c.post("/v1/jobs", json=tiny_spec("slot-first", steps=100000)).json()["id"]
        wait_job(c, first, lambda j: j["state"] == "running", timeout_s=60)
        second = c.post("/v1/jobs", json=tiny_spec("slot-second")).json()["id"]
        try:
            job = wait_job(c, second, lambda j: j["state_reason"] is not None, timeout_s=30)
            assert job["state"] == "queued"
            assert job["state_reason"] == BUSY
            out = cli_process(
                "queue", env={"WSTRAIN_URL": one_slot.url, "COLUMNS": "200"}, timeout_s=60
            )
            assert out.returncode == 0, out.stderr
            row = next(line for line in out.stdout.splitlines() if second in line)
            assert "1 of 1 CPU slots busy" in row
        finally:
            for jid in (second, first):
                c.post(f"/v1/jobs/{jid}/cancel")
            for jid in (first, second):
                assert wait_terminal(c, jid, timeout_s=60)["state"] == "cancelled"
