"""Where the fair-share error of a simulated day comes from: the backlogged window
(bench/queue_sim.py's definition) taken apart, for the fixed-budget day and the ranged day of
bench/queue_ranges.py. A diagnostic: no raw file of its own.

    python -m bench.queue_window --sweep-seeds 5
    python -m bench.queue_window --charge-window-only   # the counterfactual below

Per day, beside share_err: when the window opens and how long it is; each owner's GPU-hours
before it opens (the policy's factor counts them: its usage is decayed over the whole day,
half-life 7 days, while share_err counts the window only) and in it; the part of the window's
GPU-seconds held by exclusive jobs (a whole GPU for hours: the coarse grain of the share);
the part held by jobs first started before the window (what the order in it cannot steer);
each owner's starts in it. The policy's charge is the unit share_err counts (`job_weight`,
device bytes over GPU bytes), checked here: `charged_equals_measured`.

`--charge-window-only` charges usage only while every owner is backlogged, as if the
policy's memory were the metric's window: not a policy (the policy cannot know the window),
a bound on what aligning the two time bases could buy.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from bench.queue_events import QueueSim
from bench.queue_ranges import figures, ranges_of
from bench.queue_trace import NODE, OWNERS, QUOTAS, TraceJob, make_trace
from wstrain.policy import NodeState, PolicyConfig, Usage
from wstrain.policy.state import BudgetPoint


class WindowSim(QueueSim):
    """QueueSim that also records what the backlogged window is made of."""

    def __init__(
        self,
        trace: Sequence[TraceJob],
        config: PolicyConfig,
        node: NodeState = NODE,
        ranges: Mapping[str, tuple[BudgetPoint, ...]] | None = None,
        charge_window_only: bool = False,
    ) -> None:
        super().__init__(trace, config, node, ranges)
        self.charge_window_only = charge_window_only
        self.opened_s: float | None = None
        self.measured_gpu_s = dict.fromkeys(OWNERS, 0.0)  # every held second, weight-charged
        self.measured_usage: dict[str, Usage] = {}  # the same, decayed as the policy decays
        self.before_gpu_s: dict[str, float] = {}  # measured_gpu_s when the window first opens
        self.exclusive_gpu_s = 0.0  # in the window
        self.started_before_gpu_s = 0.0  # in the window, jobs first started before it opened
        self.starts_in_window = dict.fromkeys(OWNERS, 0)

    def _in_window(self) -> bool:
        return bool(self.backlogged) and all(self.backlogged.get(o, False) for o in OWNERS)

    def _advance(self, to_s: float) -> None:
        dt = to_s - self.now_s
        window = self._in_window()
        if window and self.opened_s is None:
            self.opened_s, self.before_gpu_s = self.now_s, dict(self.measured_gpu_s)
        opened_s = self.now_s if self.opened_s is None else self.opened_s
        gained = dict.fromkeys(OWNERS, 0.0)
        for j in self._holding():
            w = self.weight(j) * dt
            self.measured_gpu_s[j.spec.owner] += w
            gained[j.spec.owner] += w
            if window:
                self.exclusive_gpu_s += w if j.spec.exclusive else 0.0
                first = j.first_start_s
                self.started_before_gpu_s += w if first is not None and first < opened_s else 0.0
        for owner, gpu_s in gained.items():
            if gpu_s > 0:
                was = self.measured_usage.get(owner, Usage(0.0, to_s))
                self.measured_usage[owner] = was.add(to_s, gpu_s, self.config.half_life_s)
        kept = self.usage
        super()._advance(to_s)
        if self.charge_window_only and not window:
            self.usage = kept

    def _start(self, j: Any, gpu: int | None, point: BudgetPoint | None = None) -> None:
        if self._in_window() and j.first_start_s is None:
            self.starts_in_window[j.spec.owner] += 1
        super()._start(j, gpu, point)


def _shares(gpu_s: Mapping[str, float]) -> dict[str, float]:
    total = sum(gpu_s.values()) or 1.0
    return {o: round(gpu_s.get(o, 0.0) / total, 3) for o in OWNERS}


def window_row(
    seed: int, jobs_per_owner: int = 80, ranged: bool = True, charge_window_only: bool = False
) -> dict[str, Any]:
    """One day taken apart (see the module docstring)."""
    trace = make_trace(seed, jobs_per_owner)
    config = PolicyConfig(quotas=QUOTAS)
    sim = WindowSim(trace, config, NODE, ranges_of(trace) if ranged else None, charge_window_only)
    sim.run()
    fig = figures(sim, config)
    window_gpu_s = sum(sim.window_gpu_s.values()) or 1.0
    # the policy's usage against the window's weights decayed the same way: equal to float
    # rounding when the policy charges the unit share_err counts (a counterfactual run
    # charges less on purpose)
    charged_equals_measured = all(
        math.isclose(
            sim.usage.get(o, Usage()).decayed(sim.now_s, config.half_life_s).gpu_s,
            sim.measured_usage.get(o, Usage()).decayed(sim.now_s, config.half_life_s).gpu_s,
            rel_tol=1e-9,
        )
        for o in OWNERS
    )
    return {
        "seed": seed,
        "day": "ranged" if ranged else "fixed",
        "charge_window_only": charge_window_only,
        "share_err": fig["share_err"],
        "share_err_by_owner": fig["share_err_by_owner"],
        "window_opens_h": None if sim.opened_s is None else round(sim.opened_s / 3600, 2),
        "backlogged_window_h": fig["backlogged_window_h"],
        "gpu_h_before_window": round(sum(sim.before_gpu_s.values()) / 3600, 1),
        "share_before_window": _shares(sim.before_gpu_s),
        "share_in_window": _shares(sim.window_gpu_s),
        "window_gpu_h": round(window_gpu_s / 3600, 1),
        "exclusive_part_of_window": round(sim.exclusive_gpu_s / window_gpu_s, 3),
        "started_before_part_of_window": round(sim.started_before_gpu_s / window_gpu_s, 3),
        "starts_in_window": sim.starts_in_window,
        "charged_equals_measured": charged_equals_measured,
        "wait_mean_h": fig["wait_mean_h"],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--seed", type=int, default=20261125)
    p.add_argument("--jobs-per-owner", type=int, default=80)
    p.add_argument("--sweep-seeds", type=int, default=0, help="also seeds 1..N")
    p.add_argument("--charge-window-only", action="store_true")
    args = p.parse_args()
    errs: dict[str, list[float]] = {"fixed": [], "ranged": []}
    for seed in [args.seed, *range(1, args.sweep_seeds + 1)]:
        for ranged in (False, True):
            row = window_row(seed, args.jobs_per_owner, ranged, args.charge_window_only)
            print(json.dumps(row))
            if seed != args.seed:
                errs[row["day"]].append(row["share_err"])
    for day, values in errs.items():
        if values:
            print(
                f"{day}: share_err over seeds 1-{len(values)}, mean {statistics.fmean(values):.4f}"
            )


if __name__ == "__main__":
    main()
