"""The API's routes, one thin router per resource; service/app.py includes ROUTERS in order.

jobs.py     /v1/jobs: submit, list, get, plan, events, cancel, resume
plans.py    /v1/plans: dry-run a spec's plan
nodes.py    /v1/nodes and /v1/presets: what the cluster has and which models it knows
health.py   /healthz, /readyz, /metrics
"""

from __future__ import annotations

from fastapi import APIRouter

from wstrain.service.api.routes import health, jobs, nodes, plans

ROUTERS: tuple[APIRouter, ...] = (jobs.router, plans.router, nodes.router, health.router)
