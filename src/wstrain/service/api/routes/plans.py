"""POST /v1/plans: validate a JobSpec and answer the plan it would run with, queueing nothing
(`wstrain plan spec.yaml`). Errors are those of POST /v1/jobs: 422 with the fix; 403 for a
`priority` above the owner's grant or over its quota (routes/grants.py)."""

from __future__ import annotations

from fastapi import APIRouter

from wstrain.scheduler.contracts.plan import Plan
from wstrain.scheduler.contracts.spec import JobSpec
from wstrain.service.api.deps import CallerDep, PlannerDep, Store
from wstrain.service.api.responses import BODY, CALLER, error_responses
from wstrain.service.api.routes.grants import Grants, admit_class, check_quota

router = APIRouter(prefix="/v1/plans", responses=CALLER)


# 429: the owner's plans already fill WSTRAIN_PLAN_QUEUE_PER_OWNER (api/planning.py)
@router.post("", response_model=Plan, responses={**BODY, **error_responses(403, 429)})
async def dry_run(
    spec: JobSpec, st: Store, planner: PlannerDep, caller: CallerDep, grants: Grants
) -> Plan:
    await check_quota(grants, await admit_class(grants, caller, spec.priority), spec.priority)
    return await planner.plan(spec, await st.nodes(), caller.owner)  # behind its own plans
