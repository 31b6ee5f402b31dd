"""GET /v1/nodes with two owners' tokens against a real uvicorn, a real Redis and a real agent
training both owners' jobs: a user sees its own running job ids and only a count of the
others' (a job id is its owner's to see, as /v1/jobs answers 404 for another owner's job);
an admin sees every id.

    pytest tests/api/test_node_privacy.py
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import REPO, TERMINAL, Stack, bearer, make_stack, tiny_spec

TOKENS = {
    "tok-alice": {"owner": "alice", "role": "user"},
    "tok-bob": "bob",
    "tok-root": {"owner": "ops", "role": "admin"},
}


@pytest.fixture(scope="module")
def shared_node(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """Tokens on, and an agent (2 CPU slots) started here: make_stack's wait for it reads
    /v1/nodes without a token."""
    s = make_stack(
        redis_url,
        tmp_path_factory.mktemp("nodeprivacy"),
        "nodeprivacy",
        with_agent=False,
        extra_env={"WSTRAIN_API_TOKENS": json.dumps(TOKENS)},
    )
    s.agent = subprocess.Popen([sys.executable, "-m", "wstrain.agent.agent"], env=s.env, cwd=REPO)
    try:
        deadline = time.monotonic() + 60
        with s.client() as c:
            while not c.get("/v1/nodes", headers=bearer("tok-root")).json()["nodes"]:
                assert s.agent.poll() is None, "agent exited during start-up"
                assert time.monotonic() < deadline, "agent did not register in 60 s"
                time.sleep(0.2)
        yield s
    finally:
        s.stop()


def _wait(c: httpx.Client, job_id: str, headers: dict[str, str], pred: Any) -> None:
    deadline = time.monotonic() + 120
    while not pred(job := c.get(f"/v1/jobs/{job_id}", headers=headers).json()):
        assert time.monotonic() < deadline, f"job {job_id} never met the condition: {job}"
        time.sleep(0.1)


def _node(c: httpx.Client, token: str) -> dict[str, Any]:
    r = c.get("/v1/nodes", headers=bearer(token))
    assert r.status_code == 200, r.text
    (node,) = r.json()["nodes"]
    return dict(node)


def test_a_user_sees_its_own_running_job_ids_and_only_a_count_of_others(
    shared_node: Stack,
) -> None:
    with shared_node.client() as c:
        ids = {}
        for token in ("tok-alice", "tok-bob"):
            r = c.post("/v1/jobs", json=tiny_spec("long", steps=100000), headers=bearer(token))
            assert r.status_code == 201, r.text
            ids[token] = r.json()["id"]
        root = bearer("tok-root")
        try:
            for jid in ids.values():  # both train on the one node at once (2 CPU slots)
                _wait(c, jid, root, lambda j: j["state"] == "running")
            deadline = time.monotonic() + 30  # the node's record follows at its next heartbeat
            while sorted((admin := _node(c, "tok-root"))["running"]) != sorted(ids.values()):
                assert time.monotonic() < deadline, admin
                time.sleep(0.1)
            assert admin["others_running"] == 0
            for me, other in (("tok-alice", "tok-bob"), ("tok-bob", "tok-alice")):
                body = c.get("/v1/nodes", headers=bearer(me)).text
                assert ids[other] not in body, body  # nowhere in the answer
                node = _node(c, me)
                assert node["running"] == [ids[me]] and node["others_running"] == 1, node
        finally:
            for jid in ids.values():
                c.post(f"/v1/jobs/{jid}/cancel", headers=root)
            for jid in ids.values():
                _wait(c, jid, root, lambda j: j["state"] in TERMINAL)
