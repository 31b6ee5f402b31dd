"""`wstrain plan --gpu NAME` (POST /v1/plans?gpu=NAME): a plan for a chip no node of the queue
has, from a CPU-only stack (real uvicorn and Redis, tests/conftest.py api_only), made with the
profile wstrain ships for it and saying so; unknown names and budgets larger than the chip
are 422s that name the fix; POST /v1/jobs takes no `gpu`, so such a plan is never queued.

    pytest tests/api/test_plan_gpu.py
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, get_args

import pytest
import yaml

from tests.conftest import REPO, Stack, tiny_spec
from tests.helpers.cli import run_main
from wstrain.contracts.calibration import GIB
from wstrain.contracts.chips import BOARDS, CHIPS, GPU_NAMES, GpuName
from wstrain.contracts.hardware import SHIPPED_PROFILES, NodeProfile


def llama8b(name: str, **over: Any) -> dict[str, Any]:
    """An 8B-class job at a 24 GiB device budget: no CPU node of the stack (16 GiB) holds it.
    Its host budget is the 120 GiB the working set keeps home, with room."""
    spec = tiny_spec(
        name,
        model={"preset": "llama3-8b"},
        data={"kind": "synthetic"},
        seq_len=8192,
        global_batch=32,
        precision="bf16",
        budget={"device_gib": 24, "host_gib": 200},
    )
    spec.update(over)
    return spec


def test_cli_plans_an_8b_job_for_an_h100_from_a_cpu_only_stack(
    api_only: Stack, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "llama8b.yaml"
    spec.write_text(yaml.safe_dump(llama8b("laptop-8b")))
    # the same spec against the queue's nodes: larger than the one CPU node
    code, _, err = run_main(capsys, "plan", str(spec), "--server", api_only.url)
    assert code == 1 and "larger than any node has" in err, err

    code, out, err = run_main(capsys, "plan", str(spec), "--gpu", "H100", "--server", api_only.url)
    assert code == 0, err
    note = out.splitlines()[0]
    assert note.startswith("note: planned for H100 SXM GPUs (--gpu h100)"), out
    assert "measured on an NVIDIA H100 80GB HBM3" in note and "2026-11-27" in note, note
    assert "not on a node of this queue" in note, note
    rows = {line.split()[0]: line.split()[1] for line in out.splitlines()[2:]}
    assert rows["device"] == "cuda", out
    assert 0 < float(rows["peak_device"]) <= 24, out  # GiB: the budget, inside 80


def test_api_plan_for_a_gpu_fits_the_chip_and_says_where_its_profile_is_from(
    api_only: Stack,
) -> None:
    with api_only.client() as c:
        h100 = c.post("/v1/plans", params={"gpu": "h100"}, json=llama8b("api-8b"))
        a100 = c.post("/v1/plans", params={"gpu": "a100"}, json=llama8b("api-8b"))
    assert h100.status_code == a100.status_code == 200, (h100.text, a100.text)
    plan = h100.json()
    assert plan["device"] == "cuda"
    assert plan["predicted"]["peak_device_bytes"] <= 24 * GIB < 80 * GIB
    assert plan["predicted"]["peak_host_bytes"] <= 200 * GIB
    assert "for H100 SXM GPUs" in plan["reasons"]["gpu"]
    # no A100 was measured: its note says so, and its 312 TFLOP/s step is the slower
    assert "datasheet, not a measurement" in a100.json()["reasons"]["gpu"]
    assert a100.json()["predicted"]["step_seconds"] > plan["predicted"]["step_seconds"]


def test_an_unknown_chip_is_a_422_naming_the_field_and_the_known_chips(api_only: Stack) -> None:
    with api_only.client() as c:
        r = c.post("/v1/plans", params={"gpu": "h1000"}, json=llama8b("unknown-chip"))
    assert r.status_code == 422, r.text
    (error,) = r.json()["detail"]
    assert error["loc"] == ["query", "gpu"], error
    assert "h1000" in error["input"], error
    for name in GPU_NAMES:
        assert f"'{name}'" in error["msg"], error


def test_a_budget_larger_than_the_chip_names_its_memory_and_larger_chips(api_only: Stack) -> None:
    with api_only.client() as c:
        r = c.post(
            "/v1/plans",
            params={"gpu": "l40s"},
            json=llama8b("too-big", budget={"device_gib": 60, "host_gib": 200}),
        )
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert "device_gib=60" in detail and "L40S holds (47.5 GiB)" in detail, detail
    assert "--gpu h100 (79.2 GiB)" in detail and "b200" in detail, detail


def test_post_jobs_takes_no_gpu_so_such_a_plan_is_never_queued(api_only: Stack) -> None:
    with api_only.client() as c:
        before = c.get("/v1/jobs", params={"limit": 500}).json()["jobs"]
        r = c.post("/v1/jobs", params={"gpu": "h100"}, json=llama8b("never-queued"))
        after = c.get("/v1/jobs", params={"limit": 500}).json()["jobs"]
    assert r.status_code == 422 and "larger than any node has" in r.json()["detail"], r.text
    assert len(after) == len(before)


def test_every_chip_has_a_name_a_board_and_a_shipped_profile() -> None:
    assert set(get_args(GpuName)) == set(GPU_NAMES) == set(SHIPPED_PROFILES)
    assert set(GPU_NAMES.values()) == set(CHIPS)
    for gpu, shipped in SHIPPED_PROFILES.items():
        assert shipped.label in BOARDS, gpu
        node = NodeProfile.from_profile(
            "cuda", shipped.profile, shipped.device_total_bytes, shipped.host_total_bytes
        )
        assert len(node.attention_points) == 5, gpu  # every key read back, none defaulted
        assert node.matmul_flops == shipped.profile["matmul_flops"], gpu
        assert BOARDS[shipped.label].memory_gib * 0.98 * GIB < node.device_total_bytes, gpu


@pytest.mark.parametrize("gpu", ["h100", "h200"])
def test_measured_profiles_are_the_bench_files_they_name(gpu: GpuName) -> None:
    """The shipped numbers are the bench's own, to 4 digits: the file named in the note
    holds the plan's node profile as the agent measured it."""
    shipped = SHIPPED_PROFILES[gpu]
    path = shipped.source.rsplit("(", 1)[1].rstrip(")")
    rows = json.loads((REPO / path).read_text())
    node = next(r["plan"]["node"] for r in rows if (r.get("plan") or {}).get("node"))
    measured = {k: v for k, v in node.items() if k.endswith("_per_s") or k == "matmul_flops"}
    measured |= {f"attention_flops.{s}": f for s, f in node["attention_points"]}
    assert measured.keys() == shipped.profile.keys()
    for key, value in measured.items():
        assert shipped.profile[key] == pytest.approx(value, rel=1e-3), key
    assert shipped.device_total_bytes == node["device_total_bytes"]
    assert shipped.host_total_bytes == node["host_total_bytes"]
