"""The wstrain REST API (v1): a stateless FastAPI app over the Redis job store.

Run it with `wstrain serve` (API + agent + Redis), or alone:
    uvicorn --factory wstrain.service.app:create_app --host 127.0.0.1 --port 8000
"""


import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated

from fastapi import Depends, FastAPI, Header, Query, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel

from wstrain.scheduler.contracts.jobs import (TERMINAL_STATES, Event, Job, JobList, JobSpec, JobState, Node,
                                 Plan, PresetList)
from wstrain.scheduler.contracts.errors import Conflict, Unauthorized, WstrainError
from wstrain.scheduler.contracts.model_dims import preset_list
from wstrain.scheduler.store import JobStore
from wstrain.service.metrics import ApiMetrics
from wstrain.service.settings import ServiceSettings
from wstrain.service.validation import validate_and_plan

log = logging.getLogger(__name__)


class Health(BaseModel):
    status: str


class NodeList(BaseModel):
    nodes: list[Node]


def create_app(settings: ServiceSettings | None = None) -> FastAPI:
    settings = settings or ServiceSettings()
    metrics = ApiMetrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.store = JobStore.from_url(settings.redis_url, settings.key_prefix)
        yield
        await app.state.store.close()

    app = FastAPI(title="wstrain", version="1", lifespan=lifespan,
                  description="Training jobs under hard device- and host-memory budgets.")

    @app.exception_handler(WstrainError)
    async def _wstrain_error(_: Request, exc: WstrainError) -> JSONResponse:
        return JSONResponse(status_code=exc.status, content={"detail": exc.message, **exc.detail})

    @app.middleware("http")
    async def _time_requests(request: Request, call_next):  # type: ignore[no-untyped-def]
        start = time.perf_counter()
        response = await call_next(request)
        route = request.scope.get("route")
        metrics.observe(request.method, getattr(route, "path", "unmatched"),
                        response.status_code, time.perf_counter() - start)
        return response

    def store(request: Request) -> JobStore:
        return request.app.state.store

    def owner(authorization: Annotated[str | None, Header()] = None,
              x_wstrain_owner: Annotated[str | None, Header()] = None) -> str:
        if not settings.api_tokens:
            return x_wstrain_owner or "anonymous"
        token = (authorization or "").removeprefix("Bearer ").strip()
        if token not in settings.api_tokens:
            raise Unauthorized("missing or unknown bearer token; set WSTRAIN_TOKEN or send "
                               "'Authorization: Bearer <token>'")
        return settings.api_tokens[token]

    Store = Annotated[JobStore, Depends(store)]
    Owner = Annotated[str, Depends(owner)]

    @app.post("/v1/jobs", status_code=201, response_model=Job)
    async def submit(spec: JobSpec, st: Store, who: Owner) -> Job:
        plan = validate_and_plan(spec, await st.nodes(), settings.data_roots)
        job = await st.create(spec, who, plan)
        log.info("job %s: submitted by %s (%s)", job.id, who, spec.name)
        return job

    @app.get("/v1/jobs", response_model=JobList)
    async def list_jobs(st: Store, _: Owner, state: JobState | None = None,
                        owner: str | None = None, offset: Annotated[int, Query(ge=0)] = 0,
                        limit: Annotated[int, Query(ge=1, le=500)] = 50) -> JobList:
        jobs, total = await st.list(state, owner, offset, limit)
        return JobList(jobs=jobs, total=total, offset=offset, limit=limit)

    @app.get("/v1/jobs/{job_id}", response_model=Job)
    async def get_job(job_id: str, st: Store, _: Owner) -> Job:
        return await st.get(job_id)

    @app.get("/v1/jobs/{job_id}/plan", response_model=Plan)
    async def get_plan(job_id: str, st: Store, _: Owner) -> Plan:
        job = await st.get(job_id)
        assert job.plan is not None, "every stored job carries the plan it was admitted with"
        return job.plan

    @app.get("/v1/jobs/{job_id}/events", response_model=list[Event])
    async def get_events(job_id: str, st: Store, _: Owner, after: str | None = None,
                         limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> list[Event]:
        await st.get(job_id)  # 404 for an unknown job rather than an empty list
        return await st.events(job_id, after, limit)

    @app.post("/v1/jobs/{job_id}/cancel", status_code=202, response_model=Job)
    async def cancel(job_id: str, st: Store, who: Owner) -> Job:
        job = await st.get(job_id)
        if job.state in TERMINAL_STATES:
            raise Conflict(f"job {job_id} is already {job.state.value}; only queued, planning "
                           "or running jobs can be cancelled", state=job.state.value)
        if job.state == JobState.cancelling:
            return job
        if job.state in (JobState.queued, JobState.planning):
            await st.transition(job_id, JobState.cancelled, f"cancelled by {who} before it ran",
                                sources=frozenset({JobState.queued, JobState.planning}))
        else:
            await st.transition(job_id, JobState.cancelling,
                                f"cancel requested by {who}; stopping at the next step",
                                sources=frozenset({JobState.running}))
        return await st.get(job_id)

    @app.post("/v1/jobs/{job_id}/resume", status_code=202, response_model=Job)
    async def resume(job_id: str, st: Store, who: Owner) -> Job:
        job = await st.get(job_id)
        if job.state not in (JobState.cancelled, JobState.failed):
            raise Conflict(f"job {job_id} is {job.state.value}; only cancelled or failed jobs "
                           "can be resumed", state=job.state.value)
        where = job.last_checkpoint or "the start (no checkpoint yet)"
        await st.transition(job_id, JobState.queued, f"resumed by {who} from {where}",
                            sources=frozenset({JobState.cancelled, JobState.failed}),
                            attempt=job.attempt + 1, error=None, node=None, worker_pid=None)
        return await st.get(job_id)

    @app.post("/v1/plans", response_model=Plan)
    async def dry_run(spec: JobSpec, st: Store, _: Owner) -> Plan:
        return validate_and_plan(spec, await st.nodes(), settings.data_roots)

    @app.get("/v1/nodes", response_model=NodeList)
    async def nodes(st: Store, _: Owner) -> NodeList:
        return NodeList(nodes=await st.nodes())

    @app.get("/v1/presets", response_model=PresetList)
    async def presets(_: Owner) -> PresetList:
        return PresetList(presets=preset_list())

    @app.get("/metrics")
    async def prometheus(st: Store) -> Response:
        body = await metrics.render(st)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    @app.get("/healthz", response_model=Health)
    async def healthz() -> Health:
        return Health(status="ok")

    @app.get("/readyz", response_model=Health)
    async def readyz(st: Store) -> Response:
        try:
            await st.redis.ping()
        except Exception as exc:  # any Redis failure means "not ready", with the reason
            return JSONResponse(status_code=503, content={"status": f"redis unreachable: {exc}"})
        return JSONResponse(content={"status": "ready"})

    return app
