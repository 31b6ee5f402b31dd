"""How close to resident the working set can get under AdaWS's per-round schedule: an upper
bound on tokens/s over resident, from a benchmark row's own measurements. CPU only.

    python -m bench.bound bench/results/2026-11-22-h200-runtime-s10.json --row ws-20
    python -m bench.bound bench/results/2026-11-22-h200-runtime-s10.json --row ws-20 --levers

It prints the bound at each micro-batch the planner tries first (AdaWS's bound and above);
with --levers, the ceilings of the schedules issue 26 weighs, each the same argument with one
term changed (see `bound`): saved activations as fp8 with a scale per block (cost_model's
bytes: the inputs and the MLP's pair at 1 byte, the attention kernel's set exact), and
cross-round overlap (the next round's forward beside this round's backward, so the link's
backward time carries saved sets too, less the gradients it sends home then).

The argument, per round of X sequences. Every (layer, sequence) of the round's forward
produces a saved set (working_set/schedule.py levels 0-3; level 0, the input, at the least).
When the round's forward (and its LM-head loss) ends, each byte of those sets has either left
over the D2H link during it or is still in device memory, so

    saved bytes <= forward_s * link_bytes_per_s + (device budget - fixed device bytes)

and what does not fit is recomputed in backward. The link rate is the profiled one with both
directions busy (the next layers' weights stream in meanwhile). The fixed bytes are the cost model's
(scheduler/planning/cost_model.py fixed_device_bytes) for the leanest layout: two weight slots, one
gradient slot, the optimizer on the host, no copies in flight home. Levels are bought as a
fractional knapsack (recomputation avoided per byte), so the bound is generous: it assumes a
perfectly used link, the resident step's own kernel times, no idle, no extra weight-gradient
GEMMs, and nothing else ever waiting. The same layer rates give the resident step, so the
bound is the resident step measured on the same machine over itself plus that recomputation.
(Slowing the forward to send more never pays: a byte takes ~20 ps of a 50 GB/s link, and
recomputing a GEMM output of K = 4096 ~4096 FLOPs a byte, ~5 ps at 800 TFLOP/s.)
"""

from __future__ import annotations

import argparse
import json
import logging
from dataclasses import dataclass

from wstrain.scheduler.contracts.calibration import LEVELS
from wstrain.scheduler.contracts.hardware import LayerTimes, NodeProfile
from wstrain.scheduler.planning import cost_model as cm
from wstrain.scheduler.planning import memory_model as mm

log = logging.getLogger("bench.bound")


@dataclass(frozen=True)
class Bound:
    micro_batch: int
    saved_bytes: tuple[int, ...]  # one (layer, sequence) per level
    recompute_s: tuple[float, ...]  # its backward recomputation per level
    capacity_bytes: float  # per round: the forward's D2H bytes plus the spare device bytes
    min_recompute_s: float  # per step
    resident_step_s: float
    ceiling: float  # tokens/s over resident, at most


def node_from_row(row: dict) -> NodeProfile:  # type: ignore[type-arg]
    """The node profile a benchmark row was planned with (bench/runtime.py keeps it)."""
    n = dict(row["plan"]["node"])
    points = tuple((int(s), float(f)) for s, f in n.pop("attention_points"))
    layer = n.pop("layer")
    return NodeProfile(**n, attention_points=points, layer=LayerTimes(**layer) if layer else None)


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


def _spec_dims(row: dict):  # type: ignore[no-untyped-def,type-arg]
    """The row's JobSpec and model dims, as bench/runtime.py planned them."""
    from bench.runtime import _dims, job_activation_precision, job_precision, llama_spec

    dims = _dims(int(row["layers"]))
    spec = llama_spec(
        row["name"],
        dims.num_layers,
        int(row["seq_len"]),
        int(row["global_batch"]),
        3,
        float(row["device_budget_gib"]),
        100,
        {},
        precision=job_precision(row["name"]),
        activation_precision=job_activation_precision(row["name"]),
    )
    return spec, dims


