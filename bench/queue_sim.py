"""A day of the lab queue through the real scheduling policy (`wstrain.policy`): a
discrete-event simulation on a virtual clock (no sleeping) of one modelled 8-GPU node, fed a
seeded 24-hour trace of jobs from 4 owners. CPU only, a few seconds.

    python -m bench.queue_sim --out bench/results/2026-11-25-queue-sim.json
    python -m bench.queue_sim --sweep-seeds 12   # the same figures for 12 other days

The node: 8 GPUs of 141 GiB (an H200's HBM as a round figure) and 2 TiB of host memory.
Events: submit, finish, crash (the worker dies; retried from its last checkpoint after
the agent's back-off, 30 s doubling, at most 2 retries), stopped (a preempted or
cancelled worker exits STOP_GRACE_S after its SIGTERM), cancel, wake (a back-off ends).
After the events of an instant, usage is charged (`policy.charge`) and `policy.decide`
runs once; its starts, preemptions and unsatisfiable jobs are applied. Workers checkpoint
every CHECKPOINT_EVERY_S of run time: a crashed or preempted job loses the work since its
last checkpoint (the pessimistic case: the agent's SIGTERM also makes it checkpoint).

The figures (issue "scheduling policy", Done-when):

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
- Packing. Mean jobs running (GPU slots used) over the 24 h, against the same trace and
  policy with every job exclusive (whole-GPU placement).
"""

from __future__ import annotations

import argparse
import enum
import heapq
import json
import math
import platform
import random
import statistics
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from wstrain.contracts.calibration import GIB
from wstrain.contracts.jobs import JobState
from wstrain.policy import (
    Decision,
    Gpu,
    NodeState,
    PendingJob,
    PolicyConfig,
    Quota,
    RunningJob,
    Usage,
    WaitKind,
    charge,
    decide,
    job_weight,
)

DAY_S = 86400.0
OWNERS = ("ana", "ben", "chen", "dara")
NODE = NodeState(tuple(Gpu(i, 141 * GIB) for i in range(8)), 2048 * GIB)
# dara's quota sits above her fair quarter of the node (2 GPUs, 282 GiB), so it binds when
# the others leave room, not when all four compete
QUOTAS = {"dara": Quota.from_gib(max_jobs=10, device_gib=400, host_gib=800)}
# (device GiB, host GiB, weight): a lab's mix, from a small fine-tune on the working set
# to a whole H200; host budgets hold the streamed weights and optimizer state
SIZES = ((12, 24, 0.30), (20, 32, 0.25), (40, 64, 0.20), (80, 96, 0.15), (141, 160, 0.10))
CHECKPOINT_EVERY_S = 600.0
STOP_GRACE_S = 30.0  # SIGTERM to exit: the checkpoint write
RETRY_BACKOFF_S = 30.0  # the agent's WSTRAIN_RETRY_BACKOFF_S, doubling, capped at 900 s
MAX_RETRIES = 2


@dataclass(frozen=True)
class TraceJob:
    id: str
    owner: str
    priority: int
    submit_s: float
    device_bytes: int
    host_bytes: int
    exclusive: bool
    work_s: float  # run time to finish, from scratch
    after: tuple[str, ...] = ()
    crash_at_work_s: tuple[float, ...] = ()  # the worker dies when its progress reaches each
    cancel_s: float | None = None


