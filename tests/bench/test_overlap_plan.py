"""bench/overlap_plan.py on rows measured on an H200: re-planned per round, each row gets the
plan it ran; with the overlap, less recomputation where the link has room, and never less
than the overlap's ideal bound.

    pytest tests/bench/test_overlap_plan.py
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.bound import bound, micro_batches_at_bound
from bench.overlap_plan import replan
from bench.specs import spec_dims_of
from wstrain.planning import layer_time

RESULTS = Path(__file__).parents[2] / "bench/results"
ROWS = json.loads((RESULTS / "runtime/per-round-rows-h200-2026-11-27.json").read_text())
SHARES = json.loads((RESULTS / "runtime/link-share-h200-2026-11-27.json").read_text())


def _working_set(rows: list[dict]) -> list[dict]:  # type: ignore[type-arg]
    return [r for r in rows if r["runtime"] == "working_set"]


@pytest.mark.parametrize(
    "row", _working_set(ROWS + SHARES), ids=lambda r: f"{r['name']}@{r['plan']['link_share']}"
)
def test_the_per_round_replan_is_the_rows_own_plan(
    row: dict,  # type: ignore[type-arg]
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """16 and 32 layers, bf16 and fp8 saved sets, the link at 80% and 100%: the planner run
    again on the row's node profile plans the levels and time the row planned."""
    # the rows were planned while attention cost 3.5 / 3 of its profiled time
    # (contracts/calibration.py ATTENTION_BACKWARD_RATIO): costed so again
    monkeypatch.setattr(layer_time, "ATTENTION_OVERHEAD", 3.5 / 3)
    plan = replan(row, overlap=False)
    assert plan is not None and plan.working_set is not None
    counts = [sum(r.count(lv) for r in plan.working_set.levels) for lv in range(4)]
    assert counts == row["plan"]["working_set"]["levels"]  # the row keeps each level's count
    # the rows were planned before the step's start charged a host-updated layer's load after
    # its update (planning/cost_model.py): the replan may add up to that one load
    _, dims = spec_dims_of(row)
    load_s = dims.layer_params * 2 / row["plan"]["node"]["h2d_bytes_per_s"]  # bf16 weights
    added_s = plan.predicted.step_seconds - row["plan"]["predicted"]["step_seconds"]
    assert -1e-9 <= added_s <= load_s * (1 + 1e-9)


@pytest.mark.parametrize(
    ("name", "less"), [("ws-20", True), ("ws-12", False), ("ws-20-fp8", True), ("ws-12-fp8", False)]
)
def test_the_overlap_recomputes_never_less_than_its_bound(name: str, less: bool) -> None:
    """At 20 GiB the overlap plan recomputes less than per round (both directions carry
    sets); at 12 GiB it runs rounds of 2, whose link, shared both ways at
    PAIRED_LINK_SHARE, takes fewer sets than rounds of 4 per round. Never less than the
    overlap's ideal bound."""
    row = next(r for r in ROWS if r["name"] == name)
    res = next(r for r in ROWS if r["name"] == "resident")["measured_step_seconds"]
    per_round, overlap = replan(row, overlap=False), replan(row, overlap=True)
    assert per_round is not None and overlap is not None
    assert overlap.working_set is not None and overlap.working_set.overlap
    ideal = min(
        bound(row, res, X, overlap=True).min_recompute_s for X in micro_batches_at_bound(row)
    )
    assert ideal <= overlap.predicted.recompute_seconds
    assert (overlap.predicted.recompute_seconds < per_round.predicted.recompute_seconds) == less
