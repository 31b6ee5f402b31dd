"""What becomes of a job once its worker has exited: succeeded; cancelled; `timeout` at its
time limit; failed at once when the worker refused the spec before training
(WorkerExit.refused: a path into the state dir or outside the data roots, which no retry
changes) or ran out of a memory budget (WorkerExit.out_of_memory: the same plan would again;
the error names the budget that fits), unless its budget is a range that holds that budget:
then re-planned from there and requeued at once, a retry; requeued when the agent shut
down or the job was preempted (it wrote a checkpoint, the next attempt resumes there); and
when the worker died (killed, OOM-killed, a CUDA error, hung: SIGKILLed by the agent after
its no-progress window, agent/hang.py; a lost node) requeued again as an automatic retry,
with back-off, until the spec's `max_retries` are spent, then failed with the cause. Every
write is fenced by the agent's lease on the job.

Used by agent/supervisor.py (a worker's exit) and recovery.py (a dead node's jobs).
"""

from __future__ import annotations

import logging
import signal
import time
from dataclasses import dataclass, field

from wstrain.contracts.calibration import GIB
from wstrain.contracts.errors import Conflict, LeaseLost
from wstrain.contracts.jobs import Job, JobState, WorkerExit
from wstrain.policy import BudgetPoint
from wstrain.policy.budgets import above_floor
from wstrain.policy.state import gib_count
from wstrain.store import JobStore

log = logging.getLogger(__name__)

# The retry back-off doubles from the agent's WSTRAIN_RETRY_BACKOFF_S (30 s: 30, 60, 120 s)
# up to 15 min: a node that kills every worker (a bad driver) is not hammered, and a job
# hit by one OOM-kill is back within a minute.
MAX_BACKOFF_S = 900.0
_LIVE = frozenset({JobState.running, JobState.cancelling})


@dataclass(frozen=True)
class Resize:
    """A ranged job stopped at a checkpoint to restart at another point of its range: lower
    (`shrink`, room for a job of a higher class) or higher (grow, room no one waits for)."""

    shrink: bool
    to: BudgetPoint

    def text(self, for_job: str) -> str:
        """What its requeue says: shrunk for whom, or grown into what room."""
        device, host = gib_count(self.to.device_bytes), gib_count(self.to.host_bytes)
        to = f"{device} GiB device, {host} GiB host"
        if self.shrink:
            return f"shrunk for {for_job}: restarts lower in its range, at most {to}"
        return f"grows into {for_job}: restarts higher in its range, at {to}"


@dataclass(frozen=True)
class Exit:
    """What the supervisor knows of a worker's end besides its exit code."""

    error: str | None  # the worker's own `error` report
    last_step: int
    cancel_sent: bool  # the user cancelled: SIGTERM forwarded
    shutting_down: bool  # the agent stops: its workers checkpoint and go back to the queue
    timed_out: bool  # SIGTERM at the job's time limit
    preempted_by: str | None  # SIGTERM to make room for this job ("job ID", or no id)
    retry_backoff_s: float
    # out of memory: the budget that would have held it (WorkerMessage.needs_gib)
    needs_gib: dict[str, float] = field(default_factory=dict)
    resize: Resize | None = None  # stopped to restart elsewhere in its range, not evicted


async def settle_exit(store: JobStore, job: Job, fence: str, code: int, ex: Exit) -> None:
    jid = job.id
    stopped = code == WorkerExit.cancelled and not ex.cancel_sent  # by us, at a checkpoint
    # SIGTERM'd by us before its handler was installed (torch's import alone takes ~2.5 s,
    # over 10 s on a loaded host): the signal's meaning stands, a retry would be wrong; the
    # job keeps its last checkpoint
    killed_early = code == -signal.SIGTERM and not ex.cancel_sent
    try:
        if code == WorkerExit.succeeded:
            # error=None: a retried job's earlier cause ("worker killed by SIGKILL") stays in
            # its events, not on a job that succeeded
            await store.transition(
                jid, JobState.succeeded, "training finished", sources=_LIVE, fence=fence, error=None
            )
        elif code == WorkerExit.out_of_memory:  # the same plan would run out again
            await out_of_memory(store, job, fence, ex)
        elif code == WorkerExit.refused:  # the spec itself: a retry would be refused alike
            cause = ex.error or "the worker refused the spec before training; see worker.log"
            await store.transition(
                jid, JobState.failed, f"failed: {cause}", sources=_LIVE, fence=fence, error=cause
            )
        elif (stopped or killed_early) and ex.timed_out:
            limit = job.spec.time_limit_s
            saved = "checkpoint written" if stopped else "killed before this attempt's first step"
            await store.transition(
                jid,
                JobState.timeout,
                f"stopped at step {ex.last_step}: ran past its time limit of {limit:.0f} s; "
                f"{saved}, resume it to continue",
                sources=frozenset({JobState.running}),
                fence=fence,
                state_reason=f"time limit {limit:.0f} s",
            )
        elif ex.preempted_by and not ex.cancel_sent and ex.resize is not None:
            why = ex.resize.text(ex.preempted_by)
            await requeue(store, job, fence, why, f"{why}; stopped at step {ex.last_step}")
        elif ex.preempted_by and not ex.cancel_sent:  # a SIGKILL past the grace too
            why = f"preempted by {ex.preempted_by}"  # scheduling.py's preemptor_text
            await requeue(store, job, fence, why, f"{why} at step {ex.last_step}")
        elif (stopped or killed_early) and ex.shutting_down:
            await requeue(store, job, fence, "agent shut down")
        elif code == WorkerExit.cancelled or (ex.cancel_sent and code == -signal.SIGTERM):
            await store.transition(
                jid,
                JobState.cancelled,
                f"cancelled at step {ex.last_step}; checkpoint written",
                sources=_LIVE,
                fence=fence,
            )
        else:
            await retry_or_fail(store, job, fence, ex.error or describe_exit(code), ex)
    except Conflict as exc:  # someone else settled it, or took the job over; keep theirs
        log.warning("job %s: could not settle after exit %d: %s", jid, code, exc.message)
    log.info("job %s: worker exited with %d", jid, code)


