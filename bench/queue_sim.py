"""A day of the lab queue through the real scheduling policy (`wstrain.policy`): a
discrete-event simulation on a virtual clock (no sleeping) of one modelled 8-GPU node, fed a
seeded 24-hour trace of jobs from 4 owners. CPU only: a few seconds, ~10 s with the start
forecasts (`--no-forecast` skips them).

    python -m bench.queue_sim --out bench/results/queue/policy-simulated-day-cpu-2026-11-28.json
    python -m bench.queue_sim --sweep-seeds 12   # the same figures for 12 other days
    python -m bench.queue_sim --out bench/results/queue/forecast-simulated-day-cpu-2026-11-28.json

The node, owners and trace: bench/queue_trace.py. The events and what a round does:
bench/queue_events.py. Each round's reasons checked: bench/queue_check.py.

The figures:

- Delivered GPU-share. An owner is backlogged while it asks for at least its fair share of
  the node: the weights of its running jobs plus those of its pending jobs not waiting on a
  dependency or a back-off add up to f_o · GPUs or more (2 GPUs here), so an owner with one
  small job left is not. Over the time in which all 4 owners are backlogged (a union of
  intervals), delivered_o = W_o / Σ W, where W_o integrates the owner's running jobs'
  weights (`policy.job_weight`: device_bytes / GPU bytes, 1 when exclusive; jobs being
  stopped included, they hold the GPU). Fair share f_o = S_o / Σ S (0.25 each here). The
  target: |delivered_o − f_o| ≤ 0.10 · f_o for every owner. Beside it: the same share over
  the part of the window within the 24 h, and the owners' decayed usage shares when the
  window ends (what the factor balances).
- Reasons. At every decision each pending job left waiting must have a reason that is true
  then, checked here independently of the policy's code by replaying the round in its order:
  back-off ahead, a dependency not succeeded, the quota full with the job, no GPU physically
  fitting it (resources), lower-class victims on its held GPU that make it fit (preemption),
  or every fitting GPU (or the host memory it needs) held by a job ahead (priority). A job
  that some GPU not held by a job ahead takes, and the host memory not set aside, with no
  back-off, dependency or quota block, is never left waiting (`violations` counts it).
- Quotas. The most jobs and GiB each owner held at once, against its quota (dara has one).
- Start forecast. At each job's submission, `policy.forecast` on the simulator's state
  (running jobs ending at their remaining work, pending jobs lasting theirs) predicts its
  start; over the jobs that started, err = |predicted − actual start| / max(actual wait,
  60 s): `start_median_err`, `start_mean_err`, `start_p90_err` (`forecast_none`: started
  jobs it gave no start). It cannot know crashes, cancellations, or the jobs submitted
  after (a higher class, an owner the fair-share factor ranks higher).
- Packing. Mean jobs running (GPU slots used) over the 24 h, against the same trace and
  policy with every job exclusive (whole-GPU placement).
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import time
from dataclasses import replace
from typing import Any

from bench.queue_events import QueueSim, State, run_sim
from bench.queue_trace import DAY_S, NODE, OWNERS, QUOTAS, make_trace
from wstrain.contracts.calibration import GIB
from wstrain.policy import PolicyConfig, Usage


def _pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


def _run_row(sim: QueueSim, label: str) -> dict[str, Any]:
    jobs = list(sim.jobs.values())
    waits_h = [
        (j.first_start_s - j.spec.submit_s) / 3600 for j in jobs if j.first_start_s is not None
    ]
    ends = [j.end_s for j in jobs if j.end_s is not None]
    by_size: dict[str, list[float]] = {}
    for j in jobs:  # class 0 only: the classes above and below jump or trail the queue
        if j.first_start_s is not None and j.spec.priority == 0:
            size = f"{j.spec.device_bytes // GIB}{'x' if j.spec.exclusive else ''}"
            by_size.setdefault(size, []).append((j.first_start_s - j.spec.submit_s) / 3600)
    return {
        "bench": "queue-sim",
        "row": label,
        "jobs": len(jobs),
        "succeeded": sum(j.state == State.succeeded for j in jobs),
        "failed": sum(j.state == State.failed for j in jobs),
        "cancelled": sum(j.state == State.cancelled for j in jobs),
        "rounds": sim.rounds,
        "mean_jobs_running_24h": round(sim.slots_day_s / DAY_S, 3),
        "mean_gpus_reserved_24h": round(sim.gpus_day_s / DAY_S, 3),
        "makespan_h": round(max(ends) / 3600, 2),
        "wait_median_h": round(statistics.median(waits_h), 3),
        "wait_p95_h": round(_pct(waits_h, 0.95), 3),
        "wait_max_h": round(max(waits_h), 3),
        # device GiB, x: exclusive -> [jobs, median, max wait in h]
        "class0_wait_h_by_size": {
            k: [len(v), round(statistics.median(v), 2), round(max(v), 2)]
            for k, v in sorted(by_size.items(), key=lambda kv: (int(kv[0].rstrip("x")), kv[0]))
        },
        "preemptions": sim.preempted,
        "lost_gpu_h": round(sum(j.lost_s * sim.weight(j) for j in jobs) / 3600, 2),
        "reason_rounds": dict(sorted(sim.reason_rounds.items())),
        "violations": len(sim.violations),
        "violation_samples": sim.violations[:10],
    }


def forecast_figures(sim: QueueSim) -> dict[str, Any]:
    """The forecast made at each job's submission against its first start: |predicted -
    actual| / max(actual wait, 60 s) over the jobs that started with a prediction."""
    errs, none, early = [], 0, 0
    for j in sim.jobs.values():
        if j.first_start_s is None:
            continue
        if j.predicted_start_s is None:
            none += 1
            continue
        wait_s = j.first_start_s - j.spec.submit_s
        errs.append(abs(j.predicted_start_s - j.first_start_s) / max(wait_s, 60.0))
        early += j.predicted_start_s < j.first_start_s
    return {
        "forecast_jobs": len(errs),
        "forecast_none": none,
        "forecast_early": early,  # predicted to start before it did
        "start_median_err": round(statistics.median(errs), 4) if errs else None,
        "start_mean_err": round(statistics.fmean(errs), 4) if errs else None,
        "start_p90_err": round(_pct(errs, 0.90), 4) if errs else None,
    }


def simulate(
    seed: int = 20261125, jobs_per_owner: int = 80, predict: bool = False
) -> list[dict[str, Any]]:
    """Both runs of one trace; rows: the packed run, the whole-GPU run, one per owner (packed
    run), one per job (packed run). `predict`: forecast each job's start at its submission
    in the packed run (policy/forecast.py; ~20 s more) and report the error."""
    trace = make_trace(seed, jobs_per_owner)
    config = PolicyConfig(quotas=QUOTAS)
    start = time.perf_counter()
    packed = run_sim(trace, config, predict=predict)
    whole = run_sim([replace(t, exclusive=True) for t in trace], config)
    elapsed_s = time.perf_counter() - start
    total_gpu_s = sum(packed.window_gpu_s.values()) or 1.0
    total_day_gpu_s = sum(packed.window_day_gpu_s.values()) or 1.0
    total_usage = sum(packed.usage_at_window_end.values()) or 1.0
    shares = sum(config.share(o) for o in OWNERS)
    summary = _run_row(packed, "packed")
    summary |= {
        "seed": seed,
        "owners": len(OWNERS),
        "gpus": len(NODE.gpus),
        "gpu_gib": NODE.gpus[0].total_bytes / GIB,
        "host_gib": NODE.host_bytes / GIB,
        "half_life_s": config.half_life_s,
        "backlogged_window_h": round(packed.window_s / 3600, 2),
        "packing_vs_whole_gpu": round(packed.slots_day_s / max(1e-9, whole.slots_day_s), 3),
        "sim_wall_s": round(elapsed_s, 2),
        **(forecast_figures(packed) if predict else {}),
        "python": platform.python_version(),
    }
    rows = [summary, _run_row(whole, "whole-gpu")]
    for owner in OWNERS:
        fair = config.share(owner) / shares
        delivered = packed.window_gpu_s[owner] / total_gpu_s
        quota = config.quotas.get(owner)
        n, dev, host = packed.peak[owner]
        rows.append(
            {
                "bench": "queue-sim",
                "row": f"owner:{owner}",
                "fair_share": round(fair, 4),
                "delivered_share": round(delivered, 4),
                "deviation_of_fair": round((delivered - fair) / fair, 4),
                "window_gpu_h": round(packed.window_gpu_s[owner] / 3600, 2),
                # the same over the part of the window within the trace's 24 h, and the
                # decayed usage shares (what the factor balances) when the window ends
                "delivered_share_first_24h": round(
                    packed.window_day_gpu_s[owner] / total_day_gpu_s, 4
                ),
                "usage_share_at_window_end": round(
                    packed.usage_at_window_end.get(owner, 0.0) / total_usage, 4
                ),
                "peak_jobs": n,
                "peak_device_gib": dev / GIB,
                "peak_host_gib": host / GIB,
                "quota": None
                if quota is None
                else {
                    "max_jobs": quota.max_jobs,
                    "device_gib": (quota.max_device_bytes or 0) / GIB,
                    "host_gib": (quota.max_host_bytes or 0) / GIB,
                },
                "final_usage_gpu_h": round(packed.usage.get(owner, Usage()).gpu_s / 3600, 2),
            }
        )
    for j in packed.jobs.values():
        s = j.spec
        rows.append(
            {
                "bench": "queue-sim",
                "row": f"job:{s.id}",
                "owner": s.owner,
                "priority": s.priority,
                "device_gib": s.device_bytes / GIB,
                "exclusive": s.exclusive,
                "submit_s": round(s.submit_s, 1),
                "first_start_s": None if j.first_start_s is None else round(j.first_start_s, 1),
                "predicted_start_s": None
                if j.predicted_start_s is None
                else round(j.predicted_start_s, 1),
                "end_s": None if j.end_s is None else round(j.end_s, 1),
                "state": j.state.value,
                "preemptions": j.preemptions,
                "retries": j.retries,
                "waits": dict(j.waits),
                "last_reason": j.last_reason,
            }
        )
    return rows


def sweep(seeds: int, jobs_per_owner: int) -> list[dict[str, Any]]:
    """One row per seed 1..seeds: the Done-when figures of other days of the same kind."""
    out = []
    for seed in range(1, seeds + 1):
        rows = simulate(seed, jobs_per_owner)
        owners = [r for r in rows if r["row"].startswith("owner:")]
        out.append(
            {
                "bench": "queue-sim",
                "row": f"seed:{seed}",
                "deviation_of_fair": {r["row"][6:]: r["deviation_of_fair"] for r in owners},
                "max_abs_deviation": max(abs(r["deviation_of_fair"]) for r in owners),
                "backlogged_window_h": rows[0]["backlogged_window_h"],
                "packing_vs_whole_gpu": rows[0]["packing_vs_whole_gpu"],
                "violations": rows[0]["violations"] + rows[1]["violations"],
                "quota_peak_ok": all(
                    r["quota"] is None or r["peak_jobs"] <= r["quota"]["max_jobs"] for r in owners
                ),
            }
        )
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--seed", type=int, default=20261125)
    p.add_argument("--jobs-per-owner", type=int, default=80)
    p.add_argument("--sweep-seeds", type=int, default=0, help="also seeds 1..N, a row each")
    p.add_argument("--no-forecast", action="store_true", help="skip the start forecasts")
    p.add_argument("--out")
    args = p.parse_args()
    rows = simulate(args.seed, args.jobs_per_owner, predict=not args.no_forecast)
    rows += sweep(args.sweep_seeds, args.jobs_per_owner)
    for row in rows:
        if not row["row"].startswith("job:"):
            print(json.dumps(row))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
