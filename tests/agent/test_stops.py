"""agent/stops.py with supervisor.heard: a preempted worker's SIGKILL deadline runs from
its `stopping` report (it has ended its step in flight; a long sequence's step takes
minutes), not from the SIGTERM, so a real process that ignores SIGTERM mid-step outlives
the grace until it reports `stopping`, then is killed the grace later; one that has
reported no step of this run is killed the grace after the SIGTERM. The worker's side (it
reports `stopping` before its checkpoint): tests/e2e/test_jobs.py's cancel.

    pytest tests/agent/test_stops.py
"""

from __future__ import annotations

import asyncio
import sys
import time
from types import SimpleNamespace

from wstrain.agent.stops import preempt
from wstrain.agent.supervisor import WorkerHandle, heard
from wstrain.contracts.jobs import WorkerMessage

GRACE_S = 0.3


async def _mid_step(step_s: float | None) -> tuple[SimpleNamespace, asyncio.subprocess.Process]:
    """A worker in the middle of a step, ignoring SIGTERM, as a handle sees it."""
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
        step_s=step_s,
        reported_s=time.monotonic(),
        on_stopping=None,
        gang=False,
    )
    return handle, proc


async def _killed_after_stopping() -> None:
    handle, proc = await _mid_step(step_s=600.0)  # a 512K step: 10 minutes
    preempt(handle, "job j-2", GRACE_S)  # type: ignore[arg-type]
    await asyncio.sleep(3 * GRACE_S)  # past the grace: its step has not ended
    assert proc.returncode is None, "killed at the grace from the SIGTERM, mid-step"
    stopped = time.monotonic()
    heard(handle, WorkerMessage(kind="stopping", step=7))  # type: ignore[arg-type]
    assert handle.on_stopping is None  # armed once
    await asyncio.wait_for(proc.wait(), 10)
    assert time.monotonic() - stopped >= GRACE_S - 0.05
    assert proc.returncode == -9 and handle.preempted_by == "job j-2"


async def _killed_at_grace_before_a_step() -> None:
    handle, proc = await _mid_step(step_s=None)  # its first step of this run: none to lose
    start = time.monotonic()
    preempt(handle, "job j-2", GRACE_S)  # type: ignore[arg-type]
    await asyncio.wait_for(proc.wait(), 10)  # only a hang takes that long
    assert time.monotonic() - start >= GRACE_S - 0.05 and proc.returncode == -9


def test_a_preempted_worker_is_killed_the_grace_after_it_reports_stopping() -> None:
    asyncio.run(_killed_after_stopping())


def test_a_worker_with_no_step_yet_is_killed_the_grace_after_the_sigterm() -> None:
    asyncio.run(_killed_at_grace_before_a_step())


def test_heard_keeps_the_last_step_and_the_time_of_every_report() -> None:
    h = SimpleNamespace(reported_s=0.0, step_s=None, on_stopping=None)
    heard(h, WorkerMessage(kind="step", step=3, step_seconds=12.4))  # type: ignore[arg-type]
    assert h.step_s == 12.4 and h.reported_s > 0
    before = h.reported_s
    heard(h, WorkerMessage(kind="eval", step=3, loss=2.0))  # type: ignore[arg-type]
    assert h.step_s == 12.4 and h.reported_s >= before
    assert WorkerHandle.__dataclass_fields__["on_stopping"].default is None
