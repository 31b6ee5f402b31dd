"""The log shipper: tails one worker's STATE_DIR/jobs/ID/worker.log into the job's capped
Redis stream (store/logs.py), so the API can page and follow it from any host.

The agent starts one per worker, right after spawning it; it stops by itself once the
worker process exits, after shipping the rest of the file and an end marker:

    ship_worker_log(store, job, jdir / "worker.log", proc)     # returns the asyncio.Task

Or driven by hand (the tests do), until an event is set:

    shipper = LogShipper(JobLogs.of(store), job_id, attempt, path)
    await shipper.run(stop)        # stop: asyncio.Event; flushes the rest once it is set

Every 0.5 s it reads the bytes appended since the last poll, splits them into lines (at
most 8 KiB each, a longer one is cut with a note) and appends the complete ones. It starts
where the stream's last entry says the previous shipper of this job stopped (a resumed
attempt appends to the same file), so no line is shipped twice or lost across attempts or an
agent restart. A Redis outage loses nothing: the offset advances only after a write lands.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from redis.exceptions import RedisError

from wstrain.agent.zygote import WorkerProcess
from wstrain.contracts.jobs import Job
from wstrain.store import JobStore
from wstrain.store.logs import JobLogs

log = logging.getLogger(__name__)

POLL_S = 0.5  # a line reaches a follower about this long after the worker wrote it
MAX_LINE_BYTES = 8 << 10  # longer lines (a dumped tensor, a progress bar on \r) are cut
READ_BYTES = 1 << 20  # a poll reads at most 1 MiB at a time, however far behind it is
# On a cancelled agent, the last flush gets this long before the shipper gives up on Redis.
FINAL_FLUSH_S = 2.0

_RUNNING: set[asyncio.Task[None]] = set()  # asyncio holds tasks weakly; these are ours


@dataclass(frozen=True)
class Chunk:
    """Lines cut from a run of bytes, the offset past each, and how far it consumed."""

    lines: list[str]
    ends: list[int]
    consumed: int  # bytes of the input used; the rest is an incomplete last line
    skipping: bool  # inside an over-long line whose first MAX_LINE_BYTES were shipped


def _text(raw: bytes, cut: bool) -> str:
    text = raw.decode("utf-8", errors="replace").rstrip("\r")
    # a line redrawn with \r (a progress bar) shows its last state, as a terminal would
    text = text.rsplit("\r", 1)[-1]
    return f"{text} [line cut at {MAX_LINE_BYTES} bytes]" if cut else text


def split_lines(data: bytes, base: int, skipping: bool, final: bool) -> Chunk:
    """Cut `data` (which starts at file offset `base`) into lines. An incomplete last line
    stays unconsumed unless `final` (the worker exited) or it is already over the cap;
    `skipping` drops the bytes up to the next newline (the rest of a cut line)."""
    lines: list[str] = []
    ends: list[int] = []
    pos = 0
    while pos < len(data):
        nl = data.find(b"\n", pos)
        if nl < 0:
            tail = data[pos:]
            if skipping:
                return Chunk(lines, ends, len(data), not final)
            if len(tail) >= MAX_LINE_BYTES:
                lines.append(_text(tail[:MAX_LINE_BYTES], cut=True))
                ends.append(base + len(data))
                return Chunk(lines, ends, len(data), not final)
            if final:
                lines.append(_text(tail, cut=False))
                ends.append(base + len(data))
                return Chunk(lines, ends, len(data), False)
            return Chunk(lines, ends, pos, False)
        raw = data[pos:nl]
        if not skipping:
            lines.append(_text(raw[:MAX_LINE_BYTES], cut=len(raw) > MAX_LINE_BYTES))
            ends.append(base + nl + 1)
        skipping = False
        pos = nl + 1
    return Chunk(lines, ends, pos, skipping)


def _read(path: Path, offset: int) -> tuple[bytes, int]:
    """Up to READ_BYTES of `path` from `offset`, and the file's size (0 when absent)."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size <= offset:
                return b"", size
            f.seek(offset)
            return f.read(READ_BYTES), size
    except FileNotFoundError:
        return b"", 0


