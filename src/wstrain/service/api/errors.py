"""The API's one exception mapper: any WstrainError (the hierarchy in
scheduler/contracts/errors.py) becomes a JSON response with the error's HTTP status,
`{"detail": message, **detail}` (e.g. 422 with `min_budget`, 409 with `state`).

Redis unreachable (connection refused, timed out, loading its AOF after a restart) is not
the client's fault and not a bug: 503 with Retry-After, so clients and proxies retry.

A request that fails validation answers 422 with one entry per error: where (`loc`), what
(`msg`) and an excerpt of the offending value of at most 80 characters — never the input
itself, which may be megabytes or hold values JSON cannot carry (inf, NaN, bytes).

Routes and dependencies just raise; service/app.py installs the mappers with
`install_error_handlers(app)`.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from redis.exceptions import BusyLoadingError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from wstrain.scheduler.contracts.errors import WstrainError


async def wstrain_error_response(_: Request, exc: Exception) -> JSONResponse:
    """The status and body a WstrainError answers with."""
    if not isinstance(exc, WstrainError):  # registered for WstrainError only
        raise exc
    retry_s = exc.detail.get("retry_after_s")  # TooManyRequests: when to come back
    return JSONResponse(
        status_code=exc.status,
        content={"detail": exc.message, **exc.detail},
        headers=None if retry_s is None else {"Retry-After": str(retry_s)},
    )


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


EXCERPT_CHARS = 80


def _excerpt(value: object) -> str:
    text = repr(value)
    return text if len(text) <= EXCERPT_CHARS else text[: EXCERPT_CHARS - 3] + "..."


async def validation_error_response(_: Request, exc: Exception) -> JSONResponse:
    """422 naming each field that failed, with a short excerpt of what was sent."""
    if not isinstance(exc, RequestValidationError):  # registered for it only
        raise exc
    errors = [
        {
            "loc": [str(part)[:64] for part in err.get("loc", ())],
            "msg": str(err.get("msg", ""))[:300],
            "type": str(err.get("type", "")),
            "input": _excerpt(err.get("input")),
        }
        for err in exc.errors()[:20]
    ]
    return JSONResponse(status_code=422, content={"detail": errors})


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(WstrainError, wstrain_error_response)
    app.add_exception_handler(RequestValidationError, validation_error_response)
    for unavailable in (RedisConnectionError, RedisTimeoutError, BusyLoadingError):
        app.add_exception_handler(unavailable, redis_down_response)
