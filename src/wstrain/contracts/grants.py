"""Granted priority classes, as Slurm's QOS and Kueue's priority classes: an owner may submit
a job above the default class (priority > 0) only as high as an admin granted it, and only as
many such unfinished jobs at once as the grant's quota says. Priorities <= 0 need no grant.

    grant = PriorityGrant(owner="alice", max_priority=50, max_jobs=2, granted_by="ops", ...)
    check_class("alice", 60, grant)        # Forbidden: names the grant and the fix
    effective_priority(60, None)           # 0: a revoked grant stops preempting at once

Admins grant and revoke over /v1/grants (api/routes/grants.py, `wstrain grant`); the
store keeps them in Redis (store/grants.py); the API checks each non-admin
submission and resume; the agent schedules a job admitted under a grant at
min(its priority, its owner's grant now).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from wstrain.contracts.errors import Forbidden

# JobSpec.priority's bounds (spec.py): a grant above 100 would grant nothing more.
MAX_CLASS = 100
# Unfinished jobs above class 0 one grant may hold at once. Rounds consider the queue's first
# 500 jobs (agent/scheduling.py QUEUE_HEAD), ordered by their own class: one owner's class
# jobs, even after a revocation, then fill at most a fifth of it.
MAX_CLASS_JOBS = 100
# An owner's name, as WSTRAIN_API_TOKENS spells it (api/settings.py TokenGrant).
OWNER_PATTERN = r"^[A-Za-z0-9._@-]{1,64}$"


class GrantRequest(BaseModel):
    """PUT /v1/grants/{owner}: the classes above 0 an owner may use, and how many at once."""

    model_config = ConfigDict(extra="forbid")

    max_priority: int = Field(
        ge=1,
        le=MAX_CLASS,
        description="the highest `priority` the owner's jobs may have (1..100); without a "
        "grant an owner may use priority <= 0 only",
    )
    max_jobs: int = Field(
        ge=1,
        le=MAX_CLASS_JOBS,
        description="how many of the owner's unfinished jobs above priority 0 may exist at "
        "once (queued, running or stopping)",
    )


class PriorityGrant(GrantRequest):
    """A grant as stored and answered."""

    owner: str = Field(pattern=OWNER_PATTERN)
    granted_by: str = Field(max_length=64, description="the admin who granted it")
    granted_at: float = Field(ge=0, description="when, seconds since the epoch")
    class_jobs: int = Field(
        default=0,
        ge=0,
        description="the owner's unfinished jobs above priority 0 admitted under a grant now",
    )


class GrantList(BaseModel):
    """GET /v1/grants: every grant for an admin; the caller's own (or none) for a user."""

    grants: list[PriorityGrant]


def grant_command(owner: str, max_priority: int, max_jobs: int) -> str:
    """The CLI line an admin runs to grant this: the fix every refusal names."""
    return f"wstrain grant {owner} --max-priority {max_priority} --max-jobs {max_jobs}"


def check_class(owner: str, priority: int, grant: PriorityGrant | None) -> None:
    """Forbidden unless `owner` may submit at `priority`: <= 0 always, above 0 up to its
    grant's max_priority."""
    if priority <= 0 or (grant is not None and priority <= grant.max_priority):
        return
    if grant is None:
        held = f"{owner} holds no priority grant, so its jobs may use priority <= 0"
        ask = grant_command(owner, priority, 1)
    else:
        held = (
            f"{owner}'s grant allows priority <= {grant.max_priority} "
            f"(max_jobs {grant.max_jobs}, granted by {grant.granted_by})"
        )
        ask = grant_command(owner, priority, grant.max_jobs)
    raise Forbidden(
        f"priority={priority} is above what {owner} may use: {held}; submit at a priority "
        f"{'<= 0' if grant is None else f'<= {grant.max_priority}'} or ask an admin to run "
        f"`{ask}`",
        field="priority",
        owner=owner,
        max_priority=0 if grant is None else grant.max_priority,
    )


def quota_refusal(owner: str, priority: int, grant: PriorityGrant, in_use: int) -> Forbidden:
    """The 403 for a submission at a granted class while the grant's quota is used up."""
    ask = grant_command(owner, grant.max_priority, grant.max_jobs + 1)
    return Forbidden(
        f"priority={priority}: {owner} has {in_use} unfinished jobs above priority 0 and its "
        f"grant's quota is max_jobs={grant.max_jobs}; wait for one to finish, cancel one, "
        f"submit at priority <= 0, or ask an admin to run `{ask}`",
        field="priority",
        owner=owner,
        max_jobs=grant.max_jobs,
        class_jobs=in_use,
    )


def effective_priority(priority: int, grant: PriorityGrant | None) -> int:
    """The class a job admitted under a grant is scheduled at now: its own, capped by its
    owner's current grant (0 without one). Classes <= 0 are never changed."""
    if priority <= 0:
        return priority
    return min(priority, grant.max_priority if grant is not None else 0)