def make_trace(seed: int = 20261125, jobs_per_owner: int = 80) -> list[TraceJob]:
    """Per owner: a sweep of 12 jobs in the first 10 minutes, the rest at uniform times over
    the day; budgets from SIZES (141 GiB and 5% of the others exclusive), work log-uniform
    30 min to 8 h, 5% in the scavenger class -10, 10% after an earlier job of the owner,
    4% crashing once. Then 2 urgent class-10 jobs per owner between 06:00 and 18:00, one job
    crashing past its retries and one cancelled, each with a dependent job."""
    rng = random.Random(seed)
    jobs: list[TraceJob] = []

    def new_id() -> str:
        return f"{len(jobs) + 1:012x}"

    for owner in OWNERS:
        times = sorted(
            [rng.uniform(0, 600) for _ in range(12)]
            + [rng.uniform(600, DAY_S) for _ in range(jobs_per_owner - 12)]
        )
        mine: list[TraceJob] = []
        for t in times:
            dev, host, _ = rng.choices(SIZES, weights=[s[2] for s in SIZES])[0]
            work = math.exp(rng.uniform(math.log(1800), math.log(8 * 3600)))
            recent = [j for j in mine if t - j.submit_s < 4 * 3600]
            job = TraceJob(
                new_id(),
                owner,
                -10 if rng.random() < 0.05 else 0,
                t,
                dev * GIB,
                host * GIB,
                dev == 141 or rng.random() < 0.05,
                work,
                after=(rng.choice(recent).id,) if recent and rng.random() < 0.10 else (),
                crash_at_work_s=(rng.uniform(0.1, 0.9) * work,) if rng.random() < 0.04 else (),
            )
            mine.append(job)
            jobs.append(job)
        for _ in range(2):
            dev, host = rng.choice(((80, 96), (141, 160)))
            jobs.append(
                TraceJob(
                    new_id(),
                    owner,
                    10,
                    rng.uniform(6 * 3600, 18 * 3600),
                    dev * GIB,
                    host * GIB,
                    dev == 141,
                    rng.uniform(3600, 7200),
                )
            )
    # one job dying past its 2 retries and one its owner cancels, each with a dependent
    # that can then never start
    doomed = TraceJob(
        new_id(),
        "ben",
        0,
        3600.0,
        20 * GIB,
        32 * GIB,
        False,
        7200.0,
        crash_at_work_s=(600.0, 1300.0, 2000.0),
    )
    jobs.append(doomed)
    cancelled = TraceJob(
        new_id(), "chen", 0, 5400.0, 12 * GIB, 24 * GIB, False, 7200.0, cancel_s=9000.0
    )
    jobs.append(cancelled)
    for parent in (doomed, cancelled):
        jobs.append(
            TraceJob(
                new_id(),
                parent.owner,
                0,
                parent.submit_s + 60,
                12 * GIB,
                24 * GIB,
                False,
                3600.0,
                after=(parent.id,),
            )
        )
    return sorted(jobs, key=lambda j: (j.submit_s, j.id))


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


_JOB_STATE = {
    State.future: JobState.queued,
    State.pending: JobState.queued,
    State.running: JobState.running,
    State.stopping: JobState.running,
    State.succeeded: JobState.succeeded,
    State.failed: JobState.failed,
    State.cancelled: JobState.cancelled,
}
_HOLDING = (State.running, State.stopping)


