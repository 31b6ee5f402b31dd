"""Budgets as ranges in the queue simulation: the same 24-hour trace (bench/queue_trace.py)
with fixed budgets, and with each packable job's device budget a range from the smallest
budget its model trains at to the budget it asked for; the policy places a ranged job at its
min and gives it what its GPU has left by predicted speed (policy/budgets.py).

    python -m bench.queue_ranges --sweep-seeds 12 \
        --out bench/results/queue/ranges-simulated-day-cpu-2026-11-29.json

A job's speed at a budget is the planner's prediction (`make_plan` on the shipped H200
profile, bf16, 4K tokens, global batch 16) for a model of its size class, relative to its
speed at the budget it asked for, which is what its trace work time is counted at:

    12 GiB  fixed (already the smallest)        40 GiB  Llama-3-8B       12..40 GiB
    20 GiB  Llama-3-8B, 16 layers, 12..20 GiB   80 GiB  a 15B dense      12..80 GiB
    141 GiB exclusive, fixed (a whole H200)

The working set hides most of its streaming behind compute, so these curves are flat: the
8B trains at 0.96x its 40 GiB speed in 12 GiB (planner, H200). The host budgets stay as in
the trace. The figures: jobs an hour, mean queue wait, the worst
owner's fair-share error (bench/queue_sim.py's definition; with --sweep-seeds, also over
every day's backlogged window pooled: a last row, "pooled"), the most each owner held
against its quota, beside the fixed-budget row of the same trace and node. Jobs an hour
are the day's jobs over the time to finish them (as bench/pack.py counts them), with jobs
finished within the 24 h beside them.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from collections.abc import Mapping, Sequence
from functools import cache
from typing import Any

from bench.queue_events import QueueSim, State, run_sim
from bench.queue_sim import forecast_figures
from bench.queue_trace import DAY_S, NODE, OWNERS, QUOTAS, TraceJob, make_trace
from wstrain.contracts.calibration import GIB
from wstrain.contracts.hardware import H200
from wstrain.contracts.model_dims import PRESETS
from wstrain.contracts.spec import JobSpec
from wstrain.planning.planner import make_plan
from wstrain.policy import PolicyConfig
from wstrain.policy.state import BudgetPoint

SEQ_LEN, GLOBAL_BATCH = 4096, 16
MIN_DEVICE_GIB = 12
# size class (device GiB asked) -> the model whose predicted speed curve it follows
MODELS = {20: "llama3-8b-16l", 40: "llama3-8b", 80: "dense-15b"}
POINTS_GIB = (12, 16, 20, 24, 32, 40, 60, 80)  # the planner is asked at these (up to the max)


@cache
def tokens_per_s(preset: str, device_gib: int) -> float:
    """The planner's predicted tokens/s of `preset` at `device_gib` on an H200 (host ample:
    the curve is the device budget's)."""
    spec = JobSpec.model_validate(
        {
            "name": "curve",
            "model": {"preset": preset},
            "data": {"kind": "synthetic"},
            "seq_len": SEQ_LEN,
            "global_batch": GLOBAL_BATCH,
            "steps": 1,
            "precision": "bf16",
            "budget": {"device_gib": device_gib, "host_gib": 400},
        }
    )
    plan = make_plan(spec, PRESETS[preset], H200)
    return SEQ_LEN * GLOBAL_BATCH / plan.predicted.step_seconds


def points_for(job: TraceJob) -> tuple[BudgetPoint, ...]:
    """The job's range as points from its min up, each with its speed relative to the
    budget it asked for (tokens_per_s here is that ratio: the trace counts work in run time
    at the asked budget). () for a job whose budget stays fixed."""
    asked_gib = job.device_bytes // GIB
    preset = MODELS.get(asked_gib)
    if job.exclusive or preset is None:
        return ()
    at_asked = tokens_per_s(preset, asked_gib)
    return tuple(
        BudgetPoint(g * GIB, job.host_bytes, tokens_per_s(preset, g) / at_asked)
        for g in (*(g for g in POINTS_GIB if MIN_DEVICE_GIB <= g < asked_gib), asked_gib)
    )


