"""Which Redis replies are storage faults (retried by the store, 503 from the API), and that
nothing else is: a wrong command still fails at once, however long the store retries.

    pytest tests/store/test_faults.py
"""

from __future__ import annotations

import asyncio
import time

import pytest
from redis.exceptions import (
    NoScriptError,
    OutOfMemoryError,
    ReadOnlyError,
    ResponseError,
)

from wstrain.store import JobStore
from wstrain.store.faults import storage_fault


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
