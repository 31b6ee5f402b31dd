"""When each queued job will start and end: the queue replayed forward in time on the
policy's own fit rules. Pure: the same inputs give the same forecast; no clock, no I/O.

    ends = {job.id: now_s + run_seconds(steps - step, step_s) for each running job}
    got = forecast(now_s, pending, nodes, ends, durations, usage, config, dependencies)
    got[job_id].start_s, got[job_id].end_s, got[job_id].reason

Rules. The near future is the policy's own rounds (policy/replay.py): `decide` now and at
each moment a running job is predicted to end (remaining steps x predicted step seconds,
clamped >= 0), a back-off to pass or a preempted job to leave (its step in flight, then
`stop_s`, after its round), up
to `rounds` of them, node after node as agents take turns: backfill into any hole, the
round's drain hold, quotas and preemption as the policy does them. Past the last round the
jobs still pending are booked in the policy's order (fairshare.py: class, owner's factor,
submission, id), the jobs ahead of each first: a job starts at the earliest t >= the last
round, >= its back-off's not_before and >= the predicted end of every job of its `after`, at
which a node takes it for the whole of [t, t + its run seconds): a GPU whose every interval
of that span passes `Slot.takes` (device bytes free, or empty for an exclusive job) with
`Ledger.host_fits`, or a gang's N such GPUs (gangs.py), the GPUs chosen by the policy's
best fit (`Ledger.best_fit`, `gang_fit`) over the span's peak; its owner's quota (gates.py's
rule) must hold over that span too. Running jobs without a predicted end, and jobs without
a predicted step time once started, hold their room for good. A job ends at its start + its
run seconds. Among nodes the earliest start wins, the first node on a tie.

The bookings past the replay are reservations, as in conservative backfill: a job behind
never delays one ahead, where the policy lets it take a hole unless a drain hold keeps it,
so far in the queue a job that jumps into a hole is forecast later than it starts. Not
modelled: jobs submitted later (a higher class, an owner the factor ranks higher), factors
moving as usage accrues, crashes and cancellations, a CPU node's slot count. None with a
reason: no node could ever take the job (the policy's `resources: ...` on an empty node),
more than its owner's whole quota, a dependency that can never succeed (`dependency: ...`),
or room that frees only as jobs without a predicted end finish.

Work: each replayed round is one `decide` over the jobs left (64 rounds x 500 jobs at most);
the timeline has a breakpoint per predicted start and end (at most 2 x jobs), and a job's
search visits each about once per GPU, skipping intervals known to refuse its demand: 500
jobs queued at once on 8 GPUs, 140 h deep, take ~1.7 s on a shared 2-core host.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from wstrain.contracts.jobs import JobState
from wstrain.policy.fairshare import Usage, fair_share_factors, ordered, owners_in_play
from wstrain.policy.gangs import could_ever_fit as gang_could_ever_fit
from wstrain.policy.gangs import gang_reason
from wstrain.policy.gates import QuotaBook, dependency_wait
from wstrain.policy.placement import Ledger, Slot
from wstrain.policy.replay import replay
from wstrain.policy.state import NodeState, PendingJob, PolicyConfig, RunningJob
from wstrain.policy.timeline import QuotaLine, Timeline

__all__ = ["Forecast", "ForecastNode", "forecast", "run_seconds"]

_FOREVER = "resources: it fits only where jobs without a predicted end run"
_QUOTA_FOREVER = "quota: its owner's quota frees only as jobs without a predicted end finish"
_NO_END = "its end is unknown: no predicted step time"
_LIVE = {JobState.queued, JobState.planning, JobState.running}


@dataclass(frozen=True)
class ForecastNode:
    """One node and the jobs running on it (their budgets, GPUs, exclusivity)."""

    name: str
    state: NodeState
    running: tuple[RunningJob, ...] = ()


@dataclass(frozen=True)
class Forecast:
    """A pending job's predicted start and end, epoch seconds; None with `reason` when it
    cannot be predicted. `node`: where it is forecast to start."""

    job_id: str
    start_s: float | None
    end_s: float | None
    reason: str = ""
    node: str = ""


def run_seconds(steps_left: int, step_s: float | None) -> float | None:
    """Remaining steps x seconds a step, never negative; None when the step time is unknown."""
    if step_s is None or not math.isfinite(step_s) or step_s < 0:
        return None
    return max(0, steps_left) * step_s


def _never(job: PendingJob, node: NodeState) -> str | None:
    """The policy's reason why the empty node would not take the job, else None."""
    empty = Ledger(node)
    dev, host = empty.demand(job)
    if job.gpus > 1 and not empty.cpu_only:
        if gang_could_ever_fit(empty, job, dev, host):
            return None
        return gang_reason(empty, job, dev, host)
    if empty.could_ever_fit(dev, host):
        return None
    return empty.resource_reason(dev, host, job.exclusive)