def ranges_of(trace: Sequence[TraceJob]) -> Mapping[str, tuple[BudgetPoint, ...]]:
    """Every ranged job's points, by id."""
    return {t.id: pts for t in trace if (pts := points_for(t))}


def figures(sim: QueueSim, config: PolicyConfig) -> dict[str, Any]:
    """Throughput, waits, fair share and quotas of one run."""
    jobs = list(sim.jobs.values())
    waits_h = [
        (j.first_start_s - j.spec.submit_s) / 3600 for j in jobs if j.first_start_s is not None
    ]
    done_in_day = sum(
        j.state == State.succeeded and j.end_s is not None and j.end_s <= DAY_S for j in jobs
    )
    total_gpu_s = sum(sim.window_gpu_s.values())
    shares = sum(config.share(o) for o in OWNERS)
    share_err = {  # none without a window in which every owner is backlogged (a small day)
        o: round((sim.window_gpu_s[o] / total_gpu_s) / (config.share(o) / shares) - 1, 4)
        for o in OWNERS
        if total_gpu_s > 0
    }
    quota_ok = True
    for owner, (n, dev, host) in sim.peak.items():
        q = config.quotas.get(owner)
        if q is not None:
            quota_ok &= (q.max_jobs is None or n <= q.max_jobs) and (
                (q.max_device_bytes is None or dev <= q.max_device_bytes)
                and (q.max_host_bytes is None or host <= q.max_host_bytes)
            )
    ends = [j.end_s for j in jobs if j.end_s is not None]
    succeeded = sum(j.state == State.succeeded for j in jobs)
    firsts = [j.first_point.device_bytes / GIB for j in jobs if j.first_point is not None]
    return {
        # throughput as bench/pack.py counts it on GPUs: the day's jobs over the time the
        # queue takes to finish them all; beside it, jobs finished within the 24 h, which
        # arrivals bound (a job submitted at 23:00 cannot finish in the day under any policy:
        # on the main trace even a node of 400 GPUs reaches only 1.24x the fixed day)
        "jobs_per_hour": round(succeeded / (max(ends) / 3600), 3),
        "jobs_per_hour_in_day": round(done_in_day / 24, 3),
        "succeeded": succeeded,
        "started": len(waits_h),
        "makespan_h": round(max(ends) / 3600, 2),
        "ranged_first_device_gib_mean": round(statistics.fmean(firsts), 2) if firsts else None,
        "wait_mean_h": round(statistics.fmean(waits_h), 3),
        "wait_median_h": round(statistics.median(waits_h), 3),
        "mean_jobs_running_24h": round(sim.slots_day_s / DAY_S, 3),
        "backlogged_window_h": round(sim.window_s / 3600, 2),
        "share_err_by_owner": share_err,
        "share_err": max((abs(v) for v in share_err.values()), default=None),
        "window_gpu_h_by_owner": {o: round(sim.window_gpu_s[o] / 3600, 4) for o in OWNERS},
        "quotas_kept": quota_ok,
        "preemptions": sim.preempted,
        "shrinks": sim.shrunk,
        "grows": sim.grown,
        "violations": len(sim.violations),
    }


def compare(seed: int, jobs_per_owner: int) -> dict[str, Any]:
    """The fixed-budget day and the ranged day of one trace, side by side."""
    trace = make_trace(seed, jobs_per_owner)
    config = PolicyConfig(quotas=QUOTAS)
    ranges = ranges_of(trace)
    start = time.perf_counter()
    fixed = figures(run_sim(trace, config), config)
    sim = run_sim(trace, config, NODE, ranges, predict=True)
    ranged = {**figures(sim, config), **forecast_figures(sim)}
    return {
        "bench": "queue-ranges",
        "row": f"seed:{seed}",
        "jobs": len(trace),
        "ranged_jobs": len(ranges),
        "gpus": len(NODE.gpus),
        "jobs_per_hour_ratio": round(ranged["jobs_per_hour"] / fixed["jobs_per_hour"], 3),
        "jobs_per_hour_in_day_ratio": round(
            ranged["jobs_per_hour_in_day"] / fixed["jobs_per_hour_in_day"], 3
        ),
        "wait_ratio": round(ranged["wait_mean_h"] / fixed["wait_mean_h"], 3),
        "share_err": ranged["share_err"],
        # the start forecast at each submission (`wstrain queue`), over the ranged day
        "start_median_err": ranged["start_median_err"],
        "quotas_kept": ranged["quotas_kept"] and fixed["quotas_kept"],
        "fixed": fixed,
        "ranged": ranged,
        "curves": {
            f"{gib} GiB {preset}": {
                g: round(tokens_per_s(preset, g), 1) for g in POINTS_GIB if g <= gib
            }
            for gib, preset in MODELS.items()
        },
        "sim_wall_s": round(time.perf_counter() - start, 2),
        "python": platform.python_version(),
    }


