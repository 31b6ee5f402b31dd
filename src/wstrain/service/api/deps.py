"""FastAPI dependencies of the API's routes, in one place: the settings, the Redis job
store, the planner, the metrics and the request's owner.

A route takes what it needs as an annotated parameter:

    async def get_job(job_id: str, st: Store, _: Owner) -> Job: ...

create_app() (service/app.py) puts the objects on `app.state`: settings and metrics when it
builds the app, the store and the planner in its lifespan. Owner resolution: with no
WSTRAIN_API_TOKENS the owner is the X-Wstrain-Owner header (or "anonymous"); with tokens a
request needs `Authorization: Bearer <token>` and its owner is the token's.
"""

from __future__ import annotations

from typing import Annotated, cast

from fastapi import Depends, Header, Request

from wstrain.scheduler.contracts.errors import Unauthorized
from wstrain.scheduler.store import JobStore
from wstrain.service.api.planning import Planner
from wstrain.service.metrics import ApiMetrics
from wstrain.service.settings import ServiceSettings


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


async def get_owner(
    settings: Settings,
    authorization: Annotated[str | None, Header()] = None,
    x_wstrain_owner: Annotated[str | None, Header()] = None,
) -> str:
    """Who is asking: the bearer token's owner when auth is on, else the header's claim."""
    if not settings.api_tokens:
        return x_wstrain_owner or "anonymous"
    token = (authorization or "").removeprefix("Bearer ").strip()
    if token not in settings.api_tokens:
        raise Unauthorized(
            "missing or unknown bearer token; set WSTRAIN_TOKEN or send "
            "'Authorization: Bearer <token>'"
        )
    return settings.api_tokens[token]


Owner = Annotated[str, Depends(get_owner)]
