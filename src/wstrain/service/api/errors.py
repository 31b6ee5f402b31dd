"""The API's one exception mapper: any WstrainError (the hierarchy in
scheduler/contracts/errors.py) becomes a JSON response with the error's HTTP status,
`{"detail": message, **detail}` (e.g. 422 with `min_budget`, 409 with `state`).

Redis unreachable (connection refused, timed out, loading its AOF after a restart) is not
the client's fault and not a bug: 503 with Retry-After, so clients and proxies retry.

Routes and dependencies just raise; service/app.py installs the mapper with
`install_error_handlers(app)`. FastAPI's own request-validation 422s are left as they are.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from redis.exceptions import BusyLoadingError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from wstrain.scheduler.contracts.errors import WstrainError


async def wstrain_error_response(_: Request, exc: Exception) -> JSONResponse:
    """The status and body a WstrainError answers with."""
    if not isinstance(exc, WstrainError):  # registered for WstrainError only
        raise exc
    return JSONResponse(status_code=exc.status, content={"detail": exc.message, **exc.detail})


log = logging.getLogger(__name__)

# Seconds a client should wait before retrying while Redis is away: a restart that replays
# its AOF takes seconds; the agent's own back-off starts at 0.5 s.
REDIS_RETRY_AFTER_S = 2


async def redis_down_response(request: Request, exc: Exception) -> JSONResponse:
    log.warning("%s %s: Redis unavailable: %s", request.method, request.url.path, exc)
    return JSONResponse(
        status_code=503,
        headers={"Retry-After": str(REDIS_RETRY_AFTER_S)},
        content={"detail": "the job store (Redis) is unavailable; retry shortly"},
    )


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(WstrainError, wstrain_error_response)
    for unavailable in (RedisConnectionError, RedisTimeoutError, BusyLoadingError):
        app.add_exception_handler(unavailable, redis_down_response)