class QueueSim:
    def __init__(self, trace: Sequence[TraceJob], config: PolicyConfig, node: NodeState) -> None:
        self.jobs = {t.id: _Job(t) for t in trace}
        self.config = config
        self.node = node
        self.events: list[tuple[float, int, Event, str, int]] = []
        self.seq = 0
        self.usage: dict[str, Usage] = {}
        self.last_round_s = 0.0
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
        self.preempted = 0
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

    def _weight(self, j: _Job) -> float:
        """Its GPU-seconds a second; a pending job as on GPU 0 (the GPUs are alike)."""
        s, gpu = j.spec, self.node.gpus[0].index if j.gpu is None else j.gpu
        return job_weight(s.device_bytes, s.host_bytes, s.exclusive, gpu, self.node)

    def _advance(self, to_s: float) -> None:
        """Integrate the figures over (now, to_s], in which nothing changes."""
        dt = to_s - self.now_s
        holding = self._holding()
        in_day = max(0.0, min(to_s, DAY_S) - self.now_s)
        self.slots_day_s += len(holding) * in_day
        self.gpus_day_s += sum(self._weight(j) for j in holding) * in_day
        if self.backlogged and all(self.backlogged.get(o, False) for o in OWNERS):
            self.window_s += dt
            for j in holding:
                self.window_gpu_s[j.spec.owner] += self._weight(j) * dt
                self.window_day_gpu_s[j.spec.owner] += self._weight(j) * in_day
        self.now_s = to_s

    def _kept(self, j: _Job, progress_s: float) -> float:
        """Work kept at a stop: the last periodic checkpoint of this run."""
        ran = max(0.0, progress_s - j.done_s)
        kept = j.done_s + math.floor(ran / CHECKPOINT_EVERY_S) * CHECKPOINT_EVERY_S
        j.lost_s += (self.now_s - j.run_start_s) - (kept - j.done_s)
        return kept

    def _event(self, kind: Event, j: _Job, gen: int) -> None:
        now = self.now_s
        if kind == Event.submit and j.state == State.future:
            j.state = State.pending
        elif kind == Event.finish and j.state == State.running and gen == j.gen:
            j.state, j.end_s, j.done_s = State.succeeded, now, j.spec.work_s
        elif kind == Event.crash and j.state == State.running and gen == j.gen:
            j.done_s = self._kept(j, j.done_s + now - j.run_start_s)
            j.crashes += 1
            j.gen += 1
            if j.retries >= MAX_RETRIES:
                j.state, j.end_s = State.failed, now
            else:
                j.retries += 1
                j.state = State.pending
                j.not_before_s = now + min(RETRY_BACKOFF_S * 2 ** (j.retries - 1), 900.0)
                self._push(j.not_before_s, Event.wake, j.spec.id)
        elif kind == Event.stopped and j.state == State.stopping and gen == j.gen:
            j.done_s = self._kept(j, j.done_s + now - STOP_GRACE_S - j.run_start_s)
            j.gen += 1
            if j.stop_kind == StopKind.preempted:
                j.state = State.pending
            else:
                j.state, j.end_s = State.cancelled, now
        elif kind == Event.cancel:
            if j.state in (State.pending, State.future):
                j.state, j.end_s = State.cancelled, now
            elif j.state == State.running:
                self._stop(j, StopKind.cancelled)

    def _stop(self, j: _Job, why: StopKind) -> None:
        j.state, j.stop_kind = State.stopping, why
        j.gen += 1
        self._push(self.now_s + STOP_GRACE_S, Event.stopped, j.spec.id, j.gen)

    def _start(self, j: _Job, gpu: int | None) -> None:
        now = self.now_s
        j.state, j.gpu, j.run_start_s = State.running, gpu, now
        j.gen += 1
        if j.first_start_s is None:
            j.first_start_s = now
        crash = next((c for c in j.spec.crash_at_work_s[j.crashes :] if c > j.done_s), None)
        if crash is not None and crash < j.spec.work_s:
            self._push(now + crash - j.done_s, Event.crash, j.spec.id, j.gen)
        else:
            self._push(now + j.spec.work_s - j.done_s, Event.finish, j.spec.id, j.gen)

    # ------------------------------------------------------------------ one decision

    def _inputs(self) -> tuple[list[PendingJob], list[RunningJob], dict[str, JobState]]:
        pending, running = [], []
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
                        s.device_bytes,
                        s.host_bytes,
                        s.exclusive,
                        s.after,
                        j.not_before_s,
                        j.retries,
                    )
                )
                for dep in s.after:
                    deps[dep] = _JOB_STATE[self.jobs[dep].state]
            elif j.state in _HOLDING:
                running.append(
                    RunningJob(
                        s.id,
                        s.owner,
                        s.priority,
                        j.gpu,
                        s.device_bytes,
                        s.host_bytes,
                        j.run_start_s,
                        s.exclusive,
                        j.state == State.stopping,
                    )
                )
        return pending, running, deps

    def _round(self) -> None:
        now = self.now_s
        pending, running, deps = self._inputs()
        self.usage = charge(
            self.usage, running, self.node, self.last_round_s, now, self.config.half_life_s
        )
        self.last_round_s = now
        if not pending:
            self.backlogged = {}
            return
        decision = decide(now, pending, running, self.node, self.usage, self.config, deps)
        self.rounds += 1
        self.violations += check_round(
            now, decision, pending, running, deps, self.node, self.config
        )
        for job_id, gpu, _share in decision.start:
            self._start(self.jobs[job_id], gpu)
        for job_id in decision.preempt:
            self.jobs[job_id].preemptions += 1
            self.preempted += 1
            self._stop(self.jobs[job_id], StopKind.preempted)
        for job_id in decision.unsatisfiable:
            j = self.jobs[job_id]
            j.state, j.end_s = State.failed, now
        demand = dict.fromkeys(OWNERS, 0.0)
        for j in self._holding():
            demand[j.spec.owner] += self._weight(j)
        for job_id, kind in decision.kinds.items():
            j = self.jobs[job_id]
            j.waits[kind.value] += 1
            j.last_reason = decision.reasons[job_id]
            self.reason_rounds[kind.value] += 1
            if j.state == State.pending and kind not in (WaitKind.dependency, WaitKind.back_off):
                demand[j.spec.owner] += self._weight(j)
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
            mine = [j.spec for j in self._holding() if j.spec.owner == owner]
            held = (len(mine), sum(s.device_bytes for s in mine), sum(s.host_bytes for s in mine))
            self.peak[owner] = [max(a, b) for a, b in zip(peak, held)]


