"""No 500s from what a client sends or from a full disk, under Redis or the state dir.

Stream ids past 2^64-1 (`after=`, `Last-Event-ID`) are a 422 naming the parameter, not a
Redis error. A Redis whose AOF directory is a full tmpfs refuses writes with MISCONF: every
write route answers 503 with Retry-After, reads keep working, and a running agent rides it
out (its process alive, its job training on, its heartbeat back once space is freed). A
full state dir fails a real job's checkpoint with the documented message. The tmpfs tests
mount file systems (tests/tmpfs.py): they skip, saying why, where mount is refused.

    pytest tests/api/test_storage_faults.py
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import Stack, make_stack, tiny_spec, wait_job, wait_terminal
from tests.tmpfs import fill, small_fs

U64_MAX = 2**64 - 1


@pytest.fixture(scope="module")
def queued_job(api_only: Stack) -> str:
    with api_only.client() as c:
        r = c.post("/v1/jobs", json=tiny_spec("stream-ids"))
        assert r.status_code == 201, r.text
        return str(r.json()["id"])


@pytest.mark.parametrize("route", ["events", "logs"])
@pytest.mark.parametrize(
    "after",
    [
        "99999999999999999999",  # the issue's: 20 digits, past 2^64-1
        f"{U64_MAX + 1}",
        f"1-{U64_MAX + 1}",
        f"{U64_MAX + 1}-0",
        "9" * 5000,  # past Python's int-from-string limit too
    ],
)
def test_stream_ids_past_u64_are_422(
    api_only: Stack, queued_job: str, route: str, after: str
) -> None:
    with api_only.client() as c:
        r = c.get(f"/v1/jobs/{queued_job}/{route}", params={"after": after})
    assert r.status_code == 422, r.text
    (err,) = r.json()["detail"]
    assert err["loc"] == ["query", "after"]
    assert "past 2^64-1 (18446744073709551615)" in err["msg"], err


@pytest.mark.parametrize("route", ["events", "logs"])
@pytest.mark.parametrize("after", ["01", "1-007"])
def test_stream_ids_with_leading_zeros_are_422(
    api_only: Stack, queued_job: str, route: str, after: str
) -> None:
    with api_only.client() as c:
        r = c.get(f"/v1/jobs/{queued_job}/{route}", params={"after": after})
    assert r.status_code == 422, r.text
    assert "leading zero" in r.json()["detail"][0]["msg"]


def test_last_event_id_past_u64_is_422(api_only: Stack, queued_job: str) -> None:
    with api_only.client() as c:
        r = c.get(
            f"/v1/jobs/{queued_job}/logs",
            params={"follow": "true"},
            headers={"Last-Event-ID": f"{U64_MAX + 1}-1"},
        )
    assert r.status_code == 422, r.text
    (err,) = r.json()["detail"]
    assert err["loc"] == ["header", "last-event-id"]
    assert "past 2^64-1" in err["msg"]


@pytest.mark.parametrize("route", ["events", "logs"])
@pytest.mark.parametrize(
    "after", [f"{U64_MAX}-{U64_MAX}", f"{U64_MAX}", f"{U64_MAX - 1}-{U64_MAX}"]
)
def test_largest_stream_ids_read_an_empty_page(
    api_only: Stack, queued_job: str, route: str, after: str
) -> None:
    """Ids up to 2^64-1 are ids: nothing follows them, which is an empty page, not an
    error (Redis refuses to read after the very last id: the route answers for it)."""
    with api_only.client() as c:
        r = c.get(f"/v1/jobs/{queued_job}/{route}", params={"after": after})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body == [] if route == "events" else body["lines"] == []
        # and a small id reads what is there: the job's `queued` event
        if route == "events":
            assert c.get(f"/v1/jobs/{queued_job}/events", params={"after": "0"}).json()


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB file system of its own, for Redis' --dir."""
    with small_fs(tmp_path / "small-disk", "4m") as disk:
        yield disk


