"""No 500s from what a client sends or from a full disk under Redis.

Stream ids past 2^64-1 (`after=`, `Last-Event-ID`) are a 422 naming the parameter, not a
Redis error. A Redis whose AOF directory is a full tmpfs refuses writes with MISCONF: every
write route answers 503 with Retry-After, reads keep working, and a running agent rides it
out (its process alive, its heartbeat back once space is freed).

    pytest tests/service/test_storage_faults.py
"""

from __future__ import annotations

import pytest

from tests.conftest import Stack, tiny_spec

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
