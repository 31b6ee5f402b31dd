"""When each queued job will start and end: the queue replayed forward in time on the
policy's own fit rules. Pure: the same inputs give the same forecast; no clock, no I/O.

    ends = {job.id: now_s + run_seconds(steps - step, step_s) for each running job}
    got = forecast(now_s, pending, nodes, ends, durations, usage, config, dependencies)
    got[job_id].start_s, got[job_id].end_s, got[job_id].reason

Rules. The near future is the policy's own rounds (policy/replay.py): `decide` now and at
each moment a running job is predicted to end (remaining steps x predicted step seconds,
clamped >= 0), a back-off to pass or a preempted job to leave (`stop_s` after its round), up
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

import bisect
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from wstrain.contracts.jobs import JobState
from wstrain.policy.fairshare import Usage, fair_share_factors, ordered, owners_in_play
from wstrain.policy.gangs import could_ever_fit as gang_could_ever_fit
from wstrain.policy.gangs import gang_fit, gang_reason
from wstrain.policy.gates import QuotaBook, dependency_wait
from wstrain.policy.placement import Ledger, Slot
from wstrain.policy.replay import replay
from wstrain.policy.state import NodeState, PendingJob, PolicyConfig, Quota, RunningJob

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


class _Timeline:
    """One node's future: breakpoints `times` (the first is now) and, for each interval
    [times[i], times[i+1]) (the last one open-ended), the ledger of what it holds then."""

    def __init__(self, now_s: float, node: ForecastNode, ends: Mapping[str, float | None]) -> None:
        self.name, self.node = node.name, node.state
        end_of = {j.id: ends.get(j.id) for j in node.running}
        finite = sorted({max(now_s, e) for e in end_of.values() if e is not None})
        self.times = [now_s, *(t for t in finite if t > now_s)]
        self.ledgers = [
            Ledger.of(
                node.state,
                [j for j in node.running if (e := end_of[j.id]) is None or e > t],
            )
            for t in self.times
        ]
        # (device, host, exclusive) demand, GPU -> every interval before this refuses it
        self.full_until: dict[tuple[tuple[int, int, bool], int | None], float] = {}

    def _split(self, t: float) -> int:
        """The index of the interval starting at t, splitting the one containing it."""
        i = bisect.bisect_right(self.times, t) - 1
        if self.times[i] == t:
            return i
        self.times.insert(i + 1, t)
        self.ledgers.insert(i + 1, _copy(self.node, self.ledgers[i]))
        return i + 1

    def _span(self, i: int, start_s: float, run_s: float | None) -> int:
        """One past the last interval that [start_s, start_s + run_s) overlaps."""
        if run_s is None:
            return len(self.times)
        return max(i + 1, bisect.bisect_left(self.times, start_s + run_s))

    def earliest(
        self, job: PendingJob, from_s: float, run_s: float | None
    ) -> tuple[float, list[Slot]] | None:
        """The earliest start >= from_s at which the job fits for its whole run, with the
        slots the policy's best fit picks over the span's peak; None: never."""
        probe = Ledger(self.node)
        dev, host = probe.demand(job)
        gang = job.gpus if job.gpus > 1 and not probe.cpu_only else 1
        first = max(0, bisect.bisect_right(self.times, from_s) - 1)
        host_ok: dict[int, bool] = {}

        def fits(m: int, index: int | None) -> bool:
            ledger = self.ledgers[m]
            if m not in host_ok:
                host_ok[m] = ledger.host_fits(host, None)
            return host_ok[m] and ledger.slots[index].takes(dev, job.exclusive)

        start_s = self._gang_start(first, from_s, run_s, gang, fits) if gang > 1 else None
        tied: list[int | None] = []
        if gang == 1:  # each GPU's own earliest run of fitting intervals; the soonest wins
            key = (dev, host, job.exclusive)
            known = {i: self.full_until.get((key, i), self.times[0]) for i in probe.slots}
            for index in sorted(probe.slots, key=lambda i: (known[i], i or 0)):
                got = self._gpu_start(first, from_s, run_s, index, fits, start_s, key)
                if got is not None and (start_s is None or got < start_s):
                    start_s, tied = got, [index]
                elif got is not None and got == start_s:
                    tied.append(index)
        if start_s is None:
            return None
        i = bisect.bisect_right(self.times, start_s) - 1
        if len(tied) == 1:  # one GPU takes it first: no choice for best fit to make
            return start_s, [self.ledgers[i].slots[tied[0]]]
        peak = _peak(self.node, self.ledgers[i : self._span(i, start_s, run_s)])
        if gang > 1:
            return start_s, gang_fit(peak, job, dev, host, None) or []
        slot = peak.best_fit(dev, host, job.exclusive, None)
        return None if slot is None else (start_s, [slot])

    def _gpu_start(
        self,
        first: int,
        from_s: float,
        run_s: float | None,
        index: int | None,
        fits: Callable[[int, int | None], bool],
        bound_s: float | None,
        key: tuple[int, int, bool],
    ) -> float | None:
        """The earliest start on one GPU (None: never, or not before `bound_s`): a run of
        intervals that each take the job, from a start until start + run_s. Bookings only
        add, so an interval that refuses a demand refuses it for good: `full_until` keeps,
        per demand and GPU, the time before which every interval refused it."""
        known_s = self.full_until.get((key, index), self.times[0])
        known = bisect.bisect_right(self.times, known_s) - 1
        scan = max(first, known)
        run_from, prefix = scan, first <= known  # the scan starts where the refusals end
        bound = math.inf if bound_s is None else bound_s
        start_s = max(from_s, self.times[run_from])
        for m in range(scan, len(self.times)):
            if start_s > bound:
                return None
            if not fits(m, index):
                run_from = m + 1
                if m + 1 < len(self.times):
                    start_s = max(from_s, self.times[m + 1])
                    if prefix:
                        self.full_until[(key, index)] = self.times[m + 1]
                continue
            prefix = False
            if run_s is None:
                continue  # it holds its room for good: every interval to the end must take it
            if m + 1 == len(self.times) or self.times[m + 1] >= start_s + run_s:
                return start_s
        if run_from < len(self.times) and run_s is None:
            return max(from_s, self.times[run_from])
        return None

    def _gang_start(
        self,
        first: int,
        from_s: float,
        run_s: float | None,
        gang: int,
        fits: Callable[[int, int | None], bool],
    ) -> float | None:
        """The earliest start at which `gang` GPUs take the job for its whole run: a window
        starting at or before a GPU's last failing interval fails on it too."""
        i = first
        while i < len(self.times):
            start_s = max(from_s, self.times[i])
            last_fail = dict.fromkeys(self.ledgers[i].slots, -1)
            for m in range(i, self._span(i, start_s, run_s)):
                for index in last_fail:
                    if not fits(m, index):
                        last_fail[index] = m
                if sum(f < 0 for f in last_fail.values()) < gang:
                    break
            passing = sorted(last_fail.values())
            if passing[gang - 1] < 0:
                return start_s
            i = max(i + 1, passing[gang - 1] + 1)
        return None

    def book(
        self, job: PendingJob, start_s: float, run_s: float | None, gpus: Sequence[int | None]
    ) -> None:
        i = self._split(start_s)
        stop = len(self.times) if run_s is None else self._split(start_s + run_s)
        for ledger in self.ledgers[i:stop]:
            ledger.place(job, *(ledger.slots[g] for g in gpus))