@pytest.mark.slow  # the whole service and a real worker, about 45 s
def test_a_full_disk_under_redis_is_503_and_the_agent_rides_it_out(
    small_disk: Path, tmp_path: Path
) -> None:
    import redis

    from tests.ports import free_port
    from wstrain.cli.serve import start_redis

    port = free_port()
    redis_proc = start_redis(small_disk, port)  # --dir on the small disk, AOF on
    probe = redis.Redis(port=port)
    stack: Stack | None = None
    try:
        stack = make_stack(f"redis://127.0.0.1:{port}/0", tmp_path, "fulldisk", with_agent=True)
        assert stack.agent is not None
        with stack.client() as c:
            r = c.post("/v1/jobs", json=tiny_spec("through-the-fault", steps=150))
            assert r.status_code == 201, r.text
            job_id = r.json()["id"]
            wait_job(c, job_id, lambda j: j["state"] == "running", 120)

            ballast = fill(small_disk)
            deadline = time.monotonic() + 30
            while True:  # Redis' next AOF write fails; from then on it refuses writes
                try:
                    probe.set("probe", "1")
                except redis.ResponseError as exc:
                    assert str(exc).startswith("MISCONF"), exc
                    break
                assert time.monotonic() < deadline, "Redis still takes writes on a full disk"
                time.sleep(0.1)

            for method, path, body in (
                ("POST", "/v1/jobs", tiny_spec("refused")),
                ("POST", f"/v1/jobs/{job_id}/cancel", None),
            ):
                r = c.request(method, path, json=body)
                assert r.status_code == 503, (method, path, r.status_code, r.text)
                assert r.headers["Retry-After"] == "10"
                assert r.json()["fault"] == "MISCONF"
                assert "disk is full" in r.json()["detail"]
            for path in (
                "/v1/jobs",
                f"/v1/jobs/{job_id}",
                f"/v1/jobs/{job_id}/events",
                f"/v1/jobs/{job_id}/logs",
                "/v1/nodes",
                "/v1/queue",
                "/healthz",
            ):
                r = c.get(path)  # Redis serves reads while it refuses writes
                assert r.status_code == 200, (path, r.status_code, r.text)

            time.sleep(3)  # six heartbeats' worth of refused writes
            assert stack.agent.poll() is None, "the agent exited on a full disk under Redis"
            assert c.get(f"/v1/jobs/{job_id}").json()["state"] == "running"

            ballast.unlink()
            freed_at = time.time()
            deadline = time.monotonic() + 30
            while True:  # the agent's heartbeat lands again
                nodes = c.get("/v1/nodes").json()["nodes"]
                if nodes and nodes[0]["heartbeat_at"] > freed_at:
                    break
                assert time.monotonic() < deadline, f"no heartbeat since space was freed: {nodes}"
                time.sleep(0.2)
            assert stack.agent.poll() is None
            done = wait_terminal(c, job_id)
            assert (done["state"], done["attempt"]) == ("succeeded", 1), done
            assert c.post("/v1/jobs", json=tiny_spec("after-the-fault")).status_code == 201
    finally:
        if stack is not None:
            stack.stop()
        probe.close()
        redis_proc.terminate()
        redis_proc.wait(10)


@pytest.mark.slow  # the whole service and a real worker, about 45 s
def test_a_full_state_dir_fails_the_checkpoint_naming_what_filled_up(
    redis_url: str, tmp_path: Path
) -> None:
    """A real job whose state dir (a 64 MiB tmpfs) fills up while it trains: its checkpoint
    fails with the documented message, naming the checkpoint dir and the bytes free there,
    and the checkpoint before it stays the job's last."""
    with small_fs(tmp_path / "state", "64m") as state:
        stack: Stack | None = None
        try:
            stack = make_stack(redis_url, tmp_path, "fullstate", with_agent=True)
            with stack.client() as c:
                spec = tiny_spec("fills-the-disk", steps=400, checkpoint_every=100, max_retries=0)
                r = c.post("/v1/jobs", json=spec)
                assert r.status_code == 201, r.text
                job_id = r.json()["id"]
                first = wait_job(c, job_id, lambda j: j["last_checkpoint"] is not None, 120)
                fill(state)
                done = wait_terminal(c, job_id)
            assert done["state"] == "failed", done
            error = done["error"]
            root = state / "jobs" / job_id / "checkpoints"
            assert "checkpoint of step" in error and "not written: no space left on" in error
            assert f"({root}: " in error and " bytes free; " in error, error
            assert "Free space on that file system" in error, error
            assert done["last_checkpoint"] == first["last_checkpoint"]
            latest = (root / "latest").read_text().strip()
            assert str(first["last_checkpoint"]).endswith(latest), (latest, first)
            assert not list(root.glob(".tmp-*"))
        finally:
            if stack is not None:
                stack.stop()


def test_a_redis_error_that_is_no_storage_fault_stays_a_500(redis_url: str, tmp_path: Path) -> None:
    """Only the storage faults are 503: a reply that says the store is wrong (a key of the
    wrong type, planted here) is a bug, and answers as one. On an API of its own: the 500 it
    provokes would stay in the shared api_only's /metrics, where test_hostile.py checks
    that no 5xx was ever answered (under xdist this module may run first)."""
    import redis

    stack = make_stack(redis_url, tmp_path, "wrongtype", with_agent=False)
    r = redis.Redis.from_url(redis_url)
    key = "wrongtype:job:wrongtype0001"
    r.set(key, "not a hash")
    try:
        with stack.client() as c:
            got = c.get("/v1/jobs/wrongtype0001")
        assert got.status_code == 500, got.text
    finally:
        r.delete(key)
        r.close()
        stack.stop()


def test_a_disk_that_refuses_a_write_is_503_and_other_os_errors_stay_500(
    small_disk: Path,
) -> None:
    """The API writes no file today; the mapper still answers a write that a full disk
    refuses (a real ENOSPC, on a full tmpfs) with 503 + Retry-After, and any other OSError
    (a missing file: a bug) with 500. A bare app with the API's own handlers, in process."""
    import asyncio

    from fastapi import FastAPI

    from wstrain.api.errors import install_error_handlers

    app = FastAPI()
    install_error_handlers(app)

    @app.post("/write")
    def write() -> dict[str, str]:
        (small_disk / "note").write_bytes(b"x" * 65536)
        return {}

    @app.get("/missing")
    def missing() -> dict[str, str]:
        return {"text": (small_disk / "no-such-file").read_text()}

    async def go() -> tuple[httpx.Response, httpx.Response]:
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as c:
            return await c.post("/write"), await c.get("/missing")

    fill(small_disk)
    full, missing_file = asyncio.run(go())
    assert full.status_code == 503, full.text
    assert full.headers["Retry-After"] == "10"
    assert full.json()["fault"] == "ENOSPC"
    assert missing_file.status_code == 500, missing_file.text
