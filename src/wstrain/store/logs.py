"""Worker logs in Redis: one capped stream per job, so the API (which may run on another host
than the GPU agents and cannot read STATE_DIR/jobs/ID/worker.log) can page and follow them.

    logs = JobLogs.of(store)                        # the store's client and key prefix
    await logs.append(job_id, ["a line", "another"], ends=[7, 15])
    page = await logs.read(job_id, after=None, limit=1000)      # oldest first
    new = await logs.follow(job_id, after=page.next, block_ms=1000)   # XREAD BLOCK

The agent's shipper (agent/logship.py) appends what a worker writes; the API's
/v1/jobs/{id}/logs route reads. Each entry is one line of the log (`line`) and the byte
offset in worker.log just past it (`end`), so a shipper started again (a resumed attempt, a
restarted agent) carries on where the last one stopped, neither losing nor repeating a
line. When a worker exits its shipper appends an end marker (`eof` = the attempt), which
tells a follower that this attempt's log is complete.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import redis.asyncio as aioredis

if TYPE_CHECKING:
    from wstrain.store.job_store import JobStore

log = logging.getLogger(__name__)

# A job keeps about its newest 20,000 lines (MAXLEN ~, trimmed by whole radix nodes, so a
# few hundred more at times): at ~120 bytes a line about 2.4 MB of Redis per job.
LOG_MAXLEN = 20_000
# A log nobody wrote to for 30 days is dropped with its stream; the job record stays.
LOG_RETENTION_S = 30 * 86400
# XADDs per MULTI: a burst of 100,000 short lines goes in 100 round trips, not one huge one.
APPEND_BATCH = 1000


@dataclass(frozen=True)
class LogEntry:
    """One stream entry: a line of the log, or (line None) the end marker of an attempt."""

    id: str  # the Redis stream id, "<ms>-<seq>": the cursor to read after
    line: str | None
    end: int | None  # byte offset in worker.log just past this line
    eof_attempt: int | None = None  # set on an end marker: the attempt whose worker exited


@dataclass(frozen=True)
class LogRead:
    """A page of entries, the cursor after them, and whether the stream holds more."""

    entries: list[LogEntry]
    next: str | None  # the id of the last entry read (the given cursor when none was)
    more: bool

    @property
    def lines(self) -> list[LogEntry]:
        return [e for e in self.entries if e.line is not None]


def _entry(entry_id: str, fields: dict[str, str]) -> LogEntry:
    end = fields.get("end")
    eof = fields.get("eof")
    return LogEntry(
        id=entry_id,
        line=None if eof is not None else fields.get("line", ""),
        end=int(end) if end else None,
        eof_attempt=int(eof) if eof else None,
    )


class JobLogs:
    """The log streams of every job under one key prefix, on the store's Redis client."""

    def __init__(
        self, redis: aioredis.Redis, prefix: str = "wstrain", maxlen: int = LOG_MAXLEN
    ) -> None:
        self.redis = redis
        self.prefix = prefix
        self.maxlen = maxlen

    @classmethod
    def of(cls, store: JobStore) -> JobLogs:
        return cls(store.redis, store.keys.prefix)

    def key(self, job_id: str) -> str:  # stream: {line, end} entries and {eof, end} markers
        return f"{self.prefix}:logs:{job_id}"

    async def append(
        self, job_id: str, lines: Sequence[str], ends: Sequence[int] | None = None
    ) -> str | None:
        """Append `lines` (each without its newline), oldest first; `ends[i]` is worker.log's
        byte offset just past line i (the shipper's resume point; None for lines from
        elsewhere). Atomic per batch of APPEND_BATCH lines. The id of the last entry written,
        None for no lines."""
        if ends is not None and len(ends) != len(lines):
            raise ValueError(f"{len(lines)} lines but {len(ends)} end offsets; pass one each")
        last: str | None = None
        key = self.key(job_id)
        for start in range(0, len(lines), APPEND_BATCH):
            async with self.redis.pipeline(transaction=True) as pipe:
                for i in range(start, min(start + APPEND_BATCH, len(lines))):
                    fields: dict[str, str | int] = {"line": lines[i]}
                    if ends is not None:
                        fields["end"] = ends[i]
                    pipe.xadd(key, fields, maxlen=self.maxlen, approximate=True)  # type: ignore[arg-type]
                pipe.expire(key, LOG_RETENTION_S)
                ids = await pipe.execute()
            last = cast(str, ids[-2])
        return last

    async def mark_end(self, job_id: str, attempt: int, end: int) -> str:
        """The end marker of `attempt`: its worker exited and every line it wrote is in."""
        key = self.key(job_id)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.xadd(key, {"eof": attempt, "end": end}, maxlen=self.maxlen, approximate=True)
            pipe.expire(key, LOG_RETENTION_S)
            entry_id, _ = await pipe.execute()
        return cast(str, entry_id)

    async def read(self, job_id: str, after: str | None = None, limit: int = 1000) -> LogRead:
        """Up to `limit` entries after the id `after` (from the oldest kept with None)."""
        rows = cast(
            list[tuple[str, dict[str, str]]],
            await self.redis.xrange(
                self.key(job_id), min=f"({after}" if after else "-", max="+", count=limit + 1
            ),
        )
        entries = [_entry(i, f) for i, f in rows[:limit]]
        return LogRead(entries, entries[-1].id if entries else after, len(rows) > limit)

    async def follow(
        self, job_id: str, after: str | None, block_ms: int | None, limit: int = 500
    ) -> list[LogEntry]:
        """The entries after `after` (None: from the start), waiting up to `block_ms` (> 0;
        None: not at all) for the first one to arrive (XREAD BLOCK); [] when none came."""
        if block_ms is not None and block_ms <= 0:
            raise ValueError(f"block_ms={block_ms}: BLOCK 0 waits forever; pass >= 1 or None")
        reply: Any = await self.redis.xread(
            {self.key(job_id): after or "0-0"}, count=limit, block=block_ms
        )
        if not reply:
            return []
        # RESP3 answers {key: [[id, fields], ...]}, RESP2 [[key, [(id, fields), ...]]]
        rows = next(iter(reply.values())) if isinstance(reply, dict) else reply[0][1]
        return [_entry(i, f) for i, f in rows]

    async def last(self, job_id: str) -> LogEntry | None:
        """The newest entry, None for a job with no log yet."""
        rows = cast(
            list[tuple[str, dict[str, str]]],
            await self.redis.xrevrange(self.key(job_id), max="+", min="-", count=1),
        )
        return _entry(*rows[0]) if rows else None

    async def resume_offset(self, job_id: str) -> int:
        """The worker.log offset past the last line shipped (0 for a job with no log)."""
        last = await self.last(job_id)
        return last.end if last is not None and last.end is not None else 0

    async def delete(self, job_id: str) -> None:
        await self.redis.delete(self.key(job_id))
