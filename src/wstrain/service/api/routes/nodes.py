"""GET /v1/nodes (the heartbeating scheduler agents: GPUs, measured profile, free memory) and
GET /v1/presets (every model preset with its dimensions, parameters and state bytes;
`wstrain presets`)."""

from __future__ import annotations

from fastapi import APIRouter
from pydantic import BaseModel

from wstrain.scheduler.contracts.jobs import Node, PresetList
from wstrain.scheduler.contracts.model_dims import preset_list
from wstrain.service.api.deps import CallerDep, Store
from wstrain.service.api.responses import CALLER

router = APIRouter(prefix="/v1", responses=CALLER)


class NodeList(BaseModel):
    nodes: list[Node]


@router.get("/nodes", response_model=NodeList)
async def nodes(st: Store, _: CallerDep) -> NodeList:
    return NodeList(nodes=await st.nodes())


@router.get("/presets", response_model=PresetList)
async def presets(_: CallerDep) -> PresetList:
    return PresetList(presets=preset_list())
