"""The scheduling policy's one entry point: given the queue, the running jobs, the node and
the owners' usage, which jobs start where, which jobs are preempted, and why each other
pending job waits. Pure: the same inputs give the same Decision; no clock, no I/O.

    decision = decide(now_s, pending, running, node, usage, config, dependencies)
    for job_id, gpu_index, link_share in decision.start: ...
    for job_id in decision.preempt: ...   # SIGTERM: checkpoint and requeue

A round. The pending jobs are put in order (fairshare.py: priority class desc, owner's
fair-share factor desc, submission asc, id) and considered one by one against a ledger of
the node that each start or hold updates:

 1. back-off, dependency, quota (gates.py): a job stopped at a gate waits with its reason;
 2. placement (placement.py): best fit on a GPU not held from it, with the host memory not
    set aside for holds: the job starts;
 3. else, if it fits nowhere now but some GPU takes it once its jobs being stopped have
    exited, it holds that GPU and waits (`resources: waiting for 2 stopping jobs to leave
    GPU 3`);
 4. else, if shrinking ranged jobs of its class or below on one GPU, each restarted lower
    in its range, makes it fit (budgets.py), they are shrunk and the job holds that GPU
    (`preemption: shrinking 2 ranged jobs on GPU 3 ...`); a job is preempted only when
    shrinking cannot make room;
 5. else, if evicting lower-class jobs on one GPU makes it fit (preemption.py), those jobs
    are preempted and the job holds that GPU (`preemption: stopping 2 jobs of class -10
    on GPU 3`);
 6. else, if it would fit now but for holds, it waits behind their jobs (`priority: 4 jobs
    ahead; GPU 3 is held for <id>`);
 7. else it waits on resources (`resources: no GPU has 20.0 GiB free (largest free 12.0
    GiB)`); the first such job of the round that the empty node would take (with
    `config.drain`, the default) holds the GPU closest to taking it (`; GPU 5 drains for
    it`).

A job on several GPUs (a gang, policy/gangs.py) takes steps 2, 6 and 7 on all its GPUs at
once: it starts on every one of them or holds none but a drain hold, and preempts or shrinks
nothing.

A hold binds every job of the same or a lower class considered after it in the round: it
keeps the GPU and sets aside the holder's host budget and its owner's quota, so a
preempting job is not overtaken by smaller jobs while its victims stop. A higher-class job
is never bound by a lower-class hold.

Backfill. A job that fits starts even when jobs ahead of it wait, of any class, except on
what a job ahead holds. With the drain hold, one GPU at a time drains for the first blocked
job, so the jobs behind it cannot fill every hole that opens there; jobs ahead of it in the
fair-share order still can (binding them as well lets the blocked job overtake the jobs of
owners the factor ranks above its own: up to 32% off fair share over bench/queue_sim.py's
seeded days). Slurm's backfill also starts a job on a held GPU when its time limit ends
before the hold's expected start; the queue has no reliable end times (time_limit_s is
optional), so a held GPU takes nothing new.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from wstrain.contracts.jobs import JobState
from wstrain.policy.budgets import RangedJob, choose_growth, choose_points, choose_shrink
from wstrain.policy.fairshare import (
    Usage,
    fair_share_factors,
    ordered,
    owners_in_play,
)
from wstrain.policy.gangs import (
    blocking_hold,
    could_ever_fit,
    drain_targets,
    gang_fit,
    gang_reason,
)
from wstrain.policy.gates import QuotaBook, back_off_wait, dependency_wait
from wstrain.policy.placement import Hold, Ledger
from wstrain.policy.preemption import choose_victims
from wstrain.policy.state import (
    BudgetPoint,
    Decision,
    NodeState,
    PendingJob,
    PolicyConfig,
    RunningJob,
    Start,
    WaitKind,
)


def _wait_behind(
    out: _Round, ledger: Ledger, job: PendingJob, dev: int, position: int, blocking: Hold
) -> None:
    """`job` waits behind a hold kept for a job ahead of it (draining or held GPU)."""
    holder = ledger.slots[blocking.slot_index]
    where = holder.name if holder.takes(dev, job.exclusive) else "host memory"
    verb = "drains" if blocking.drain else "is held"
    # another owner's job id is not this owner's to see (docs/OPERATIONS.md, Security): its class is
    for_whom = (
        blocking.job_id
        if blocking.owner == job.owner
        else f"another owner's job of priority {blocking.priority}"
    )
    out.wait(
        job,
        WaitKind.priority,
        f"priority: {_plural(position, 'job')} ahead; {where} {verb} for {for_whom}",
    )


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


@dataclass
class _Round:
    """One pass over the queue: what it starts, preempts and holds, and why others wait."""

    starts: list[Start] = field(default_factory=list)
    preempt: list[str] = field(default_factory=list)
    reasons: dict[str, str] = field(default_factory=dict)
    kinds: dict[str, WaitKind] = field(default_factory=dict)
    held: dict[str, int | None] = field(default_factory=dict)
    unsatisfiable: list[str] = field(default_factory=list)
    gangs: dict[str, tuple[int, ...]] = field(default_factory=dict)
    shrink: dict[str, BudgetPoint] = field(default_factory=dict)
    drains: int = 0  # drain holds made

    def wait(self, job: PendingJob, kind: WaitKind, text: str) -> None:
        self.reasons[job.id] = text
        self.kinds[job.id] = kind


def _gate(
    job: PendingJob, now_s: float, states: Mapping[str, JobState], book: QuotaBook, out: _Round
) -> bool:
    """Back-off, dependency, quota: True when the job passes all three."""
    text = back_off_wait(job, now_s)
    if text is not None:
        out.wait(job, WaitKind.back_off, text)
        return False
    text, never = dependency_wait(job, states)
    if text is not None:
        out.wait(job, WaitKind.dependency, text)
        if never:
            out.unsatisfiable.append(job.id)
        return False
    text = book.block(job)
    if text is not None:
        out.wait(job, WaitKind.quota, text)
        return False
    return True


def _pass(
    now_s: float,
    queue: Sequence[PendingJob],
    ledger: Ledger,
    book: QuotaBook,
    config: PolicyConfig,
    states: Mapping[str, JobState],
) -> _Round:
    out = _Round()
    for position, job in enumerate(queue):
        if not _gate(job, now_s, states, book, out):
            continue
        disk = ledger.disk_wait(job)
        if disk is not None:  # no room on its disk: it waits, nothing is stopped for it
            out.wait(job, WaitKind.resources, disk)
            continue
        if job.gpus > 1 and not ledger.cpu_only:  # a CPU node pools a gang's memory
            _gang(position, job, ledger, book, config, out)
            continue
        dev, host = ledger.demand(job)
        slot = ledger.best_fit(dev, host, job.exclusive, job)
        if slot is not None:
            out.starts.append(Start(job.id, slot.index, ledger.place(job, slot)))
            book.add(job)
            continue

        # a job that fits now but for holds waits behind them (or preempts): it does not
        # hold a GPU whose stopping jobs are leaving as well
        blocking = ledger.hold_blocking(dev, host, job.exclusive, job)
        slot = None if blocking else ledger.after_stops(dev, host, job.exclusive, job)
        shrink = None if slot else choose_shrink(job, dev, host, ledger, config)
        eviction = None if slot or shrink else choose_victims(job, dev, host, ledger, config)
        if slot is not None:
            out.wait(
                job,
                WaitKind.resources,
                f"resources: waiting for {_plural(slot.stopping, 'stopping job')} to leave "
                f"{slot.name}",
            )
        elif shrink is not None:
            index, moves = shrink
            slot = ledger.slots[index]
            ledger.mark_shrinking(
                {m.job_id: (m.freed_device_bytes, m.freed_host_bytes) for m in moves}
            )
            out.shrink.update({m.job_id: m.to for m in moves})
            out.wait(
                job,
                WaitKind.preemption,
                f"preemption: shrinking {_plural(len(moves), 'ranged job')} on {slot.name} "
                "to a smaller budget of its range",
            )
        elif eviction is not None:
            slot = ledger.slots[eviction.slot_index]
            ledger.mark_stopping(eviction.victims)
            out.preempt.extend(v.id for v in eviction.victims)
            classes = sorted({v.priority for v in eviction.victims})
            out.wait(
                job,
                WaitKind.preemption,
                f"preemption: stopping {_plural(len(eviction.victims), 'job')} of class "
                f"{', '.join(map(str, classes))} on {slot.name}",
            )
        elif blocking is not None:
            _wait_behind(out, ledger, job, dev, position, blocking)
        else:
            text = ledger.resource_reason(dev, host, job.exclusive)
            if config.drain and not out.drains and ledger.could_ever_fit(dev, host):
                target = ledger.drain_target(dev, job.exclusive)
                if target is not None:
                    ledger.hold(job, target, drain=True)
                    book.add(job)
                    out.held[job.id] = target.index
                    out.drains += 1
                    text += f"; {target.name} drains for it"
            out.wait(job, WaitKind.resources, text)
        if slot is not None:
            ledger.hold(job, slot)
            book.add(job)
            out.held[job.id] = slot.index
    return out


def _gang(
    position: int,
    job: PendingJob,
    ledger: Ledger,
    book: QuotaBook,
    config: PolicyConfig,
    out: _Round,
) -> None:
    """A job on several GPUs (policy/gangs.py): all of them now, or a wait holding none
    (beside a drain hold as the round's first blocked job)."""
    dev, host = ledger.demand(job)
    slots = gang_fit(ledger, job, dev, host, job)
    if slots is not None:
        out.starts.append(Start(job.id, slots[0].index, ledger.place(job, *slots)))
        out.gangs[job.id] = tuple(s.index for s in slots if s.index is not None)
        book.add(job)
        return
    blocking = blocking_hold(ledger, job, dev, host)
    if blocking is not None:
        _wait_behind(out, ledger, job, dev, position, blocking)
        return
    text = gang_reason(ledger, job, dev, host)
    if config.drain and not out.drains and could_ever_fit(ledger, job, dev, host):
        targets = drain_targets(ledger, job, dev)
        if targets:
            for i, target in enumerate(targets):
                ledger.hold(job, target, drain=True, host=i == 0)
            book.add(job)
            out.held[job.id] = targets[0].index
            out.drains += 1
            text += f"; GPU {', '.join(str(t.index) for t in targets)} drain for it"
    out.wait(job, WaitKind.resources, text)


def _choose_budgets(
    out: _Round, queue: Sequence[PendingJob], ledger: Ledger, book: QuotaBook, config: PolicyConfig
) -> dict[str, BudgetPoint]:
    """The ranged jobs this round started, each placed at its min: what their GPU has left
    once every start of the round is placed goes where it buys the most tokens/s, weighted
    by their owners' shares, within each owner's quota. A GPU held for a job keeps what is
    left for it, the host keeps what holds set aside; a gang keeps its min (its GPUs would
    have to agree). On a CPU node device and host budgets come out of its one pool."""
    by_id = {j.id: j for j in queue}
    on_slot: dict[int | None, list[PendingJob]] = {}
    for start in out.starts:
        job = by_id[start.job_id]
        if job.points and job.id not in out.gangs:
            on_slot.setdefault(start.gpu_index, []).append(job)
    chosen: dict[str, BudgetPoint] = {}
    host_left = ledger.host_free_bytes - sum(h.host_bytes for h in ledger.holds)
    quota_left = {o: book.room(o) for o in {j.owner for j in by_id.values()}}
    for index, jobs in on_slot.items():
        slot = ledger.slots[index]
        device_left = 0 if slot.hold is not None else slot.free_bytes
        pool = ledger.cpu_only
        ranged = []
        for j in jobs:  # the points its owner's quota still allows
            room_device, room_host = quota_left[j.owner]
            allowed = tuple(
                p
                for p in j.points
                if p.device_bytes - j.device_bytes <= room_device
                and p.host_bytes - j.host_bytes <= room_host
            )
            pts = tuple(
                BudgetPoint(p.device_bytes + p.host_bytes, 0, p.tokens_per_s) if pool else p
                for p in allowed
            )
            ranged.append(RangedJob(j.id, config.share(j.owner), pts))
        device_room = device_left + sum(r.points[0].device_bytes for r in ranged)
        host_room = max(host_left, 0) + sum(r.points[0].host_bytes for r in ranged)
        points = choose_points(ranged, device_room, host_room) or {}
        extra: dict[str, tuple[int, int]] = {}
        for job, r in zip(jobs, ranged, strict=True):
            point = job.points[r.points.index(points[job.id])] if job.id in points else None
            chosen[job.id] = point or job.points[0]
            d, h = extra.get(job.owner, (0, 0))
            extra[job.owner] = (
                d + chosen[job.id].device_bytes - job.device_bytes,
                h + chosen[job.id].host_bytes - job.host_bytes,
            )
        for owner, (d, h) in extra.items():
            room_device, room_host = quota_left[owner]
            if d > room_device or h > room_host:  # two of its jobs here took its room twice
                for job in jobs:
                    if job.owner == owner:
                        chosen[job.id] = job.points[0]
                d = h = 0
            quota_left[owner] = (room_device - d, room_host - h)
            host_left -= 0 if pool else h
    return chosen


def _quiet(out: _Round) -> bool:
    """A round that started nothing and left no job waiting for memory: what a GPU has
    free is no one's (budgets.py choose_growth); this round's starts get theirs from
    _choose_budgets."""
    memory = (WaitKind.resources, WaitKind.preemption, WaitKind.priority)
    return not out.starts and not any(k in memory for k in out.kinds.values())


def decide(
    now_s: float,
    pending: Sequence[PendingJob],
    running: Sequence[RunningJob],
    node: NodeState,
    usage: Mapping[str, Usage],
    config: PolicyConfig | None = None,
    dependencies: Mapping[str, JobState] | None = None,
    elsewhere: Sequence[RunningJob] = (),
) -> Decision:
    """One decision round. `usage`: each owner's decayed GPU-seconds (fairshare.charge keeps
    it); `dependencies`: the state of every job named in a pending job's `after` (an id
    missing here is taken as unknown to the store); `elsewhere`: the jobs running on other
    nodes, which count against their owners' quotas but take no room here."""
    config = config or PolicyConfig()
    states = dependencies or {}
    owners = owners_in_play(usage, pending, [*running, *elsewhere], config)
    factors = fair_share_factors(usage, owners, config, now_s)
    queue = ordered(pending, factors)
    book = QuotaBook.of([*running, *elsewhere], config.quotas)
    ledger = Ledger.of(node, running)
    out = _pass(now_s, queue, ledger, book, config, states)
    return Decision(
        start=tuple(out.starts),
        preempt=tuple(out.preempt),
        reasons=out.reasons,
        kinds=out.kinds,
        order=tuple(j.id for j in queue),
        held=out.held,
        unsatisfiable=tuple(out.unsatisfiable),
        factors=factors,
        gangs=out.gangs,
        budgets=_choose_budgets(out, queue, ledger, book, config),
        shrink=out.shrink,
        grow=choose_growth(now_s, ledger, book, config, quiet=_quiet(out)),
    )
