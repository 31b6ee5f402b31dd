"""A benchmark row re-planned with the cross-round overlap: the row's job, node profile and
link share through this planner (planning/working_set.py) once per round, which
reproduces the row's own plan, and once with overrides.overlap. The difference of the two
predictions, added to the row's measured step, estimates what the overlap would measure
beside the same resident row; only a device row measures it. CPU only.

    python -m bench.bound bench/results/runtime/per-round-rows-h200-2026-11-27.json \
        --row ws-20 --levers
"""

from __future__ import annotations

import logging

from bench.specs import link_share_of, node_from_row, spec_dims_of
from wstrain.contracts.errors import InfeasibleBudget
from wstrain.contracts.plan import Plan
from wstrain.planning import cost_model as cm
from wstrain.planning.working_set import make_ws_plan

log = logging.getLogger("bench.overlap_plan")


def replan(row: dict, overlap: bool) -> Plan | None:  # type: ignore[type-arg]
    """The row's job planned again on its node profile at its link share, the overlap on or
    off (None where no overlap plan fits its budgets)."""
    spec, dims = spec_dims_of(row)
    overrides = spec.overrides.model_copy(update={"runtime": "working_set", "overlap": overlap})
    spec = spec.model_copy(update={"overrides": overrides})
    share, cm.LINK_SHARE = cm.LINK_SHARE, link_share_of(row)
    try:
        return make_ws_plan(spec, dims, node_from_row(row))
    except InfeasibleBudget:
        return None
    finally:
        cm.LINK_SHARE = share


def report(row: dict, resident_step_s: float) -> None:  # type: ignore[type-arg]
    """Log both plans' predicted recomputation and step, and the tokens/s over resident the
    overlap's would give: the row's measured step plus the predicted difference."""
    per_round, overlap = replan(row, False), replan(row, True)
    assert per_round is not None  # the row ran it
    log.info("as this planner plans it (predicted; the row measured %.2f s):", _measured(row))
    for name, plan in (
        ("per round (today's schedule)", per_round),
        ("cross-round overlap", overlap),
    ):
        if plan is None:
            log.info("  %-30s no plan fits the budgets", name)
            continue
        ws, p = plan.working_set, plan.predicted
        assert ws is not None
        step_s = _measured(row) + p.step_seconds - per_round.predicted.step_seconds
        log.info(
            "  %-30s X=%d window %d lead %d: recompute %.2f s, step %.2f s -> %.3fx",
            name,
            plan.micro_batch,
            plan.window,
            ws.lead_rounds,
            p.recompute_seconds,
            p.step_seconds,
            resident_step_s / step_s,
        )


def _measured(row: dict) -> float:  # type: ignore[type-arg]
    return float(row["measured_step_seconds"])
