"""FastAPI dependencies of the API's routes, in one place: the settings, the Redis job
store, the planner, the metrics and the request's owner.

A route takes what it needs as an annotated parameter:

    async def get_job(job: VisibleJob) -> Job: ...     # 404 unless the caller may see it

create_app() (api/app.py) puts the objects on `app.state`: settings and metrics when it
builds the app, the store and the planner in its lifespan. Who is asking (`Caller`):
with WSTRAIN_API_TOKENS set, every route needs `Authorization: Bearer <token>` and the
caller is the token's owner with its role; a user reaches only its own jobs (another
owner's job answers 404, as an unknown one: its existence is not leaked), an admin every
job. With no tokens there is no protection (a loopback development server): the owner is
the X-Wstrain-Owner header (or "anonymous") and every caller may act on every job.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from typing import Annotated, cast

from fastapi import Depends, Header, Request

from wstrain.api.metrics import ApiMetrics
from wstrain.api.planning import Planner
from wstrain.api.settings import Role, ServiceSettings
from wstrain.contracts.errors import NotFound, Unauthorized
from wstrain.contracts.jobs import Job
from wstrain.store import JobStore


async def get_settings(request: Request) -> ServiceSettings:
    return cast(ServiceSettings, request.app.state.settings)


async def get_store(request: Request) -> JobStore:
    return cast(JobStore, request.app.state.store)


async def get_planner(request: Request) -> Planner:
    return cast(Planner, request.app.state.planner)


async def get_metrics(request: Request) -> ApiMetrics:
    return cast(ApiMetrics, request.app.state.metrics)


Settings = Annotated[ServiceSettings, Depends(get_settings)]
Store = Annotated[JobStore, Depends(get_store)]
PlannerDep = Annotated[Planner, Depends(get_planner)]
Metrics = Annotated[ApiMetrics, Depends(get_metrics)]


@dataclass(frozen=True)
class Caller:
    owner: str
    admin: bool

    def may_see(self, job: Job) -> bool:
        return self.may_see_owner(job.owner)

    def may_see_owner(self, owner: str) -> bool:
        return self.admin or owner == self.owner


def _grant_for(settings: ServiceSettings, token: str) -> Caller | None:
    # compare every token in constant time, so response timing does not reveal a prefix
    found: Caller | None = None
    for known in settings.api_tokens:
        if hmac.compare_digest(known.encode(), token.encode()):
            grant = settings.grant(known)
            assert grant is not None
            found = Caller(grant.owner, grant.role == Role.admin)
    return found


async def get_caller(
    settings: Settings,
    authorization: Annotated[str | None, Header(max_length=4096)] = None,
    x_wstrain_owner: Annotated[str | None, Header(max_length=64)] = None,
) -> Caller:
    """Who is asking: the bearer token's owner and role when auth is on, else the header's
    claim with every right (no tokens: nothing is protected)."""
    if not settings.api_tokens:
        return Caller(x_wstrain_owner or "anonymous", admin=True)
    scheme, _, token = (authorization or "").partition(" ")
    caller = _grant_for(settings, token.strip()) if scheme.lower() == "bearer" else None
    if caller is None:
        raise Unauthorized(
            "missing or unknown bearer token; set WSTRAIN_TOKEN or send "
            "'Authorization: Bearer <token>'"
        )
    return caller


CallerDep = Annotated[Caller, Depends(get_caller)]


async def get_optional_caller(
    settings: Settings,
    authorization: Annotated[str | None, Header(max_length=4096)] = None,
) -> Caller | None:
    """The caller where one is known, None for a request without a valid token (routes that
    answer everyone, with less for the anonymous: /metrics)."""
    if not settings.api_tokens:
        return Caller("anonymous", admin=True)
    scheme, _, token = (authorization or "").partition(" ")
    return _grant_for(settings, token.strip()) if scheme.lower() == "bearer" else None


OptionalCaller = Annotated[Caller | None, Depends(get_optional_caller)]


async def visible_job(job_id: str, st: Store, caller: CallerDep) -> Job:
    """The job `job_id` if the caller may see it; NotFound as for an unknown job otherwise."""
    job = await st.get(job_id)
    if not caller.may_see(job):
        raise NotFound(f"job {job_id!r} does not exist; list jobs with GET /v1/jobs")
    return job


VisibleJob = Annotated[Job, Depends(visible_job)]
