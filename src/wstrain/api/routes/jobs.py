"""/v1/jobs: submit a job (validated and planned before it is queued), list and read jobs,
their plans and events, cancel and resume them. Every bit of state is in Redis (JobStore);
the store's Lua script applies each state transition atomically.

    POST /v1/jobs                     201 queued job; 422 with the fix; nothing left behind;
                                      403 for a priority above the owner's grant (grants.py)
    GET  /v1/jobs?state=&owner=&offset=&limit=
    GET  /v1/jobs/{id}, /plan, /events?after=&limit=        404 for an unknown job; a
                                      queued job with its predicted_start/_end
                                      (api/forecast.py)
    POST /v1/jobs/{id}/cancel         202; 409 once finished
    POST /v1/jobs/{id}/resume         202 back to queued as a new attempt; 409 unless
                                      cancelled or failed
"""

from __future__ import annotations

import json
import logging
from typing import Annotated

from fastapi import APIRouter, Query, Response
from pydantic import BaseModel, Field

from wstrain.api.deps import CallerDep, PlannerDep, Settings, Store, VisibleJob
from wstrain.api.forecast import queue_forecast
from wstrain.api.responses import BODY, CALLER, JOB, error_responses
from wstrain.api.routes.grants import Grants, admit_class, class_place
from wstrain.contracts.errors import Conflict, InvalidSpec, NotFound
from wstrain.contracts.jobs import TERMINAL_STATES, Event, Job, JobList, JobState
from wstrain.contracts.plan import Plan
from wstrain.contracts.spec import JobSpec
from wstrain.contracts.stream_ids import LAST_ID, STREAM_ID_SCHEMA, StreamId

log = logging.getLogger(__name__)

router = APIRouter(prefix="/v1/jobs", responses=CALLER)
_FINISHED = {**JOB, **error_responses(409)}  # cancel or resume in the wrong state

_BEFORE_RUNNING = frozenset({JobState.queued, JobState.planning})
_RESUMABLE = frozenset({JobState.cancelled, JobState.failed, JobState.timeout})
_CANCEL_TRIES = 4  # transitions tried while the agent moves the job (cancel)


# 429: the owner's plans already fill WSTRAIN_PLAN_QUEUE_PER_OWNER (api/planning.py)
@router.post(
    "", status_code=201, response_model=Job, responses={**BODY, **error_responses(403, 429)}
)
async def submit(
    spec: JobSpec, st: Store, planner: PlannerDep, caller: CallerDep, grants: Grants
) -> Job:
    # a class above the owner's grant is refused before planning spends a thread on it
    grant = await admit_class(grants, caller, spec.priority)
    for i, dep in enumerate(spec.after):  # a dependency the caller may not see is unknown
        try:
            owner, _ = await st.get_json(dep)
        except NotFound:
            owner = None
        if owner is None or not caller.may_see_owner(owner):
            raise InvalidSpec(
                f"after[{i}]: job {dep!r} does not exist; name jobs of yours "
                "(GET /v1/jobs lists them)",
                field=f"after[{i}]",
            )
    plan = await planner.plan(spec, await st.nodes(), caller.owner)  # behind its own plans
    async with class_place(grants, grant, spec.priority) as bind:  # 403 over the quota
        job = await st.create(spec, caller.owner, plan)
        await bind(job.id)
    log.info("job %s: submitted by %s (%s)", job.id, caller.owner, spec.name)
    return job


def _json(model: BaseModel) -> Response:
    # Serialised here, once: FastAPI would dump a returned model to a dict and validate it
    # again against the response model, 4 ms for a page of 50 jobs, most of a list's time
    # (bench/api_load.py). The response_model on the route still documents the body.
    return Response(model.model_dump_json(), media_type="application/json")


@router.get("", response_model=JobList)
async def list_jobs(
    st: Store,
    caller: CallerDep,
    state: JobState | None = None,
    owner: Annotated[str | None, Query(max_length=64)] = None,
    offset: Annotated[int, Query(ge=0, le=1_000_000)] = 0,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
) -> Response:
    """A user lists its own jobs only (another owner's filter lists nothing); an admin
    lists every owner's, or one owner's with `owner`."""
    if not caller.admin:
        if owner is not None and owner != caller.owner:
            return _json(JobList(jobs=[], total=0, offset=offset, limit=limit))
        owner = caller.owner
    jobs, total = await st.list_json(state, owner, offset, limit)
    # JobList's JSON from each job's JSON, dumped once per job revision by the store
    body = f'{{"jobs":[{",".join(jobs)}],"total":{total},"offset":{offset},"limit":{limit}}}'
    return Response(body, media_type="application/json")


