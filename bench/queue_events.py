"""The queue simulation's event loop: the modelled node on a virtual clock (no sleeping),
driven by a trace (bench/queue_trace.py) through the real scheduling policy.

Events: submit, finish, crash (the worker dies; retried from its last checkpoint after the
agent's back-off, 30 s doubling, at most 2 retries), stopped (a preempted or cancelled
worker exits STOP_GRACE_S after its SIGTERM), cancel, wake (a back-off ends). At each
instant the jobs held until then are charged (`policy.charge`), its events run, and
`policy.decide` runs once: its starts, shrinks, growths, preemptions and unsatisfiable jobs
are applied and the round checked (bench/queue_check.py). Workers checkpoint every
CHECKPOINT_EVERY_S of run time: a crashed or preempted job loses the work since its last
checkpoint (the pessimistic case: the agent's SIGTERM also makes it checkpoint). Between
events the figures bench/queue_sim.py reports are integrated: GPU-seconds by owner while
every owner is backlogged, and jobs and GPUs held over the day.
"""

from __future__ import annotations

import enum
import heapq
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from bench.queue_check import check_round
from bench.queue_trace import DAY_S, NODE, OWNERS, TraceJob
from wstrain.contracts.jobs import JobState
from wstrain.policy import (
    NodeState,
    PendingJob,
    PolicyConfig,
    RunningJob,
    Usage,
    WaitKind,
    charge,
    decide,
    forecast,
    job_weight,
)
from wstrain.policy.forecast import ForecastNode
from wstrain.policy.state import BudgetPoint

CHECKPOINT_EVERY_S = 600.0
STOP_GRACE_S = 30.0  # SIGTERM to exit: the checkpoint write
RETRY_BACKOFF_S = 30.0  # the agent's WSTRAIN_RETRY_BACKOFF_S, doubling, capped at 900 s
MAX_RETRIES = 2


class State(str, enum.Enum):  # noqa: UP042 - values are the JSON rows' states
    future = "future"  # not submitted yet
    pending = "pending"
    running = "running"
    stopping = "stopping"  # SIGTERMed, exits STOP_GRACE_S later
    succeeded = "succeeded"
    failed = "failed"
    cancelled = "cancelled"


class Event(str, enum.Enum):  # noqa: UP042
    submit = "submit"
    finish = "finish"
    crash = "crash"
    stopped = "stopped"
    cancel = "cancel"
    wake = "wake"  # a back-off ends: a round runs


class StopKind(str, enum.Enum):  # noqa: UP042
    preempted = "preempted"  # back to the queue
    cancelled = "cancelled"
    shrunk = "shrunk"  # restarts at once on its GPU, lower in its range
    grown = "grown"  # restarts at once on its GPU, higher in its range


@dataclass
class _Job:
    """One job's state in the simulation."""

    spec: TraceJob
    state: State = State.future
    done_s: float = 0.0  # work checkpointed, kept across runs
    run_start_s: float = 0.0
    gpu: int | None = None
    gen: int = 0  # bumps at every start or stop, so stale finish/crash events are ignored
    crashes: int = 0
    retries: int = 0
    not_before_s: float | None = None
    first_start_s: float | None = None
    end_s: float | None = None
    stop_kind: StopKind = StopKind.preempted
    preemptions: int = 0
    lost_s: float = 0.0
    waits: Counter[str] = field(default_factory=Counter)
    last_reason: str = ""
    points: tuple[BudgetPoint, ...] = ()  # a ranged budget's (bench/queue_ranges.py)
    point: BudgetPoint | None = None  # the point it runs at; tokens_per_s: its speed ratio
    first_point: BudgetPoint | None = None  # the point of its first start
    predicted_start_s: float | None = None  # the forecast at its submission (policy/forecast)
    predicted_reason: str = ""  # why the forecast gave none
    shrink_to: BudgetPoint | None = None  # where a shrunk or grown job restarts
    shrinks: int = 0

    @property
    def rate(self) -> float:
        """Work done a second of run time: the trace's work counts at the asked budget."""
        return self.point.tokens_per_s if self.point is not None else 1.0

    @property
    def held_bytes(self) -> tuple[int, int]:
        """(device, host) bytes it holds while it runs, or asks for while it waits (a
        ranged job: its min)."""
        if self.point is not None:
            return self.point.device_bytes, self.point.host_bytes
        if self.points:
            return self.points[0].device_bytes, self.points[0].host_bytes
        return self.spec.device_bytes, self.spec.host_bytes