def bound(
    row: dict,  # type: ignore[type-arg]
    resident_step_s: float,
    X: int,
    fp8: bool = False,
    overlap: bool = False,
) -> Bound:
    """The bound for the row's model, budget and node at micro-batch X; `fp8`: saved sets
    at cost_model's fp8 bytes; `overlap`: a round's backward link time (less its gradients'
    bytes) adds to the round's capacity, as if the next round's forward ran beside it within
    the same device memory (generous: it holds no second round's activations)."""
    spec, dims = _spec_dims(row)
    if fp8:
        spec = spec.model_copy(update={"activation_precision": "fp8"})
    node = node_from_row(row)
    if node.layer is None or node.layer.seq_len != spec.seq_len:
        raise ValueError(
            f"row {row['name']!r} carries no layer timed at seq_len "
            f"{spec.seq_len}: use a working-set row from bench/runtime.py"
        )
    fwd_s = node.layer.forward_s
    saved = [mm.saved_bytes(dims, spec, lv) for lv in range(LEVELS)]
    shares = cm.recompute_shares(dims, spec.seq_len, node)
    recompute = [s * fwd_s for s in shares]
    # the round's forward, layers and LM head (6 S D V FLOPs a sequence, forward and backward)
    head_s = 6 * spec.seq_len * dims.hidden_size * dims.vocab_size / node.matmul_flops
    round_fwd_s = X * (dims.num_layers * fwd_s + head_s)
    lean = mm.Layout(X, r_param=2, r_grad=1, optimizer="host", loss_tokens=512)
    spare = spec.budget.device_bytes - mm.fixed_device_bytes(dims, spec, lean, dims.num_layers)
    # sets kept on the device stay 16-bit under fp8: its spare holds fewer of them
    spare *= saved[3] / mm.saved_bytes(dims, spec, 3, home=False)
    capacity = round_fwd_s * node.both_bytes_per_s + spare
    if overlap:  # every layer's gradient slot goes home once a round, in its backward
        round_bwd_s = X * dims.num_layers * node.layer.backward_s
        grads = dims.num_layers * dims.layer_params * cm.ELEMENT_BYTES[spec.precision]
        capacity += max(0.0, round_bwd_s * node.both_bytes_per_s - grads)
    rounds = spec.global_batch // X
    rec_s = rounds * min_recompute_s(dims.num_layers * X, saved, recompute, capacity)
    return Bound(
        X,
        tuple(saved),
        tuple(recompute),
        capacity,
        rec_s,
        resident_step_s,
        resident_step_s / (resident_step_s + rec_s),
    )


def micro_batches_at_bound(row: dict) -> list[int]:  # type: ignore[type-arg]
    """The micro-batches the planner tries first: divisors of the global batch at or above
    AdaWS's bound (below it the weights cannot stream in behind a layer's compute)."""
    from wstrain.scheduler.planning.layouts import micro_batches

    spec, dims = _spec_dims(row)
    tiers, _ = micro_batches(spec, dims, node_from_row(row))
    return tiers[0]


def levers(row: dict, resident_step_s: float, measured: float) -> None:  # type: ignore[type-arg]
    """Each lever's ceiling at the micro-batches the planner tries first, and the row's
    measured gap to it."""
    for name, kw in (
        ("per round (today's schedule)", {}),
        ("fp8 saved sets", {"fp8": True}),
        ("cross-round overlap", {"overlap": True}),
        ("both", {"fp8": True, "overlap": True}),
    ):
        best = max(
            (bound(row, resident_step_s, X, **kw) for X in micro_batches_at_bound(row)),
            key=lambda b: b.ceiling,
        )
        log.info(
            "%-30s X=%-3d capacity %6.1f GB  recompute %.2f s a step  ceiling %.3fx  "
            "(the row: %.3fx, %.3f under)",
            name,
            best.micro_batch,
            best.capacity_bytes / 1e9,
            best.min_recompute_s,
            best.ceiling,
            measured,
            best.ceiling - measured,
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("results", help="a bench/results/*.json file with a resident row")
    p.add_argument("--row", default="ws-20")
    p.add_argument("--resident", default="resident")
    p.add_argument("--levers", action="store_true", help="the ceilings of issue 26's levers")
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
