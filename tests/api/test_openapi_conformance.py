"""The OpenAPI document is what the API does: schemathesis (`--checks all`, a fixed seed,
bounded examples) against a real uvicorn on a real Redis, with bearer tokens on, so every
protected route is exercised, once with an admin's token and once with a user's; plus the
document's own promises (each operation names the statuses its router can answer) and the
fixes it led to.

    pytest tests/api/test_openapi_conformance.py

A failure prints schemathesis' report: each case with a curl line to reproduce it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import Stack, bearer, secured_stack, tiny_spec

ADMIN = "tok-conformance-admin"
USER = "tok-conformance-alice"
TOKENS = {ADMIN: {"owner": "ops", "role": "admin"}, USER: {"owner": "alice", "role": "user"}}
SEED = 45  # any fixed seed makes a failure reproducible with the same run
# Examples per operation and phase: 12 runs the 19 operations in about 30 s per token on 2
# cores (the coverage phase's boundary cases come on top; they are not random)
MAX_EXAMPLES = 12
RUN_TIMEOUT_S = 420
# The coverage phase sends every boundary case of the schema, whatever max_examples says: for
# the two routes that take a JobSpec, ~650 schema-invalid requests each (a field out of
# range, of the wrong type, missing; a bad query parameter), over half of a run's requests.
# FastAPI refuses each with its 422 while it validates the request, before any handler reads
# the caller's role, so the answer is the same for either token: the admin's run sends them
# (and checks the 422s), the user's run sends those routes' schema-valid boundary cases
# (~350 each, which reach the role's grants, quotas and visibility), and both runs fuzz all
# 19 operations with valid and invalid data.
USER_SPEC_COVERAGE = 'phases.coverage.generation.mode = "positive"'

# The documented exclusions, one line of reason each:
# - a schema cannot say which specs plan (a budget of 5e-324 GiB, an unknown preset, a
#   dependency on a job the caller cannot see are schema-valid): positive_data_acceptance
#   takes a 422 with the fix on the two routes that plan a spec;
# - logs are read as pages only: follow=true streams until the job ends, so on a queued job
#   the fuzzer would wait forever (keep-alives every 15 s beat any read timeout); the stream
#   is tested in tests/api/test_logs.py and below (Last-Event-ID).
CONFIG = """
[dictionaries.jobs]
values = {jobs}
[dictionaries.presets]
values = ["micro-llama", "tiny-llama"]
[dictionaries.owners]
values = ["ops", "alice"]

# real ids, real presets and owners half the time, so the routes past a 404 and specs
# that plan are exercised too; random values the other half
[parameters]
"path.job_id" = {{ dictionary = "jobs", probability = 0.5 }}
"path.owner" = {{ dictionary = "owners", probability = 0.5 }}
"body.model.preset" = {{ dictionary = "presets", probability = 0.5 }}

[[operations]]
include-path = ["/v1/jobs", "/v1/plans"]
include-method = "POST"
checks.positive_data_acceptance.expected-statuses = [
  "2xx", "401", "403", "404", "409", "422", "429",
]
{spec_coverage}

