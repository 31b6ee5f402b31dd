"""agent/stops.py: a preempted worker's deadline is its checkpoint's grace plus the rest of
its step in flight (a long sequence's step takes minutes and it stops only at a step's end),
and preempt() holds its SIGKILL until then: a real process that ignores SIGTERM outlives the
bare grace and is killed at the deadline.

    pytest tests/agent/test_stops.py
"""

from __future__ import annotations

import asyncio
import sys
import time
from types import SimpleNamespace
from typing import cast

import pytest

from wstrain.agent.stops import STEP_SPREAD, preempt, preempt_grace_s
from wstrain.agent.supervisor import WorkerHandle


def test_the_deadline_is_the_grace_and_the_rest_of_the_step_in_flight() -> None:
    assert preempt_grace_s(120.0, None, 0.0, 50.0) == 120.0  # no step of this run to lose
    # a 512K step of 573 s, reported 100 s ago: 1.25 x 573 - 100 s of it may be left
    assert preempt_grace_s(120.0, 573.0, 1000.0, 1100.0) == pytest.approx(
        120.0 + STEP_SPREAD * 573.0 - 100.0
    )
    assert preempt_grace_s(120.0, 573.0, 0.0, 5000.0) == 120.0  # past it: the grace alone
    assert preempt_grace_s(120.0, 0.01, 0.0, 0.0) == pytest.approx(120.0125)  # short steps


async def _preempt_mid_step() -> None:
    # a worker in the middle of a step: it ignores SIGTERM until its step would end
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('ready', flush=True); time.sleep(60)",
        stdout=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None
    await proc.stdout.readline()  # its SIGTERM handler is set
    handle = SimpleNamespace(
        job=SimpleNamespace(id="j-long"),
        proc=proc,
        preempted_by=None,
        resize=None,
        step_s=0.8,
        reported_s=time.monotonic(),
        gang=False,
    )
    grace_s = 0.3
    start = time.monotonic()
    preempt(cast(WorkerHandle, handle), "job j-2", grace_s)
    await asyncio.sleep(0.9)  # past the bare grace: the step in flight may not be done
    assert proc.returncode is None, "killed at the bare grace, mid-step"
    await asyncio.wait_for(proc.wait(), 10)
    assert time.monotonic() - start >= grace_s + STEP_SPREAD * 0.8 - 0.05
    assert proc.returncode == -9 and handle.preempted_by == "job j-2"


def test_preempt_waits_for_the_step_in_flight_before_sigkill() -> None:
    asyncio.run(_preempt_mid_step())
