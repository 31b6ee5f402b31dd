"""The disk tier's planning (planning/spill.py and its use in planning/working_set.py): which
layers' moments go to disk, that the plan's host and disk bytes stay within their budgets,
what the disk adds to the step, and the refusals that name budget.disk_gib."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest

from wstrain.contracts.calibration import GIB, SPILL_SLOTS
from wstrain.contracts.errors import InfeasibleBudget
from wstrain.contracts.hardware import H200
from wstrain.contracts.model_dims import PRESETS
from wstrain.contracts.spec import JobSpec
from wstrain.planning import memory_model as mm
from wstrain.planning import spill as sp
from wstrain.planning.planner import make_plan

DIMS = replace(PRESETS["llama3-8b"], num_layers=16)
NODE = replace(H200, disk_read_bytes_per_s=1.1e9, disk_write_bytes_per_s=1.3e9)


def _spec(host_gib: float, disk_gib: float = 0.0, global_batch: int = 8) -> JobSpec:
    return JobSpec.model_validate(
        {
            "name": "spill",
            "model": {"preset": "llama3-8b-16l"},
            "data": {"kind": "synthetic"},
            "seq_len": 8192,
            "global_batch": global_batch,
            "steps": 10,
            "budget": {"device_gib": 24, "host_gib": host_gib, "disk_gib": disk_gib},
            "overrides": {"runtime": "working_set"},
        }
    )


def test_a_state_past_the_host_budget_spills_the_last_layers_within_both_budgets() -> None:
    spec = _spec(host_gib=34, disk_gib=40)
    plan = make_plan(spec, DIMS, NODE)
    ws = plan.working_set
    assert ws is not None and ws.spilled_layers > 0
    assert ws.optimizer in ("host", "split")
    assert ws.device_layers <= DIMS.num_layers - ws.spilled_layers  # the host updates them
    assert plan.predicted.peak_host_bytes <= spec.budget.host_bytes
    assert plan.predicted.peak_disk_bytes == ws.spilled_layers * sp.spill_record_bytes(DIMS, "bf16")
    assert plan.predicted.peak_disk_bytes <= spec.budget.disk_bytes
    assert "spill file" in plan.reasons["disk"]
    # without the disk the host budget cannot hold the state and the saved sets
    with pytest.raises(InfeasibleBudget):
        make_plan(_spec(host_gib=34), DIMS, NODE)


def test_a_state_the_host_holds_is_not_spilled_and_no_disk_changes_nothing() -> None:
    with_disk = make_plan(_spec(host_gib=100, disk_gib=40), DIMS, NODE)
    without = make_plan(_spec(host_gib=100), DIMS, NODE)
    assert with_disk.working_set is not None and with_disk.working_set.spilled_layers == 0
    assert with_disk.predicted.peak_disk_bytes == 0
    assert with_disk.predicted.step_seconds == without.predicted.step_seconds
    assert "unused" in with_disk.reasons["disk"]


def test_a_disk_budget_too_small_is_refused_naming_the_field_and_the_size_that_fits() -> None:
    with pytest.raises(InfeasibleBudget) as err:
        make_plan(_spec(host_gib=34, disk_gib=1), DIMS, NODE)
    assert err.value.detail["field"] == "budget.disk_gib"
    need = err.value.min_budget["disk_gib"]
    assert need > 1 and f"budget.disk_gib >= {need:g}" in err.value.message
    plan = make_plan(_spec(host_gib=34, disk_gib=need), DIMS, NODE)  # that size fits
    assert plan.predicted.peak_disk_bytes <= need * GIB


def test_without_a_disk_budget_the_refusal_says_what_disk_would_hold_the_rest() -> None:
    with pytest.raises(InfeasibleBudget) as err:
        make_plan(_spec(host_gib=34), DIMS, NODE)
    assert "budget.disk_gib >=" in err.value.message
    assert "field" not in err.value.detail  # the host budget's fault, not the disk's
    # a node without a spill directory (no profiled disk) plans no spill and says so
    with pytest.raises(InfeasibleBudget) as err:
        make_plan(_spec(host_gib=34, disk_gib=40), DIMS, H200)
    assert "spill directory" in err.value.message


def test_a_host_no_spill_rescues_is_told_the_host_that_does_with_every_layer_spilled() -> None:
    """Weights, gradients and the embedding's and head's moments stay on the host: a budget
    below them is refused with the host that holds the job with every layer on disk."""
    with pytest.raises(InfeasibleBudget) as err:
        make_plan(_spec(host_gib=20, disk_gib=40), DIMS, NODE)
    message = err.value.message
    assert "the disk tier cannot make up the difference" in message, message
    host = float(message.rsplit("host_gib=", 1)[1].split(" ")[0])
    disk = float(message.split("budget.disk_gib >= ")[1].split(")")[0])
    assert 20 < host < err.value.min_budget["host_gib"]
    plan = make_plan(_spec(host_gib=host, disk_gib=disk), DIMS, NODE)  # that host does
    assert plan.working_set is not None and plan.working_set.spilled_layers > 0
    assert plan.predicted.peak_host_bytes <= host * GIB


def test_no_disk_advice_where_the_planner_would_not_spill() -> None:
    """The device optimizer streams the moments (no spill), and a node without a spill
    directory spills nothing: neither refusal offers a host the planner would refuse."""
    device_opt = JobSpec.model_validate(
        {
            **_spec(20, 40).model_dump(),
            "overrides": {"runtime": "working_set", "optimizer": "device"},
        }
    )
    with pytest.raises(InfeasibleBudget) as err:
        make_plan(device_opt, DIMS, NODE)
    assert "holds it" not in err.value.message and "holds the" not in err.value.message
    with pytest.raises(InfeasibleBudget) as err:
        make_plan(_spec(host_gib=20, disk_gib=40), DIMS, H200)  # no spill directory
    assert "holds it on a node with a spill directory" in err.value.message, err.value.message


def test_a_refusal_with_disk_enough_does_not_ask_for_the_disk_it_has() -> None:
    budget = {"device_gib": 1, "host_gib": 34, "disk_gib": 40}
    tight = JobSpec.model_validate({**_spec(34).model_dump(), "budget": budget})
    with pytest.raises(InfeasibleBudget) as err:
        make_plan(tight, DIMS, NODE)  # the device budget falls short, not the disk
    assert "budget.disk_gib=40 holds the" in err.value.message, err.value.message
    assert "budget.disk_gib >=" not in err.value.message
    assert "field" not in err.value.detail


def test_the_disk_paces_the_update_and_a_faster_disk_predicts_a_faster_step() -> None:
    spec = _spec(host_gib=34, disk_gib=40)
    slow = make_plan(spec, DIMS, NODE)
    fast = make_plan(
        spec, DIMS, replace(NODE, disk_read_bytes_per_s=20e9, disk_write_bytes_per_s=20e9)
    )
    assert slow.predicted.optimizer_seconds is not None
    assert fast.predicted.optimizer_seconds is not None
    assert fast.predicted.optimizer_seconds < slow.predicted.optimizer_seconds
    ws = slow.working_set
    assert ws is not None
    read_s, write_s = sp.spill_io_seconds(DIMS, "bf16", NODE)
    # disk-bound: every spilled layer's read and write pass through one disk queue
    assert (
        slow.predicted.optimizer_seconds
        >= (ws.spilled_layers - SPILL_SLOTS) * (read_s + write_s)
        - 16 * DIMS.layer_params / NODE.optimizer_params_per_s
    )


def test_the_rate_both_ways_in_the_spills_order_paces_a_record_where_measured() -> None:
    record = sp.spill_record_bytes(DIMS, "bf16")
    apart = sp.spill_io_seconds(DIMS, "bf16", NODE)
    assert apart == pytest.approx((record / 1.1e9, record / 1.3e9))
    both = replace(NODE, disk_both_bytes_per_s=1.5e9)  # more than either direction alone
    read_s, write_s = sp.spill_io_seconds(DIMS, "bf16", both)
    assert read_s + write_s == pytest.approx(2 * record / 1.5e9)
    assert read_s / write_s == pytest.approx(1.3 / 1.1)  # each direction keeps its share
    spec = _spec(host_gib=34, disk_gib=40)
    apart_s, both_s = (make_plan(spec, DIMS, n).predicted.optimizer_seconds for n in (NODE, both))
    assert apart_s is not None and both_s is not None and both_s < apart_s


def test_update_ends_follow_the_slower_of_the_cpu_and_the_disk() -> None:
    # CPU-bound: reads ahead keep the update at the CPU's pace after the first read
    ends = sp.spilled_update_ends(0.0, 6, layer_s=1.0, read_s=0.1, write_s=0.1)
    assert ends == pytest.approx([1.1 + k for k in range(6)])
    # disk-bound: a layer every read + write once the slots cycle
    ends = sp.spilled_update_ends(0.0, 6, layer_s=0.01, read_s=1.0, write_s=1.0)
    steps = [b - a for a, b in itertools.pairwise(ends)]
    assert steps[-1] == pytest.approx(2.0, abs=0.02)
    assert sp.spilled_update_ends(5.0, 0, 1.0, 1.0, 1.0) == []


def test_spill_counts_start_at_the_least_and_end_at_the_most() -> None:
    assert sp.spill_counts(3, 3) == [3]
    counts = sp.spill_counts(2, 16)
    assert counts[0] == 2 and counts[-1] == 16 and len(counts) <= sp.SPILL_CHOICES + 1
    most = sp.most_spilled(DIMS, "bf16", 5 * sp.spill_record_bytes(DIMS, "bf16") + 1)
    assert most == 5
    assert sp.least_spilled(DIMS, "bf16", 10**15, DIMS.num_layers) is None


def test_host_state_without_spilled_moments_counts_the_slots() -> None:
    whole = mm.host_state_bytes(DIMS, "mixed")
    record = sp.spill_record_bytes(DIMS, "mixed")
    assert record >= 8 * DIMS.layer_params  # fp32 m and v
    spilled = mm.host_state_bytes(DIMS, "mixed", 4)
    assert spilled == whole - 4 * 8 * DIMS.layer_params + SPILL_SLOTS * record
