"""Owners and admins against a real uvicorn and a real Redis with WSTRAIN_API_TOKENS set: a
user reaches only its own jobs (another owner's answers 404, as an unknown job does), an
admin reaches all, no route but the probes answers without a token; and the request-size and
cursor bounds that keep bad input from becoming a 500.

    pytest tests/api/test_auth.py
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from tests.conftest import Stack, bearer, secured_stack, tiny_spec

TOKENS = {
    "tok-alice": {"owner": "alice", "role": "user"},
    "tok-bob": "bob",  # the {token: owner} shorthand: a user
    "tok-root": {"owner": "ops", "role": "admin"},
}


@pytest.fixture(scope="module")
def secured(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = secured_stack(redis_url, tmp_path_factory, "secured", TOKENS)
    yield s
    s.stop()


def _submit(c: httpx.Client, token: str, name: str) -> str:
    r = c.post("/v1/jobs", json=tiny_spec(name), headers=bearer(token))
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


def test_another_users_job_is_not_found(secured: Stack) -> None:
    with secured.client() as c:
        job = _submit(c, "tok-alice", "alice-job")
        assert c.get(f"/v1/jobs/{job}", headers=bearer("tok-alice")).json()["owner"] == "alice"
        unknown = c.get("/v1/jobs/no-such-job", headers=bearer("tok-bob"))
        for method, path in (
            ("GET", f"/v1/jobs/{job}"),
            ("GET", f"/v1/jobs/{job}/plan"),
            ("GET", f"/v1/jobs/{job}/events"),
            ("POST", f"/v1/jobs/{job}/cancel"),
            ("POST", f"/v1/jobs/{job}/resume"),
        ):
            r = c.request(method, path, headers=bearer("tok-bob"))
            assert r.status_code == 404, (method, path, r.text)
            # the same answer as for a job that does not exist, but for the id
            assert r.json()["detail"] == unknown.json()["detail"].replace("no-such-job", job)
        listed = c.get("/v1/jobs", params={"limit": 500}, headers=bearer("tok-bob")).json()
        assert job not in {j["id"] for j in listed["jobs"]}
        theirs = c.get("/v1/jobs", params={"owner": "alice"}, headers=bearer("tok-bob")).json()
        assert theirs["jobs"] == [] and theirs["total"] == 0
        # nothing bob did touched it
        assert c.get(f"/v1/jobs/{job}", headers=bearer("tok-alice")).json()["state"] == "queued"


def test_a_user_lists_only_its_own_jobs(secured: Stack) -> None:
    with secured.client() as c:
        mine = _submit(c, "tok-bob", "bob-job")
        _submit(c, "tok-alice", "alice-other")
        listed = c.get("/v1/jobs", params={"limit": 500}, headers=bearer("tok-bob")).json()
        assert mine in {j["id"] for j in listed["jobs"]}
        assert {j["owner"] for j in listed["jobs"]} == {"bob"}
        assert listed["total"] == len(listed["jobs"])


def test_an_admin_sees_and_acts_on_every_job(secured: Stack) -> None:
    with secured.client() as c:
        job = _submit(c, "tok-alice", "for-admin")
        assert c.get(f"/v1/jobs/{job}", headers=bearer("tok-root")).json()["owner"] == "alice"
        everyone = c.get("/v1/jobs", params={"limit": 500}, headers=bearer("tok-root")).json()
        assert {"alice", "bob"} <= {j["owner"] for j in everyone["jobs"]}
        only = c.get("/v1/jobs", params={"owner": "alice"}, headers=bearer("tok-root")).json()
        assert only["jobs"] and {j["owner"] for j in only["jobs"]} == {"alice"}
        r = c.post(f"/v1/jobs/{job}/cancel", headers=bearer("tok-root"))
        assert r.status_code == 202 and r.json()["state"] == "cancelled"
        r = c.post(f"/v1/jobs/{job}/resume", headers=bearer("tok-root"))
        assert r.status_code == 202 and r.json()["state"] == "queued"
        events = c.get(f"/v1/jobs/{job}/events", headers=bearer("tok-alice")).json()
        assert any("by ops" in e["message"] for e in events)


ROUTES = [
    ("GET", "/v1/jobs"),
    ("POST", "/v1/jobs"),
    ("GET", "/v1/jobs/x"),
    ("GET", "/v1/jobs/x/plan"),
    ("GET", "/v1/jobs/x/events"),
    ("POST", "/v1/jobs/x/cancel"),
    ("POST", "/v1/jobs/x/resume"),
    ("POST", "/v1/plans"),
    ("GET", "/v1/nodes"),
    ("GET", "/v1/presets"),
    ("GET", "/openapi.json"),
    ("GET", "/docs"),
]


@pytest.mark.parametrize("header", [None, "Bearer nope", "Basic tok-alice", "tok-alice", ""])
def test_no_route_answers_without_a_valid_token(secured: Stack, header: str | None) -> None:
    headers = {} if header is None else {"Authorization": header}
    with secured.client() as c:
        for method, path in ROUTES:
            body = tiny_spec("anon") if method == "POST" else None
            r = c.request(method, path, json=body, headers=headers)
            assert r.status_code == 401, (method, path, r.status_code, r.text)
        # the probes and /metrics carry no job data and answer a supervisor or a Prometheus
        # that holds no secret
        assert c.get("/healthz").status_code == 200
        assert c.get("/readyz").status_code == 200
        metrics = c.get("/metrics")
        assert metrics.status_code == 200 and "alice" not in metrics.text
        # and with a token the schema is there
        assert "/v1/jobs" in c.get("/openapi.json", headers=bearer("tok-bob")).json()["paths"]


def test_a_body_over_the_limit_is_refused_unread(secured: Stack) -> None:
    with secured.client() as c:
        before = c.get("/v1/jobs", params={"limit": 1}, headers=bearer("tok-root")).json()["total"]
        spec = tiny_spec("huge")
        spec["name"] = "x" * (2 << 20)
        r = c.post("/v1/jobs", content=json.dumps(spec), headers=bearer("tok-alice"))
        assert r.status_code == 413 and "WSTRAIN_MAX_BODY_BYTES" in r.json()["detail"]

        def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it streams
            for _ in range(40):
                yield b" " * 65536
            yield json.dumps(tiny_spec("chunked")).encode()

        r = c.post("/v1/plans", content=chunks(), headers=bearer("tok-alice"))
        assert r.status_code == 413
        after = c.get("/v1/jobs", params={"limit": 1}, headers=bearer("tok-root")).json()["total"]
        assert after == before


@pytest.mark.parametrize("cursor", ["abc", "1-2-3", "-", "(0", "9" * 40, "1-x"])
def test_a_malformed_events_cursor_is_a_422(secured: Stack, cursor: str) -> None:
    with secured.client() as c:
        job = _submit(c, "tok-alice", "cursor")
        r = c.get(f"/v1/jobs/{job}/events", params={"after": cursor}, headers=bearer("tok-alice"))
        assert r.status_code == 422, r.text
        ok = c.get(f"/v1/jobs/{job}/events", headers=bearer("tok-alice")).json()
        r = c.get(
            f"/v1/jobs/{job}/events", params={"after": ok[0]["id"]}, headers=bearer("tok-alice")
        )
        assert r.status_code == 200 and r.json() == []


def test_metrics_name_jobs_and_owners_to_an_admin_token_only(secured: Stack) -> None:
    with secured.client() as c:
        job = _submit(c, "tok-alice", "alice-metrics")
        anonymous = c.get("/metrics").text
        as_user = c.get("/metrics", headers=bearer("tok-alice")).text
        as_admin = c.get("/metrics", headers=bearer("tok-root")).text
    assert f'job="{job}"' in as_admin and 'owner="alice"' in as_admin
    for text in (anonymous, as_user):  # counts only: no job id, no owner
        assert "wstrain_queue_depth" in text and 'wstrain_jobs{state="queued"}' in text
        assert job not in text and "alice" not in text and "wstrain_job_info" not in text


def test_the_queue_shows_a_user_only_their_jobs_at_their_true_positions(secured: Stack) -> None:
    with secured.client() as c:
        bob = _submit(c, "tok-bob", "bob-queued")
        alice = _submit(c, "tok-alice", "alice-queued")
        mine = c.get("/v1/queue", headers=bearer("tok-alice")).json()
        everyone = c.get("/v1/queue", headers=bearer("tok-root")).json()
    assert {j["owner"] for j in mine["jobs"]} == {"alice"} and mine["total"] >= 2
    positions = {j["id"]: j["position"] for j in everyone["jobs"]}
    assert positions[bob] < positions[alice]  # first come, first served at equal factors
    (entry,) = [j for j in mine["jobs"] if j["id"] == alice]
    assert entry["position"] == positions[alice]


def test_a_dependency_must_be_a_job_the_caller_may_see(secured: Stack) -> None:
    with secured.client() as c:
        bobs = _submit(c, "tok-bob", "bob-dep")
        spec = tiny_spec("alice-after", after=[bobs])
        r = c.post("/v1/jobs", json=spec, headers=bearer("tok-alice"))
        assert r.status_code == 422 and "after[0]" in r.text and bobs in r.text
        r = c.post("/v1/jobs", json=tiny_spec("bob-after", after=[bobs]), headers=bearer("tok-bob"))
        assert r.status_code == 201 and r.json()["spec"]["after"] == [bobs]
        r = c.post("/v1/jobs", json=tiny_spec("bad-id", after=["nope"]), headers=bearer("tok-bob"))
        assert r.status_code == 422 and "after" in r.text  # not a job id's shape
