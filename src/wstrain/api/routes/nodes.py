"""GET /v1/nodes (the heartbeating scheduler agents: GPUs, measured profile, free memory) and
GET /v1/presets (every model preset with its dimensions, parameters and state bytes;
`wstrain presets`).

A node's `running` names only the caller's own jobs (an admin's: every job); the others are
counted in `others_running`, as `/v1/jobs` answers 404 for another owner's job: a job id
is its owner's to see.
"""

from __future__ import annotations

from typing import cast

from fastapi import APIRouter
from pydantic import BaseModel, Field

from wstrain.api.deps import Caller, CallerDep, Store
from wstrain.api.responses import CALLER
from wstrain.contracts.jobs import Node, PresetList
from wstrain.contracts.model_dims import preset_list
from wstrain.store import JobStore

router = APIRouter(prefix="/v1", responses=CALLER)


class NodeView(Node):
    others_running: int = Field(
        default=0,
        ge=0,
        description="jobs running on the node that are another owner's (their ids are not "
        "shown; an admin sees every id in `running` and 0 here)",
    )


class NodeList(BaseModel):
    nodes: list[NodeView]


async def _visible(st: JobStore, caller: Caller, nodes: list[Node]) -> list[NodeView]:
    """Each node with only the running jobs `caller` may see by id; one pipelined read of
    their owners for all nodes."""
    if caller.admin:
        return [NodeView(**n.model_dump()) for n in nodes]
    ids = sorted({j for n in nodes for j in n.running})
    async with st.redis.pipeline(transaction=False) as pipe:
        for jid in ids:
            pipe.hget(st.keys.job(jid), "owner")
        owners = dict(zip(ids, cast(list[str | None], await pipe.execute())))
    views = []
    for n in nodes:
        mine = [j for j in n.running if owners.get(j) == caller.owner]
        views.append(
            NodeView(
                **n.model_dump(exclude={"running"}),
                running=mine,
                others_running=len(n.running) - len(mine),
            )
        )
    return views


@router.get("/nodes", response_model=NodeList)
async def nodes(st: Store, caller: CallerDep) -> NodeList:
    return NodeList(nodes=await _visible(st, caller, await st.nodes()))


@router.get("/presets", response_model=PresetList)
async def presets(_: CallerDep) -> PresetList:
    return PresetList(presets=preset_list())
