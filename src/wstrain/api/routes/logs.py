"""/v1/jobs/{id}/logs: a job's worker log, from the capped Redis stream its agent's shipper
appends to (agent/logship.py), so it reads the same from any API host.

    GET /v1/jobs/{id}/logs?after=&limit=     {"lines": [{"id", "line"}], "next", "more"}
                                             oldest first; page on with after=<next>
    GET /v1/jobs/{id}/logs?follow=true[&after=]     text/event-stream (Server-Sent Events):
        id: <stream id>\\ndata: <line>\\n\\n per line; ": keep-alive" comments while quiet
        (WSTRAIN_LOG_KEEPALIVE_S); `event: end` with the job's state once it is terminal
        and its log is drained; a reconnect's Last-Event-ID header resumes after that id.
        A stream that closes without `end` (the API shutting down, a proxy's cut) is to be
        resumed: `wstrain logs -f` reconnects after the last id it printed

    curl -N "$S/v1/jobs/$ID/logs?follow=true"          # or: wstrain logs -f $ID

Visibility as every job route: another owner's job is 404. At most
WSTRAIN_LOG_FOLLOWERS_MAX followers per API process (each holds a Redis connection in XREAD
BLOCK); over it 429. Everything on the event loop awaits redis.asyncio; nothing blocks.
"""

from __future__ import annotations

import json
import logging
import re
import signal
import time
from collections.abc import AsyncIterator, Callable
from typing import Annotated, Any, cast

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, BeforeValidator, Field
from starlette.types import Receive, Scope, Send

from wstrain.api.deps import Settings, Store, VisibleJob
from wstrain.api.responses import CALLER, JOB, error_responses
from wstrain.contracts.jobs import TERMINAL_STATES
from wstrain.contracts.stream_ids import (
    LAST_ID,
    STREAM_ID_PATTERN,
    STREAM_ID_SCHEMA,
    StreamId,
)
from wstrain.store import JobStore
from wstrain.store.logs import JobLogs, LogEntry, LogRead

log = logging.getLogger(__name__)

router = APIRouter(prefix="/v1/jobs", responses=CALLER)

PAGE_MAX_LINES = 1000  # a line is at most 8 KiB, so a page is at most 8 MiB
FOLLOW_BLOCK_MS = 1000  # a follower checks its job's state (and its client) once a second
FOLLOW_BATCH = 500  # entries per XREAD: one chunk of the response
# A terminal job whose worker's shipper has not marked the end of its log (an agent without
# a shipper, or one that died) ends its stream this long after it was drained; the shipper
# polls every 0.5 s, so a live one has marked the end well before.
END_GRACE_S = 5.0
SSE_RETRY_MS = 2000  # an EventSource reconnects after 2 s, with Last-Event-ID
FOLLOWERS_RETRY_AFTER_S = 5
_NEWLINES = re.compile(r"\r\n|\r|\n")


def _absent_if_null(value: object) -> object:
    # A header cannot carry JSON's null: an EventSource polyfill or an OpenAPI client with no
    # id yet sends the text "null" or an empty value. Both mean "no id": read from `after`.
    return None if value in ("", "null") else value


LastEventId = Annotated[StreamId | None, BeforeValidator(_absent_if_null)]
LAST_EVENT_ID_SCHEMA: dict[str, object] = {
    "pattern": f"^(null)?$|{STREAM_ID_PATTERN}",
    "description": "the last stream id this client saw; empty or `null` for none",
}


class LogLine(BaseModel):
    id: str = Field(description="the line's stream id: pass it as `after` to read past it")
    line: str


class LogPage(BaseModel):
    lines: list[LogLine]
    next: str | None = Field(description="the cursor to read after (the `after` given if none)")
    more: bool = Field(description="the log holds more entries past this page now")


class FollowerSlots:
    """How many log streams this API process serves at once, against its limit."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def take(self) -> bool:
        if self.used >= self.limit:
            return False
        self.used += 1
        return True

    def give(self) -> None:
        self.used = max(0, self.used - 1)


def follower_slots(request: Request, limit: int) -> FollowerSlots:
    """The app's slots, made on first use (one app per process, one event loop: no lock)."""
    slots = getattr(request.app.state, "log_followers", None)
    if slots is None:
        slots = request.app.state.log_followers = FollowerSlots(limit)
    return cast(FollowerSlots, slots)


class _FollowResponse(StreamingResponse):
    """Gives its follower slot back however the response ends: drained, the client gone,
    an error, or never started (the generator's own `finally` would not run then)."""

    def __init__(self, content: AsyncIterator[str], slots: FollowerSlots) -> None:
        super().__init__(
            content,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},  # nginx: stream
        )
        self._slots = slots

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._slots.give()


def _frame(entry: LogEntry) -> str:
    # a line holds no newline (the shipper splits on it), but one appended by hand may: each
    # piece is a data: field of the same event, which the client joins with "\n"
    data = "".join(f"data: {part}\n" for part in _NEWLINES.split(entry.line or ""))
    return f"id: {entry.id}\n{data}\n"


_TERMINAL = frozenset(s.value for s in TERMINAL_STATES)


