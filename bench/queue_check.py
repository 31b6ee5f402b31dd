"""The queue simulation's check of each decision, independent of the policy's code: the round
replayed in the policy's order by plain bookkeeping, so every start fits and keeps its
owner's quota, and every job left waiting has a reason that is true at that point
(bench/queue_sim.py's docstring lists them).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from wstrain.contracts.jobs import JobState
from wstrain.policy import (
    Decision,
    NodeState,
    PendingJob,
    PolicyConfig,
    RunningJob,
    WaitKind,
)


@dataclass
class _Gpu:
    """One GPU as the checker books it: (id, device bytes, exclusive, class, stopping)."""

    total_bytes: int
    jobs: list[tuple[str, int, bool, int, bool]] = field(default_factory=list)

    def takes(
        self,
        job: PendingJob,
        leaving: frozenset[str] = frozenset(),
        smaller: Mapping[str, int] | None = None,
    ) -> bool:
        """Whether `job` fits once `leaving` have gone and `smaller` (id -> device bytes)
        have restarted lower in their ranges."""
        staying = [j for j in self.jobs if j[0] not in leaving]
        if job.exclusive:
            return not staying and self.total_bytes >= job.device_bytes
        used = sum((smaller or {}).get(j[0], j[1]) for j in staying)
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
    host_shrunk = sum(
        r.host_bytes - decision.shrink[r.id].host_bytes for r in running if r.id in decision.shrink
    )
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
            shrunk = [k for k in gpus[gpu].jobs if k[0] in decision.shrink]
            smaller = {k: p.device_bytes for k, p in decision.shrink.items()}
            true = (
                bool(evicted or shrunk)
                and all(classes[k[0]] < job.priority for k in evicted)
                and all(classes[k[0]] <= job.priority for k in shrunk)
                and gpus[gpu].takes(job, frozenset(leaving), smaller)
                and host_free - set_aside + host_leaving + host_shrunk >= job.host_bytes
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
