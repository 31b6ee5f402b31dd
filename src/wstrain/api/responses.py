"""What the API's error answers look like, for its OpenAPI document: one body model per kind
of answer and the `responses=` bundles the app and the routers document them with, so the
schema names every status a route can answer (tests/api/test_openapi_conformance.py
holds it to that with schemathesis against the live API).

    ErrorBody        {"detail": "<what failed, the value, the fix>", ...}  every error but a
                     request that failed validation; WstrainError's detail adds fields
                     (`field`, `min_budget`, `state`, `limit`) beside `detail`
    Unprocessable    422: `detail` is that message, or for a request that failed validation
                     (or a spec that failed several submission checks) one InvalidField
                     per field (api/errors.py builds both)

Where each bundle goes: EVERY_REQUEST on the app (the body limit stands in front of every
route), BODY on the routes that read a JSON body, CALLER on every router whose routes take
the caller (a token with WSTRAIN_API_TOKENS, headers and parameters that can fail
validation, the job store in Redis), JOB on the routes of one job; a route adds its own
(409, 429) with error_responses().
A router added later documents its errors by passing `responses=CALLER` too.

With WSTRAIN_API_TOKENS set, create_app adds the bearer token to the document as its
security scheme (declare_bearer), required by every operation that documents 401.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

# Seconds to wait before retrying, on 429 and 503, always whole (api/errors.py and
# routes/logs.py send it: 2 s while Redis is away, 10 s while it refuses writes, 5 s for a
# log follower slot, the plan deadline rounded up for a full plan queue).
RETRY_AFTER = {
    "Retry-After": {
        "description": "seconds to wait before retrying",
        "schema": {"type": "string", "pattern": "^[0-9]+$"},
    }
}


class ErrorBody(BaseModel):
    """An error: what failed, the offending value and the fix, in `detail`."""

    # WstrainError's keyword details ride beside `detail`; those listed are the documented
    # ones, and a new error may add its own
    model_config = ConfigDict(extra="allow")

    detail: str = Field(description="what failed, the offending value and the fix")
    field: str | None = Field(default=None, description="the spec field at fault")
    state: str | None = Field(default=None, description="the job's state, on 409")
    min_budget: dict[str, float] | None = Field(
        default=None, description="on an infeasible budget: the smallest that works, in GiB"
    )


class InvalidField(BaseModel):
    """One field of a request that failed validation."""

    loc: list[str] = Field(description='where: ["body", "budget", "device_gib"]')
    msg: str = Field(
        description="what is wrong with it, at most 300 characters from the schema; a "
        "submission check's message in full, with the fix"
    )
    type: str = Field(
        description="pydantic's error type, e.g. greater_than; invalid_spec or "
        "infeasible_budget from a submission check"
    )
    input: str = Field(description="an excerpt of the value sent, at most 80 characters")


class Unprocessable(BaseModel):
    """422: the request failed validation (a list, one entry per field, at most 20), or it is
    well-formed but cannot work: a message naming the field and the fix, or a list of them
    when several submission checks failed."""

    model_config = ConfigDict(extra="allow")

    detail: str | list[InvalidField]
    field: str | None = Field(default=None, description="the spec field at fault")
    min_budget: dict[str, float] | None = Field(
        default=None, description="on an infeasible budget: the smallest that works, in GiB"
    )


_STATUSES: dict[int, tuple[type[BaseModel], str]] = {
    400: (ErrorBody, "the request body could not be read as JSON text (e.g. not UTF-8)"),
    401: (ErrorBody, "with WSTRAIN_API_TOKENS set: no bearer token, or an unknown one"),
    403: (ErrorBody, "the caller's role or grants do not allow it; the message names them"),
    404: (ErrorBody, "no such job, or another owner's (the two are not told apart)"),
    409: (ErrorBody, "the job's state does not allow it; `state` names it"),
    413: (ErrorBody, "the request body is over WSTRAIN_MAX_BODY_BYTES"),
    422: (Unprocessable, "a field failed validation, or the spec cannot work; with the fix"),
    429: (ErrorBody, "too many at once; retry after Retry-After seconds"),
    503: (ErrorBody, "the job store is unavailable; retry after Retry-After seconds"),
}


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """`responses=` for a FastAPI app, router or route: each status with its body model."""
    out: dict[int | str, dict[str, Any]] = {}
    for status in statuses:
        model, description = _STATUSES[status]
        out[status] = {"model": model, "description": description}
        if status in (429, 503):
            out[status]["headers"] = RETRY_AFTER
    return out


EVERY_REQUEST = error_responses(413)
BODY = error_responses(400)
CALLER = error_responses(401, 422, 503)
JOB = error_responses(404)


BEARER = "bearer"  # the security scheme's name in the document
_TOKEN_HEADERS = frozenset({"authorization", "x-wstrain-owner"})


def declare_bearer(schema: dict[str, Any]) -> dict[str, Any]:
    """`schema` (the app's OpenAPI document, changed in place) with the bearer token as its
    security scheme, required by each operation that documents 401: what the API asks when
    WSTRAIN_API_TOKENS is set (create_app adds it then, and only then)."""
    schemes = schema.setdefault("components", {}).setdefault("securitySchemes", {})
    schemes[BEARER] = {
        "type": "http",
        "scheme": "bearer",
        "description": "a token of WSTRAIN_API_TOKENS (the CLI sends WSTRAIN_TOKEN)",
    }
    for operations in schema["paths"].values():
        for operation in operations.values():
            if "401" in operation.get("responses", {}):
                operation["security"] = [{BEARER: []}]
                # Authorization is the scheme's, not a parameter to fill in; X-Wstrain-Owner
                # (the owner claimed where no token is asked) is ignored once one is
                operation["parameters"] = [
                    p
                    for p in operation.get("parameters", [])
                    if p["in"] != "header" or p["name"].lower() not in _TOKEN_HEADERS
                ]
    return schema