class JobView(Job):
    """A job as GET /v1/jobs/{id} shows it: a queued one with its forecast."""

    predicted_start: float | None = Field(
        default=None,
        description="queued jobs only: epoch seconds it is predicted to start (as GET "
        "/v1/queue); null when it cannot be predicted or the job is not queued",
    )
    predicted_end: float | None = Field(
        default=None,
        description="queued jobs only: epoch seconds it is predicted to end; null when unknown",
    )


@router.get("/{job_id}", response_model=JobView, responses=JOB)
async def get_job(job_id: str, st: Store, caller: CallerDep, settings: Settings) -> Response:
    # the store's JSON of this revision of the job: no parse, no dump (bench/api_load.py)
    owner, body = await st.get_json(job_id)
    if not caller.may_see_owner(owner):
        raise NotFound(f"job {job_id!r} does not exist; list jobs with GET /v1/jobs")
    if '"state":"queued"' in body and body.endswith("}"):  # only a queued job replays the queue
        got = (await queue_forecast(st, settings.policy_config())).get(job_id)
        if got is not None:
            extra = json.dumps({"predicted_start": got.start_s, "predicted_end": got.end_s})
            body = f"{body[:-1]},{extra[1:]}"
    return Response(body, media_type="application/json")


@router.get("/{job_id}/plan", response_model=Plan, responses=JOB)
async def get_plan(job: VisibleJob) -> Plan:
    assert job.plan is not None, "every stored job carries the plan it was admitted with"
    return job.plan


@router.get("/{job_id}/events", response_model=list[Event], responses=JOB)
async def get_events(
    job: VisibleJob,
    st: Store,
    # a Redis stream id, as the events carry it: "<ms>-<seq>" (or "<ms>"), parts <= 2^64-1
    after: Annotated[StreamId | None, Query(json_schema_extra=STREAM_ID_SCHEMA)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> list[Event]:
    if after == LAST_ID:  # nothing follows it, and Redis refuses to read after it
        return []
    return await st.events(job.id, after, limit)


@router.post("/{job_id}/cancel", status_code=202, response_model=Job, responses=_FINISHED)
async def cancel(job: VisibleJob, st: Store, caller: CallerDep) -> Job:
    job_id, who = job.id, caller.owner
    # The state read with the job can move before the transition lands (the agent claims a
    # queued job, its worker starts, or the agent gives it back): each try reads it again.
    # One agent step falls between a read and a write in practice; after the last try the
    # state read is answered as the first was.
    for tries_left in range(_CANCEL_TRIES, -1, -1):
        if job.state in TERMINAL_STATES:
            raise Conflict(
                f"job {job_id} is already {job.state.value}; only queued, planning or running "
                "jobs can be cancelled",
                state=job.state.value,
            )
        if job.state == JobState.cancelling:
            return job
        if not tries_left:
            break
        try:
            if job.state in _BEFORE_RUNNING:
                await st.transition(
                    job_id,
                    JobState.cancelled,
                    f"cancelled by {who} before it ran",
                    sources=_BEFORE_RUNNING,
                )
            else:
                # A running job stops at its next step boundary, after a checkpoint (the
                # agent forwards the cancel to its worker), so it passes through `cancelling`.
                await st.transition(
                    job_id,
                    JobState.cancelling,
                    f"cancel requested by {who}; stopping at the next step",
                    sources=frozenset({JobState.running}),
                )
            return await st.get(job_id)
        except Conflict:
            job = await st.get(job_id)
    raise Conflict(
        f"job {job_id} changed state on every try to cancel it (now {job.state.value}); "
        "cancel it again",
        state=job.state.value,
    )


@router.post(
    "/{job_id}/resume",
    status_code=202,
    response_model=Job,
    responses={**_FINISHED, **error_responses(403)},
)
async def resume(job: VisibleJob, st: Store, caller: CallerDep, grants: Grants) -> Job:
    job_id, who = job.id, caller.owner
    if job.state not in _RESUMABLE:
        raise Conflict(
            f"job {job_id} is {job.state.value}; only cancelled, failed or timed-out jobs can "
            "be resumed",
            state=job.state.value,
        )
    where = job.last_checkpoint or "the start (no checkpoint yet)"
    grant = await admit_class(grants, caller, job.spec.priority)  # the grant may be revoked
    async with class_place(grants, grant, job.spec.priority) as bind:
        await st.transition(
            job_id,
            JobState.queued,
            f"resumed by {who} from {where}",
            sources=_RESUMABLE,
            attempt=job.attempt + 1,
            error=None,
            node=None,
            worker_pid=None,
        )
        await bind(job_id)
    return await st.get(job_id)