[[operations]]
include-path = "/v1/jobs/{{job_id}}/logs"
parameters = {{ "query.follow" = false }}
"""


@pytest.fixture(scope="module")
def api(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = secured_stack(redis_url, tmp_path_factory, "conformance", TOKENS)
    yield s
    s.stop()


def _submit(c: httpx.Client, name: str, token: str = ADMIN) -> str:
    r = c.post("/v1/jobs", json=tiny_spec(name), headers=bearer(token))
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


def _schema(c: httpx.Client) -> dict[str, Any]:
    r = c.get("/openapi.json", headers=bearer(USER))
    assert r.status_code == 200, r.text
    paths: dict[str, Any] = r.json()["paths"]
    return paths


def test_every_operation_documents_the_statuses_its_router_answers(api: Stack) -> None:
    with api.client() as c:
        paths = _schema(c)
    assert "/v1/jobs/{job_id}/cancel" in paths
    for path, operations in paths.items():
        for method, op in operations.items():
            codes = set(op["responses"])
            where = f"{method.upper()} {path} documents {sorted(codes)}"
            assert "413" in codes, where  # the body limit stands before every route
            if path.startswith("/v1/"):  # the caller's token, its parameters, the store
                assert {"401", "422", "503"} <= codes, where
            if "{job_id}" in path:
                assert "404" in codes, where
            if "401" in codes:  # the token is the security scheme, so a client sends it
                assert op["security"] == [{"bearer": []}], where
                headers = {p["name"] for p in op.get("parameters", []) if p["in"] == "header"}
                assert not headers & {"authorization", "x-wstrain-owner"}, where
            for code in codes - {"200", "201", "202", "204"}:
                content = op["responses"][code]["content"]
                assert "$ref" in content["application/json"]["schema"], f"{where}: {code}"


def test_request_validation_and_refusals_share_the_documented_422_body(api: Stack) -> None:
    with api.client() as c:
        schema = c.get("/openapi.json", headers=bearer(USER)).json()
        ref = schema["paths"]["/v1/plans"]["post"]["responses"]["422"]["content"][
            "application/json"
        ]["schema"]["$ref"]
        body = schema["components"]["schemas"][ref.rsplit("/", 1)[1]]
        assert {"type": "string"} in body["properties"]["detail"]["anyOf"]
        invalid = c.post("/v1/plans", json={"name": 5}, headers=bearer(USER))
        refused = c.post(
            "/v1/plans", json=tiny_spec("x", model={"preset": "no-such"}), headers=bearer(USER)
        )
    assert invalid.status_code == refused.status_code == 422, (invalid.text, refused.text)
    assert isinstance(invalid.json()["detail"], list)  # one entry per field
    assert {"loc", "msg", "type", "input"} == set(invalid.json()["detail"][0])
    assert "no-such" in refused.json()["detail"]  # a message with the fix


def test_last_event_id_null_or_empty_reads_as_absent(api: Stack) -> None:
    with api.client() as c:
        job = _submit(c, "null-last-event-id", USER)
        cancel = c.post(f"/v1/jobs/{job}/cancel", headers=bearer(USER))
        assert cancel.json()["state"] == "cancelled", cancel.text  # queued: at once
        for sent in ("null", ""):
            r = c.get(
                f"/v1/jobs/{job}/logs",
                params={"follow": "true"},
                headers={**bearer(USER), "Last-Event-ID": sent},
            )
            # a job cancelled before it ran has no log: the stream ends at once
            assert r.status_code == 200, (sent, r.text)
            assert "event: end" in r.text, (sent, r.text)
        bad = c.get(
            f"/v1/jobs/{job}/logs",
            params={"follow": "true"},
            headers={**bearer(USER), "Last-Event-ID": "nul"},
        )
    assert bad.status_code == 422, bad.text


def test_405_allows_every_method_of_the_path(api: Stack) -> None:
    with api.client() as c:
        r = c.request("PATCH", "/v1/jobs", headers=bearer(USER))
    # Starlette named only the first matching route's methods (Allow: POST)
    assert r.status_code == 405
    assert r.headers["allow"] == "GET, POST"
    assert "GET, POST" in r.json()["detail"]


# An admin reaches every job and grant; a user meets the 403s and the 404s of another's job
@pytest.mark.parametrize("token", [ADMIN, USER], ids=["admin", "user"])
def test_schemathesis_finds_no_failure(api: Stack, tmp_path: Path, token: str) -> None:
    with api.client() as c:
        queued = _submit(c, "conformance-queued")
        cancelled = _submit(c, "conformance-cancelled")
        c.post(f"/v1/jobs/{cancelled}/cancel", headers=bearer(ADMIN)).raise_for_status()
        mine = _submit(c, "conformance-alice", USER)
        operations = sum(len(ops) for ops in _schema(c).values())
    config = tmp_path / "schemathesis.toml"
    spec_coverage = USER_SPEC_COVERAGE if token == USER else ""
    config.write_text(
        CONFIG.format(jobs=json.dumps([queued, cancelled, mine]), spec_coverage=spec_coverage)
    )
    cmd = [
        sys.executable,
        "-m",
        "schemathesis.cli",
        "--config-file",
        str(config),
        "--no-color",
        "run",
        f"{api.url}/openapi.json",  # behind the token: the -H header fetches it too
        "-H",
        f"Authorization: Bearer {token}",
        "--checks",
        "all",
        "--seed",
        str(SEED),
        "--max-examples",
        str(MAX_EXAMPLES),
        "--workers",
        "1",  # CI has 2 cores, one of them the API's
        "--request-timeout",
        "30",
    ]
    # cwd: schemathesis keeps its cache (.schemathesis/) beside it
    done = subprocess.run(
        cmd, cwd=tmp_path, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False
    )
    report = done.stdout + done.stderr
    assert done.returncode == 0, report[-30000:]
    # every operation in the document was run, none skipped
    assert f"Selected: {operations}/{operations}" in report, report[-3000:]
    assert f"Tested: {operations}\n" in report, report[-3000:]
