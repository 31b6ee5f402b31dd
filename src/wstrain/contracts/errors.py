"""wstrain's one small exception hierarchy. The API translates it to HTTP in one place
(api/errors.py); the CLI prints the message. Every message says what failed, the
offending value, and what to change.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast


class WstrainError(Exception):
    """Base class: `status` is the HTTP status the API answers with."""

    status = 400

    def __init__(self, message: str, **detail: object) -> None:
        super().__init__(message)
        self.message = message
        self.detail = detail


class InvalidSpec(WstrainError):
    """The JobSpec is well-formed JSON but names something that cannot work."""

    status = 422


class InfeasibleBudget(WstrainError):
    """The budgets are too small for the model; `detail['min_budget']` says what works."""

    status = 422

    @property
    def min_budget(self) -> dict[str, float]:
        """{"device_gib": ..., "host_gib": ...}: the smallest budgets that would work."""
        return cast(dict[str, float], self.detail["min_budget"])


class SpecErrors(InvalidSpec):
    """Several independent submission checks of one JobSpec failed (api/validation.py runs
    them all, so a newcomer fixes the file once): `errors` holds each failure, its
    `detail['field']` the spec field at fault, and `inputs` the value the spec gave each
    field, in the same order. The API answers them as it answers schema errors, 422 with
    one entry per field; `min_budget` rides along when one of them is an InfeasibleBudget."""

    def __init__(
        self,
        message: str,
        errors: Sequence[WstrainError] = (),
        inputs: Sequence[object] = (),
        **detail: object,
    ) -> None:
        super().__init__(message, **detail)
        self.errors = list(errors)
        self.inputs = list(inputs)

    @classmethod
    def of(cls, errors: Sequence[WstrainError], inputs: Sequence[object]) -> SpecErrors:
        """One error for `errors` (two or more), its message theirs joined."""
        budgets = [e.min_budget for e in errors if isinstance(e, InfeasibleBudget)]
        extra: dict[str, object] = {"min_budget": budgets[0]} if budgets else {}
        return cls("; ".join(e.message for e in errors), errors, inputs, **extra)


class NotFound(WstrainError):
    status = 404


class Conflict(WstrainError):
    """The request is valid but the job's state does not allow it (cancel a finished job)."""

    status = 409


class LeaseLost(Conflict):
    """An agent wrote to a job whose lease another agent holds now (it took the job over
    after this agent was presumed dead): the write changed nothing, and this agent must stop
    its worker for that job."""


class Unauthorized(WstrainError):
    status = 401


class Forbidden(WstrainError):
    """The caller is known but may not do this: a priority class above its owner's grant,
    over the grant's quota, or an admin-only route (contracts/grants.py)."""

    status = 403


class TooManyRequests(WstrainError):
    """The caller already has as many requests of this kind waiting as it may (its plans
    beyond WSTRAIN_PLAN_QUEUE_PER_OWNER); `detail['retry_after_s']` says when to try again,
    and the API sends it as the Retry-After header too."""

    status = 429


class BudgetExceeded(WstrainError):
    """A running job was about to take memory past its budget (a planner bug: the plan said
    it fits); the worker fails the job with this instead of overrunning the budget."""

    status = 500
