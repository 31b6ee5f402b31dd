"""Granted priority classes against a real uvicorn and a real Redis with WSTRAIN_API_TOKENS
set: a user's `priority` above its grant is a 403 naming the grant and the fix, on
POST /v1/jobs, /v1/plans and resume; admins grant, read and revoke over /v1/grants (users
read their own); a grant's quota holds under concurrent submissions; with auth off every
caller is an admin. Scheduling with grants is tests/e2e/test_priority_grants.py.

    pytest tests/api/test_grants.py
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from tests.conftest import Stack, bearer, secured_stack, tiny_spec
from wstrain.contracts.errors import Forbidden
from wstrain.contracts.grants import PriorityGrant, check_class, effective_priority

TOKENS = {
    "tok-alice": {"owner": "alice", "role": "user"},
    "tok-bob": {"owner": "bob", "role": "user"},
    "tok-carol": {"owner": "carol", "role": "user"},
    "tok-dave": {"owner": "dave", "role": "user"},
    "tok-root": {"owner": "ops", "role": "admin"},
}


@pytest.fixture(scope="module")
def secured(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = secured_stack(redis_url, tmp_path_factory, "grants", TOKENS)
    yield s
    s.stop()


def _total(c: httpx.Client) -> int:
    return int(c.get("/v1/jobs", params={"limit": 1}, headers=bearer("tok-root")).json()["total"])


def _submit(c: httpx.Client, token: str, name: str, priority: int) -> httpx.Response:
    return c.post("/v1/jobs", json=tiny_spec(name, priority=priority), headers=bearer(token))


def _grant(c: httpx.Client, owner: str, max_priority: int, max_jobs: int) -> dict[str, Any]:
    body = {"max_priority": max_priority, "max_jobs": max_jobs}
    r = c.put(f"/v1/grants/{owner}", json=body, headers=bearer("tok-root"))
    assert r.status_code == 200, r.text
    return dict(r.json())


def test_a_class_above_the_owners_grant_is_a_403_naming_it(secured: Stack) -> None:
    with secured.client() as c:
        before = _total(c)
        r = _submit(c, "tok-alice", "no-grant", 50)
        assert r.status_code == 403, r.text
        body = r.json()
        assert body["field"] == "priority" and body["owner"] == "alice"
        assert body["max_priority"] == 0
        assert "priority=50" in body["detail"] and "holds no priority grant" in body["detail"]
        assert "wstrain grant alice --max-priority 50" in body["detail"]
        plan = c.post(
            "/v1/plans", json=tiny_spec("no-grant", priority=1), headers=bearer("tok-alice")
        )
        assert plan.status_code == 403 and "priority=1" in plan.json()["detail"]
        assert _total(c) == before  # nothing queued
        # the default class and those below it need no grant
        for p in (0, -100):
            assert _submit(c, "tok-alice", f"class-{p}", p).status_code == 201
        # an admin submits any class
        r = _submit(c, "tok-root", "admin-top", 100)
        assert r.status_code == 201 and r.json()["owner"] == "ops"


def test_admins_grant_and_revoke_users_read_their_own(secured: Stack) -> None:
    with secured.client() as c:
        body = {"max_priority": 20, "max_jobs": 1}
        r = c.put("/v1/grants/bob", json=body, headers=bearer("tok-bob"))
        assert r.status_code == 403 and "admin token" in r.json()["detail"], r.text
        assert c.delete("/v1/grants/bob", headers=bearer("tok-bob")).status_code == 403
        assert c.get("/v1/grants/bob", headers=bearer("tok-bob")).status_code == 404
        assert _submit(c, "tok-bob", "before-grant", 20).status_code == 403

        g = _grant(c, "bob", 20, 1)
        assert (g["owner"], g["max_priority"], g["max_jobs"], g["granted_by"]) == (
            "bob", 20, 1, "ops"
        )  # fmt: skip
        mine = c.get("/v1/grants/bob", headers=bearer("tok-bob"))
        assert mine.status_code == 200 and mine.json()["max_priority"] == 20
        assert c.get("/v1/grants", headers=bearer("tok-bob")).json()["grants"] == [mine.json()]
        # another owner's grant is not a user's to read; the list shows a user its own only
        assert c.get("/v1/grants/bob", headers=bearer("tok-alice")).status_code == 403
        listed = c.get("/v1/grants", headers=bearer("tok-alice")).json()["grants"]
        assert "bob" not in {x["owner"] for x in listed}
        assert "bob" in {
            x["owner"] for x in c.get("/v1/grants", headers=bearer("tok-root")).json()["grants"]
        }

        job = _submit(c, "tok-bob", "granted", 20)
        assert job.status_code == 201, job.text
        above = _submit(c, "tok-bob", "above", 21)
        assert above.status_code == 403 and above.json()["max_priority"] == 20
        assert "bob's grant allows priority <= 20" in above.json()["detail"]

        assert c.delete("/v1/grants/bob", headers=bearer("tok-root")).status_code == 204
        assert c.delete("/v1/grants/bob", headers=bearer("tok-root")).status_code == 404
        assert _submit(c, "tok-bob", "revoked", 20).status_code == 403


def test_the_grants_quota_counts_unfinished_jobs_and_resume(secured: Stack) -> None:
    with secured.client() as c:
        _grant(c, "carol", 30, 2)
        ids = [_submit(c, "tok-carol", f"q{i}", 30 - i).json()["id"] for i in range(2)]
        assert _submit(c, "tok-carol", "below", 0).status_code == 201  # class 0: no quota
        r = _submit(c, "tok-carol", "third", 5)
        assert r.status_code == 403, r.text
        assert r.json()["max_jobs"] == 2 and r.json()["class_jobs"] == 2
        assert "max_jobs=2" in r.json()["detail"] and "--max-jobs 3" in r.json()["detail"]
        plan = c.post("/v1/plans", json=tiny_spec("third", priority=5), headers=bearer("tok-carol"))
        assert plan.status_code == 403 and "max_jobs=2" in plan.json()["detail"]
        assert c.get("/v1/grants/carol", headers=bearer("tok-carol")).json()["class_jobs"] == 2

        # a finished job frees its place; resuming it takes one again
        cancel = c.post(f"/v1/jobs/{ids[0]}/cancel", headers=bearer("tok-carol"))
        assert cancel.json()["state"] == "cancelled"
        assert _submit(c, "tok-carol", "third", 5).status_code == 201
        r = c.post(f"/v1/jobs/{ids[0]}/resume", headers=bearer("tok-carol"))
        assert r.status_code == 403 and "max_jobs=2" in r.json()["detail"]
        assert (
            c.get(f"/v1/jobs/{ids[0]}", headers=bearer("tok-carol")).json()["state"] == "cancelled"
        )

        # a resume is checked against the grant now: lowered below the job's class, refused
        _grant(c, "carol", 10, 5)
        r = c.post(f"/v1/jobs/{ids[0]}/resume", headers=bearer("tok-carol"))
        assert r.status_code == 403 and "carol's grant allows priority <= 10" in r.text
        _grant(c, "carol", 30, 5)
        r = c.post(f"/v1/jobs/{ids[0]}/resume", headers=bearer("tok-carol"))
        assert r.status_code == 202 and r.json()["state"] == "queued"
        assert c.get("/v1/grants/carol", headers=bearer("tok-root")).json()["class_jobs"] == 3


def test_the_quota_holds_under_concurrent_submissions(secured: Stack) -> None:
    with secured.client() as c:
        _grant(c, "dave", 40, 2)

    def one(i: int) -> int:
        with secured.client() as c:
            return _submit(c, "tok-dave", f"race-{i}", 40).status_code

    with ThreadPoolExecutor(8) as pool:
        codes = sorted(pool.map(one, range(8)))
    assert codes == [201] * 2 + [403] * 6, codes


@pytest.mark.parametrize(
    "body",
    [
        {"max_priority": 101, "max_jobs": 1},
        {"max_priority": 0, "max_jobs": 1},
        {"max_priority": 5, "max_jobs": 0},
        {"max_priority": 5, "max_jobs": 101},
        {"max_priority": 5},
        {"max_priority": 5, "max_jobs": 1, "owner": "ops"},
    ],
)
def test_a_grant_out_of_bounds_is_a_422(secured: Stack, body: dict[str, Any]) -> None:
    with secured.client() as c:
        r = c.put("/v1/grants/erin", json=body, headers=bearer("tok-root"))
        assert r.status_code == 422, r.text
        bad_owner = c.put("/v1/grants/a%20b", json=body, headers=bearer("tok-root"))
        assert bad_owner.status_code == 422
        assert c.get("/v1/grants/erin", headers=bearer("tok-root")).status_code == 404


def test_with_auth_off_every_caller_is_an_admin(api_only: Stack) -> None:
    with api_only.client() as c:
        r = c.post("/v1/jobs", json=tiny_spec("open", priority=100))
        assert r.status_code == 201, r.text
        # api_only's queue is shared by the session: leave no class-100 job at its head
        assert c.post(f"/v1/jobs/{r.json()['id']}/cancel").json()["state"] == "cancelled"
        body = {"max_priority": 7, "max_jobs": 3}
        assert c.put("/v1/grants/frank", json=body).status_code == 200
        assert c.get("/v1/grants").json()["grants"][0]["owner"] == "frank"
        assert c.delete("/v1/grants/frank").status_code == 204


def test_the_effective_class_is_capped_by_the_grant_held_now() -> None:
    grant = PriorityGrant(owner="a", max_priority=10, max_jobs=1, granted_by="ops", granted_at=0)
    assert effective_priority(50, grant) == 10
    assert effective_priority(5, grant) == 5
    assert effective_priority(50, None) == 0  # revoked
    assert effective_priority(-3, None) == -3  # below the default: never changed
    check_class("a", 10, grant)
    check_class("a", 0, None)
    with pytest.raises(Forbidden, match="a's grant allows priority <= 10"):
        check_class("a", 11, grant)


def test_the_cli_grants_lists_and_revokes(
    secured: Stack, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from wstrain.cli.main import main

    for var in ("WSTRAIN_URL", "WSTRAIN_TOKEN", "WSTRAIN_CONFIG"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", "/nonexistent")

    def cli(token: str, *args: str) -> tuple[int, str, str]:
        code = main(["--server", secured.url, "--token", token, *args])
        out, err = capsys.readouterr()
        return code, out, err

    code, _, err = cli("tok-alice", "grant", "gina", "--max-priority", "9", "--max-jobs", "1")
    assert code == 1 and "403" in err and "admin token" in err
    code, out, _ = cli("tok-root", "grant", "gina", "--max-priority", "9", "--max-jobs", "1")
    assert code == 0 and "gina may submit at priority <= 9, 1 unfinished jobs" in out
    code, out, _ = cli("tok-root", "grants")
    row = next(line for line in out.splitlines() if line.startswith("gina"))
    assert row.split()[:4] == ["gina", "9", "0/1", "ops"]
    code, out, _ = cli("tok-root", "grants", "--json")
    assert {"owner": "gina", "max_priority": 9}.items() <= next(
        g for g in json.loads(out) if g["owner"] == "gina"
    ).items()
    assert cli("tok-root", "revoke", "gina")[0] == 0
    code, _, err = cli("tok-root", "revoke", "gina")
    assert code == 1 and "404" in err and "gina holds no priority grant" in err
    with pytest.raises(SystemExit):  # out of bounds: refused before any request
        main(["grant", "gina", "--max-priority", "101", "--max-jobs", "1"])
