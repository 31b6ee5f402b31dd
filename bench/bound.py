"""How close to resident the working set can get under AdaWS's per-round schedule: an upper
bound on tokens/s over resident, from a benchmark row's own measurements. CPU only.

    python -m bench.bound bench/results/runtime/working-set-rows-h200-2026-11-27.json --row ws-20
    python -m bench.bound bench/results/runtime/working-set-rows-h200-2026-11-27.json \
        --row ws-20 --levers

It prints the bound at each micro-batch the planner tries first (AdaWS's bound and above);
with --levers, the ceilings of the schedules weighed against it, each the same argument with one
term changed (see `bound`): saved activations as fp8 with a scale per block (cost_model's
bytes: the inputs and the MLP's pair at 1 byte, the attention kernel's set exact), and
cross-round overlap (the next round's forward beside this round's backward, so the link's
backward time carries saved sets too, within both directions and a second ring and round on
the device); each ideal (the whole link, the leanest layout) and as this planner would plan
it (the link at the row's planned share, LINK_SHARE unless the row set another, and the
row's own layout).

The argument, per round of X sequences. Every (layer, sequence) of the round's forward
produces a saved set (working_set/schedule.py levels 0-3; level 0, the input, at the least).
When the round's last layer ends, each byte of those sets has either left over the D2H link
during the layers or is still in device memory, so

    saved bytes <= layers_forward_s * link_bytes_per_s + min(head_s * link_bytes_per_s,
                   a layer's temporaries) + (device budget - fixed device bytes)

and what does not fit is recomputed in backward. The LM head's link time adds at most what
fits in the device bytes a layer's pass holds and the head does not (workspace, whole weight
gradients, copies in flight): a byte that leaves during the head was on the device when it
started. The link rate is the profiled one with both directions busy (the next layers'
weights stream in meanwhile). The fixed bytes are the memory model's
(planning/memory_model.py fixed_device_bytes) for the leanest layout: two weight
slots, one gradient slot, the optimizer on the host, no copies in flight home. Levels are
bought as a fractional knapsack (recomputation avoided per byte), so the bound is generous:
it assumes a perfectly used link, the resident step's own kernel times, no idle, no extra
weight-gradient GEMMs, and nothing else ever waiting. The same layer rates give the resident
step, so the bound is the resident step measured on the same machine over itself plus that
recomputation. (Slowing the forward to send more never pays: a byte takes ~20 ps of a 50 GB/s
link, and recomputing a GEMM output of K = 4096 ~4096 FLOPs a byte, ~5 ps at 800 TFLOP/s.)
"""

from __future__ import annotations

import argparse
import json
import logging
from dataclasses import dataclass, replace

from bench.overlap_plan import report
from bench.specs import link_share_of, node_from_row, spec_dims_of
from wstrain.contracts.calibration import (
    ALLOCATOR_SLACK,
    LEVELS,
    PAIRED_LINK_SHARE,
    WRITE_BUFFER_BYTES,
)
from wstrain.planning import cost_model as cm
from wstrain.planning import memory_model as mm
from wstrain.planning.layouts import micro_batches

log = logging.getLogger("bench.bound")


@dataclass(frozen=True)
class Bound:
    micro_batch: int
    saved_bytes: tuple[int, ...]  # one (layer, sequence) per level
    recompute_s: tuple[float, ...]  # its backward recomputation per level
    capacity_bytes: float  # a round's link bytes for saved sets plus the spare device bytes
    first_capacity_bytes: float  # the step's first round's (no backward beside it)
    min_recompute_s: float  # per step
    resident_step_s: float
    ceiling: float  # tokens/s over resident, at most


def min_recompute_s(
    n_pairs: int, saved: list[int], recompute: list[float], capacity_bytes: float
) -> float:
    """Least recomputation of `n_pairs` identical (layer, sequence) pairs whose saved sets
    share `capacity_bytes`: all at level 0, then upgrades by the best seconds per byte
    first, fractionally. Raises ValueError where even level 0 does not fit."""
    left = capacity_bytes - n_pairs * saved[0]
    if left < 0:
        raise ValueError(f"{n_pairs} inputs of {saved[0]} bytes exceed {capacity_bytes:.3g}")
    level, total = 0, n_pairs * recompute[0]
    while left > 0:  # walk the upper hull of (bytes, avoided seconds) from `level`
        steps = [
            ((recompute[level] - recompute[u]) / (saved[u] - saved[level]), u)
            for u in range(LEVELS)
            if saved[u] > saved[level] and recompute[u] < recompute[level]
        ]
        if not steps:
            break
        rate, up = max(steps)
        need = n_pairs * (saved[up] - saved[level])
        take = min(left, need)
        total -= take * rate
        left -= take
        if take < need:
            break
        level = up
    return total