def forecast(
    now_s: float,
    pending: Sequence[PendingJob],
    nodes: Sequence[ForecastNode],
    ends: Mapping[str, float | None],
    durations: Mapping[str, float | None],
    usage: Mapping[str, Usage] | None = None,
    config: PolicyConfig | None = None,
    dependencies: Mapping[str, JobState] | None = None,
    stop_s: float = 30.0,
    rounds: int = 64,
    step_s: Mapping[str, float | None] | None = None,
) -> dict[str, Forecast]:
    """Every pending job's Forecast. `ends`: each running job's predicted end (epoch s; None
    or missing: unknown); `durations`: each pending job's run seconds (None or missing:
    unknown); `dependencies`: the state of every job an `after` names (missing: unknown);
    `stop_s`: how long a preempted job takes to exit (its checkpoint) once its step in
    flight has ended; `step_s`: each job's step time (missing: none); `rounds`: the
    policy's rounds replayed before the rest is booked in order (policy/replay.py).
    The order is the policy's, from `usage` and `config` as `decide` computes it."""
    config = config or PolicyConfig()
    usage = usage or {}
    states = dependencies or {}
    running = [j for n in nodes for j in n.running]
    factors = fair_share_factors(
        usage, owners_in_play(usage, pending, running, config), config, now_s
    )
    queue = ordered(pending, factors)
    queued = {j.id for j in queue}
    # the near future: the policy's own rounds at the predicted ends (backfill into any
    # hole, the drain hold, quotas, preemption); past them, the rest is booked in order
    starts, ends, horizon_s = replay(
        now_s,
        queue,
        [(n.name, n.state, n.running) for n in nodes],
        ends,
        durations,
        usage,
        config,
        states,
        stop_s,
        rounds,
        step_s,
    )
    timelines = {n.name: Timeline(now_s, n.name, n.state, n.running, ends) for n in nodes}
    quotas = QuotaLine(config.quotas)
    for r in running:
        quotas.add(r, now_s, ends.get(r.id))
    out: dict[str, Forecast] = {}
    for st in starts:
        end_s = ends.get(st.job.id)
        timelines[st.node].book(st.job, st.start_s, durations.get(st.job.id), st.gpus)
        quotas.add(st.job, st.start_s, end_s)
        why = "" if end_s is not None else _NO_END
        out[st.job.id] = Forecast(st.job.id, st.start_s, end_s, why, st.node)
    left = [j for j in queue if j.id not in out]

    def dep_ready(job: PendingJob) -> float | str | None:
        """When its dependencies have ended, a reason it never starts, or None: not yet
        forecast (a dependency behind it in the order)."""
        ready = now_s
        for dep in job.after:
            state = states.get(dep)
            if state is JobState.succeeded:
                continue
            if state is JobState.cancelling:
                return f"dependency: {dep} is being cancelled"
            if state is None or state not in _LIVE:
                return dependency_wait(job, states)[0] or f"dependency: {dep} ended"
            if dep in queued:
                got = out.get(dep)
                if got is None:
                    return None
                if got.end_s is None:
                    return f"dependency: {dep} has no predicted end ({got.reason or 'unknown'})"
                ready = max(ready, got.end_s)
            elif dep in ends and ends[dep] is not None:
                ready = max(ready, float(ends[dep] or 0.0))
            else:
                return f"dependency: {dep} ({state.value}) has no predicted end"
        return ready

    def place(job: PendingJob, ready_s: float) -> Forecast:
        never = [r for n in nodes if (r := _never(job, n.state)) is not None]
        if not nodes or len(never) == len(nodes):
            return Forecast(job.id, None, None, never[0] if never else "resources: no node")
        over = QuotaBook(config.quotas).block(job)
        if over is not None:  # more than its owner's whole quota
            return Forecast(job.id, None, None, over)
        from_s = max(ready_s, job.not_before_s or now_s, horizon_s)
        run_s = durations.get(job.id)
        while True:
            best: tuple[float, Timeline, list[Slot]] | None = None
            for tl in timelines.values():
                got = tl.earliest(job, from_s, run_s)
                if got is not None and (best is None or got[0] < best[0]):
                    best = (got[0], tl, got[1])
            if best is None:
                return Forecast(job.id, None, None, _FOREVER)
            ok_s = quotas.next_ok(job, best[0], run_s)
            if ok_s is None:
                return Forecast(job.id, None, None, _QUOTA_FOREVER)
            if ok_s == best[0]:
                break
            from_s = ok_s
        start_s, tl, slots = best
        quotas.add(job, start_s, None if run_s is None else start_s + run_s)
        tl.book(job, start_s, run_s, [s.index for s in slots])
        end_s = None if run_s is None else start_s + run_s
        why = "" if run_s is not None else _NO_END
        return Forecast(job.id, start_s, end_s, why, tl.name)

    waiting = left
    progress = True
    while waiting and progress:
        progress, rest = False, []
        for job in waiting:
            ready = dep_ready(job)
            if ready is None:
                rest.append(job)
                continue
            progress = True
            if isinstance(ready, str):
                out[job.id] = Forecast(job.id, None, None, ready)
            else:
                out[job.id] = place(job, ready)
        waiting = rest
    for job in waiting:  # a cycle of dependencies among queued jobs
        out[job.id] = Forecast(job.id, None, None, "dependency: a cycle among queued jobs")
    return out
