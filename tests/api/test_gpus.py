"""`gpus` through the API and the CLI, on a real uvicorn and Redis: a bad count is a 422 that
names the field and leaves nothing behind, a good one is planned with a rank per GPU, and
`wstrain submit/plan --gpus N` set it.

    pytest tests/api/test_gpus.py
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import Stack, tiny_spec
from tests.helpers.cli import run_main as _run

pytestmark = pytest.mark.usefixtures("leave_the_queue_as_found")


@pytest.mark.parametrize(
    ("over", "words"),
    [
        ({"gpus": 0}, "greater than or equal to 1"),
        ({"gpus": 9}, "less than or equal to 8"),
        ({"gpus": 3}, "gpus=3 must divide global_batch=4"),
        ({"gpus": 2, "overrides": {"optimizer": "device"}}, "gpus=2 with overrides.optimizer"),
    ],
)
def test_a_bad_gpus_is_a_422_naming_the_field(
    api_only: Stack, over: dict[str, Any], words: str
) -> None:
    with api_only.client() as c:
        before = c.get("/v1/jobs", params={"limit": 1}).json()["total"]
        r = c.post("/v1/jobs", json=tiny_spec("bad-gpus", **over))
        assert r.status_code == 422, r.text
        (err,) = r.json()["detail"]
        assert "gpus" in err["loc"] or "gpus" in err["msg"], err
        assert words in err["msg"], err
        assert c.get("/v1/jobs", params={"limit": 1}).json()["total"] == before


def test_a_job_on_two_gpus_is_planned_with_a_rank_each(api_only: Stack) -> None:
    with api_only.client() as c:
        r = c.post("/v1/jobs", json=tiny_spec("two-gpus", gpus=2))
        assert r.status_code == 201, r.text
        job = r.json()
        plan = c.get(f"/v1/jobs/{job['id']}/plan").json()
    assert job["spec"]["gpus"] == 2 and plan["ranks"] == 2
    assert plan["micro_batch"] * plan["rounds"] * 2 == 4
    assert "ranks" in plan["reasons"]


def test_submit_and_plan_take_gpus(
    api_only: Stack, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec_file = tmp_path / "dp.yaml"
    spec_file.write_text(yaml.safe_dump(tiny_spec("cli-gpus")))
    server = ["--server", api_only.url]
    code, out, err = _run(capsys, *server, "submit", str(spec_file), "--gpus", "2")
    assert code == 0, err
    job_id = out.strip()
    with api_only.client() as c:
        assert c.get(f"/v1/jobs/{job_id}").json()["spec"]["gpus"] == 2
    code, out, _ = _run(capsys, *server, "plan", str(spec_file), "--gpus", "2")
    assert code == 0 and any(line.split()[:2] == ["ranks", "2"] for line in out.splitlines())
    code, _, err = _run(capsys, *server, "submit", str(spec_file), "--gpus", "3")
    assert code == 1 and "gpus=3 must divide global_batch=4" in err
    code, out, _ = _run(capsys, *server, "ls", "--limit", "500")
    assert code == 0 and "gpu" in out.splitlines()[0]
    code, out, _ = _run(capsys, *server, "status", job_id)
    assert code == 0 and any(line.split() == ["gpus", "2"] for line in out.splitlines())
