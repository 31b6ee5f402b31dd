"""Following a job from the terminal: `wstrain watch ID` (and `wstrain submit --follow`), a
live progress bar, and `wstrain logs [-f] ID`, the worker's log.

    wstrain watch 3f2a9c1e0b7d        # step/steps, loss, tok/s, ETA; polls once a second
    wstrain logs -f 3f2a9c1e0b7d      # the log so far, then each line as it is written

watch polls GET /v1/jobs/{id} every second and draws a `rich` bar on a terminal (a plain line
every 10 s when the output is a file or a pipe). Ctrl-C detaches: the job keeps running and
watch exits 0; it never cancels. When the job ends, it prints the final state and exits 0
for succeeded, 1 otherwise.

logs pages GET /v1/jobs/{id}/logs; with -f it follows the Server-Sent Events stream until
the job has ended and its log is drained, reconnecting after a dropped connection where it
left off (a server at its follower limit is polled instead). Ctrl-C exits 0 quietly.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn

from wstrain.cli.client import (
    REQUEST_TIMEOUT_S,
    ApiError,
    CliError,
    call,
    error_of,
    unreachable,
)
from wstrain.contracts.jobs import TERMINAL_STATES, JobState

POLL_S = 1.0
PLAIN_EVERY_S = 10.0  # a log file gets a progress line this often, not one a second
# a server restart (or a blip) is waited out this long before watch gives up
RECONNECT_S = 60.0
# The server sends a keep-alive every 15 s (WSTRAIN_LOG_KEEPALIVE_S); a read this long
# without one is a dead connection: reconnect after the last line seen.
SSE_READ_TIMEOUT_S = 60.0
SSE_MAX_RETRIES = 5
LOG_POLL_S = 2.0  # polling a log while the server's follower slots are all taken

STATE_STYLE = {
    "queued": "yellow",
    "planning": "cyan",
    "running": "bold cyan",
    "cancelling": "magenta",
    "succeeded": "bold green",
    "failed": "bold red",
    "cancelled": "dim",
    "timeout": "red",
}


def is_terminal(job: dict[str, Any]) -> bool:
    return JobState(job["state"]) in TERMINAL_STATES


def fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(max(0.0, seconds))
    days, s = divmod(s, 86400)
    text = f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"
    return f"{days}d {text}" if days else text


def fmt_rate(per_s: float | None) -> str:
    if per_s is None:
        return "-"
    for unit, scale in (("M", 1e6), ("k", 1e3)):
        if per_s >= scale:
            return f"{per_s / scale:.1f}{unit}"
    return f"{per_s:.0f}"


def fmt_loss(loss: float | None) -> str:
    return "-" if loss is None else f"{loss:.4f}"


def progress_fields(job: dict[str, Any]) -> dict[str, str]:
    return {
        "loss": fmt_loss(job.get("loss")),
        "rate": fmt_rate(job.get("tokens_per_s")),
        "eta": fmt_duration(job.get("eta_s")),
    }


def _fields(job: dict[str, Any]) -> dict[str, Any]:
    return dict(progress_fields(job))  # rich's **fields are typed Any


def _description(job: dict[str, Any]) -> str:
    state = job["state"]
    text = f"{escape(job['name'])} [{STATE_STYLE.get(state, '')}]{state}[/]"
    if job.get("state_reason") and not is_terminal(job):
        text += f" [dim]{escape(job['state_reason'][:60])}[/]"
    return text


def final_line(job: dict[str, Any]) -> str:
    text = (
        f"job {job['id']} {job['state']}: step {job['step']}/{job['steps']}, "
        f"loss {fmt_loss(job.get('loss'))}"
    )
    return text + (f"; error: {job['error']}" if job.get("error") else "")


def _exit_code(job: dict[str, Any]) -> int:
    print(final_line(job), flush=True)
    return 0 if job["state"] == JobState.succeeded.value else 1


class _Poller:
    """GET the job once a second; a server that stops answering is retried for
    RECONNECT_S (an API restart), an error it answers (404) ends the watch at once."""

    def __init__(self, c: httpx.Client, job_id: str) -> None:
        self.c, self.job_id = c, job_id
        self.ok_at = time.monotonic()
        self.trouble: str | None = None

    def poll(self, job: dict[str, Any]) -> dict[str, Any]:
        try:
            job = call(self.c, "GET", f"/v1/jobs/{self.job_id}")
        except ApiError as exc:
            if exc.status is not None and exc.status < 500:
                raise
            if time.monotonic() - self.ok_at > RECONNECT_S:
                raise CliError(f"{exc} (for {RECONNECT_S:.0f} s)") from exc
            self.trouble = "server not answering; retrying"
            return job
        self.ok_at, self.trouble = time.monotonic(), None
        return job


def _watch_bar(c: httpx.Client, job: dict[str, Any]) -> dict[str, Any]:
    poller = _Poller(c, job["id"])
    columns = (
        TextColumn("{task.description}"),
        BarColumn(bar_width=30),
        TextColumn("step {task.completed:.0f}/{task.total:.0f}"),
        TextColumn("loss {task.fields[loss]}"),
        TextColumn("{task.fields[rate]} tok/s"),
        TextColumn("ETA {task.fields[eta]}"),
    )
    # 3 columns short of the terminal: a line that fills it leaves the cursor past its last
    # column, so the "^C" the terminal echoes would wrap and the bar be drawn twice
    console = Console(width=max(40, Console().width - 3))
    with Progress(*columns, console=console, refresh_per_second=4) as bar:
        task = bar.add_task(
            _description(job), total=job["steps"], completed=job["step"], **_fields(job)
        )
        while not is_terminal(job):
            time.sleep(POLL_S)
            job = poller.poll(job)
            described = _description(job)
            if poller.trouble:
                described += f" [red]{poller.trouble}[/]"
            bar.update(
                task,
                description=described,
                total=job["steps"],
                completed=job["step"],
                **_fields(job),
            )
    return job


def _plain_line(job: dict[str, Any]) -> str:
    f = progress_fields(job)
    reason = f" ({job['state_reason']})" if job.get("state_reason") else ""
    return (
        f"{time.strftime('%H:%M:%S')} {job['state']}{reason} step {job['step']}/{job['steps']}"
        f" loss {f['loss']} {f['rate']} tok/s ETA {f['eta']}"
    )


def _watch_plain(c: httpx.Client, job: dict[str, Any]) -> dict[str, Any]:
    poller = _Poller(c, job["id"])
    print(_plain_line(job), flush=True)
    printed_at, printed = time.monotonic(), (job["state"], job["step"])
    while not is_terminal(job):
        time.sleep(POLL_S)
        job = poller.poll(job)
        now = (job["state"], job["step"])
        first_progress = printed[1] == 0 and job["step"] > 0
        due = time.monotonic() - printed_at >= PLAIN_EVERY_S and now != printed
        if now[0] != printed[0] or first_progress or due:
            print(_plain_line(job), flush=True)
            printed_at, printed = time.monotonic(), now
    return job


def watch(c: httpx.Client, job_id: str) -> int:
    """Follow `job_id` until it ends (its exit code) or Ctrl-C (0; the job keeps running)."""
    job = call(c, "GET", f"/v1/jobs/{job_id}")  # an unknown id fails at once
    try:
        if not is_terminal(job):
            job = _watch_bar(c, job) if sys.stdout.isatty() else _watch_plain(c, job)
    except KeyboardInterrupt:
        print(
            f"detached; job {job['id']} keeps running — re-attach with `wstrain watch {job['id']}`",
            file=sys.stderr,
            flush=True,
        )
        return 0
    return _exit_code(job)


# ---------------------------------------------------------------- logs


@dataclass
class SseEvent:
    kind: str  # "message" for a log line, "end" at the end of the log
    id: str | None
    data: str


def sse_events(lines: Iterator[str]) -> Iterator[SseEvent]:
    """Events of a text/event-stream (comments and `retry:` skipped)."""
    kind: str = "message"
    event_id: str | None = None
    data: list[str] = []
    for line in lines:
        if line == "":
            if data or kind != "message":
                yield SseEvent(kind, event_id, "\n".join(data))
            kind, event_id, data = "message", None, []
        elif line.startswith(":"):
            continue
        else:
            field, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if field == "data":
                data.append(value)
            elif field == "id":
                event_id = value
            elif field == "event":
                kind = value


def _write(lines: list[str]) -> None:
    if lines:
        sys.stdout.write("".join(f"{line}\n" for line in lines))
        sys.stdout.flush()


def _page(c: httpx.Client, job_id: str, after: str | None) -> tuple[list[str], str | None, bool]:
    params = {"after": after} if after else {}
    page = call(c, "GET", f"/v1/jobs/{job_id}/logs", params=params)
    return [x["line"] for x in page["lines"]], page["next"], page["more"]


def _print_pages(c: httpx.Client, job_id: str, after: str | None) -> str | None:
    while True:
        lines, after, more = _page(c, job_id, after)
        _write(lines)
        if not more:
            return after


def _poll_log(c: httpx.Client, job_id: str, after: str | None) -> int:
    """Pages every LOG_POLL_S until the job has ended and one more page came back empty."""
    ended = False
    while True:
        after = _print_pages(c, job_id, after)
        if ended:
            return 0
        ended = is_terminal(call(c, "GET", f"/v1/jobs/{job_id}"))
        time.sleep(LOG_POLL_S)


def _follow_log(c: httpx.Client, job_id: str) -> int:
    after: str | None = None
    retries = 0
    timeout = httpx.Timeout(REQUEST_TIMEOUT_S, read=SSE_READ_TIMEOUT_S)
    while True:
        params = {"follow": "true", **({"after": after} if after else {})}
        failure: CliError | None = None
        try:
            with c.stream("GET", f"/v1/jobs/{job_id}/logs", params=params, timeout=timeout) as r:
                if r.status_code == 429:
                    print(
                        "wstrain: the server streams as many logs as it may; polling every "
                        f"{LOG_POLL_S:.0f} s instead",
                        file=sys.stderr,
                    )
                    return _poll_log(c, job_id, after)
                if r.status_code >= 400:
                    r.read()
                    failure = error_of(r)
                    if r.status_code < 500:  # 404, 401: asking again will not help
                        raise failure
                for event in sse_events(r.iter_lines()):
                    if event.kind == "end":
                        return 0
                    if event.id is not None:
                        _write([event.data])
                        after, retries = event.id, 0
        except httpx.TransportError as exc:
            failure = unreachable(c, exc)
        # cut, refused (503: Redis away) or closed without its end event (an API restart):
        # again after `after`, backing off 1, 2, 4, 8, 10 s while nothing gets through
        retries += 1
        if retries > SSE_MAX_RETRIES:
            raise failure or CliError(
                f"the log stream of job {job_id} closed {retries} times without its end; "
                f"page it with `wstrain logs {job_id}`"
            )
        time.sleep(min(2.0 ** (retries - 1), 10.0))


def logs(c: httpx.Client, job_id: str, follow: bool) -> int:
    """Print the job's log; with `follow` until the job ends. Ctrl-C exits 0 quietly."""
    try:
        if not follow:
            _print_pages(c, job_id, None)
            return 0
        return _follow_log(c, job_id)
    except KeyboardInterrupt:
        return 0
