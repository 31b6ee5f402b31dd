"""Liveness, readiness and Prometheus: GET /healthz (the process answers), GET /readyz
(Redis answers and an agent heartbeats; 503 with the reason when not) and GET /metrics
(api/metrics.py). These three need no token even when tokens are set: the probes answer
a supervisor and /metrics a Prometheus. Without a token /metrics carries counts only (jobs
by state, the queue, nodes, latency by route); the series naming jobs and owners
(wstrain_job_info, wstrain_job_state, wstrain_queue_pending_jobs) need an admin token, which
Prometheus sends from a credentials file (deploy/prometheus/prometheus.yml)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel

from wstrain.api.deps import Metrics, OptionalCaller, Store
from wstrain.api.responses import error_responses

router = APIRouter()


class Health(BaseModel):
    status: str


@router.get(
    "/metrics",
    # a plain Response: its errors are still documented as JSON, its 200 as text only
    response_class=Response,
    responses={
        200: {
            "description": "the Prometheus text format",
            "content": {"text/plain": {"schema": {"type": "string"}}},
        },
        **error_responses(422, 503),
    },
)
async def prometheus(st: Store, metrics: Metrics, caller: OptionalCaller) -> Response:
    body = await metrics.render(st, detailed=caller is not None and caller.admin)
    return Response(body, media_type=CONTENT_TYPE_LATEST)


@router.get("/healthz", response_model=Health)
async def healthz() -> Health:
    return Health(status="ok")


@router.get(
    "/readyz",
    response_model=Health,
    responses={503: {"model": Health, "description": "not ready; `status` says why"}},
)
async def readyz(st: Store) -> Response:
    """Ready when Redis answers and at least one agent heartbeats (a node's record expires
    WSTRAIN_NODE_TTL_S after its agent's last heartbeat): with no agent, jobs would only
    queue."""
    try:
        await st.redis.ping()
        nodes = await st.nodes()
    except Exception as exc:  # any Redis failure means "not ready", with the reason
        return JSONResponse(status_code=503, content={"status": f"redis unreachable: {exc}"})
    if not nodes:
        return JSONResponse(
            status_code=503, content={"status": "no scheduler agent is heartbeating"}
        )
    return JSONResponse(content={"status": "ready"})
