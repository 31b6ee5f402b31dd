"""Liveness, readiness and Prometheus: GET /healthz (the process answers), GET /readyz
(Redis answers and an agent heartbeats; 503 with the reason when not) and GET /metrics
(queue depth, jobs by state, registered nodes, API request latency by route). These three
need no token even when tokens are set: the probes answer a supervisor and /metrics a
Prometheus that hold no secret, and none of them carries a job id, an owner or a spec —
only counts by state and latency by route."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel

from wstrain.service.api.deps import Metrics, Store

router = APIRouter()


class Health(BaseModel):
    status: str


@router.get("/metrics")
async def prometheus(st: Store, metrics: Metrics) -> Response:
    body = await metrics.render(st)
    return Response(body, media_type=CONTENT_TYPE_LATEST)


@router.get("/healthz", response_model=Health)
async def healthz() -> Health:
    return Health(status="ok")


@router.get("/readyz", response_model=Health)
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