def server_stopping() -> Callable[[], bool]:
    """Whether the server is shutting down. uvicorn waits for every open response before it
    exits, so a log stream would hold a restart until its job ended; followers end their
    stream (without `end`: clients reconnect) once this turns true. uvicorn's SIGTERM
    handler is its Server's bound `handle_exit`, whose `should_exit` says a shutdown began;
    under another server this stays False and streams end with their jobs."""
    server = getattr(signal.getsignal(signal.SIGTERM), "__self__", None)
    if server is None or not hasattr(server, "should_exit"):
        return lambda: False
    return lambda: bool(server.should_exit)


async def _end_of(
    st: JobStore, logs: JobLogs, job_id: str, terminal_at: float | None
) -> tuple[dict[str, Any] | None, float | None]:
    """The `end` event's data once the job has ended and its log is complete (or the
    grace for an unmarked end has passed), else None; and since when it is known ended."""
    state, attempt, pid = cast(
        list[str | None],  # the store's client decodes replies
        await st.redis.hmget(st.keys.job(job_id), ["state", "attempt", "worker_pid"]),
    )
    if state is not None and state not in _TERMINAL:
        return None, None  # running, or resumed since: a new attempt's lines will come
    now = time.monotonic()
    terminal_at = terminal_at or now
    last = await logs.last(job_id)
    # no worker in this attempt (cancelled while queued, failed while planning): no log
    complete = not pid or (last is not None and last.eof_attempt == int(attempt or 0))
    if state is None or complete or now - terminal_at >= END_GRACE_S:
        return {"state": state, "attempt": int(attempt or 0), "complete": complete}, terminal_at
    return None, terminal_at


async def _follow(
    request: Request,
    st: JobStore,
    job_id: str,
    after: str | None,
    keepalive_s: float,
) -> AsyncIterator[str]:
    logs = JobLogs.of(st)
    stopping = server_stopping()
    cursor = after
    yield f"retry: {SSE_RETRY_MS}\n\n"
    sent_at = time.monotonic()
    terminal_at: float | None = None
    while True:
        # wake for the next keep-alive on time; BLOCK 0 would mean forever, so at least 1 ms
        due_ms = (keepalive_s - (time.monotonic() - sent_at)) * 1000
        block_ms = int(max(1, min(FOLLOW_BLOCK_MS, due_ms)))
        entries = await logs.follow(job_id, cursor, block_ms, FOLLOW_BATCH)
        if stopping():
            return  # the client reconnects after `cursor`, to this server restarted or another
        if not entries:  # drained: now the job's state matters
            if await request.is_disconnected():
                return
            end, terminal_at = await _end_of(st, logs, job_id, terminal_at)
            if end is not None:
                # lines written before the job ended may have landed after the read above:
                # one more read, without blocking, and the end only if it finds none
                entries = await logs.follow(job_id, cursor, None, FOLLOW_BATCH)
                if not entries:
                    yield f"event: end\ndata: {json.dumps(end)}\n\n"
                    return
        if entries:
            cursor = entries[-1].id
            if chunk := "".join(_frame(e) for e in entries if e.line is not None):
                yield chunk
                sent_at = time.monotonic()
            continue
        if time.monotonic() - sent_at >= keepalive_s:
            yield ": keep-alive\n\n"
            sent_at = time.monotonic()


@router.get(
    "/{job_id}/logs",
    response_model=LogPage,
    responses={
        200: {
            "content": {"text/event-stream": {}},
            "description": "a page, or with "
            "follow=true a stream of `id:`/`data:` events ending with `event: end`",
        },
        **JOB,
        429: {
            **error_responses(429)[429],
            "description": "WSTRAIN_LOG_FOLLOWERS_MAX streams already served",
        },
    },
)
async def get_logs(
    job: VisibleJob,
    st: Store,
    settings: Settings,
    request: Request,
    after: Annotated[StreamId | None, Query(json_schema_extra=STREAM_ID_SCHEMA)] = None,
    limit: Annotated[int, Query(ge=1, le=PAGE_MAX_LINES)] = PAGE_MAX_LINES,
    follow: bool = False,
    last_event_id: Annotated[LastEventId, Header(json_schema_extra=LAST_EVENT_ID_SCHEMA)] = None,
) -> Response:
    """The job's worker log: a page of lines after `after`, or with follow=true a stream."""
    if not follow:
        if after == LAST_ID:  # nothing follows it, and Redis refuses to read after it
            read = LogRead([], after, False)
        else:
            read = await JobLogs.of(st).read(job.id, after, limit)
        page = LogPage(
            lines=[LogLine(id=e.id, line=e.line or "") for e in read.lines],
            next=read.next,
            more=read.more,
        )
        return Response(page.model_dump_json(), media_type="application/json")
    slots = follower_slots(request, settings.log_followers_max)
    if not slots.take():
        return JSONResponse(
            status_code=429,
            headers={"Retry-After": str(FOLLOWERS_RETRY_AFTER_S)},
            content={
                "detail": f"this API process already streams {slots.limit} logs, its "
                f"WSTRAIN_LOG_FOLLOWERS_MAX={slots.limit}; retry in "
                f"{FOLLOWERS_RETRY_AFTER_S} s, page with GET /v1/jobs/{job.id}/logs?after=, "
                "or raise WSTRAIN_LOG_FOLLOWERS_MAX",
                "limit": slots.limit,
            },
        )
    # an EventSource that reconnects sends the last id it saw; it is newer than `after`
    start = last_event_id or after
    log.debug("job %s: log follower %d/%d from %s", job.id, slots.used, slots.limit, start)
    return _FollowResponse(_follow(request, st, job.id, start, settings.log_keepalive_s), slots)
