"""Redis storage faults: replies that say Redis cannot take a write *now*, whatever the
command, as opposed to a command that is wrong (a bug, which must stay loud).

    MISCONF     its AOF or RDB write failed: a full or failing disk under its --dir
    OOM         used memory is at maxmemory
    READONLY    it is a replica (a failover is under way)
    LOADING     it is loading its AOF after a restart
    NOREPLICAS  fewer replicas than min-replicas-to-write
    MASTERDOWN  a replica lost its primary

The store retries them like a lost connection, for the store's retry_s (StoreRetry): the
agent rides out a full disk as it rides out a Redis restart, its workers training on, and
the API answers 503 with Retry-After once its short retry is spent (api/errors.py).
Redis clears MISCONF by itself within 1 s of the disk having room again (it retries the
AOF write every second), so nothing has to be restarted.

    storage_fault(exc)   # "MISCONF", ... or None
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from redis.asyncio.retry import Retry
from redis.exceptions import (
    BusyLoadingError,
    MasterDownError,
    OutOfMemoryError,
    ReadOnlyError,
    RedisError,
    ResponseError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

log = logging.getLogger(__name__)

T = TypeVar("T")

STORAGE_FAULT_CODES = ("MISCONF", "OOM", "READONLY", "LOADING", "NOREPLICAS", "MASTERDOWN")
# redis-py raises its own class for some codes (and strips the code from the message); the
# others come as a plain ResponseError whose message starts with the code, or, from a
# pipeline, holds it after "caused error: " (a transaction's as a tuple: "('MISCONF ...',)")
_CLASSES: dict[type[RedisError], str] = {
    OutOfMemoryError: "OOM",
    ReadOnlyError: "READONLY",
    BusyLoadingError: "LOADING",
    MasterDownError: "MASTERDOWN",
}
_CODE = re.compile(rf"^\(?'?({'|'.join(STORAGE_FAULT_CODES)})\b")


def storage_fault(exc: BaseException) -> str | None:
    """The Redis reply code if `exc` says Redis cannot store a write now, else None."""
    for cls, code in _CLASSES.items():
        if isinstance(exc, cls):
            return code
    if not isinstance(exc, ResponseError):
        return None
    # the reply after the pipeline's preamble, which quotes the command (a job's name...)
    reply = str(exc).rpartition("caused error: ")[2]
    if found := _CODE.match(reply):
        return found.group(1)
    return None


class _Episode:
    """One warning when Redis starts refusing writes and one when it takes them again, per
    process, however many commands are waiting meanwhile."""

    def __init__(self) -> None:
        self.since: float | None = None

    def refused(self, exc: BaseException, retry_s: float) -> None:
        if self.since is None:
            self.since = time.monotonic()
            log.warning(
                "Redis refuses writes (%s); each command is retried for up to %.0f s: "
                "free space under Redis' --dir (or memory, for OOM)",
                _first_line(exc),
                retry_s,
            )

    def passed(self) -> None:
        if self.since is not None:
            log.warning("Redis takes writes again after %.1f s", time.monotonic() - self.since)
            self.since = None


EPISODE = _Episode()


def _first_line(exc: BaseException) -> str:
    return str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__


class StoreRetry(Retry):
    """redis-py's Retry (connection errors, timeouts) that also retries storage faults,
    and nothing else a command can answer: a wrong command still raises at once."""

    def __init__(self, backoff: Any, retries: int, retry_s: float) -> None:
        super().__init__(
            backoff,
            retries,
            supported_errors=(RedisConnectionError, RedisTimeoutError, ResponseError),
        )
        self.retry_s = retry_s

    async def call_with_retry(
        self,
        do: Callable[[], Awaitable[T]],
        fail: Callable[..., Any],
        is_retryable: Callable[[Exception], bool] | None = None,
        with_failure_count: bool = False,
    ) -> T:
        faulted = False

        def retryable(error: Exception) -> bool:
            nonlocal faulted
            if isinstance(error, ResponseError):
                if storage_fault(error) is None:
                    return False  # a wrong command: raised at once, never retried
                faulted = True
                EPISODE.refused(error, self.retry_s)
            return is_retryable is None or is_retryable(error)

        result = await super().call_with_retry(do, fail, retryable, with_failure_count)
        if faulted:  # a write that went through: reads pass while writes are refused
            EPISODE.passed()
        return result