class LogShipper:
    """Ships one attempt's worker.log into the job's stream; `run` until stopped."""

    def __init__(
        self,
        logs: JobLogs,
        job_id: str,
        attempt: int,
        path: Path,
        poll_s: float = POLL_S,
    ) -> None:
        self.logs = logs
        self.job_id = job_id
        self.attempt = attempt
        self.path = path
        self.poll_s = poll_s
        self.offset = 0  # bytes of the file shipped (or deliberately dropped)
        self.skipping = False
        self.lines_shipped = 0

    async def run(self, stop: asyncio.Event) -> None:
        """Tail the file until `stop` is set, then ship what is left and the end marker."""
        start = await self._start_offset(stop)
        if start is None:
            log.warning("job %s: worker exited while Redis was away; log not shipped", self.job_id)
            return
        self.offset = start
        try:
            while not stop.is_set():
                await self._ship(final=False)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.poll_s)
            await self._finish()
        except asyncio.CancelledError:
            # the agent is going away: one bounded try at the rest, then go
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._finish(), FINAL_FLUSH_S)
            raise

    async def _start_offset(self, stop: asyncio.Event) -> int | None:
        """Where the last shipper of this job stopped; None if `stop` came first."""
        while True:
            try:
                resume = await self.logs.resume_offset(self.job_id)
                break
            except RedisError as exc:
                if stop.is_set():
                    return None
                log.warning("job %s: log shipping waits for Redis: %s", self.job_id, exc)
                await asyncio.sleep(self.poll_s)
        size = (await asyncio.to_thread(_read, self.path, 0))[1]
        # a file smaller than what was shipped is a new file (a wiped state dir): read it all
        return resume if resume <= size else 0

    async def _ship(self, final: bool) -> None:
        while True:
            data, size = await asyncio.to_thread(_read, self.path, self.offset)
            if size < self.offset:  # truncated under us: start again at its new end
                log.warning(
                    "job %s: %s shrank from %d to %d bytes; shipping from its end",
                    self.job_id,
                    self.path,
                    self.offset,
                    size,
                )
                self.offset, self.skipping = size, False
                return
            if not data:
                return
            last_read = self.offset + len(data) >= size
            chunk = split_lines(data, self.offset, self.skipping, final and last_read)
            if chunk.lines:
                try:
                    await self.logs.append(self.job_id, chunk.lines, chunk.ends)
                except RedisError as exc:  # keep the offset: the same lines go next poll
                    log.warning("job %s: log lines not shipped, retrying: %s", self.job_id, exc)
                    return
            self.lines_shipped += len(chunk.lines)
            self.offset += chunk.consumed
            self.skipping = chunk.skipping
            if last_read or chunk.consumed == 0:
                return

    async def _finish(self) -> None:
        await self._ship(final=True)
        try:
            await self.logs.mark_end(self.job_id, self.attempt, self.offset)
        except RedisError as exc:
            log.warning("job %s: end of the log not marked: %s", self.job_id, exc)
        log.debug("job %s: %d log lines shipped", self.job_id, self.lines_shipped)


async def _until_exit(shipper: LogShipper, proc: WorkerProcess) -> None:
    stop = asyncio.Event()
    waiter = asyncio.ensure_future(proc.wait())
    waiter.add_done_callback(lambda _: stop.set())
    try:
        await shipper.run(stop)
    finally:
        waiter.cancel()


def ship_worker_log(
    store: JobStore, job: Job, path: Path, proc: WorkerProcess
) -> asyncio.Task[None]:
    """Start shipping `path` (the worker.log of `job`'s current attempt) until `proc`
    exits; the task is held here, so the caller may drop it."""
    shipper = LogShipper(JobLogs.of(store), job.id, job.attempt, path)
    task = asyncio.create_task(_until_exit(shipper, proc), name=f"logship-{job.id}")
    _RUNNING.add(task)
    task.add_done_callback(_RUNNING.discard)
    return task
