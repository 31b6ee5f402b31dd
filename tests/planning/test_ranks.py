"""Plans of jobs on several GPUs (planning/ranks.py through `make_plan`): one rank
planned as a job of global_batch/gpus sequences, the shared host state counted once and
each rank's private host bytes once per rank, host AdamW on the working set, the gradients'
all-reduce in the predicted step, and the spec's checks of `gpus`.

    pytest tests/planning/test_ranks.py
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from pydantic import ValidationError

from wstrain.contracts.calibration import (
    ALLREDUCE_BUS_BYTES_PER_S,
    GIB,
    PROCESS_BYTES,
)
from wstrain.contracts.errors import InfeasibleBudget, InvalidSpec
from wstrain.contracts.hardware import DEFAULT_PROFILE, H200, NodeProfile
from wstrain.contracts.model_dims import PRESETS
from wstrain.contracts.spec import JobSpec
from wstrain.planning import memory_model as mm
from wstrain.planning.planner import make_plan

LLAMA = PRESETS["llama3-8b-16l"]


def _spec(gpus: int, batch: int, **over: Any) -> JobSpec:
    raw: dict[str, Any] = {
        "name": "dp",
        "model": {"preset": "llama3-8b-16l"},
        "data": {"kind": "synthetic"},
        "seq_len": 8192,
        "global_batch": batch,
        "steps": 1,
        "precision": "bf16",
        "budget": {"device_gib": 20, "host_gib": 400},
        "gpus": gpus,
    }
    raw.update(over)
    return JobSpec.model_validate(raw)


def test_a_two_gpu_plan_has_two_ranks_each_with_half_the_batch() -> None:
    plan = make_plan(_spec(2, 32), LLAMA, H200)
    assert plan.ranks == 2
    assert plan.rounds == 32 // (plan.micro_batch * 2)
    assert plan.reasons["rounds"] == (
        f"{plan.rounds} a rank = global_batch 32 / (micro_batch {plan.micro_batch} x 2 ranks)"
    )
    assert plan.reasons["ranks"].startswith("2 ranks, one per GPU, data parallel")
    one = make_plan(_spec(1, 32), LLAMA, H200)
    assert one.ranks == 1 and "ranks" not in one.reasons
    assert one.micro_batch * one.rounds == 32


def test_the_working_set_ranks_update_on_the_host() -> None:
    plan = make_plan(_spec(2, 32), LLAMA, H200)
    assert plan.runtime == "working_set" and plan.working_set is not None
    assert plan.working_set.optimizer == "host" and plan.working_set.device_layers == 0


def test_host_bytes_count_the_shared_state_once_and_each_ranks_private_bytes() -> None:
    # the same rank on one and on two GPUs: 8 sequences a rank, every choice pinned
    pin = {"runtime": "working_set", "micro_batch": 2, "window": 4, "level": 1}
    pin |= {"optimizer": "host", "lead_rounds": 1, "r_param": 3, "r_grad": 2}
    one = make_plan(_spec(1, 8, overrides=pin), LLAMA, H200)
    two = make_plan(_spec(2, 16, overrides=pin), LLAMA, H200)
    assert (one.micro_batch, one.rounds, one.window) == (two.micro_batch, two.rounds, two.window)
    shared = mm.host_state_bytes(LLAMA, "bf16")
    private = one.predicted.peak_host_bytes - shared  # one rank's store and reserve
    assert private > PROCESS_BYTES["cuda"]
    assert two.predicted.peak_host_bytes - one.predicted.peak_host_bytes == private
    # the device budget is per GPU: each rank's peak is the one-GPU job's
    assert two.predicted.peak_device_bytes == one.predicted.peak_device_bytes


def test_a_resident_rank_keeps_a_whole_copy_so_its_host_bytes_count_per_rank() -> None:
    micro = PRESETS["micro-llama"]
    spec = {"model": {"preset": "micro-llama"}, "seq_len": 32, "precision": "fp32"}
    over = {"overrides": {"runtime": "resident"}, "budget": {"device_gib": 1, "host_gib": 4}}
    one = make_plan(_spec(1, 4, **spec, **over), micro, DEFAULT_PROFILE)
    two = make_plan(_spec(2, 8, **spec, **over), micro, DEFAULT_PROFILE)
    assert two.predicted.peak_host_bytes == 2 * one.predicted.peak_host_bytes
    assert two.predicted.peak_device_bytes == one.predicted.peak_device_bytes


def test_the_predicted_step_adds_the_gradients_all_reduce() -> None:
    plan = make_plan(_spec(4, 32), LLAMA, H200)
    pred = plan.predicted
    sums = plan.rounds if plan.runtime == "working_set" else 1  # every round's, or the step's
    expected = sums * 2 * 3 / 4 * LLAMA.params * 2 / ALLREDUCE_BUS_BYTES_PER_S
    assert pred.allreduce_seconds == pytest.approx(expected)
    parts = (
        pred.compute_seconds,
        pred.recompute_seconds,
        pred.exposed_transfer_seconds,
        pred.optimizer_seconds,
        pred.allreduce_seconds,
    )
    assert sum(p or 0.0 for p in parts) == pytest.approx(pred.step_seconds)
    assert make_plan(_spec(1, 32), LLAMA, H200).predicted.allreduce_seconds is None


def test_an_infeasible_host_budget_names_one_that_holds_every_rank() -> None:
    over = {"budget": {"device_gib": 20, "host_gib": 50}}
    make_plan(_spec(1, 32, **over), LLAMA, H200)  # one rank fits 50 GiB, four do not
    with pytest.raises(InfeasibleBudget) as exc:
        make_plan(_spec(4, 32, **over), LLAMA, H200)
    need = exc.value.detail["min_budget"]
    assert need["host_gib"] > 50
    bigger = {"budget": {"device_gib": 20, "host_gib": need["host_gib"]}}
    plan = make_plan(_spec(4, 32, **bigger), LLAMA, H200)
    assert plan.predicted.peak_host_bytes <= need["host_gib"] * GIB


def test_a_micro_batch_override_must_divide_each_ranks_share() -> None:
    with pytest.raises(InvalidSpec, match=r"global_batch/gpus = 8"):
        make_plan(_spec(2, 16, overrides={"micro_batch": 16}), LLAMA, H200)


@pytest.mark.parametrize(
    ("gpus", "batch", "over", "words"),
    [
        (0, 8, {}, "greater than or equal to 1"),
        (9, 18, {}, "less than or equal to 8"),
        (3, 8, {}, "gpus=3 must divide global_batch=8"),
        (2, 8, {"overrides": {"optimizer": "device"}}, 'gpus=2 with overrides.optimizer="device"'),
        (2, 8, {"overrides": {"optimizer": "split"}}, "updates its one shared host copy"),
    ],
)
def test_the_spec_refuses_gpus_it_cannot_train_with(
    gpus: int, batch: int, over: dict[str, Any], words: str
) -> None:
    with pytest.raises(ValidationError, match="gpus") as exc:
        _spec(gpus, batch, **over)
    assert words in str(exc.value)


def test_a_plan_on_several_nodes_splits_the_batch_over_every_rank() -> None:
    plan = make_plan(_spec(2, 32, nodes=4), LLAMA, H200)
    assert (plan.ranks, plan.nodes) == (2, 4)
    assert plan.rounds == 32 // (plan.micro_batch * 2 * 4)
    assert plan.reasons["rounds"].endswith("x 2 ranks x 4 nodes)")
    assert plan.reasons["nodes"].startswith("4 nodes of 2 rank(s): 8 ranks in all")
    # host and device budgets are per node and per GPU: the same as for one node of 2
    one_node = make_plan(_spec(2, 8), LLAMA, H200)
    assert plan.predicted.peak_host_bytes == one_node.predicted.peak_host_bytes
    assert plan.predicted.peak_device_bytes == one_node.predicted.peak_device_bytes
    # one rank a node still data-parallel: the working set updates on the host
    single = make_plan(_spec(1, 32, nodes=2, overrides={"runtime": "working_set"}), LLAMA, H200)
    assert single.working_set is not None and single.working_set.optimizer == "host"


# 4x H100, measured (bench/RESULTS.md "Data parallel"): D2H 55 GB/s a GPU alone or two at
# once, 34 GB/s each with four at once
SHARED_D2H = replace(
    H200, d2h_by_gpus=((2, H200.d2h_bytes_per_s), (4, 0.61 * H200.d2h_bytes_per_s))
)


def test_ranks_plan_with_the_link_rate_their_gpus_get_together() -> None:
    assert SHARED_D2H.for_ranks(1) is SHARED_D2H and SHARED_D2H.for_ranks(2) is SHARED_D2H
    four = SHARED_D2H.for_ranks(4)
    assert four.d2h_bytes_per_s == pytest.approx(0.61 * H200.d2h_bytes_per_s)
    assert four.both_bytes_per_s == pytest.approx(0.61 * H200.both_bytes_per_s)
    assert SHARED_D2H.for_ranks(8).d2h_bytes_per_s == four.d2h_bytes_per_s  # nearest below
    assert H200.for_ranks(4) is H200  # nothing measured: the one-GPU rate
    spec = _spec(4, 32, overrides={"runtime": "working_set"})
    alone, shared = (make_plan(spec, LLAMA, node).predicted for node in (H200, SHARED_D2H))
    # a slower way home: fewer saved sets sent there, more recomputed, a slower step
    assert (shared.recompute_seconds or 0) > (alone.recompute_seconds or 0)
    assert shared.step_seconds > alone.step_seconds
    # one GPU plans alike on both (each plan's inputs digest names its own node)
    one = [make_plan(_spec(1, 8), LLAMA, node) for node in (SHARED_D2H, H200)]
    assert one[0].model_dump(exclude={"inputs_digest"}) == one[1].model_dump(
        exclude={"inputs_digest"}
    )
    measured = {"d2h_bytes_per_s": 55e9, "d2h_bytes_per_s.4": 34e9, "d2h_bytes_per_s.2": 55e9}
    node = NodeProfile.from_profile("cuda", measured, 80 * 2**30, 512 * 2**30)
    assert node.d2h_by_gpus == ((2, 55e9), (4, 34e9))  # the agent's profile, as measured


def test_a_binding_host_budget_keeps_what_every_ranks_store_can_hold() -> None:
    # 512K tokens a rank: level 0 everywhere fits 250 GiB for two ranks, but not every saved
    # set. Each set dropped to level 0 frees its bytes in both ranks' stores, so the plan
    # keeps as many as the budget holds and predicts the host bytes its levels take.
    spec = _spec(2, 2, seq_len=524288, budget={"device_gib": 24, "host_gib": 250})
    plan = make_plan(spec, LLAMA, H200)
    ws = plan.working_set
    assert ws is not None and ws.seq_chunk > 0
    kept = [lv for row in ws.levels[: plan.layers - plan.window] for lv in row]
    assert any(kept) and not all(kept)  # the budget binds: some sets kept, some dropped
    saved = [mm.saved_bytes(LLAMA, spec, lv, ws.seq_chunk) for lv in range(4)]
    host = mm.host_bytes(LLAMA, spec, sum(saved[lv] for lv in kept), "cuda")
    assert plan.predicted.peak_host_bytes == host <= spec.budget.host_bytes
    # keeping one more set at its level would not fit both ranks' stores
    smallest = min(saved[lv] for lv in range(1, 4) if lv in kept) - saved[0]
    assert host + 2 * smallest > spec.budget.host_bytes