async def out_of_memory(store: JobStore, job: Job, fence: str, ex: Exit) -> None:
    """A worker ran out of a memory budget. A ranged job whose range holds what the worker
    measured goes back to the queue at once, its points under that floor dropped, so its
    next attempt is planned at a point that fits and resumes from its last checkpoint
    (counted as a retry; the event says what changed). Otherwise, or with its retries
    spent, it fails: the worker's error names the budget that fits. A disk budget (a fixed
    number, never a range) too small fails at once."""
    cause = ex.error or "ran out of a memory budget; see worker.log"
    budget, needs = job.spec.budget, ex.needs_gib
    left: tuple[BudgetPoint, ...] = ()
    if budget.ranged and needs and "disk_gib" not in needs and job.retries < job.spec.max_retries:
        floor = (int(needs.get("device_gib", 0) * GIB), int(needs.get("host_gib", 0) * GIB))
        left = above_floor(await store.range_points(job.id), *floor)
    if not left:
        await store.transition(
            job.id, JobState.failed, f"failed: {cause}", sources=_LIVE, fence=fence, error=cause
        )
        return
    low, n = left[0], job.retries + 1
    needed = ", ".join(f"{k.removesuffix('_gib')} {v:g} GiB" for k, v in needs.items())
    reason = (
        f"retry {n} of {job.spec.max_retries}: ran out of memory at {budget.device_gib:g} GiB "
        f"device, {budget.host_gib:g} GiB host (it needs at least {needed}); re-planned in its "
        f"range from {gib_count(low.device_bytes)} GiB device, {gib_count(low.host_bytes)} "
        "GiB host"
    )
    await _to_queue(
        store,
        job,
        fence,
        f"{reason}; requeued to resume from the last checkpoint",
        retries=n,
        points=[[p.device_bytes / GIB, p.host_bytes / GIB, p.tokens_per_s] for p in left],
        state_reason=reason,
        error=cause,
    )
    log.warning("job %s: %s", job.id, reason)


async def retry_or_fail(
    store: JobStore, job: Job, fence: str, cause: str, ex: Exit | None = None
) -> None:
    """A job whose worker died: back to the queue from its last checkpoint while retries
    remain (not before the back-off has passed), else failed with the cause. A job the user
    was cancelling ends failed: nobody wants it retried."""
    backoff_s = ex.retry_backoff_s if ex is not None else 30.0
    if job.retries < job.spec.max_retries:
        n = job.retries + 1
        wait_s = min(backoff_s * 2**job.retries, MAX_BACKOFF_S)
        reason = f"retry {n} of {job.spec.max_retries} after: {cause}"
        try:
            await _to_queue(
                store,
                job,
                fence,
                f"{reason}; requeued to resume from the last checkpoint in {wait_s:.0f} s",
                retries=n,
                not_before=time.time() + wait_s,
                state_reason=f"back-off: {reason}",
                error=cause,
            )
            log.warning("job %s: %s (back-off %.0f s)", job.id, reason, wait_s)
            return
        except Conflict as exc:
            if isinstance(exc, LeaseLost) or exc.detail.get("state") != "cancelling":
                raise
    tried = f" (after {job.retries} automatic retries)" if job.retries else ""
    await store.transition(
        job.id,
        JobState.failed,
        f"failed: {cause}{tried}",
        sources=frozenset({JobState.planning, *_LIVE}),
        error=f"{cause}{tried}; resume the job to continue from its last checkpoint",
        fence=fence,
    )


async def requeue(
    store: JobStore, job: Job, fence: str, why: str, reason: str | None = None
) -> None:
    """Put a job whose worker stopped at a checkpoint back in the queue (attempt + 1) to
    resume there; a job the user cancelled meanwhile ends `cancelled` instead."""
    try:
        await _to_queue(
            store,
            job,
            fence,
            f"{reason or why}; requeued to resume from the last checkpoint",
            state_reason=why,
        )
    except Conflict as exc:
        if isinstance(exc, LeaseLost) or exc.detail.get("state") != JobState.cancelling.value:
            raise
        await store.transition(
            job.id,
            JobState.cancelled,
            f"cancelled ({why}); checkpoint written",
            sources=frozenset({JobState.cancelling}),
            fence=fence,
        )


async def _to_queue(store: JobStore, job: Job, fence: str, message: str, **fields: object) -> None:
    """A live job back to the queue as its next attempt, its placement and worker cleared."""
    await store.transition(
        job.id,
        JobState.queued,
        message,
        sources=frozenset({JobState.planning, JobState.running}),
        fence=fence,
        attempt=job.attempt + 1,
        node=None,
        gpu=None,
        worker_pid=None,
        worker_start=None,
        lease_agent=None,
        **fields,
    )


def describe_exit(code: int) -> str:
    if code < 0:
        return f"worker killed by {signal.Signals(-code).name} (exit {code})"
    return f"worker exited with code {code} without reporting an error; see worker.log"