class _QuotaLine:
    """What each owner with a quota holds over time: (start, end, device, host) a job."""

    def __init__(self, quotas: Mapping[str, Quota]) -> None:
        self.quotas = quotas
        self.held: dict[str, list[tuple[float, float, int, int]]] = {}

    def add(self, job: PendingJob | RunningJob, start_s: float, end_s: float | None) -> None:
        if job.owner in self.quotas:
            end = math.inf if end_s is None else end_s
            booking = (start_s, end, job.device_bytes * job.gpus, job.host_bytes)
            self.held.setdefault(job.owner, []).append(booking)

    def next_ok(self, job: PendingJob, start_s: float, run_s: float | None) -> float | None:
        """start_s when the owner's quota (gates.py's rule) takes the job for its whole run,
        else the next end of one of its jobs after start_s (None: none ends)."""
        quota = self.quotas.get(job.owner)
        mine = self.held.get(job.owner, [])
        if quota is None or not mine:
            return start_s
        stop = math.inf if run_s is None else start_s + run_s
        near = [b for b in mine if b[0] < stop and b[1] > start_s]
        for at in {start_s, *(b[0] for b in near if b[0] > start_s)}:
            on = [b for b in near if b[0] <= at < b[1]]
            jobs, dev, host = len(on), sum(b[2] for b in on), sum(b[3] for b in on)
            if (
                (quota.max_jobs is not None and jobs + 1 > quota.max_jobs)
                or (
                    quota.max_device_bytes is not None
                    and dev + job.device_bytes * job.gpus > quota.max_device_bytes
                )
                or (
                    quota.max_host_bytes is not None
                    and host + job.host_bytes > quota.max_host_bytes
                )
            ):
                later = [b[1] for b in mine if start_s < b[1] < math.inf]
                return min(later) if later else None
        return start_s


def _copy(node: NodeState, ledger: Ledger) -> Ledger:
    """What `ledger` holds, without the running jobs (the timeline books, never evicts)."""
    out = Ledger(node)
    out.host_used_bytes = ledger.host_used_bytes
    for i, s in ledger.slots.items():
        copy = out.slots[i]
        copy.used_bytes, copy.occupants, copy.live = s.used_bytes, s.occupants, s.live
        copy.exclusive = s.exclusive
    return out


def _peak(node: NodeState, ledgers: Sequence[Ledger]) -> Ledger:
    """A ledger holding, per GPU and for the host, the most any of `ledgers` holds: a job
    fits it iff it fits each of them (Slot.takes and host_fits only grow stricter)."""
    out = _copy(node, ledgers[0])
    for ledger in ledgers[1:]:
        out.host_used_bytes = max(out.host_used_bytes, ledger.host_used_bytes)
        for index, slot in ledger.slots.items():
            peak = out.slots[index]
            peak.used_bytes = max(peak.used_bytes, slot.used_bytes)
            peak.occupants = max(peak.occupants, slot.occupants)
            peak.exclusive = max(peak.exclusive, slot.exclusive)
    return out


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
) -> dict[str, Forecast]:
    """Every pending job's Forecast. `ends`: each running job's predicted end (epoch s; None
    or missing: unknown); `durations`: each pending job's run seconds (None or missing:
    unknown); `dependencies`: the state of every job an `after` names (missing: unknown);
    `stop_s`: how long a preempted job takes to exit (its checkpoint); `rounds`: the
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
    )
    timelines = {n.name: _Timeline(now_s, n, ends) for n in nodes}
    quotas = _QuotaLine(config.quotas)
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
            best: tuple[float, _Timeline, list[Slot]] | None = None
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
