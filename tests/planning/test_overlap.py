"""The planner's cross-round overlap (overrides.overlap): the levels DP drains a round's
saved sets beside the previous round's backward, the memory model charges two rounds in
flight, and the plan keeps more saved sets than the per-round one within the same budgets.

    pytest tests/planning/test_overlap.py
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.helpers.specs import working_set_spec as _spec
from wstrain.contracts.calibration import (
    ACTIVATION_CHUNK_BYTES,
    ALLOCATOR_SLACK,
    GIB,
    WRITE_BUFFER_BYTES,
)
from wstrain.contracts.errors import InfeasibleBudget, InvalidSpec
from wstrain.contracts.hardware import H200
from wstrain.contracts.model_dims import PRESETS
from wstrain.planning import cost_model as cm
from wstrain.planning import memory_model as mm
from wstrain.planning.levels import solve
from wstrain.planning.working_set import make_ws_plan

DIMS = PRESETS["llama3-8b-16l"]


def _saved(levels: list[list[int]], spec: object) -> int:
    return sum(mm.saved_bytes(DIMS, spec, lv) for row in levels for lv in row)  # type: ignore[arg-type]


@pytest.mark.parametrize("device_gib", [20, 24])
def test_the_overlap_keeps_more_saved_sets_within_the_same_budgets(device_gib: int) -> None:
    """Llama-3-8B (16 layers), 8K tokens, 32 sequences a step in rounds of 4 (bench/runtime.py's
    rows) on the H200 profile: asked for, the plan overlaps, its later rounds save more than
    its first pass (which has no backward beside it), it predicts less recomputation and a
    shorter step than the per-round plan, and both fit the budgets. Not asked for, the
    planner keeps rounds one after another."""
    plans = {
        ov: make_ws_plan(
            _spec(DIMS, 8192, 32, device_gib, 100, micro_batch=4, overlap=ov), DIMS, H200
        )
        for ov in (None, True)
    }
    per_round, overlap = plans[None], plans[True]
    assert per_round.working_set is not None and overlap.working_set is not None
    assert not per_round.working_set.overlap and per_round.working_set.first_levels == []
    assert per_round.reasons["overlap"].startswith("off")
    ws, spec = overlap.working_set, _spec(DIMS, 8192, 32, device_gib, 100)
    assert ws.overlap and overlap.reasons["overlap"].startswith("on (override)")
    assert len(ws.first_levels) == len(ws.levels) == DIMS.num_layers
    assert _saved(ws.levels, spec) > _saved(ws.first_levels, spec)
    assert overlap.predicted.recompute_seconds < per_round.predicted.recompute_seconds
    assert overlap.predicted.step_seconds < per_round.predicted.step_seconds
    for plan in plans.values():
        assert plan.predicted.peak_device_bytes <= device_gib * GIB
        assert plan.predicted.peak_host_bytes <= 100 * GIB


def test_two_rounds_in_flight_are_charged() -> None:
    """A second round's transition and a second write buffer's copies (the previous round's
    sets coming back) on the device, with the allocator's slack; one host store that holds
    the most two passes keep at once: a pass's layer i beside the previous pass's layers
    0..L-1-i."""
    spec = _spec(DIMS, 8192, 32, 20, 100)
    lay = mm.Layout(4, lead_rounds=2)
    extra = mm.fixed_device_bytes(DIMS, spec, replace(lay, overlap=True), 3)
    extra -= mm.fixed_device_bytes(DIMS, spec, lay, 3)
    transition = 4 * 8192 * DIMS.hidden_size * 2
    assert extra == pytest.approx((transition + WRITE_BUFFER_BYTES) * ALLOCATOR_SLACK, abs=2)
    # equal passes: one pass and one layer more
    assert mm.overlap_live_bytes([3] * 4, [3] * 4) == 15
    # a lead pass twice a later one's: the lead pass and the next pass's layer 0
    assert mm.overlap_live_bytes([6] * 4, [3] * 4) == 27
    # a window on top sends nothing home, so its backward frees nothing while the next
    # pass's bottom layers go home: both passes' bottom layers at once
    assert mm.overlap_live_bytes([5, 5, 0, 0], [5, 5, 0, 0]) == 20
    # a first pass saving little: two later passes beside each other are the most
    assert mm.overlap_live_bytes([1] * 4, [3] * 4) == 15
    # each layer's sets in whole pages: 1 GiB and one byte takes 17 of 64 MiB
    C = ACTIVATION_CHUNK_BYTES
    # the next pass's layer 0 beside the whole first pass
    assert mm.overlap_stored_bytes([GIB + 1] * 4, [GIB] * 4) == C * (17 * 4 + 16)


def test_the_levels_dp_drains_beside_the_paired_backward() -> None:
    """The paired backward's time (less its weight gradients going home) drains the link
    too, so the same layer buys at least as much; per round it is the DP it was."""
    spec = _spec(DIMS, 8192, 32, 20, 100)
    lay = mm.Layout(4)
    alone = cm.layer_cost(DIMS, spec, lay, H200)
    paired = cm.layer_cost(DIMS, spec, replace(lay, overlap=True), H200)
    assert alone.drain_s == 0 and paired.drain_s > 0
    assert paired.inbound_s > alone.inbound_s and paired.busy_s > alone.busy_s
    L = DIMS.num_layers
    assert solve([paired] * L).best_s(L) > solve([alone] * L).best_s(L)
    assert solve([replace(paired, drain_s=0.0)] * L).best_s(L) < solve([paired] * L).best_s(L)


def test_the_overlap_is_refused_where_it_cannot_run() -> None:
    olmoe = PRESETS["olmoe-7b-a1b"]
    with pytest.raises(InvalidSpec, match=r"overrides.overlap=true.*mixture of experts"):
        make_ws_plan(_spec(olmoe, 4096, 32, 20, 200, overlap=True), olmoe, H200)
    with pytest.raises(InvalidSpec, match="global_batch=1"):
        make_ws_plan(_spec(DIMS, 8192, 1, 20, 200, overlap=True), DIMS, H200)
    with pytest.raises(InvalidSpec, match="seq_chunk=4096"):
        make_ws_plan(_spec(DIMS, 8192, 32, 20, 200, overlap=True, seq_chunk=4096), DIMS, H200)


def test_an_overlap_that_does_not_fit_says_so() -> None:
    """At 12 GiB in rounds of 4 the per-round plan fits with 0.5 GiB to spare; two rounds in
    flight need about 1.5 GiB more (a transition, a write buffer), and the refusal names the
    override, not only the budget."""
    spec = _spec(DIMS, 8192, 32, 12, 100, micro_batch=4)
    assert make_ws_plan(spec, DIMS, H200).predicted.peak_device_bytes <= 12 * GIB
    with pytest.raises(InfeasibleBudget, match=r"with overrides.overlap=true.*drop overlap"):
        make_ws_plan(_spec(DIMS, 8192, 32, 12, 100, micro_batch=4, overlap=True), DIMS, H200)


def test_unasked_the_planner_weighs_the_overlap_for_fp8_saved_sets() -> None:
    """Llama-3-8B (16 layers) at 20 GiB on the H200 profile, overrides.overlap unset: with
    fp8 saved sets the overlap predicts the shorter step and is planned, and its reason says
    the planner chose it; pinned off, the same job runs per round, predicted slower.
    Lossless sets stay per round (their overlap rows ran slower on an H200)."""
    fp8 = _spec(DIMS, 8192, 32, 20, 100).model_copy(update={"activation_precision": "fp8"})
    chosen = make_ws_plan(fp8, DIMS, H200)
    assert chosen.working_set is not None and chosen.working_set.overlap
    assert chosen.reasons["overlap"].startswith("on (fastest for fp8 saved sets)")
    off = fp8.model_copy(update={"overrides": fp8.overrides.model_copy(update={"overlap": False})})
    per_round = make_ws_plan(off, DIMS, H200)
    assert per_round.working_set is not None and not per_round.working_set.overlap
    assert per_round.predicted.step_seconds > chosen.predicted.step_seconds
    lossless = make_ws_plan(_spec(DIMS, 8192, 32, 20, 100), DIMS, H200)
    assert lossless.working_set is not None and not lossless.working_set.overlap
