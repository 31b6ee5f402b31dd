"""The scheduling policy as pure code: what the agent starts, where, what it preempts, and
why every other queued job waits. Standard library and the contracts only (no Redis, no
asyncio, no torch), so `bench/queue_sim.py` replays a day of jobs through this very code.

    from wstrain.policy import decide, charge, NodeState, Gpu, PendingJob, ...
    usage = charge(usage, running, node, since_s=last_s, now_s=now_s)
    decision = decide(now_s, pending, running, node, usage, PolicyConfig(), dependencies)

Modules, one rule each: state.py (the inputs and the Decision), fairshare.py (decayed usage,
Slurm's fair-share factor, the order), gates.py (back-off, dependencies, quotas),
placement.py (best-fit packing by budgets, holds, resource reasons), gangs.py (a job on
several GPUs: all of them or none), preemption.py (the
fewest lowest-class victims on one GPU), decide.py (the round), forecast.py (each queued
job's predicted start and end: replay.py, the rounds replayed forward in time, then the rest
booked in order on timeline.py's bookings over time). docs/OPERATIONS.md,
"Scheduling policy", has the formulas and the defaults.
"""

from wstrain.policy.decide import decide
from wstrain.policy.fairshare import (
    Usage,
    charge,
    fair_share_factors,
    job_weight,
    order_key,
    running_weight,
)
from wstrain.policy.forecast import Forecast, ForecastNode, forecast, run_seconds
from wstrain.policy.replay import stop_after
from wstrain.policy.state import (
    DEFAULT_GROW_AFTER_S,
    DEFAULT_GROW_MIN_GAIN,
    DEFAULT_HALF_LIFE_S,
    DEFAULT_SHARE,
    BudgetPoint,
    Decision,
    Gpu,
    NodeState,
    PendingJob,
    PolicyConfig,
    Quota,
    RunningJob,
    Start,
    WaitKind,
)

__all__ = [
    "DEFAULT_GROW_AFTER_S",
    "DEFAULT_GROW_MIN_GAIN",
    "DEFAULT_HALF_LIFE_S",
    "DEFAULT_SHARE",
    "BudgetPoint",
    "Decision",
    "Forecast",
    "ForecastNode",
    "Gpu",
    "NodeState",
    "PendingJob",
    "PolicyConfig",
    "Quota",
    "RunningJob",
    "Start",
    "Usage",
    "WaitKind",
    "charge",
    "decide",
    "fair_share_factors",
    "forecast",
    "job_weight",
    "order_key",
    "run_seconds",
    "running_weight",
    "stop_after",
]
