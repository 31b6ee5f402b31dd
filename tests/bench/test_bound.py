"""bench/bound.py's ceiling on CPU: the fractional knapsack on a hand-worked case, and the
bound on the H200 reference profile where the budget holds everything or nothing spare.

    pytest tests/bench/test_bound.py
"""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from bench.bound import bound, micro_batches_at_bound, min_recompute_s, row_ceilings
from bench.specs import spec_dims_of
from bench.table import format_rows
from wstrain.contracts.hardware import H200, LayerTimes
from wstrain.planning.memory_model import Layout, fixed_device_bytes

LAYER = LayerTimes(
    8192, forward_s=0.0059, backward_s=0.0122, attention_forward_s=0.002, mlp_forward_s=0.0039
)


def test_knapsack_takes_the_best_seconds_per_byte_first() -> None:
    saved, recompute = [1, 3, 5, 6], [10.0, 5.0, 3.0, 0.0]
    # from level 0: level 1 avoids 2.5 s a byte, level 2 1.75, level 3 2.0 -> level 1 first;
    # from level 1: level 2 1.0, level 3 5/3 -> then level 3 (never level 2)
    assert min_recompute_s(2, saved, recompute, 2) == 20.0  # inputs only
    assert min_recompute_s(2, saved, recompute, 4) == pytest.approx(15.0)  # one at level 1
    assert min_recompute_s(2, saved, recompute, 6) == pytest.approx(10.0)  # both at level 1
    assert min_recompute_s(2, saved, recompute, 9) == pytest.approx(5.0)  # half to level 3
    assert min_recompute_s(2, saved, recompute, 100) == 0.0  # everything saved
    with pytest.raises(ValueError, match="exceed"):
        min_recompute_s(2, saved, recompute, 1)


def _row(budget_gib: float) -> dict[str, object]:
    node = asdict(replace(H200, layer=LAYER))
    return {
        "name": "ws",
        "layers": 16,
        "seq_len": 8192,
        "global_batch": 32,
        "device_budget_gib": budget_gib,
        "plan": {"node": node},
    }


def test_a_larger_budget_never_lowers_the_ceiling() -> None:
    ceilings = [bound(_row(gib), 12.5, 4).ceiling for gib in (12, 20, 40, 80)]
    assert ceilings == sorted(ceilings) and ceilings[0] < ceilings[-1] <= 1.0


def test_a_budget_that_holds_every_set_leaves_only_level_3s_recomputation() -> None:
    b = bound(_row(400), 12.5, 4)
    rounds, pairs = 32 // 4, 16 * 4
    assert b.min_recompute_s == pytest.approx(rounds * pairs * b.recompute_s[3])
    assert b.recompute_s == tuple(sorted(b.recompute_s, reverse=True))  # more saved, less redone


def test_micro_batches_start_at_adaws_bound() -> None:
    xs = micro_batches_at_bound(_row(20))
    assert xs and all(32 % x == 0 for x in xs) and min(xs) >= 2


def _link_bytes(seconds: float) -> float:
    return seconds * H200.both_bytes_per_s


# the LM head of a round of 4 sequences at Llama-3-8B dims and 8K tokens (6 S D V FLOPs each)
HEAD_S = 4 * 6 * 8192 * 4096 * 128256 / H200.matmul_flops
LAYER_BYTES = 218_112_000 * 2  # a Llama-3-8B layer in bf16


def test_a_rounds_capacity_is_its_layers_link_time_the_heads_room_and_the_spare() -> None:
    """What leaves during the LM head sat on the device when the head started: the head adds
    only the bytes a layer's pass holds and the head does not (workspace 2.1 GB, the
    attention block's whole weight gradients, with the allocator's slack), not the 6 GB its
    link time would carry. A budget 20 GiB larger adds exactly that to the spare."""
    base, more = bound(_row(20), 12.5, 4), bound(_row(40), 12.5, 4)
    assert more.capacity_bytes - base.capacity_bytes == pytest.approx(20 * 2**30)
    head_room = base.capacity_bytes - _link_bytes(4 * 16 * LAYER.forward_s) - _spare(20)
    assert 2.5e9 < head_room < 2.7e9 < _link_bytes(HEAD_S)
    assert base.first_capacity_bytes == base.capacity_bytes  # every round alike


def _spare(budget_gib: float, overlap: bool = False) -> float:
    """The leanest layout's spare, from the memory model."""
    spec, dims = spec_dims_of(_row(budget_gib))
    lay = Layout(4, r_param=4 if overlap else 2, r_grad=1, optimizer="host", loss_tokens=512)
    lay = replace(lay, lead_rounds=2) if overlap else lay
    return spec.budget.device_bytes - fixed_device_bytes(dims, spec, lay, 16)


