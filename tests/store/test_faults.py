"""Which Redis replies are storage faults (retried by the store, 503 from the API), and that
nothing else is: a wrong command still fails at once, however long the store retries; and
how long the store retries: its pauses sum to at most retry_s, as redis-py pauses.

    pytest tests/store/test_faults.py
"""

from __future__ import annotations

import asyncio
import time

import pytest
from redis.backoff import ExponentialBackoff
from redis.exceptions import (
    NoScriptError,
    OutOfMemoryError,
    ReadOnlyError,
    ResponseError,
)

from wstrain.store import JobStore
from wstrain.store.faults import storage_fault
from wstrain.store.job_store import RETRY_BASE_S, RETRY_CAP_S


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (
            ResponseError("MISCONF Errors writing to the AOF file: No space left on device"),
            "MISCONF",
        ),
        # from a Lua script, as the store's transitions meet it
        (
            ResponseError(
                "MISCONF Errors writing to the AOF file: No space left on device script: "
                "c2f06ed382bfa66069f9efd6cfe6b64029913518, on @user_script:5."
            ),
            "MISCONF",
        ),
        # from a transaction, as redis-py words it
        (
            ResponseError(
                "Command # 1 (HSET p:job:1 id 1 name x) of pipeline caused error: "
                "('MISCONF Errors writing to the AOF file: No space left on device',)"
            ),
            "MISCONF",
        ),
        (ResponseError("NOREPLICAS Not enough good replicas to write."), "NOREPLICAS"),
        (OutOfMemoryError("command not allowed when used memory > 'maxmemory'."), "OOM"),
        (ReadOnlyError("You can't write against a read only replica."), "READONLY"),
        # bugs stay bugs
        (ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value"), None),
        (ResponseError("ERR unknown command 'NOSUCH'"), None),
        (NoScriptError("No matching script."), None),
        # a job's name quoted in the preamble does not make a bug a fault
        (
            ResponseError(
                "Command # 1 (HSET p:job:1 name caused error: MISCONF) of pipeline caused "
                "error: WRONGTYPE Operation against a key"
            ),
            None,
        ),
    ],
)
def test_storage_fault_codes(exc: Exception, code: str | None) -> None:
    assert storage_fault(exc) == code


def test_a_wrong_command_is_not_retried(redis_url: str) -> None:
    async def go() -> float:
        store = JobStore.from_url(redis_url, "faults", retry_s=30)
        start = time.monotonic()
        try:
            with pytest.raises(ResponseError, match="unknown command"):
                await store.redis.execute_command("NOSUCHCOMMAND")
            await store.redis.set("faults:x", "1")  # and the client still works
            return time.monotonic() - start
        finally:
            await store.close()

    assert asyncio.run(go()) < 1.0


@pytest.mark.parametrize("retry_s", [0.0, 0.05, 1.0, 300.0])
def test_the_retries_pause_for_about_retry_s_and_no_longer(retry_s: float) -> None:
    """Summed as redis-py's own back-off pauses after failure 1, 2, ... (counted from 0 they
    summed to twice retry_s: an API request on a Redis that was down took 3.1 s, not 1)."""
    retry = JobStore.from_url("redis://127.0.0.1:1/0", "faults", retry_s=retry_s).redis.get_retry()
    assert retry is not None
    backoff = ExponentialBackoff(cap=RETRY_CAP_S, base=RETRY_BASE_S)
    paused_s = sum(backoff.compute(failures) for failures in range(1, retry._retries + 1))
    if retry_s == 0:
        assert retry._retries == 0
    else:  # at least one retry (a blip), then as many as fit
        assert retry._retries >= 1
        assert paused_s <= max(retry_s, backoff.compute(1)), (retry._retries, paused_s)
        assert paused_s + backoff.compute(retry._retries + 1) > retry_s  # one more would not fit
