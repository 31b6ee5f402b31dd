"""POST /v1/plans: validate a JobSpec and answer the plan it would run with, queueing nothing
(`wstrain plan spec.yaml`). Errors are those of POST /v1/jobs: 422 with the fix; 403 for a
`priority` above the owner's grant or over its quota (routes/grants.py).

POST /v1/plans?gpu=h100 (`wstrain plan --gpu h100`) plans for that chip instead of the
queue's nodes, with the profile wstrain ships for it (contracts/hardware.py
SHIPPED_PROFILES: measured on H100 and H200, from the datasheet for the others), and says
so in the plan's reasons["gpu"]; an unknown name is a 422 listing the known ones. Only this
route takes `gpu`: such a plan is never queued.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from wstrain.api.deps import CallerDep, PlannerDep, Store
from wstrain.api.responses import BODY, CALLER, error_responses
from wstrain.api.routes.grants import Grants, admit_class, check_quota
from wstrain.api.validation import gpu_node
from wstrain.contracts.chips import GpuName
from wstrain.contracts.plan import Plan
from wstrain.contracts.spec import JobSpec

router = APIRouter(prefix="/v1/plans", responses=CALLER)

GPU_HELP = (
    "plan for this chip rather than the queue's nodes, with wstrain's shipped profile for "
    "it (measured on h100 and h200, from the datasheet for the others); the plan's "
    "reasons.gpu says which"
)


# 429: the owner's plans already fill WSTRAIN_PLAN_QUEUE_PER_OWNER (api/planning.py)
@router.post("", response_model=Plan, responses={**BODY, **error_responses(403, 429)})
async def dry_run(
    spec: JobSpec,
    st: Store,
    planner: PlannerDep,
    caller: CallerDep,
    grants: Grants,
    gpu: Annotated[GpuName | None, Query(description=GPU_HELP)] = None,
) -> Plan:
    await check_quota(grants, await admit_class(grants, caller, spec.priority), spec.priority)
    if gpu is None:
        return await planner.plan(spec, await st.nodes(), caller.owner)  # behind its own plans
    # the planner processes plan against this one node as against a registered one, and
    # their refusal and plan caches key on its profile as on a registered node's
    node, note = gpu_node(spec, gpu)
    plan = await planner.plan(spec, [node], caller.owner)
    plan.reasons["gpu"] = note
    return plan
