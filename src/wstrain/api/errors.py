"""The API's one exception mapper: any WstrainError (the hierarchy in
contracts/errors.py) becomes a JSON response with the error's HTTP status,
`{"detail": message, **detail}` (e.g. 422 with `min_budget`, 409 with `state`).

Redis unreachable (connection refused, timed out, loading its AOF after a restart) is not
the client's fault and not a bug: 503 with Retry-After, so clients and proxies retry. So is
Redis refusing writes (a storage fault, store/faults.py: MISCONF from a full disk
under its --dir, OOM, READONLY, NOREPLICAS, MASTERDOWN): 503 with a longer Retry-After, and
the reply's code in `fault`. Any other Redis reply error is a bug and stays a 500. A full,
over-quota or read-only disk under a file the API writes (it writes none today: its only
storage is Redis) is the same 503, `fault` naming the errno.

A request that fails validation answers 422 with one entry per error: where (`loc`), what
(`msg`) and an excerpt of the offending value of at most 80 characters — never the input
itself, which may be megabytes or hold values JSON cannot carry (inf, NaN, bytes). A spec
that fails several submission checks (SpecErrors, api/validation.py) answers the same way,
one entry per failed check, its `msg` the check's message with the fix and its `input` the
spec's value of that field (never a file's bytes), `min_budget` beside them when one of
them is a budget too small for the model.

Routes and dependencies just raise; api/app.py installs the mappers with
`install_error_handlers(app)`.
"""

from __future__ import annotations

import errno
import logging
import re

from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from redis.exceptions import BusyLoadingError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from starlette.exceptions import HTTPException

from wstrain.contracts.errors import SpecErrors, WstrainError
from wstrain.store.faults import storage_fault


async def wstrain_error_response(_: Request, exc: Exception) -> JSONResponse:
    """The status and body a WstrainError answers with."""
    if not isinstance(exc, WstrainError):  # registered for WstrainError only
        raise exc
    if isinstance(exc, SpecErrors):  # several at once: one entry each, as schema errors
        return JSONResponse(status_code=exc.status, content=spec_errors_body(exc))
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
    return _unavailable(
        REDIS_RETRY_AFTER_S, {"detail": "the job store (Redis) is unavailable; retry shortly"}
    )


def _unavailable(retry_after_s: int, content: dict[str, str]) -> JSONResponse:
    """503 with Retry-After: a fault of the service's storage, not the client's nor a bug."""
    return JSONResponse(
        status_code=503, headers={"Retry-After": str(retry_after_s)}, content=content
    )


# Seconds to wait while Redis refuses writes: space has to be freed by someone, and Redis
# takes writes again within 1 s of it (it retries its AOF write every second).
STORAGE_RETRY_AFTER_S = 10


async def storage_fault_response(request: Request, exc: Exception) -> JSONResponse:
    """503 for a Redis storage fault; any other reply error is re-raised: a 500, a bug."""
    code = storage_fault(exc)
    if code is None:
        raise exc
    log.warning("%s %s: Redis refuses writes: %s", request.method, request.url.path, exc)
    return _unavailable(
        STORAGE_RETRY_AFTER_S,
        {
            "detail": f"the job store (Redis) refuses writes ({code}: "
            + ("its disk is full or failing" if code == "MISCONF" else "see its log")
            + f"); retry in {STORAGE_RETRY_AFTER_S} s, or ask the operator to free space "
            "under Redis' directory",
            "fault": code,
        },
    )


_DISK_FULL = {errno.ENOSPC: "ENOSPC", errno.EDQUOT: "EDQUOT", errno.EROFS: "EROFS"}


async def disk_fault_response(request: Request, exc: Exception) -> JSONResponse:
    """503 for a write the disk refused (full, over quota, read-only); any other OSError
    is re-raised: a 500, a bug."""
    code = _DISK_FULL.get(exc.errno or 0) if isinstance(exc, OSError) else None
    if code is None:
        raise exc
    log.warning("%s %s: a disk refused a write: %s", request.method, request.url.path, exc)
    return _unavailable(
        STORAGE_RETRY_AFTER_S,
        {
            "detail": f"the API's disk refused a write ({code}); retry in "
            f"{STORAGE_RETRY_AFTER_S} s, or ask the operator to free space",
            "fault": code,
        },
    )


EXCERPT_CHARS = 80


def _excerpt(value: object) -> str:
    text = repr(value)
    return text if len(text) <= EXCERPT_CHARS else text[: EXCERPT_CHARS - 3] + "..."


def spec_errors_body(exc: SpecErrors) -> dict[str, object]:
    """The body of several failed submission checks, in the shape of schema errors."""
    errors = [
        {
            "loc": ["body", *str(error.detail.get("field", "")).split(".")],
            "msg": error.message,  # wstrain's own words and fix: a few hundred characters
            "type": _snake(type(error).__name__),
            "input": _excerpt(value),
        }
        for error, value in zip(exc.errors, exc.inputs)
    ]
    return {"detail": errors, **exc.detail}


def _snake(name: str) -> str:
    """InfeasibleBudget -> infeasible_budget."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


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


def _documented_methods(app: FastAPI, path: str) -> list[str]:
    """The methods the OpenAPI document lists for the path template `path` matches."""
    for template, operations in app.openapi()["paths"].items():
        parts = re.split(r"(\{[^}]+\})", template)
        pattern = "".join("[^/]+" if p.startswith("{") else re.escape(p) for p in parts)
        if re.fullmatch(pattern, path):
            return sorted(method.upper() for method in operations)
    return []


async def method_not_allowed_response(request: Request, exc: Exception) -> Response:
    """405 with `Allow` naming every method the path answers, as its OpenAPI document lists
    them. Starlette names only those of the first route whose path matched: `Allow: POST`
    for PATCH /v1/jobs, which GET answers too. Any other HTTPException (404 for an unknown
    path) answers as FastAPI's own handler would."""
    if not isinstance(exc, HTTPException):  # registered for HTTPException only
        raise exc
    methods = _documented_methods(request.app, request.url.path) if exc.status_code == 405 else []
    if not methods:  # another status, or a path the document leaves out (/docs): as FastAPI
        return await http_exception_handler(request, exc)
    allow = ", ".join(methods)
    return JSONResponse(
        status_code=405,
        headers={"Allow": allow},
        content={"detail": f"{request.method} is not allowed on {request.url.path}; use {allow}"},
    )


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(HTTPException, method_not_allowed_response)
    app.add_exception_handler(WstrainError, wstrain_error_response)
    app.add_exception_handler(RequestValidationError, validation_error_response)
    for unavailable in (RedisConnectionError, RedisTimeoutError, BusyLoadingError):
        app.add_exception_handler(unavailable, redis_down_response)
    app.add_exception_handler(ResponseError, storage_fault_response)
    app.add_exception_handler(OSError, disk_fault_response)