def pooled_day(rows: Sequence[Mapping[str, Any]], day: str, config: PolicyConfig) -> dict[str, Any]:
    """`day` ("fixed" or "ranged") of every row's trace as one run: jobs over the summed
    times to finish them, the mean wait over every started job, and fair share over every
    backlogged window at once (each owner's GPU-hours in them over all owners', against its
    share). One day's window can be 2-24 h, where one exclusive job (a whole GPU for ~2.7 h)
    moves an owner by 13%; pooled over a dozen days that grain averages out and what is left
    is the policy's bias."""
    hours = {o: sum(r[day]["window_gpu_h_by_owner"][o] for r in rows) for o in OWNERS}
    total, shares = sum(hours.values()), sum(config.share(o) for o in OWNERS)
    err = {
        o: round((hours[o] / total) / (config.share(o) / shares) - 1, 4)
        for o in OWNERS
        if total > 0
    }
    started = sum(r[day]["started"] for r in rows)
    waited_h = sum(r[day]["wait_mean_h"] * r[day]["started"] for r in rows)
    return {
        "jobs_per_hour": round(
            sum(r[day]["succeeded"] for r in rows) / sum(r[day]["makespan_h"] for r in rows), 3
        ),
        "wait_mean_h": round(waited_h / started, 3) if started else None,
        "window_gpu_h": round(total, 1),
        "share_err_by_owner": err,
        "share_err": max((abs(v) for v in err.values()), default=None),
    }


def pooled(rows: Sequence[Mapping[str, Any]], config: PolicyConfig) -> dict[str, Any]:
    """The last row of a sweep: the fixed and the ranged days of every seed pooled, with the
    ratios the targets read."""
    fixed, ranged = pooled_day(rows, "fixed", config), pooled_day(rows, "ranged", config)
    return {
        "bench": "queue-ranges",
        "row": "pooled",
        "seeds": [r["row"] for r in rows],
        "jobs_per_hour_ratio": round(ranged["jobs_per_hour"] / fixed["jobs_per_hour"], 3),
        "wait_ratio": round(ranged["wait_mean_h"] / fixed["wait_mean_h"], 3),
        "share_err": ranged["share_err"],
        # a bound: the pooled median is at most the largest day's, since every day has half
        # its jobs at or under its own
        "start_median_err": max(
            (r["start_median_err"] for r in rows if r["start_median_err"] is not None),
            default=None,
        ),
        "quotas_kept": all(r["quotas_kept"] for r in rows),
        "fixed": fixed,
        "ranged": ranged,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--seed", type=int, default=20261125)
    p.add_argument("--jobs-per-owner", type=int, default=80)
    p.add_argument("--sweep-seeds", type=int, default=0, help="also seeds 1..N, a row each")
    p.add_argument("--out")
    args = p.parse_args()
    seeds = [args.seed, *range(1, args.sweep_seeds + 1)]
    rows: list[dict[str, Any]] = [compare(seed, args.jobs_per_owner) for seed in seeds]
    if len(rows) > 1:
        rows.append(pooled(rows, PolicyConfig(quotas=QUOTAS)))
    for row in rows:
        print(json.dumps({k: v for k, v in row.items() if k not in ("curves",)}))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
