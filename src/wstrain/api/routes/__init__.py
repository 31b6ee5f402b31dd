"""The API's routes, one thin router per resource; api/app.py includes ROUTERS in order.

jobs.py     /v1/jobs: submit, list, get, plan, events, cancel, resume
logs.py     /v1/jobs/{id}/logs: the worker's log, a page or followed (Server-Sent Events)
plans.py    /v1/plans: dry-run a spec's plan
nodes.py    /v1/nodes and /v1/presets: what the cluster has and which models it knows
queue.py    /v1/queue: pending jobs in the policy's order, with why each waits
grants.py   /v1/grants: the priority classes above 0 admins grant each owner
health.py   /healthz, /readyz, /metrics
"""

from __future__ import annotations

from fastapi import APIRouter

from wstrain.api.routes import grants, health, jobs, logs, nodes, plans, queue

ROUTERS: tuple[APIRouter, ...] = (
    jobs.router,
    logs.router,
    plans.router,
    nodes.router,
    queue.router,
    grants.router,
    health.router,
)
