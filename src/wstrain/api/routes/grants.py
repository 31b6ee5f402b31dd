"""/v1/grants: the priority classes above 0 each owner may use (contracts/grants.py), granted
and revoked by admins; and the check every non-admin submission, dry run and resume passes.

    GET    /v1/grants                 every grant (admin); the caller's own, or none (user)
    GET    /v1/grants/{owner}         200 with `class_jobs` in use; 404 none; 403 another's
    PUT    /v1/grants/{owner}         admin: {"max_priority": 50, "max_jobs": 2}; 403 user
    DELETE /v1/grants/{owner}         admin: 204, its jobs drop to class 0 at the next
                                      scheduling round; 404 none; 403 user

With auth off (no WSTRAIN_API_TOKENS) every caller is an admin: nothing is checked.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Annotated

from fastapi import APIRouter, Depends, Path, Response

from wstrain.api.deps import Caller, CallerDep, Store
from wstrain.api.responses import BODY, CALLER, error_responses
from wstrain.contracts.errors import Forbidden, NotFound
from wstrain.contracts.grants import (
    OWNER_PATTERN,
    GrantList,
    GrantRequest,
    PriorityGrant,
    check_class,
    grant_command,
    quota_refusal,
)
from wstrain.store.grants import GrantStore

log = logging.getLogger(__name__)

router = APIRouter(prefix="/v1/grants", responses=CALLER)

OwnerPath = Annotated[str, Path(pattern=OWNER_PATTERN, description="the owner, as in a token")]


async def get_grants(st: Store) -> GrantStore:
    return GrantStore(st)


Grants = Annotated[GrantStore, Depends(get_grants)]


def _none_held(owner: str) -> NotFound:
    return NotFound(
        f"{owner} holds no priority grant: its jobs may use priority <= 0; an admin grants "
        f"classes above with `{grant_command(owner, 10, 1)}`"
    )


def _admin_only(caller: Caller, what: str, owner: str) -> None:
    if not caller.admin:
        raise Forbidden(
            f"{what} needs an admin token and {caller.owner}'s is a user's; an admin runs "
            f"`{grant_command(owner, 10, 1)}` (or `wstrain revoke {owner}`)"
        )


@router.get("", response_model=GrantList)
async def list_grants(grants: Grants, caller: CallerDep) -> GrantList:
    if caller.admin:
        held = await grants.all()
    else:
        mine = await grants.get(caller.owner)
        held = [] if mine is None else [mine]
    return GrantList(grants=[await grants.with_usage(g) for g in held])


@router.get("/{owner}", response_model=PriorityGrant, responses=error_responses(403, 404))
async def get_grant(owner: OwnerPath, grants: Grants, caller: CallerDep) -> PriorityGrant:
    if not caller.may_see_owner(owner):
        raise Forbidden(
            f"GET /v1/grants/{owner}: a user reads its own grant only "
            f"(/v1/grants/{caller.owner}); an admin token reads every owner's"
        )
    grant = await grants.get(owner)
    if grant is None:
        raise _none_held(owner)
    return await grants.with_usage(grant)


@router.put("/{owner}", response_model=PriorityGrant, responses={**BODY, **error_responses(403)})
async def put_grant(
    owner: OwnerPath, body: GrantRequest, grants: Grants, caller: CallerDep
) -> PriorityGrant:
    _admin_only(caller, f"PUT /v1/grants/{owner}", owner)
    grant = PriorityGrant(
        owner=owner,
        max_priority=body.max_priority,
        max_jobs=body.max_jobs,
        granted_by=caller.owner,
        granted_at=time.time(),
    )
    await grants.put(grant)
    log.info(
        "grant: %s may use priority <= %d, %d jobs at once (by %s)",
        owner,
        body.max_priority,
        body.max_jobs,
        caller.owner,
    )
    return await grants.with_usage(grant)


@router.delete("/{owner}", status_code=204, responses=error_responses(403, 404))
async def delete_grant(owner: OwnerPath, grants: Grants, caller: CallerDep) -> Response:
    _admin_only(caller, f"DELETE /v1/grants/{owner}", owner)
    if not await grants.delete(owner):
        raise _none_held(owner)
    log.info("grant: %s's grant revoked by %s", owner, caller.owner)
    return Response(status_code=204)


# ---------------------------------------------------------------- the check on submissions


async def admit_class(grants: GrantStore, caller: Caller, priority: int) -> PriorityGrant | None:
    """Forbidden unless the caller may submit at `priority`; the grant it is admitted under
    (None: an admin, or priority <= 0, which count against no quota)."""
    if caller.admin or priority <= 0:
        return None
    grant = await grants.get(caller.owner)
    check_class(caller.owner, priority, grant)
    return grant


async def check_quota(grants: GrantStore, grant: PriorityGrant | None, priority: int) -> None:
    """Forbidden if a submission under `grant` would be over its quota now (a dry run's
    check: it takes no place)."""
    if grant is not None and (in_use := await grants.in_use(grant.owner)) >= grant.max_jobs:
        raise quota_refusal(grant.owner, priority, grant, in_use)


@asynccontextmanager
async def class_place(
    grants: GrantStore, grant: PriorityGrant | None, priority: int
) -> AsyncIterator[Callable[[str], Awaitable[None]]]:
    """A place in `grant`'s quota for the block, which creates (or resumes) a job and binds
    its id with the function yielded; Forbidden when the quota is used up. The place is
    given back if the block fails."""
    if grant is None:

        async def nothing(_: str) -> None:
            return None

        yield nothing
        return
    token, in_use = await grants.reserve(grant)
    if token is None:
        raise quota_refusal(grant.owner, priority, grant, in_use)

    async def bind(job_id: str) -> None:
        await grants.bind(grant.owner, token, job_id)

    try:
        yield bind
    except BaseException:
        await grants.release(grant.owner, token)
        raise