@dataclass
class _Gpu:
    """One GPU as the checker books it: (id, device bytes, exclusive, class, stopping)."""

    total_bytes: int
    jobs: list[tuple[str, int, bool, int, bool]] = field(default_factory=list)

    def takes(self, job: PendingJob, leaving: frozenset[str] = frozenset()) -> bool:
        staying = [j for j in self.jobs if j[0] not in leaving]
        if job.exclusive:
            return not staying and self.total_bytes >= job.device_bytes
        used = sum(j[1] for j in staying)
        return not any(j[2] for j in staying) and self.total_bytes - used >= job.device_bytes


def check_round(
    now_s: float,
    decision: Decision,
    pending: Sequence[PendingJob],
    running: Sequence[RunningJob],
    deps: dict[str, JobState],
    node: NodeState,
    config: PolicyConfig,
) -> list[str]:
    """The round replayed in the policy's order by plain bookkeeping: every start fits and
    keeps the quota, every wait has a reason true at that point (module docstring)."""
    by_id = {j.id: j for j in pending}
    gpus = {g.index: _Gpu(g.total_bytes) for g in node.gpus}
    host_free = node.host_bytes
    owner_use: dict[str, list[int]] = {}
    leaving = {r.id for r in running if r.stopping} | set(decision.preempt)
    host_leaving = sum(r.host_bytes for r in running if r.id in leaving)
    classes = {r.id: r.priority for r in running}

    def book(owner: str, gpu: int, key: tuple[str, int, bool, int, bool], host: int) -> None:
        nonlocal host_free
        gpus[gpu].jobs.append(key)
        host_free -= host
        u = owner_use.setdefault(owner, [0, 0, 0])
        u[0], u[1], u[2] = u[0] + 1, u[1] + key[1], u[2] + host

    def over_quota(owner: str, n: int, dev: int, host: int) -> bool:
        q = config.quotas.get(owner)
        u = owner_use.get(owner, [0, 0, 0])
        return q is not None and (
            (q.max_jobs is not None and u[0] + n > q.max_jobs)
            or (q.max_device_bytes is not None and u[1] + dev > q.max_device_bytes)
            or (q.max_host_bytes is not None and u[2] + host > q.max_host_bytes)
        )

    for r in running:
        assert r.gpu_index is not None
        book(
            r.owner,
            r.gpu_index,
            (r.id, r.device_bytes, r.exclusive, r.priority, r.stopping),
            r.host_bytes,
        )
    starts = {s.job_id: s.gpu_index for s in decision.start}
    # holds so far: holder -> (GPU, class, host bytes); one binds every job of the same or
    # a lower class considered after it was made
    holds: dict[str, tuple[int | None, int, int]] = {}
    bad: list[str] = []
    for job_id in decision.order:
        job = by_id[job_id]
        binding = [h for h in holds.values() if job.priority <= h[1]]
        set_aside = sum(h[2] for h in binding)
        held = {h[0] for h in binding}
        host_ok = host_free >= job.host_bytes
        fitting = [g for g, gpu in gpus.items() if host_ok and gpu.takes(job)]
        free = [g for g in fitting if g not in held and host_free - set_aside >= job.host_bytes]
        tag = f"t={now_s:.0f} {job_id}"
        if job_id in starts:
            gpu = starts[job_id]
            if gpu not in free or over_quota(job.owner, 1, job.device_bytes, job.host_bytes):
                bad.append(f"{tag}: started on GPU {gpu}, which does not take it")
            assert gpu is not None
            key = (job.id, job.device_bytes, job.exclusive, job.priority, False)
            book(job.owner, gpu, key, job.host_bytes)
            continue
        kind = decision.kinds[job_id]
        if kind == WaitKind.preemption:
            gpu = decision.held.get(job_id)
            assert gpu is not None
            evicted = [k for k in gpus[gpu].jobs if k[0] in set(decision.preempt)]
            true = (
                bool(evicted)
                and all(classes[k[0]] < job.priority for k in evicted)
                and gpus[gpu].takes(job, frozenset(leaving))
                and host_free - set_aside + host_leaving >= job.host_bytes
            )
        else:
            true = {
                WaitKind.back_off: job.not_before_s is not None and job.not_before_s > now_s,
                WaitKind.dependency: any(deps.get(d) != JobState.succeeded for d in job.after),
                WaitKind.quota: over_quota(job.owner, 1, job.device_bytes, job.host_bytes),
                WaitKind.resources: not fitting,
                WaitKind.priority: bool(fitting) and not free,
            }[kind]
        if not true:
            bad.append(f"{tag}: waits on {decision.reasons[job_id]!r}, which is not so")
        blocked = kind in (WaitKind.back_off, WaitKind.dependency, WaitKind.quota)
        if free and not blocked:
            bad.append(f"{tag}: left waiting with GPU {free[0]} free for it")
        if job_id in decision.held:
            holds[job_id] = (decision.held[job_id], job.priority, job.host_bytes)
            u = owner_use.setdefault(job.owner, [0, 0, 0])  # its quota is set aside too
            u[0], u[1], u[2] = u[0] + 1, u[1] + job.device_bytes, u[2] + job.host_bytes
    for owner in owner_use:
        if over_quota(owner, 0, 0, 0):
            bad.append(f"t={now_s:.0f} {owner}: over its quota")
    return bad


def run_sim(trace: Sequence[TraceJob], config: PolicyConfig, node: NodeState = NODE) -> QueueSim:
    sim = QueueSim(trace, config, node)
    sim.run()
    return sim


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
        "lost_gpu_h": round(sum(j.lost_s * sim._weight(j) for j in jobs) / 3600, 2),
        "reason_rounds": dict(sorted(sim.reason_rounds.items())),
        "violations": len(sim.violations),
        "violation_samples": sim.violations[:10],
    }


def simulate(seed: int = 20261125, jobs_per_owner: int = 80) -> list[dict[str, Any]]:
    """Both runs of one trace; rows: the packed run, the whole-GPU run, one per owner (packed
    run), one per job (packed run)."""
    trace = make_trace(seed, jobs_per_owner)
    config = PolicyConfig(quotas=QUOTAS)
    start = time.perf_counter()
    packed = run_sim(trace, config)
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
    p.add_argument("--out")
    args = p.parse_args()
    rows = simulate(args.seed, args.jobs_per_owner)
    rows += sweep(args.sweep_seeds, args.jobs_per_owner)
    for row in rows:
        if not row["row"].startswith("job:"):
            print(json.dumps(row))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
