"""`nodes` through the API and the CLI, on a real uvicorn and Redis: a bad count is a 422
that names the field and leaves nothing behind, a good one is planned with gpus ranks a node
on global_batch/(gpus x nodes) sequences each, and `wstrain submit/plan --nodes M` set it
(`status` shows it). The scheduling of such jobs: tests/e2e/test_multinode.py.

    pytest tests/api/test_nodes.py
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
        ({"nodes": 0}, "greater than or equal to 1"),
        ({"nodes": 17}, "less than or equal to 16"),
        ({"nodes": 3}, "nodes=3 x gpus=1 must divide global_batch=4"),
        ({"nodes": 2, "gpus": 4}, "nodes=2 x gpus=4 must divide global_batch=4"),
        (
            {"nodes": 2, "overrides": {"optimizer": "device"}},
            'gpus=1 x nodes=2 with overrides.optimizer="device"',
        ),
    ],
)
def test_a_bad_nodes_is_a_422_naming_the_field(
    api_only: Stack, over: dict[str, Any], words: str
) -> None:
    with api_only.client() as c:
        before = c.get("/v1/jobs", params={"limit": 1}).json()["total"]
        r = c.post("/v1/jobs", json=tiny_spec("bad-nodes", **over))
        assert r.status_code == 422, r.text
        (err,) = r.json()["detail"]
        assert "nodes" in err["loc"] or "nodes" in err["msg"], err
        assert words in err["msg"], err
        assert c.get("/v1/jobs", params={"limit": 1}).json()["total"] == before


def test_a_job_on_two_nodes_of_two_gpus_is_planned_per_rank(api_only: Stack) -> None:
    with api_only.client() as c:
        r = c.post("/v1/jobs", json=tiny_spec("two-nodes", gpus=2, nodes=2, global_batch=8))
        assert r.status_code == 201, r.text
        job = r.json()
        plan = c.get(f"/v1/jobs/{job['id']}/plan").json()
    assert job["spec"]["nodes"] == 2 and plan["nodes"] == 2 and plan["ranks"] == 2
    assert plan["micro_batch"] * plan["rounds"] * 2 * 2 == 8  # 2 sequences a rank
    assert "x 2 nodes" in plan["reasons"]["rounds"] and "nodes" in plan["reasons"]
    assert plan["working_set"] is None or plan["working_set"]["optimizer"] == "host"


def test_submit_and_plan_take_nodes(
    api_only: Stack, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec_file = tmp_path / "mn.yaml"
    spec_file.write_text(yaml.safe_dump(tiny_spec("cli-nodes")))
    server = ["--server", api_only.url]
    code, out, err = _run(capsys, *server, "submit", str(spec_file), "--nodes", "2")
    assert code == 0, err
    job_id = out.strip()
    with api_only.client() as c:
        assert c.get(f"/v1/jobs/{job_id}").json()["spec"]["nodes"] == 2
    code, out, _ = _run(capsys, *server, "plan", str(spec_file), "--nodes", "4")
    assert code == 0 and any(line.split()[:2] == ["nodes", "4"] for line in out.splitlines())
    code, _, err = _run(capsys, *server, "submit", str(spec_file), "--nodes", "3")
    assert code == 1 and "nodes=3 x gpus=1 must divide global_batch=4" in err
    code, out, _ = _run(capsys, *server, "status", job_id)
    assert code == 0 and any(line.split() == ["nodes", "2"] for line in out.splitlines())
