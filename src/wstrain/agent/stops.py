"""How the agent stops a worker that has not finished: its job's time limit, a preemption
(or a ranged job's resize) and a cancel. Each is a SIGTERM, after which the worker ends the
step in flight, reports `stopping`, checkpoints and exits (worker/main.py); only a
preemption has a deadline, past which it is SIGKILLed (its job restarts from its last
checkpoint).

A step is the unit of that stop, and a long sequence's step takes minutes: 573 s at 512K
tokens over 32 layers, ~2,500 s planned for a million (bench/RESULTS.md#long-context), and
longer where a job packed beside it shares the GPU. So a preempted worker's `grace_s` runs
from its `stopping` report, not from the SIGTERM: killed mid-step it would lose every step
since its last checkpoint (with the default checkpoint_every 0, its whole run). Until that
report the hang window (agent/hang.py) bounds a worker that never gets there. One that has
reported no step of this run has none to lose: its grace runs from the SIGTERM.

    preempt(handle, "job j-2", grace_s=120.0)   # SIGTERM; SIGKILL grace_s after `stopping`
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time

from wstrain.agent.outcomes import Resize
from wstrain.agent.processes import kill_group
from wstrain.agent.supervisor import WorkerHandle
from wstrain.contracts.errors import LeaseLost
from wstrain.contracts.jobs import JobState
from wstrain.store import JobStore

log = logging.getLogger(__name__)


async def enforce_time_limit(store: JobStore, h: WorkerHandle, grace_s: float) -> None:
    """The job's `time_limit_s`, counted from this worker's start: a warning event `grace_s`
    before it, then SIGTERM at it (the worker checkpoints at its next step boundary and
    exits; the job ends `timeout`, resumable)."""
    limit_s = h.job.spec.time_limit_s
    if limit_s is None:
        return
    warn_in_s = max(0.0, limit_s - grace_s)
    await asyncio.sleep(warn_in_s)
    if h.proc.returncode is not None or h.lease_lost:
        return
    left_s = limit_s - warn_in_s
    with contextlib.suppress(LeaseLost):
        await store.report(
            h.job.id,
            h.fence,
            (
                "time_limit",
                f"time limit {limit_s:.0f} s: checkpoint and stop in {left_s:.0f} s",
                {"time_limit_s": limit_s, "stop_in_s": left_s},
            ),
        )
    await asyncio.sleep(left_s)
    if h.proc.returncode is None and not h.lease_lost and not h.cancel_sent:
        h.timed_out = True
        h.proc.send_signal(signal.SIGTERM)
        log.info(
            "job %s: time limit %.0f s reached; stopping pid %d", h.job.id, limit_s, h.proc.pid
        )


def preempt(h: WorkerHandle, for_job: str, grace_s: float, resize: Resize | None = None) -> None:
    """Stop the worker to make room for `for_job` (its owner's words for it: "job ID" or
    "another owner's job of priority P"): SIGTERM (it checkpoints at its next step boundary
    and exits; its job is requeued, not failed), SIGKILL if it has not exited `grace_s`
    after it reported `stopping` (or after the SIGTERM, before its first step report;
    requeued all the same, from its last checkpoint). `resize`: a ranged job stopped to
    restart lower in its range (room for `for_job`) or higher (`for_job` names the room),
    not evicted: the same stop, and its requeue says so."""
    if h.preempted_by or h.proc.returncode is not None:
        return
    h.preempted_by, h.resize = for_job, resize
    what = "preempted" if resize is None else "shrunk" if resize.shrink else "grown"
    log.info("job %s: %s for %s; stopping pid %d", h.job.id, what, for_job, h.proc.pid)

    def kill() -> None:
        if h.proc.returncode is None:
            log.warning("job %s: no checkpoint %.0f s after preemption; SIGKILL", h.job.id, grace_s)
            h.proc.kill()
            if h.gang:  # its ranks as well: the worker leads their process group
                kill_group(h.proc.pid)

    def arm() -> None:
        asyncio.get_running_loop().call_later(grace_s, kill)

    if h.step_s is None:  # no step of this run reported: nothing of it to lose
        arm()
    else:  # the grace counts from the end of the step in flight (supervisor's `stopping`)
        h.on_stopping = arm
    h.proc.send_signal(signal.SIGTERM)


async def forward_cancel(store: JobStore, h: WorkerHandle) -> None:
    """SIGTERM the worker once its job is `cancelling`: it checkpoints and exits 3."""
    if h.cancel_sent or not h.started or h.proc.returncode is not None:
        return
    state = await store.redis.hget(store.keys.job(h.job.id), "state")
    if state == JobState.cancelling.value:
        h.cancel_sent = True
        h.proc.send_signal(signal.SIGTERM)
        log.info("job %s: cancel forwarded to pid %d at %.0f", h.job.id, h.proc.pid, time.time())
