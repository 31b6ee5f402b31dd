"""Cross-round overlap as this planner would plan it, from a benchmark row: the levels DP and
window search of scheduler/planning/working_set.py run again on the row's own node profile
and layout, once as they plan today's per-round schedule (which reproduces the row's planned
recomputation) and once with a chunk's saved sets draining beside the previous round's
backward. Not a bound (bench/bound.py is): the planner's own margins and discrete levels, so
it says what building the overlap into the runtime and the planner would buy. CPU only.

    python -m bench.bound bench/results/2026-11-27-h200-runtime-s42.json --row ws-20 --levers
"""

from __future__ import annotations

import logging
from dataclasses import replace

from bench.bound import layout_of, link_share_of, node_from_row, spec_dims_of
from wstrain.scheduler.planning import cost_model as cm
from wstrain.scheduler.planning.levels import solve
from wstrain.scheduler.planning.working_set import window_costs

log = logging.getLogger("bench.overlap_plan")


def planned_recompute_s(  # type: ignore[type-arg]
    row: dict, ring_slots: int = 0, first_rounds: int = 0
) -> tuple[float, float | None]:
    """(per round, cross-round overlap): recomputation plus exposed backward transfer a
    step, as this planner's levels DP and window search (planning/working_set.py
    window_costs) would plan each at the row's micro-batch and layout. Not a bound: the
    planner's own margins and discrete levels, so it says what building the overlap into
    the planner would give.

    Beside the previous round's backward, a chunk's sets drain during its forward and the
    paired backward chunk, less that backward's weight gradients going home (one layer's
    bytes over the round's chunks); inbound carries this forward's weights too, and has the
    forward's compute to hide in. The DP reads a chunk's compute as both its drain time and
    its recomputation, so the backward's share is taken back out of the cost (and out of
    the time the inbound link hides behind). The device holds a second round's transition
    and `ring_slots` more weight slots: 0 as the overlap's design plans it (one compute
    stream, so the row's ring serves both passes), 2 as `bound` charges it. The step's
    first pass keeps the per-round plan: the row's lead_rounds rounds, or `first_rounds`
    (a lead pass amortises the deferred update's weight loads, but beside the overlap its
    second round loses the backward's link time). None for the overlap where no window fits
    the device. At the row's link share (bench.runtime --link-share sets the same global)."""
    share, cm.LINK_SHARE = cm.LINK_SHARE, link_share_of(row)
    try:
        return _planned_recompute_s(row, ring_slots, first_rounds)
    finally:
        cm.LINK_SHARE = share


def _planned_recompute_s(  # type: ignore[type-arg]
    row: dict, ring_slots: int, first_rounds: int
) -> tuple[float, float | None]:
    spec, dims = spec_dims_of(row)
    node = node_from_row(row)
    X = int(row["plan"]["micro_batch"])
    lay, _ = layout_of(row, X, planned=True, overlap=False)
    lay_o = replace(lay, r_param=lay.r_param + ring_slots, lead_rounds=max(lay.lead_rounds, 2))
    L = dims.num_layers
    lc = cm.layer_cost(dims, spec, lay, node)
    _, bwd_s = cm.chunk_times(dims, spec.seq_len, node)
    weights = dims.layer_params * cm.ELEMENT_BYTES[spec.precision]
    extra_s = bwd_s - cm.link_seconds(weights, node) / X  # a chunk's added drain time
    paired = replace(
        lc,
        compute_s=lc.compute_s + extra_s,
        inbound_s=lc.inbound_s + weights / node.both_bytes_per_s,
        busy_s=lc.busy_s + X * (lc.compute_s - extra_s),
    )
    per_round = min(c for c, _, _ in window_costs(dims, spec, lay, solve([lc] * L), lc))
    costs = window_costs(dims, spec, lay_o, solve([paired] * L), paired)
    rounds, first = spec.global_batch // X, first_rounds or lay.lead_rounds
    if not costs:
        return rounds * per_round, None
    overlap = min(c for c, _, _ in costs) - L * X * extra_s
    return rounds * per_round, first * per_round + (rounds - first) * overlap


def report(row: dict, resident_step_s: float) -> None:  # type: ignore[type-arg]
    """Log each schedule's planned recomputation a step and the tokens/s over resident it
    gives with the row's other losses (optimizer wait, idle, overrun) kept as measured."""
    per_round, overlap = planned_recompute_s(row)
    _, one_first = planned_recompute_s(row, first_rounds=1)
    # what the row lost beside its planned recomputation: optimizer wait, idle, overrun
    other = row["measured_step_seconds"] - resident_step_s - per_round
    log.info(
        "as this planner's DP would plan it (recomputation + exposed transfer a step; the "
        "row's other losses, %.2f s, kept):",
        other,
    )
    for name, rec in (
        ("per round (today's schedule)", per_round),
        ("cross-round overlap", overlap),
        ("overlap, a one-round first pass", one_first),
    ):
        if rec is None:
            log.info("  %-32s no window fits the device", name)
            continue
        log.info(
            "  %-32s %.2f s  -> %.3fx", name, rec, resident_step_s / (resident_step_s + rec + other)
        )
