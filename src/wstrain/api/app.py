"""The wstrain REST API (v1): a stateless FastAPI app over the Redis job store.

Run it with `wstrain serve` (API + agent + Redis), or alone with its settings from WSTRAIN_*
(settings.py; WSTRAIN_LISTEN_HOST and WSTRAIN_LISTEN_PORT say where it listens):
    wstrain-api                                  # or: python -m wstrain.api.app
    uvicorn --factory wstrain.api.app:create_app --host 127.0.0.1 --port 8000

The routes are thin routers per resource in api/routes/, their dependencies in api/deps.py,
the one WstrainError -> HTTP mapper in api/errors.py and the off-loop, deadline-bound planner
in api/planning.py. This module assembles them with the lifespan (Redis client, planner
processes) and the request-timing middleware behind /metrics' latency histogram.
"""

from __future__ import annotations

import gc
import logging
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import Response
from redis.exceptions import RedisError
from starlette.middleware.base import RequestResponseEndpoint

from wstrain.api.errors import install_error_handlers
from wstrain.api.limits import BodyLimit
from wstrain.api.metrics import ApiMetrics
from wstrain.api.planning import Planner
from wstrain.api.responses import EVERY_REQUEST, declare_bearer
from wstrain.api.routes import ROUTERS, docs
from wstrain.api.settings import ServiceSettings
from wstrain.store import JobStore

log = logging.getLogger(__name__)

APP_FACTORY = "wstrain.api.app:create_app"


def create_app(settings: ServiceSettings | None = None) -> FastAPI:
    """The API app; `settings` default to ServiceSettings() (the WSTRAIN_* environment)."""
    settings = settings or ServiceSettings()
    metrics = ApiMetrics(
        settings.metrics_lease_s,
        settings.metrics_ended_window_s,
        settings.metrics_max_jobs,
        settings.policy_config(),
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # a short retry: a request waits out a blip, then answers 503 with Retry-After
        app.state.store = JobStore.from_url(settings.redis_url, settings.key_prefix, retry_s=1.0)
        try:
            await app.state.store.ensure_indexes()
        except RedisError as exc:  # Redis away: routes answer 503 until it is back
            log.warning("job indexes not checked, Redis unavailable: %s", exc)
        app.state.planner = Planner(
            settings.plan_timeout_s,
            settings.access(),
            processes=settings.plan_processes,
            queue_per_owner=settings.plan_queue_per_owner,
            refusal_ttl_s=settings.plan_refusal_ttl_s,
            memory_bytes=settings.plan_memory_bytes,
        )
        await app.state.planner.start()  # its processes, ready before the first request
        # what start-up built (modules, the app, its schemas) lives as long as the process:
        # out of the collector's generations, a full collection walks only what requests
        # made, 20-60 ms less a pause under bench/api_load.py
        gc.collect()
        gc.freeze()
        try:
            yield
        finally:
            app.state.planner.close()
            await app.state.store.close()

    protected = bool(settings.api_tokens)  # then the schema and its UI need a token too
    app = FastAPI(
        title="wstrain",
        version="1",
        lifespan=lifespan,
        description="Training jobs under hard device- and host-memory budgets.",
        docs_url=None if protected else "/docs",
        redoc_url=None,
        openapi_url=None if protected else "/openapi.json",
        responses=EVERY_REQUEST,  # each router adds its own (api/responses.py)
    )
    app.state.settings = settings
    app.state.metrics = metrics
    install_error_handlers(app)

    @app.middleware("http")
    async def _time_requests(request: Request, call_next: RequestResponseEndpoint) -> Response:
        start = time.perf_counter()
        code = 500  # an exception no handler mapped: the server error middleware answers 500
        try:
            response = await call_next(request)
            code = response.status_code
            return response
        finally:
            route = request.scope.get("route")
            metrics.observe(
                request.method,
                getattr(route, "path", "unmatched"),
                code,
                time.perf_counter() - start,
            )

    for router in ROUTERS:
        app.include_router(router)
    if protected:
        app.include_router(docs.router)
        documented = app.openapi  # builds the document once and keeps it
        app.openapi = lambda: declare_bearer(documented())  # type: ignore[method-assign]
    # outermost, so an oversized body is refused before any route or middleware reads it
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    return app


def main() -> None:
    """`wstrain-api`: the API alone on WSTRAIN_LISTEN_HOST:_PORT, settings from WSTRAIN_*."""
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    settings = ServiceSettings()
    log.info(
        "API on http://%s:%d, key prefix %s, plans within %s s",
        settings.listen_host,
        settings.listen_port,
        settings.key_prefix,
        settings.plan_timeout_s,
    )
    # Several worker processes share the port: the API is stateless, and one process's GIL
    # caps it near 230 mixed requests/s on 2 cores (bench/api_load.py). Each builds its
    # app from the same WSTRAIN_* environment.
    app: FastAPI | str = create_app(settings) if settings.workers == 1 else APP_FACTORY
    uvicorn.run(
        app,
        factory=settings.workers > 1,
        workers=settings.workers,
        host=settings.listen_host,
        port=settings.listen_port,
        log_level="info",
        # one log line per request costs ~15% of the API's throughput on 2 cores
        # (bench/api_load.py); /metrics counts every request by route and code instead
        access_log=settings.access_log,
    )


if __name__ == "__main__":
    main()
