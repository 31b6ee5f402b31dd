"""The disk tier end to end, on real Redis, a real API, agent and workers: an agent with a
spill directory (WSTRAIN_SPILL_DIR) measures it into its node profile; a job whose host
budget cannot hold its state is planned with its last layers' AdamW moments in a spill file,
trains, leaves no spill file behind and ends with the weights of the same job with all its
state in host memory; a disk budget too small is a 422 naming budget.disk_gib.

    pytest -m slow tests/e2e/test_disk_tier.py
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.conftest import make_stack, tiny_spec, wait_terminal
from tests.helpers.jobs import checkpoint_weights
from wstrain.contracts.calibration import GIB
from wstrain.contracts.errors import InfeasibleBudget
from wstrain.contracts.hardware import NodeProfile
from wstrain.contracts.model_dims import PRESETS
from wstrain.contracts.spec import JobSpec
from wstrain.planning.planner import make_plan

pytestmark = pytest.mark.slow

DIMS = PRESETS["tiny-llama"]  # 4 layers of 0.2 M parameters: 1.6 MB of fp32 moments each


def _spec(name: str, host_gib: float, disk_gib: float = 0.0) -> dict[str, object]:
    return tiny_spec(
        name,
        model={"preset": "tiny-llama"},
        steps=6,
        checkpoint_every=3,
        budget={"device_gib": 1, "host_gib": host_gib, "disk_gib": disk_gib},
        # the host AdamW in both runs (a spilled layer's update runs there)
        overrides={"runtime": "working_set", "optimizer": "host"},
    )


def _least_host_gib(node: NodeProfile) -> float:
    """The smallest host budget (to a byte) at which the job plans on `node` with no disk."""

    def plans(host_gib: float) -> bool:
        try:
            make_plan(JobSpec.model_validate(_spec("probe", host_gib)), DIMS, node)
        except InfeasibleBudget:
            return False
        return True

    lo, hi = 0.0, 2.0
    while hi - lo > 1 / (1024 * 1024 * 1024):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if plans(mid) else (mid, hi)
    return hi


def test_a_job_past_its_host_budget_spills_trains_and_matches_the_in_memory_run(
    redis_url: str, tmp_path: Path
) -> None:
    spill = tmp_path / "spill"
    stack = make_stack(
        redis_url,
        tmp_path,
        "disk-tier",
        with_agent=True,
        extra_env={"WSTRAIN_SPILL_DIR": str(spill)},
    )
    try:
        with stack.client() as c:
            node = c.get("/v1/nodes").json()["nodes"][0]
            assert node["profile"]["disk_write_bytes_per_s"] > 0, node["profile"]
            profile = NodeProfile.from_profile(
                "cpu", node["profile"], node["host_total_bytes"], node["host_total_bytes"]
            )
            # 1 MiB short of holding it all in host memory: it must spill
            host_gib = _least_host_gib(profile) - 1 / 1024
            # without a disk budget the host budget is refused, naming what disk would do
            r = c.post("/v1/jobs", json=_spec("no-disk", host_gib))
            assert r.status_code == 422 and "budget.disk_gib >=" in r.text, r.text
            # a disk budget smaller than the moments the host cannot hold: 422 on the field
            r = c.post("/v1/jobs", json=_spec("small-disk", host_gib, disk_gib=1 / 1024))
            assert r.status_code == 422, r.text
            assert r.json()["field"] == "budget.disk_gib" and r.json()["min_budget"]["disk_gib"]
            spilled = c.post("/v1/jobs", json=_spec("spilled", host_gib, disk_gib=1))
            assert spilled.status_code == 201, spilled.text
            straight = c.post("/v1/jobs", json=_spec("in-memory", 2)).json()
            done = wait_terminal(c, spilled.json()["id"])
            assert done["state"] == "succeeded", done
            ws = done["plan"]["working_set"]
            assert ws["spilled_layers"] > 0, done["plan"]
            assert 0 < done["plan"]["predicted"]["peak_disk_bytes"] <= 1 * GIB
            assert "spill file" in done["plan"]["reasons"]["disk"]
            # the host budget changes the plan (its micro-batch among others), never the
            # math: the same weights to fp32 rounding (sums in another order)
            a, b = checkpoint_weights(done), checkpoint_weights(wait_terminal(c, straight["id"]))
            assert a.keys() == b.keys()
            for name in a:
                torch.testing.assert_close(a[name], b[name], rtol=1e-5, atol=1e-6, msg=name)
        # the job's spill file went with its worker
        assert not list(spill.rglob("*.bin")), list(spill.rglob("*"))
    finally:
        stack.stop()