def layout_of(row: dict, X: int, planned: bool, overlap: bool) -> tuple[mm.Layout, int]:  # type: ignore[type-arg]
    """The device layout a bound charges, and its window: the leanest (two weight slots, one
    gradient slot, the optimizer on the host, every layer's sets counted as kept, so no
    copies in flight home), or with `planned` the row's own plan. Cross-round overlap runs a
    forward beside a backward: two passes' transitions and copies in flight (the memory
    model's Layout.overlap) and, on the safe side, a second weight ring of two slots."""
    L = int(row["layers"])
    if planned:
        ws = row["plan"]["working_set"]
        lay = mm.Layout(
            X,
            r_param=ws["r_param"],
            r_grad=ws["r_grad"],
            optimizer=ws["optimizer"],
            loss_tokens=ws["loss_tokens"],
            lead_rounds=ws["lead_rounds"],
            write_buffer_bytes=int(ws.get("write_buffer_bytes") or WRITE_BUFFER_BYTES),
        )
        window = int(row["plan"]["window"])
    else:
        lay, window = mm.Layout(X, r_param=2, r_grad=1, optimizer="host", loss_tokens=512), L
    if overlap:  # a row planned with the overlap has its ring already
        own = planned and row["plan"]["working_set"].get("overlap", False)
        lay = replace(lay, r_param=lay.r_param + 2 * (not own), overlap=True)
    return lay, window


def bound(
    row: dict,  # type: ignore[type-arg]
    resident_step_s: float,
    X: int,
    fp8: bool = False,
    overlap: bool = False,
    planned: bool = False,
) -> Bound:
    """The bound for the row's model, budget and node at micro-batch X.

    `fp8`: saved sets at cost_model's fp8 bytes. `overlap`: every round but the step's first
    runs its forward beside the previous round's backward (the first has no backward before
    it: the optimizer step lies between), so the link time of both passes carries saved
    sets, within both directions: out, the sets less that backward's gradients; in, the
    returning sets less both passes' weights; the device holds the overlap's second ring and
    second round (`layout_of`). `planned`: the link at the share the row was planned with
    (`link_share`, else the planner's LINK_SHARE) and the row's own layout instead of the
    whole link and the leanest layout: what the same schedule would keep under this
    planner's margins."""
    spec, dims = spec_dims_of(row)
    if fp8:
        spec = spec.model_copy(update={"activation_precision": "fp8"})
    node = node_from_row(row)
    if node.layer is None or node.layer.seq_len != spec.seq_len:
        raise ValueError(
            f"row {row['name']!r} carries no layer timed at seq_len "
            f"{spec.seq_len}: use a working-set row from bench/runtime.py"
        )
    fwd_s, L = node.layer.forward_s, dims.num_layers
    saved = [mm.saved_bytes(dims, spec, lv) for lv in range(LEVELS)]
    shares = cm.recompute_shares(dims, spec.seq_len, node)
    recompute = [s * fwd_s for s in shares]
    round_fwd_s = X * L * fwd_s  # the layers'
    round_bwd_s = X * L * node.layer.backward_s
    # the LM head (6 S D V FLOPs a sequence, forward and backward, between the passes)
    head_s = X * 6 * spec.seq_len * dims.hidden_size * dims.vocab_size / node.matmul_flops
    rate = node.both_bytes_per_s * (link_share_of(row) if planned else 1.0)
    lay, window = layout_of(row, X, planned, overlap)
    spare = spec.budget.device_bytes - mm.fixed_device_bytes(dims, spec, lay, window)
    # what leaves during the head sat on the device when the head started: beyond the spare
    # at most in what a layer's pass holds and the head does not (at Llama-3-8B dims and 8K
    # tokens 2.6 GB of the 6.5 GB the head's 0.13 s a round carries at 50 GB/s). Generous:
    # the last layer's sets were made while its workspace was live, so a schedule gains
    # about one set from the head, not the workspace
    idle = mm.layer_temporaries_bytes(dims, spec, lay, window) * ALLOCATOR_SLACK
    head_out = min(head_s * rate, idle)
    # sets kept on the device stay 16-bit under fp8: its spare holds fewer of them
    spare *= saved[3] / mm.saved_bytes(dims, spec, 3, home=False)
    layer_bytes = dims.layer_params * cm.ELEMENT_BYTES[spec.precision]
    weights_in = (2 * L - 2) * layer_bytes  # a round's weights, both passes (two reused)
    # per round: out during the layers' forward and the head; back in during the head and
    # the backward, beside the backward's weights
    alone = min(
        round_fwd_s * rate + head_out, (head_s + round_bwd_s) * rate - (L - 2) * layer_bytes
    )
    first = max(0.0, alone) + spare
    capacity = second = first
    if overlap:  # the span of this round's forward and the previous round's backward
        # as planned, both directions busy at once get the planner's PAIRED_LINK_SHARE
        # (the H200's overlap rows moved about 76 GB/s both ways together, not 100)
        span_rate = node.both_bytes_per_s * PAIRED_LINK_SHARE if planned else rate

        def span_capacity(grads_in: float) -> float:
            """Out: the sets beside that backward's gradients going home. In: the sets
            coming back beside both passes' weights and the accumulated gradients that
            backward adds to (every backward's but the step's first)."""
            span_s = round_fwd_s + round_bwd_s
            out_bytes = span_s * span_rate + head_out - L * layer_bytes
            in_bytes = (span_s + head_s) * span_rate - weights_in - grads_in
            return max(0.0, min(out_bytes, in_bytes)) + spare

        second, capacity = span_capacity(0.0), span_capacity(L * layer_bytes)
    rounds, pairs = spec.global_batch // X, L * X
    rec_s = min_recompute_s(pairs, saved, recompute, first)
    if rounds > 1:
        rec_s += min_recompute_s(pairs, saved, recompute, second)
    rec_s += max(0, rounds - 2) * min_recompute_s(pairs, saved, recompute, capacity)
    return Bound(
        X,
        tuple(saved),
        tuple(recompute),
        capacity,
        first,
        rec_s,
        resident_step_s,
        resident_step_s / (resident_step_s + rec_s),
    )


