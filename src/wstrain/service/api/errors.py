"""The API's one exception mapper: any WstrainError (the hierarchy in
scheduler/contracts/errors.py) becomes a JSON response with the error's HTTP status,
`{"detail": message, **detail}` (e.g. 422 with `min_budget`, 409 with `state`).

Routes and dependencies just raise; service/app.py installs the mapper with
`install_error_handlers(app)`. FastAPI's own request-validation 422s are left as they are.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from wstrain.scheduler.contracts.errors import WstrainError


async def wstrain_error_response(_: Request, exc: Exception) -> JSONResponse:
    """The status and body a WstrainError answers with."""
    if not isinstance(exc, WstrainError):  # registered for WstrainError only
        raise exc
    return JSONResponse(status_code=exc.status, content={"detail": exc.message, **exc.detail})


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(WstrainError, wstrain_error_response)