_JOB_STATE = {  # as the store would hold it
    **dict.fromkeys((State.future, State.pending), JobState.queued),
    **dict.fromkeys((State.running, State.stopping), JobState.running),
    **{s: JobState(s.value) for s in (State.succeeded, State.failed, State.cancelled)},
}
_HOLDING = (State.running, State.stopping)


class QueueSim:
    """One node's queue replayed event by event; `run` plays the trace to its end."""

    def __init__(
        self,
        trace: Sequence[TraceJob],
        config: PolicyConfig,
        node: NodeState,
        ranges: Mapping[str, tuple[BudgetPoint, ...]] | None = None,
        predict: bool = False,
    ) -> None:
        self.predict = predict  # forecast each job's start when it is submitted
        self.submitted: list[str] = []  # submitted at this instant, not yet forecast
        self.jobs = {t.id: _Job(t, points=(ranges or {}).get(t.id, ())) for t in trace}
        self.config = config
        self.node = node
        self.events: list[tuple[float, int, Event, str, int]] = []
        self.seq = 0
        self.usage: dict[str, Usage] = {}
        self.now_s = 0.0
        self.backlogged: dict[str, bool] = {}
        self.window_s = 0.0
        self.window_gpu_s: dict[str, float] = dict.fromkeys(OWNERS, 0.0)
        self.window_day_gpu_s: dict[str, float] = dict.fromkeys(OWNERS, 0.0)  # within 24 h
        self.usage_at_window_end: dict[str, float] = {}  # decayed GPU-s, what F balances
        self.slots_day_s = 0.0  # ∫ jobs running dt over the day
        self.gpus_day_s = 0.0  # ∫ Σ weights dt over the day
        self.rounds = 0
        self.violations: list[str] = []
        self.peak: dict[str, list[int]] = {o: [0, 0, 0] for o in OWNERS}
        self.preempted = self.shrunk = self.grown = 0
        self.reason_rounds: Counter[str] = Counter()
        for t in trace:
            self._push(t.submit_s, Event.submit, t.id)
            if t.cancel_s is not None:
                self._push(t.cancel_s, Event.cancel, t.id)

    def _push(self, at_s: float, kind: Event, job_id: str, gen: int = 0) -> None:
        self.seq += 1
        heapq.heappush(self.events, (at_s, self.seq, kind, job_id, gen))

    # ------------------------------------------------------------------ the loop

    def run(self) -> None:
        while self.events:
            at_s = self.events[0][0]
            self._advance(at_s)
            while self.events and self.events[0][0] == at_s:
                _, _, kind, job_id, gen = heapq.heappop(self.events)
                self._event(kind, self.jobs[job_id], gen)
            self._round()

    def _holding(self) -> list[_Job]:
        return [j for j in self.jobs.values() if j.state in _HOLDING]

    def weight(self, j: _Job) -> float:
        """Its GPU-seconds a second; a pending job as on GPU 0 (the GPUs are alike)."""
        s, gpu = j.spec, self.node.gpus[0].index if j.gpu is None else j.gpu
        return job_weight(*j.held_bytes, s.exclusive, gpu, self.node)

    def _advance(self, to_s: float) -> None:
        """Integrate the figures over (now, to_s], in which nothing changes, and charge its
        usage before the events at to_s end or restart jobs (after them, the run up to an end
        or stop was lost: 5.5-7.6% of each owner's GPU-seconds, seed 20261125, fixed budgets)."""
        dt = to_s - self.now_s
        holding = self._holding()
        self.usage = charge(
            self.usage, self._running(holding), self.node, self.now_s, to_s,
            self.config.half_life_s,
        )  # fmt: skip
        in_day = max(0.0, min(to_s, DAY_S) - self.now_s)
        self.slots_day_s += len(holding) * in_day
        self.gpus_day_s += sum(self.weight(j) for j in holding) * in_day
        if self.backlogged and all(self.backlogged.get(o, False) for o in OWNERS):
            self.window_s += dt
            for j in holding:
                self.window_gpu_s[j.spec.owner] += self.weight(j) * dt
                self.window_day_gpu_s[j.spec.owner] += self.weight(j) * in_day
        self.now_s = to_s

    def _kept(self, j: _Job, progress_s: float) -> float:
        """Work kept at a stop: the last periodic checkpoint of this run."""
        ran = max(0.0, progress_s - j.done_s)
        kept = j.done_s + math.floor(ran / CHECKPOINT_EVERY_S) * CHECKPOINT_EVERY_S
        j.lost_s += (self.now_s - j.run_start_s) - (kept - j.done_s) / j.rate
        return kept

    def _progress(self, j: _Job, until_s: float) -> float:
        """Its work done by `until_s` of this run."""
        return j.done_s + (until_s - j.run_start_s) * j.rate

    def _event(self, kind: Event, j: _Job, gen: int) -> None:
        now = self.now_s
        if kind == Event.submit and j.state == State.future:
            j.state = State.pending
            self.submitted.append(j.spec.id)
        elif kind == Event.finish and j.state == State.running and gen == j.gen:
            j.state, j.end_s, j.done_s = State.succeeded, now, j.spec.work_s
        elif kind == Event.crash and j.state == State.running and gen == j.gen:
            j.done_s = self._kept(j, self._progress(j, now))
            j.crashes += 1
            j.gen += 1
            j.point = None
            if j.retries >= MAX_RETRIES:
                j.state, j.end_s = State.failed, now
            else:
                j.retries += 1
                j.state = State.pending
                j.not_before_s = now + min(RETRY_BACKOFF_S * 2 ** (j.retries - 1), 900.0)
                self._push(j.not_before_s, Event.wake, j.spec.id)
        elif kind == Event.stopped and j.state == State.stopping and gen == j.gen:
            j.done_s = self._kept(j, self._progress(j, now - STOP_GRACE_S))
            j.gen += 1
            j.point = None
            if j.stop_kind in (StopKind.shrunk, StopKind.grown):  # restarted on its GPU
                self._start(j, j.gpu, j.shrink_to)
            elif j.stop_kind == StopKind.preempted:
                j.state = State.pending
            else:
                j.state, j.end_s = State.cancelled, now
        elif kind == Event.cancel:
            if j.state in (State.pending, State.future):
                j.state, j.end_s = State.cancelled, now
            elif j.state == State.running:
                self._stop(j, StopKind.cancelled)
            elif j.state == State.stopping and j.stop_kind in (StopKind.shrunk, StopKind.grown):
                j.stop_kind = StopKind.cancelled  # it will not restart

    def _stop(self, j: _Job, why: StopKind) -> None:
        j.state, j.stop_kind = State.stopping, why
        j.gen += 1
        self._push(self.now_s + STOP_GRACE_S, Event.stopped, j.spec.id, j.gen)

    def _start(self, j: _Job, gpu: int | None, point: BudgetPoint | None = None) -> None:
        now = self.now_s
        j.state, j.gpu, j.run_start_s, j.point = State.running, gpu, now, point
        j.gen += 1
        if j.first_start_s is None:
            j.first_start_s, j.first_point = now, point
        crash = next((c for c in j.spec.crash_at_work_s[j.crashes :] if c > j.done_s), None)
        if crash is not None and crash < j.spec.work_s:
            self._push(now + (crash - j.done_s) / j.rate, Event.crash, j.spec.id, j.gen)
        else:
            self._push(now + (j.spec.work_s - j.done_s) / j.rate, Event.finish, j.spec.id, j.gen)

    # ------------------------------------------------------------------ one decision

    def _running(self, holding: list[_Job]) -> list[RunningJob]:
        return [
            RunningJob(
                j.spec.id, j.spec.owner, j.spec.priority, j.gpu, *j.held_bytes, j.run_start_s,
                j.spec.exclusive, j.state == State.stopping, points=j.points,
            )
            for j in holding
        ]  # fmt: skip

    def _inputs(self) -> tuple[list[PendingJob], list[RunningJob], dict[str, JobState]]:
        pending = []
        deps: dict[str, JobState] = {}
        for j in self.jobs.values():
            s = j.spec
            if j.state == State.pending:
                pending.append(
                    PendingJob(
                        s.id,
                        s.owner,
                        s.priority,
                        s.submit_s,
                        *j.held_bytes,
                        s.exclusive,
                        s.after,
                        j.not_before_s,
                        j.retries,
                        points=j.points,
                    )
                )
                for dep in s.after:
                    deps[dep] = _JOB_STATE[self.jobs[dep].state]
        return pending, self._running(self._holding()), deps

    def _round(self) -> None:
        now = self.now_s
        pending, running, deps = self._inputs()
        if self.predict and self.submitted:
            self._forecast(pending, running, deps)
        self.submitted = []
        if not pending:
            self.backlogged = {}
            if not any(r.points for r in running):  # nothing to start, shrink or grow
                return
        decision = decide(now, pending, running, self.node, self.usage, self.config, deps)
        self.rounds += 1
        self.violations += check_round(
            now, decision, pending, running, deps, self.node, self.config
        )
        for job_id, gpu, _share in decision.start:
            self._start(self.jobs[job_id], gpu, decision.budgets.get(job_id))
        self.shrunk += len(decision.shrink)
        self.grown += len(decision.grow)
        for kind, moves in ((StopKind.shrunk, decision.shrink), (StopKind.grown, decision.grow)):
            for job_id, point in moves.items():
                j = self.jobs[job_id]
                j.shrinks += kind == StopKind.shrunk
                j.shrink_to = point
                self._stop(j, kind)
        if not pending:  # a round that only grew jobs: no demand to count
            return
        for job_id in decision.preempt:
            self.jobs[job_id].preemptions += 1
            self.preempted += 1
            self._stop(self.jobs[job_id], StopKind.preempted)
        for job_id in decision.unsatisfiable:
            j = self.jobs[job_id]
            j.state, j.end_s = State.failed, now
        demand = dict.fromkeys(OWNERS, 0.0)
        for j in self._holding():
            demand[j.spec.owner] += self.weight(j)
        for job_id, kind in decision.kinds.items():
            j = self.jobs[job_id]
            j.waits[kind.value] += 1
            j.last_reason = decision.reasons[job_id]
            self.reason_rounds[kind.value] += 1
            if j.state == State.pending and kind not in (WaitKind.dependency, WaitKind.back_off):
                demand[j.spec.owner] += self.weight(j)
        shares = sum(self.config.share(o) for o in OWNERS)
        gpus = len(self.node.gpus)
        self.backlogged = {
            o: demand[o] >= self.config.share(o) / shares * gpus - 1e-9 for o in OWNERS
        }
        if all(self.backlogged.values()):
            self.usage_at_window_end = {
                o: self.usage.get(o, Usage()).decayed(now, self.config.half_life_s).gpu_s
                for o in OWNERS
            }
        for owner, peak in self.peak.items():
            mine = [j.held_bytes for j in self._holding() if j.spec.owner == owner]
            held = (len(mine), sum(d for d, _ in mine), sum(h for _, h in mine))
            self.peak[owner] = [max(a, b) for a, b in zip(peak, held)]

    def _forecast(
        self, pending: list[PendingJob], running: list[RunningJob], deps: dict[str, JobState]
    ) -> None:
        """What `wstrain queue` would say of the jobs just submitted: the queue replayed
        forward from the jobs' remaining work (crashes and cancellations unknown to it)."""
        now = self.now_s
        ends = {}
        for r in running:
            j = self.jobs[r.id]
            left_s = max(0.0, j.spec.work_s - self._progress(j, now)) / j.rate
            ends[r.id] = now + (STOP_GRACE_S if j.state == State.stopping else left_s)
        durations = {p.id: self.jobs[p.id].spec.work_s - self.jobs[p.id].done_s for p in pending}
        node = ForecastNode("node", self.node, tuple(running))
        got = forecast(now, pending, [node], ends, durations, self.usage, self.config, deps)
        for job_id in self.submitted:
            if job_id in got:
                self.jobs[job_id].predicted_start_s = got[job_id].start_s
                self.jobs[job_id].predicted_reason = got[job_id].reason


def run_sim(
    trace: Sequence[TraceJob],
    config: PolicyConfig,
    node: NodeState = NODE,
    ranges: Mapping[str, tuple[BudgetPoint, ...]] | None = None,
    predict: bool = False,
) -> QueueSim:
    sim = QueueSim(trace, config, node, ranges, predict)
    sim.run()
    return sim
