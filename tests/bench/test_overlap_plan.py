"""bench/overlap_plan.py on rows measured on an H200: the per-round re-plan reproduces what
the planner planned for each row, and the overlap's plan lies between today's plan and the
ideal overlap bound.

    pytest tests/bench/test_overlap_plan.py
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.bound import bound, micro_batches_at_bound
from bench.overlap_plan import planned_recompute_s

RESULTS = Path(__file__).parents[2] / "bench/results"
ROWS = json.loads((RESULTS / "2026-11-27-h200-runtime-s42.json").read_text())
SHARES = json.loads((RESULTS / "2026-11-27-h200-link-share-s42.json").read_text())


def _working_set(rows: list[dict]) -> list[dict]:  # type: ignore[type-arg]
    return [r for r in rows if r["runtime"] == "working_set"]


@pytest.mark.parametrize(
    "row", _working_set(ROWS + SHARES), ids=lambda r: f"{r['name']}@{r['plan']['link_share']}"
)
def test_the_per_round_replan_is_the_rows_own_plan(row: dict) -> None:  # type: ignore[type-arg]
    """16 and 32 layers, bf16 and fp8 saved sets, the link at 80% and 100%: the DP run
    again on the row's node profile and layout plans the recomputation the row planned."""
    per_round, _ = planned_recompute_s(row)
    assert per_round == pytest.approx(row["plan"]["predicted"]["recompute_seconds"], rel=1e-6)


@pytest.mark.parametrize("name", ["ws-20", "ws-12"])
def test_the_overlap_plans_between_todays_plan_and_its_ideal_bound(name: str) -> None:
    """Beside the previous round's backward a round's sets have more link time, so the plan
    recomputes less than today's; never less than the overlap's ideal bound (whole link,
    leanest layout, fractional levels). A one-round first pass recomputes less than a lead
    pass of two; two more weight slots never buy recomputation back."""
    row = next(r for r in ROWS if r["name"] == name)
    res = next(r for r in ROWS if r["name"] == "resident")["measured_step_seconds"]
    per_round, lead = planned_recompute_s(row)
    _, one_first = planned_recompute_s(row, first_rounds=1)
    _, more_slots = planned_recompute_s(row, ring_slots=2, first_rounds=1)
    ideal = min(
        bound(row, res, X, overlap=True).min_recompute_s for X in micro_batches_at_bound(row)
    )
    assert lead is not None and one_first is not None
    assert ideal <= one_first < lead < per_round
    assert more_slots is None or more_slots >= one_first
