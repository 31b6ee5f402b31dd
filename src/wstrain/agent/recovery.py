"""Jobs no live agent supervises: what an agent does with its predecessor's on this node
(stop the worker it left, requeue the job to resume from its checkpoint) and with a dead
node's (once their lease has expired: retried from their checkpoint, or failed when their
retries are spent).

Used by agent/agent.py, at start before any claim and then every node_ttl_s.
"""

from __future__ import annotations

import contextlib
import logging
import time

from wstrain.agent.outcomes import requeue, retry_or_fail
from wstrain.agent.processes import stop_process
from wstrain.contracts.errors import Conflict
from wstrain.contracts.jobs import Job, JobState
from wstrain.store import JobStore

log = logging.getLogger(__name__)

LIVE = (JobState.planning, JobState.running, JobState.cancelling)


async def take_back(store: JobStore, job: Job, node: str, agent_id: str, grace_s: float) -> None:
    """A job of this node's previous agent: stop the worker it left (SIGTERM: it writes a
    checkpoint at its next step boundary; SIGKILL after `grace_s`), then requeue the job,
    fenced by the old lease, so it resumes from that checkpoint; one the user cancelled
    ends cancelled. Returns once that worker is gone."""
    lease = await store.lease(job.id)
    if lease.agent_id == agent_id:
        return  # ours, between claim and spawn
    how = "no worker"
    if lease.worker_pid is not None and lease.worker_start is not None:
        how = await stop_process(lease.worker_pid, lease.worker_start, grace_s)
        how = f"worker pid {lease.worker_pid} {how}"
    why = f"agent on {node} restarted ({how})"
    log.warning("job %s: %s", job.id, why)
    with contextlib.suppress(Conflict):  # a concurrent settle or cancel wins
        await requeue(store, job, lease.agent_id, why)


async def fail_orphan(store: JobStore, job: Job) -> None:
    """A job of a node that stopped heartbeating, once its lease has expired (its worker
    there cannot be seen from here, so it is not resumed behind its back before that): an
    automatic retry from its last checkpoint while its retries last, else failed."""
    lease = await store.lease(job.id)
    if lease.expires_at > time.time():
        return
    reason = f"node {job.node} stopped heartbeating"
    try:
        await retry_or_fail(store, job, lease.agent_id, reason)
        log.warning("job %s: %s", job.id, reason)
    except Conflict:
        pass
