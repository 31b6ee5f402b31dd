"""GET /v1/queue: the pending jobs in the order the scheduling policy will consider them
(priority class, then the owner's fair-share factor, then submission; policy/),
each with its position, its owner's factor, why it waits (written by the agents each
round: quota, resources, dependency, back-off, priority) and when it is predicted to start
and end (api/forecast.py: the queue replayed forward on the policy's rules from the running
jobs' remaining steps x step times). `wstrain queue` prints it.

A user sees only their own jobs, at their true positions among everyone's (`total` counts
all); an admin sees every job. The head of the queue the agents consider (500 jobs) is what
is shown: a job past it waits behind them all.
"""

from __future__ import annotations

import time

from fastapi import APIRouter
from pydantic import BaseModel, Field

from wstrain.api.deps import CallerDep, Settings, Store
from wstrain.api.forecast import QUEUE_HEAD, queue_forecast
from wstrain.api.responses import CALLER
from wstrain.contracts.calibration import GIB
from wstrain.policy import PendingJob, Usage, fair_share_factors, order_key
from wstrain.store.scheduling import SchedulingView

router = APIRouter(prefix="/v1", responses=CALLER)


class QueueEntry(BaseModel):
    position: int = Field(description="1 = considered first")
    id: str
    name: str
    owner: str
    priority: int
    fair_share_factor: float = Field(description="2^(-(usage share)/(share)), 0..1")
    state_reason: str | None = Field(description="why it waits, as of the last agent round")
    wait_s: float = Field(description="seconds since it was (re)queued")
    device_gib: float
    host_gib: float
    predicted_start: float | None = Field(
        default=None,
        description="epoch seconds it is predicted to start: the queue replayed forward on "
        "the policy's rules, running jobs ending after their remaining steps x step time; "
        "null when it cannot be predicted (predicted_reason says why)",
    )
    predicted_end: float | None = Field(
        default=None,
        description="epoch seconds it is predicted to end: predicted_start + its steps x "
        "the plan's predicted step time; null when either is unknown",
    )
    predicted_reason: str | None = Field(
        default=None,
        max_length=500,
        description="why predicted_start or predicted_end is null (e.g. no node could ever "
        "take it)",
    )


class Queue(BaseModel):
    jobs: list[QueueEntry]
    total: int = Field(description="pending jobs of every owner in the considered head")


@router.get("/queue", response_model=Queue)
async def queue(st: Store, caller: CallerDep, settings: Settings) -> Queue:
    view = SchedulingView(st)
    now = time.time()
    config = settings.policy_config()
    rows = await view.pending(QUEUE_HEAD)
    usage = {o: Usage(u, now) for o, u in (await view.usage(now, config.half_life_s)).items()}
    owners = sorted({r.owner for r in rows} | set(usage) | set(config.shares))
    factors = fair_share_factors(usage, owners, config, now)
    jobs = {
        r.id: PendingJob(r.id, r.owner, r.priority, r.queued_at, r.device_bytes, r.host_bytes)
        for r in rows
    }
    ordered = sorted(rows, key=lambda r: order_key(jobs[r.id], factors))
    mine = [r for r in rows if caller.may_see_owner(r.owner)]
    forecasts = await queue_forecast(st, config, rows) if mine else {}
    entries = [
        QueueEntry(
            position=i + 1,
            id=r.id,
            name=r.name,
            owner=r.owner,
            priority=r.priority,
            fair_share_factor=factors.get(r.owner, 1.0),
            state_reason=r.state_reason or None,
            wait_s=max(0.0, now - r.queued_at),
            device_gib=r.device_bytes / GIB,
            host_gib=r.host_bytes / GIB,
            predicted_start=None if (f := forecasts.get(r.id)) is None else f.start_s,
            predicted_end=None if f is None else f.end_s,
            predicted_reason=None if f is None else f.reason or None,
        )
        for i, r in enumerate(ordered)
        if caller.may_see_owner(r.owner)
    ]
    return Queue(jobs=entries, total=len(rows))
