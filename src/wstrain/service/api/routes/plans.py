"""POST /v1/plans: validate a JobSpec and answer the plan it would run with, queueing nothing
(`wstrain plan spec.yaml`). Errors are those of POST /v1/jobs: 422 with the fix."""

from __future__ import annotations

from fastapi import APIRouter

from wstrain.scheduler.contracts.plan import Plan
from wstrain.scheduler.contracts.spec import JobSpec
from wstrain.service.api.deps import CallerDep, PlannerDep, Store
from wstrain.service.api.responses import BODY, CALLER

router = APIRouter(prefix="/v1/plans", responses=CALLER)


@router.post("", response_model=Plan, responses=BODY)
async def dry_run(spec: JobSpec, st: Store, planner: PlannerDep, _: CallerDep) -> Plan:
    return await planner.plan(spec, await st.nodes())
