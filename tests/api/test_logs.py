"""Worker logs through Redis: the agent's shipper tails a worker.log into a capped stream per
job, and GET /v1/jobs/{id}/logs pages it or follows it as Server-Sent Events — against a
real Redis, a real uvicorn with tokens, and (the last test) a real agent and worker.

    pytest tests/api/test_logs.py            # -m "not slow" skips the real-job test
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import Stack, make_stack, register_node, tiny_spec, wait_terminal
from wstrain.agent.logship import MAX_LINE_BYTES, LogShipper, split_lines
from wstrain.store import JobStore
from wstrain.store.logs import JobLogs

TOKENS = {"tok-alice": "alice", "tok-bob": "bob"}
ALICE = {"Authorization": "Bearer tok-alice"}
BOB = {"Authorization": "Bearer tok-bob"}
PREFIX = "logs"
FOLLOWERS_MAX = 2
KEEPALIVE_S = 0.3


@pytest.fixture(scope="module")
def logstack(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """API with tokens, no agent (jobs stay queued), 2 followers a process, quick keep-alives."""
    s = make_stack(
        redis_url,
        tmp_path_factory.mktemp("logs"),
        PREFIX,
        with_agent=False,
        extra_env={
            "WSTRAIN_API_TOKENS": json.dumps(TOKENS),
            "WSTRAIN_LOG_FOLLOWERS_MAX": str(FOLLOWERS_MAX),
            "WSTRAIN_LOG_KEEPALIVE_S": str(KEEPALIVE_S),
        },
    )
    register_node(redis_url, PREFIX)
    yield s
    s.stop()


class Shipper:
    """A LogShipper on its own event loop in a thread, as the agent runs it; stop() flushes."""

    def __init__(self, redis_url: str, prefix: str, job_id: str, path: Path, attempt: int = 1):
        self.redis_url, self.prefix = redis_url, prefix
        self.job_id, self.path, self.attempt = job_id, path, attempt
        self.loop = asyncio.new_event_loop()
        self.started = threading.Event()
        self.thread = threading.Thread(target=self.loop.run_until_complete, args=(self._run(),))
        self.thread.start()
        assert self.started.wait(10)

    async def _run(self) -> None:
        store = JobStore.from_url(self.redis_url, self.prefix)
        self.stop_event = asyncio.Event()
        self.started.set()
        shipper = LogShipper(JobLogs.of(store), self.job_id, self.attempt, self.path, poll_s=0.05)
        await shipper.run(self.stop_event)
        await store.close()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.stop_event.set)
        self.thread.join(10)
        assert not self.thread.is_alive()
        self.loop.close()


def _read_all(redis_url: str, prefix: str, job_id: str) -> list[Any]:
    async def go() -> list[Any]:
        store = JobStore.from_url(redis_url, prefix)
        try:
            return (await JobLogs.of(store).read(job_id, None, 1000)).entries
        finally:
            await store.close()

    return asyncio.run(go())


def _wait(pred: Any, timeout_s: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (got := pred()):
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)
    return got


def _sse(resp: httpx.Response) -> Iterator[dict[str, str]]:
    """Events of a text/event-stream: {"id", "data", "event"} and {"comment"} for keep-alives."""
    event: dict[str, str] = {}
    for line in resp.iter_lines():
        if line == "":
            if event:
                yield event
            event = {}
        elif line.startswith(":"):
            yield {"comment": line[1:].strip()}
        else:
            field, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            event[field] = (
                f"{event[field]}\n{value}" if field == "data" and field in event else value
            )


def _submit(c: httpx.Client, name: str) -> str:
    r = c.post("/v1/jobs", json=tiny_spec(name), headers=ALICE)
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


def test_lines_are_split_capped_and_a_partial_line_waits() -> None:
    long = b"x" * (MAX_LINE_BYTES + 100)
    chunk = split_lines(b"one\ntwo\r\n10%\r50%\r100%\n" + long + b"\nhalf", 1000, False, False)
    assert chunk.lines[:3] == ["one", "two", "100%"]  # CRLF and a \r-redrawn bar
    assert chunk.lines[3].startswith("x" * MAX_LINE_BYTES) and "cut at 8192" in chunk.lines[3]
    assert len(chunk.lines) == 4 and chunk.ends[0] == 1004 and not chunk.skipping
    assert chunk.consumed == 4 + 5 + 13 + len(long) + 1  # "half" waits for its newline
    assert split_lines(b"half", 0, False, final=True).lines == ["half"]
    # an over-long line with no newline yet: its head now, the rest dropped up to the newline
    head = split_lines(long, 0, False, False)
    assert len(head.lines) == 1 and head.skipping and head.consumed == len(long)
    rest = split_lines(b"more of it\nnext\n", len(long), True, False)
    assert rest.lines == ["next"] and not rest.skipping


def test_the_shipper_tails_a_growing_file_and_a_second_one_resumes(
    redis_url: str, tmp_path: Path
) -> None:
    path = tmp_path / "worker.log"
    path.write_bytes(b"")
    job_id = "shipper0test"
    shipper = Shipper(redis_url, "logship", job_id, path)
    with path.open("ab", buffering=0) as f:
        f.write(b"first line\nsecond ")
        _wait(lambda: [e.line for e in _read_all(redis_url, "logship", job_id)] == ["first line"])
        f.write(b"half\n" + b"y" * 20000 + b"\nunterminated")
        _wait(lambda: len(_read_all(redis_url, "logship", job_id)) == 3)
    shipper.stop()  # the worker exited: the unterminated tail and the end marker go out
    entries = _read_all(redis_url, "logship", job_id)
    assert [e.line for e in entries[:2]] == ["first line", "second half"]
    assert entries[2].line.startswith("y" * MAX_LINE_BYTES) and entries[2].line.endswith("bytes]")
    assert entries[3].line == "unterminated" and entries[3].end == path.stat().st_size
    assert entries[4].line is None and entries[4].eof_attempt == 1
    # a resumed attempt appends to the same file; its shipper ships only the new lines
    with path.open("ab") as f:
        f.write(b"\nattempt two\n")
    second = Shipper(redis_url, "logship", job_id, path, attempt=2)
    _wait(lambda: _read_all(redis_url, "logship", job_id)[-1].line == "attempt two")
    second.stop()
    lines = [e.line for e in _read_all(redis_url, "logship", job_id) if e.line is not None]
    assert lines == ["first line", "second half", lines[2], "unterminated", "", "attempt two"]


def test_a_log_pages_and_follows_as_server_sent_events(
    logstack: Stack, redis_url: str, tmp_path: Path
) -> None:
    path = tmp_path / "worker.log"
    path.write_text("line 1\nline 2\nline 3\n")
    with logstack.client() as c:
        job = _submit(c, "logs-follow")
        shipper = Shipper(redis_url, PREFIX, job, path)
        url = f"/v1/jobs/{job}/logs"
        _wait(lambda: len(c.get(url, headers=ALICE).json()["lines"]) == 3)
        page = c.get(url, params={"limit": 2}, headers=ALICE).json()
        assert [x["line"] for x in page["lines"]] == ["line 1", "line 2"] and page["more"]
        rest = c.get(url, params={"after": page["next"]}, headers=ALICE).json()
        assert [x["line"] for x in rest["lines"]] == ["line 3"] and not rest["more"]
        first_id = page["lines"][0]["id"]

        def later() -> None:  # lines while the client follows, then the job ends
            time.sleep(0.8)
            with path.open("a") as f:
                f.write("line 4\nline 5\n")
            time.sleep(0.5)
            assert c.post(f"/v1/jobs/{job}/cancel", headers=ALICE).status_code == 202

        writer = threading.Thread(target=later)
        with c.stream("GET", url, params={"follow": "true"}, headers=ALICE) as resp:
            assert resp.status_code == 200
            assert resp.headers["content-type"].startswith("text/event-stream")
            writer.start()
            events = list(_sse(resp))
        writer.join()
        shipper.stop()
        lines = [e["data"] for e in events if "id" in e]
        assert lines == [f"line {i}" for i in range(1, 6)]
        assert events[1]["id"] == first_id
        assert {"comment": "keep-alive"} in events  # quiet for > 0.3 s between the writes
        end = events[-1]
        assert end["event"] == "end" and json.loads(end["data"])["state"] == "cancelled"
        # a reconnect resumes after its Last-Event-ID; the job is over, so it ends at once
        with c.stream(
            "GET", url, params={"follow": "true"}, headers={**ALICE, "Last-Event-ID": first_id}
        ) as resp:
            again = [e for e in _sse(resp) if "comment" not in e]
        assert [e["data"] for e in again if "id" in e] == [f"line {i}" for i in range(2, 6)]
        assert again[-1]["event"] == "end"


def test_another_owners_log_is_not_found(logstack: Stack) -> None:
    with logstack.client() as c:
        job = _submit(c, "logs-private")
        for params in ({}, {"follow": "true"}):
            r = c.get(f"/v1/jobs/{job}/logs", params=params, headers=BOB)
            assert r.status_code == 404 and job in r.json()["detail"], r.text
            assert c.get(f"/v1/jobs/{job}/logs", params=params).status_code == 401
        assert c.get(f"/v1/jobs/{job}/logs", headers=ALICE).json()["lines"] == []


def test_followers_past_the_cap_get_429_and_a_closed_one_frees_its_slot(
    logstack: Stack,
) -> None:
    with logstack.client() as c:
        job = _submit(c, "logs-cap")  # stays queued: its followers never end by themselves
        url, params = f"/v1/jobs/{job}/logs", {"follow": "true"}
        held = [c.stream("GET", url, params=params, headers=ALICE) for _ in range(FOLLOWERS_MAX)]
        for cm in held:
            assert cm.__enter__().status_code == 200
        over = c.get(url, params=params, headers=ALICE)
        assert over.status_code == 429 and over.headers["retry-after"] == "5"
        assert "WSTRAIN_LOG_FOLLOWERS_MAX=2" in over.json()["detail"]
        assert c.get(url, headers=ALICE).status_code == 200  # pages are not followers
        held.pop().__exit__(None, None, None)

        def a_slot_is_free() -> bool:
            with c.stream("GET", url, params=params, headers=ALICE) as resp:
                return resp.status_code == 200

        _wait(a_slot_is_free, timeout_s=10)  # noticed within a second of the close
        for cm in held:
            cm.__exit__(None, None, None)


@pytest.mark.parametrize(
    ("params", "headers", "field"),
    [
        ({"limit": 0}, {}, "limit"),
        ({"limit": 1001}, {}, "limit"),
        ({"after": "abc"}, {}, "after"),
        ({"after": "1-2-3"}, {}, "after"),
        ({"follow": "perhaps"}, {}, "follow"),
        ({"follow": "true"}, {"Last-Event-ID": "(0"}, "last-event-id"),
    ],
)
def test_a_bad_parameter_is_a_422_naming_it(
    logstack: Stack, params: dict[str, Any], headers: dict[str, str], field: str
) -> None:
    with logstack.client() as c:
        job = _submit(c, "logs-params")
        r = c.get(f"/v1/jobs/{job}/logs", params=params, headers={**ALICE, **headers})
        assert r.status_code == 422, r.text
        assert field in [str(p).lower() for p in r.json()["detail"][0]["loc"]], r.text


@pytest.mark.slow
def test_a_real_jobs_log_follows_to_its_end(stack: Stack) -> None:
    with stack.client() as c:
        job = c.post("/v1/jobs", json=tiny_spec("logs-e2e", steps=60)).json()
        url = f"/v1/jobs/{job['id']}/logs"
        with c.stream("GET", url, params={"follow": "true"}, timeout=120) as resp:
            events = [e for e in _sse(resp) if "comment" not in e]
        assert wait_terminal(c, job["id"])["state"] == "succeeded"
        end = json.loads(events[-1]["data"])
        assert end == {"state": "succeeded", "attempt": 1, "complete": True}, events[-3:]
        followed = [e["data"] for e in events if "id" in e]
        assert any("no MFU" in line for line in followed), followed  # the worker's own line
        paged = [x["line"] for x in c.get(url).json()["lines"]]
        assert paged == followed
