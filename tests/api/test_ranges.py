"""Budgets as ranges at the API: a ranged job is admitted and GET shows the range it was
sent with and the point chosen (the largest that fits the largest node: the shared API's
16 GiB CPU node, whose one pool holds device and host); min above max and a min above
every node are 422s naming budget.device_gib; POST /v1/plans lists a few points of the
range with predicted tokens/s, or why a point has no plan (api/ranges.py).

    pytest tests/api/test_ranges.py
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import REPO, Stack, tiny_spec
from wstrain.api.ranges import RANGE_POINTS, choose_point
from wstrain.api.validation import validate_and_plan
from wstrain.contracts.access import DataAccess
from wstrain.contracts.calibration import GIB
from wstrain.contracts.errors import InvalidSpec
from wstrain.contracts.jobs import GPUInfo, Node
from wstrain.contracts.spec import JobSpec

pytestmark = pytest.mark.usefixtures("leave_the_queue_as_found")

NODE_GIB = 16  # tests/conftest.py register_node: the shared API's CPU node
RANGED = {"device_gib": {"min": 1, "max": 40}, "host_gib": 2}


def _node(host_gib: float) -> Node:
    return Node(
        name="node-a",
        device="cpu",
        gpus=[],
        host_total_bytes=int(host_gib * GIB),
        host_free_bytes=int(host_gib * GIB),
        slots=2,
        running=[],
        profile={"matmul_flops": 3.1e11, "optimizer_params_per_s": 2.5e8},
        heartbeat_at=0.0,
    )


def _gpu_node(gpu_gib: float, host_gib: float) -> Node:
    gpu = GPUInfo(index=0, name="H200", total_bytes=int(gpu_gib * GIB), free_bytes=0)
    return _node(host_gib).model_copy(update={"device": "cuda", "gpus": [gpu]})


def _spec(budget: dict[str, Any]) -> JobSpec:
    return JobSpec.model_validate(tiny_spec("ranged", budget=budget))


def test_the_point_is_the_largest_the_largest_node_holds_or_the_max_without_nodes() -> None:
    spec = _spec(RANGED)
    assert choose_point(spec, []) == (40.0, 2.0)
    # a GPU node holds each budget on its own: its largest GPU, its host memory
    assert choose_point(spec, [_gpu_node(8, 64), _gpu_node(12.345, 64)]) == (12.34, 2.0)
    # a CPU node holds both in one pool: each grows from its min by the same share
    assert choose_point(spec, [_node(NODE_GIB)]) == (14.0, 2.0)
    both = _spec({"device_gib": {"min": 1, "max": 9}, "host_gib": {"min": 2, "max": 10}})
    # 13 GiB spare over the mins, 16 of range: each grows 13/16 of its 8
    assert choose_point(both, [_node(NODE_GIB)]) == (7.5, 8.5)
    with pytest.raises(InvalidSpec, match=r"budget.device_gib: the range's min=20 GiB") as err:
        choose_point(_spec({"device_gib": {"min": 20, "max": 40}, "host_gib": 2}), [_node(8)])
    assert err.value.detail["field"] == "budget.device_gib"


def test_a_ranged_plan_lists_its_points_each_planned_or_refused_with_why() -> None:
    access = DataAccess.of([REPO], None)
    plan = validate_and_plan(_spec(RANGED), [_node(NODE_GIB)], access)
    assert (plan.device_gib, plan.host_gib) == (14.0, 2.0)
    points = plan.range_points
    assert len(points) == RANGE_POINTS
    assert [p.device_gib for p in points] == [1, 10.75, 20.5, 30.25, 40]
    assert all(p.tokens_per_s and p.tokens_per_s > 0 for p in points[:2])
    assert all("more than the node" in (p.refused or "") for p in points[2:])


def test_a_ranged_job_is_admitted_and_shows_its_range_and_chosen_point(api_only: Stack) -> None:
    with api_only.client() as c:
        r = c.post("/v1/jobs", json=tiny_spec("ranged-job", budget=RANGED))
        assert r.status_code == 201, r.text
        job = c.get(f"/v1/jobs/{r.json()['id']}").json()
    budget = job["spec"]["budget"]
    assert budget["device_gib"] == {"min": 1.0, "max": 40.0} and budget["host_gib"] == 2.0
    # the 16 GiB CPU node's pool less the host's 2 GiB
    assert budget["chosen"] == {"device_gib": 14.0, "host_gib": 2.0}
    assert (job["plan"]["device_gib"], job["plan"]["host_gib"]) == (14.0, 2.0)


@pytest.mark.parametrize(
    ("device_gib", "says"),
    [
        ({"min": 40, "max": 12}, "min=40 is above max=12"),
        ({"min": 20, "max": 40}, "min=20 GiB is above every node's device memory"),
    ],
    ids=["min-above-max", "min-above-every-node"],
)
def test_a_bad_range_is_a_422_naming_the_field(
    api_only: Stack, device_gib: dict[str, float], says: str
) -> None:
    with api_only.client() as c:
        r = c.post(
            "/v1/jobs", json=tiny_spec("bad-range", budget={**RANGED, "device_gib": device_gib})
        )
    assert r.status_code == 422, r.text
    assert says in r.text and "budget.device_gib" in r.text


def test_a_dry_run_lists_predicted_tokens_per_s_at_points_of_the_range(api_only: Stack) -> None:
    with api_only.client() as c:
        r = c.post("/v1/plans", json=tiny_spec("ranged-plan", budget=RANGED))
    assert r.status_code == 200, r.text
    points = r.json()["range_points"]
    assert [p["device_gib"] for p in points] == [1, 10.75, 20.5, 30.25, 40]
    assert points[0]["tokens_per_s"] > 0 and points[0]["runtime"] in ("resident", "working_set")
    assert "more than the node" in points[-1]["refused"]