def micro_batches_at_bound(row: dict) -> list[int]:  # type: ignore[type-arg]
    """The micro-batches the planner tries first: divisors of the global batch at or above
    AdaWS's bound (below it the weights cannot stream in behind a layer's compute)."""
    spec, dims = spec_dims_of(row)
    tiers, _ = micro_batches(spec, dims, node_from_row(row))
    return tiers[0]


def row_ceilings(row: dict, resident_step_s: float) -> tuple[float, float]:  # type: ignore[type-arg]
    """(ideal, as planned) ceilings of a working-set row's schedule (per round, or with the
    cross-round overlap where its plan overlaps) over the resident step measured beside
    it: the ideal at the best micro-batch the planner tries first, the planned one at the
    row's own micro-batch and layout. What bench/runtime.py's table reports each row's gap
    against."""
    overlap = bool(row["plan"]["working_set"].get("overlap", False))
    ideal = max(
        bound(row, resident_step_s, X, overlap=overlap).ceiling for X in micro_batches_at_bound(row)
    )
    X = int(row["plan"]["micro_batch"])
    return ideal, bound(row, resident_step_s, X, overlap=overlap, planned=True).ceiling


def levers(row: dict, resident_step_s: float, measured: float) -> None:  # type: ignore[type-arg]
    """Each lever's ceiling at the micro-batches the planner tries first, on the whole link
    with the leanest layout and then as this planner would plan it, and the row's measured
    gap to each."""
    for planned in (False, True):
        log.info(
            "%s:",
            "as planned (the link at %.0f%%, the row's own layout)" % (100 * link_share_of(row))
            if planned
            else "ideal (the whole link, the leanest layout)",
        )
        for name, kw in (
            ("per round (today's schedule)", {}),
            ("fp8 saved sets", {"fp8": True}),
            ("cross-round overlap", {"overlap": True}),
            ("both", {"fp8": True, "overlap": True}),
        ):
            best = max(
                (
                    bound(row, resident_step_s, X, planned=planned, **kw)
                    for X in micro_batches_at_bound(row)
                ),
                key=lambda b: b.ceiling,
            )
            log.info(
                "  %-28s X=%-3d capacity %5.1f GB (first round %5.1f)  recompute %.2f s a "
                "step  ceiling %.3fx  (the row: %.3fx, %.3f under)",
                name,
                best.micro_batch,
                best.capacity_bytes / 1e9,
                best.first_capacity_bytes / 1e9,
                best.min_recompute_s,
                best.ceiling,
                measured,
                best.ceiling - measured,
            )
    report(row, resident_step_s)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("results", help="a bench/results/*.json file with a resident row")
    p.add_argument("--row", default="ws-20")
    p.add_argument("--resident", default="resident")
    p.add_argument(
        "--levers",
        action="store_true",
        help="the ceilings of the levers: fp8 saved sets, cross-round overlap",
    )
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    with open(args.results) as f:
        rows = [r for r in json.load(f) if "error" not in r]
    res = next(r for r in rows if r["name"] == args.resident)
    row = next(r for r in rows if r["name"] == args.row)
    measured = res["measured_step_seconds"] / row["measured_step_seconds"]
    log.info(
        "%s: measured %.3fx resident at X=%d (plan: recompute %.2f s a step)",
        args.row,
        measured,
        row["plan"]["micro_batch"],
        row["plan"]["predicted"]["recompute_seconds"],
    )
    if args.levers:
        levers(row, res["measured_step_seconds"], measured)
        return
    for i, X in enumerate(micro_batches_at_bound(row)):
        b = bound(row, res["measured_step_seconds"], X)
        if i == 0:
            log.info(
                "per (layer, sequence) and level: saved %s MB, recomputed %s ms",
                [round(s / 1e6) for s in b.saved_bytes],
                [round(r * 1e3, 2) for r in b.recompute_s],
            )
        log.info(
            "X=%d: a round's capacity %.1f GB, least recomputation %.2f s a step: ceiling %.3fx",
            X,
            b.capacity_bytes / 1e9,
            b.min_recompute_s,
            b.ceiling,
        )


if __name__ == "__main__":
    main()