def test_overlap_is_bound_by_the_weights_and_gradients_coming_in() -> None:
    """Beside the previous round's backward a round's sets go out with that backward's
    gradients (16 layers once) and come back with both passes' weights (30 layers) and the
    accumulated gradients that backward adds to (16 layers), during the span and the head:
    the inbound side binds. The step's first round has no backward beside it, the second's
    backward (the step's first) reads no gradients, and the overlap's second weight ring and
    round leave less spare."""
    row = _row(20)
    base, overlap = bound(row, 12.5, 4), bound(row, 12.5, 4, overlap=True)
    span = _link_bytes(4 * 16 * (LAYER.forward_s + LAYER.backward_s) + HEAD_S)
    spare = _spare(20, overlap=True)
    assert overlap.capacity_bytes == pytest.approx(span - 46 * LAYER_BYTES + spare)
    assert 0 < _spare(20) - spare < 2 * 2**30  # two slots and a round
    assert overlap.first_capacity_bytes == pytest.approx(base.capacity_bytes - _spare(20) + spare)
    assert base.ceiling < overlap.ceiling <= 1.0


def test_the_levers_never_lower_the_ceiling_and_the_planners_margins_never_raise_it() -> None:
    """fp8 sets are about half the bytes (the attention kernel's own set stays 16-bit); the
    planner's link share and layout only take capacity away."""
    row = _row(20)
    row["plan"].update(
        window=3,
        working_set={
            "r_param": 3,
            "r_grad": 2,
            "optimizer": "host",
            "loss_tokens": 512,
            "lead_rounds": 2,
        },
    )
    base = bound(row, 12.5, 4)
    fp8 = bound(row, 12.5, 4, fp8=True)
    assert fp8.saved_bytes[0] == pytest.approx(base.saved_bytes[0] * (1 + 4 / 128) / 2, rel=1e-6)
    for kw in ({}, {"fp8": True}, {"overlap": True}, {"fp8": True, "overlap": True}):
        ideal, planned = bound(row, 12.5, 4, **kw), bound(row, 12.5, 4, planned=True, **kw)
        assert base.ceiling <= ideal.ceiling <= 1.0
        assert planned.capacity_bytes < ideal.capacity_bytes and planned.ceiling <= ideal.ceiling


RUNTIME = Path(__file__).parents[2] / "bench/results/runtime"
H200_ROWS = RUNTIME / "working-set-and-offload-baselines-h200-2026-11-22.json"


def test_each_measured_row_lies_under_its_ceilings_and_the_table_reports_the_gap() -> None:
    """On rows measured side by side on one H200: a working-set row runs below both of its
    per-round ceilings (a bound under a measured row would be wrong), the planner's margins
    only lower the ceiling, and bench/table.py prints the ratio and both ceilings on
    the row's line (a row of another model, here 32 layers, has no resident to stand on)."""
    rows = json.loads(H200_ROWS.read_text())
    res = next(r for r in rows if r["name"] == "resident")
    table = {line.split()[0]: line.split() for line in format_rows(rows).splitlines()[1:]}
    for name in ("ws-12", "ws-20", "ws-40"):
        row = next(r for r in rows if r["name"] == name)
        ratio = res["measured_step_seconds"] / row["measured_step_seconds"]
        ideal, planned = row_ceilings(row, res["measured_step_seconds"])
        assert ratio < planned <= ideal <= 1.0
        assert table[name][-3:] == [f"{ratio:.3f}", f"{ideal:.3f}", f"{planned:.3f}"]
    assert len(table["ws-24-32l"]) == len(table["ws-20"]) - 3  # ends at the predicted step


def test_an_overlap_row_reports_its_gap_to_the_overlaps_ceiling() -> None:
    """A row the planner ran with the cross-round overlap (fp8 sets, H200 `overlap-shared-store`) is
    measured against the overlap's ceilings, not the per-round ones it beat: it lies under
    both, and they are the overlap bound at its own layout (no second ring added to a plan
    that has its ring)."""
    path = RUNTIME / "overlap-shared-store-h200-2026-11-27.json"
    rows = json.loads(path.read_text())
    res = next(r for r in rows if r["name"] == "resident")["measured_step_seconds"]
    row = next(r for r in rows if r["name"] == "ws-20-fp8")
    assert row["plan"]["working_set"]["overlap"]
    ideal, planned = row_ceilings(row, res)
    assert res / row["measured_step_seconds"] < planned <= ideal <= 1.0
    X = row["plan"]["micro_batch"]
    own = bound(row, res, X, fp8=True, overlap=True, planned=True)
    assert planned == own.ceiling
    per_round = bound(row, res, X, fp8=True, planned=True).ceiling
    assert planned != per_round
