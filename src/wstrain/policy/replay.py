"""The policy's own rounds replayed at the predicted ends of running jobs, for the queue
forecast's near future (policy/forecast.py): who starts at each, as `decide` would start
them (backfill into any hole, the round's drain hold, quotas, preemption). Pure.

Between rounds nothing arrives: a round runs now, then at each moment a job is predicted
to end, a back-off to pass, or a preempted job to leave, up to `rounds` of them. A job
started in the replay runs for its run seconds (None: for good); a job preempted leaves
when it has finished its step in flight and `stop_s` later (stop_after); a dependency counts
as succeeded once its predicted end has passed. A ranged job started holds the point of its
range the round chose for it; a ranged job the round shrinks holds its old point until it
has so stopped, then runs on at its new one.

    starts, ends, horizon_s = replay(now_s, queue, nodes, ends, durations, usage, config,
                                     states, stop_s, rounds, step_s)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from wstrain.contracts.jobs import JobState
from wstrain.policy.decide import decide
from wstrain.policy.fairshare import Usage
from wstrain.policy.state import BudgetPoint, NodeState, PendingJob, PolicyConfig, RunningJob


@dataclass(frozen=True)
class Started:
    """A pending job the replay starts: where, when, on which GPUs (() on a CPU node)."""

    node: str
    job: PendingJob
    start_s: float
    gpus: tuple[int | None, ...]


def replay(
    now_s: float,
    queue: Sequence[PendingJob],
    nodes: Sequence[tuple[str, NodeState, tuple[RunningJob, ...]]],
    ends: Mapping[str, float | None],
    durations: Mapping[str, float | None],
    usage: Mapping[str, Usage],
    config: PolicyConfig,
    states: Mapping[str, JobState],
    stop_s: float,
    rounds: int,
    step_s: Mapping[str, float | None] | None = None,
) -> tuple[list[Started], dict[str, float | None], float]:
    """(the starts, every running or started job's end, the last round's time). `step_s`:
    each job's step time (missing or None: unknown, taken as none)."""
    steps = step_s or {}
    end_of: dict[str, float | None] = dict(ends)
    on = {name: list(running) for name, _, running in nodes}
    left = list(queue)
    started: list[Started] = []
    restarts: dict[str, tuple[float, BudgetPoint]] = {}  # shrunk: back at the new point
    t = now_s
    for _ in range(max(1, rounds)):
        gone = {jid for jid, e in end_of.items() if e is not None and e <= t}
        for name in on:
            on[name] = [_restarted(j, restarts, t) for j in on[name] if j.id not in gone]
        now_states = {
            dep: JobState.succeeded if dep in gone and state in _LIVE else state
            for dep, state in states.items()
        }
        for dep in {d for j in left for d in j.after}:
            if dep in gone and dep not in now_states:
                now_states[dep] = JobState.succeeded
        for name, node, _ in nodes:
            elsewhere = [j for other, js in on.items() if other != name for j in js]
            d = decide(t, left, on[name], node, usage, config, now_states, elsewhere)
            by_id = {j.id: j for j in left}
            for s in d.start:
                job, run_s = by_id[s.job_id], durations.get(s.job_id)
                gpus = d.gangs.get(s.job_id) or (s.gpu_index,)
                started.append(Started(name, job, t, tuple(gpus)))
                end_of[job.id] = None if run_s is None else t + run_s
                point = d.budgets.get(job.id)
                on[name].append(_running(job, s.gpu_index, tuple(gpus), t, point))
            for victim in d.preempt:
                gone_s = t + stop_after(stop_s, steps.get(victim))
                end_of[victim] = min(end_of.get(victim) or math.inf, gone_s)
            for shrunk, point in d.shrink.items():
                restarts[shrunk] = (t + stop_after(stop_s, steps.get(shrunk)), point)
                on[name] = [replace(j, stopping=True) if j.id == shrunk else j for j in on[name]]
            done = {s.job_id for s in d.start}
            left = [j for j in left if j.id not in done]
        later = [e for e in end_of.values() if e is not None and e > t]
        later += [at for at, _ in restarts.values() if at > t]
        later += [j.not_before_s for j in left if j.not_before_s and j.not_before_s > t]
        if not left or not later:
            break
        t = min(later)
    return started, end_of, t


_LIVE = {JobState.queued, JobState.planning, JobState.running}


def stop_after(stop_s: float, step_s: float | None) -> float:
    """Seconds from a SIGTERM until the worker has left: it ends its step in flight (half a
    step on average: the signal lands anywhere in it), then checkpoints and exits in
    `stop_s`. A long sequence's step takes minutes (573 s at 512K tokens over 32 layers)."""
    if step_s is None or not math.isfinite(step_s) or step_s <= 0:
        return stop_s
    return stop_s + 0.5 * step_s


def _running(
    job: PendingJob,
    gpu: int | None,
    gpus: tuple[int | None, ...],
    t: float,
    point: BudgetPoint | None = None,
) -> RunningJob:
    """A job the replay started, at `point` of its range where the round chose one."""
    gang = tuple(g for g in gpus if g is not None) if len(gpus) > 1 else ()
    return RunningJob(
        job.id,
        job.owner,
        job.priority,
        gpu,
        point.device_bytes if point else job.device_bytes,
        point.host_bytes if point else job.host_bytes,
        t,
        job.exclusive,
        gpus=job.gpus,
        gang=gang,
        points=job.points if job.gpus == 1 else (),
    )


def _restarted(
    j: RunningJob, restarts: Mapping[str, tuple[float, BudgetPoint]], t: float
) -> RunningJob:
    """A shrunk job back at its new point once its stop has passed, else as it is."""
    at, point = restarts.get(j.id, (math.inf, None))
    if point is None or at > t:
        return j
    device, host = point.device_bytes, point.host_bytes
    return replace(j, device_bytes=device, host_bytes=host, started_s=at, stopping=False)
