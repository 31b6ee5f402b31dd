"""The gates a pending job passes before the policy looks for room: its retry back-off, its
dependencies and its owner's quota. A job stopped at a gate waits (never fails here) with
the reason the gate gives.

Back-off. A job with `not_before_s` > now waits: `back-off: retry 2 in 30 s` (the retry
about to be made, the seconds left rounded up).

Dependencies. Every id of `after` must be `succeeded`. While one is not, the job waits on
the first such id: `dependency: waiting on <id> (running)`. If one ended failed, cancelled
or timed out, or is unknown to the store, the job can never start as it stands:
`dependency: <id> failed` (or `was cancelled`, `timed out`, `is unknown`), and the decision
lists it as unsatisfiable for the agent to settle.

Quotas. Per owner, optional: the most jobs running at once, device bytes and host bytes
reserved at once (a job on several GPUs reserves its device budget on each). Counted over
the owner's running jobs (stopping ones too: they hold their bytes until they exit; those
on other nodes too) plus its jobs started or given a held GPU earlier in the same round
(so a job that preempts for itself is not overtaken on the quota by its owner's smaller
jobs while its victims stop). A job waits when, with it, any figure would pass its ceiling:

    jobs_running + 1 > max_jobs            quota: 3 of 3 jobs running
    device_held + device_bytes > max_dev   quota: 40 of 48 device GiB reserved, the job needs 12
    host_held + host_bytes > max_host      quota: 100 of 128 host GiB reserved, the job needs 64

    reason = back_off_wait(job, now_s) or dependency_wait(job, states)[0]
    book = QuotaBook.of(running, config.quotas); reason = book.block(job)
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from wstrain.contracts.jobs import JobState
from wstrain.policy.state import PendingJob, Quota, RunningJob, gib_count

_ENDED = {
    JobState.failed: "failed",
    JobState.cancelled: "was cancelled",
    JobState.timeout: "timed out",
}


def back_off_wait(job: PendingJob, now_s: float) -> str | None:
    """The back-off reason while `not_before_s` lies ahead, else None."""
    if job.not_before_s is None or job.not_before_s <= now_s:
        return None
    left_s = math.ceil(job.not_before_s - now_s)
    if job.retries > 0:
        return f"back-off: retry {job.retries} in {left_s} s"
    return f"back-off: starts in {left_s} s"


def dependency_wait(job: PendingJob, states: Mapping[str, JobState]) -> tuple[str | None, bool]:
    """(reason, unsatisfiable): None while every dependency succeeded. A dependency that
    ended badly outranks one still under way: the job is then known never to start."""
    waiting: str | None = None
    for dep in job.after:
        state = states.get(dep)
        if state is None:
            return f"dependency: {dep} is unknown", True
        if state in _ENDED:
            return f"dependency: {dep} {_ENDED[state]}", True
        if state != JobState.succeeded and waiting is None:
            waiting = f"dependency: waiting on {dep} ({state.value})"
    return waiting, False


@dataclass
class _Held:
    jobs: int = 0
    device_bytes: int = 0
    host_bytes: int = 0


class QuotaBook:
    """Each owner's jobs and reserved bytes during one round, against its quota."""

    def __init__(self, quotas: Mapping[str, Quota]) -> None:
        self.quotas = quotas
        self.held: dict[str, _Held] = {}

    @classmethod
    def of(cls, running: Iterable[RunningJob], quotas: Mapping[str, Quota]) -> QuotaBook:
        book = cls(quotas)
        for job in running:
            book._add(job.owner, job.device_bytes * job.gpus, job.host_bytes)
        return book

    def _add(self, owner: str, device_bytes: int, host_bytes: int) -> None:
        held = self.held.setdefault(owner, _Held())
        held.jobs += 1
        held.device_bytes += device_bytes
        held.host_bytes += host_bytes

    def add(self, job: PendingJob) -> None:
        """Count a job started, or given a held GPU, this round."""
        self._add(job.owner, job.device_bytes * job.gpus, job.host_bytes)

    def usage(self, owner: str) -> tuple[int, int, int]:
        """(jobs, device bytes, host bytes) the owner holds now."""
        held = self.held.get(owner, _Held())
        return held.jobs, held.device_bytes, held.host_bytes

    def room(self, owner: str) -> tuple[int, int]:
        """(device, host) bytes the owner's quota still allows past what it holds now."""
        quota = self.quotas.get(owner)
        _, device, host = self.usage(owner)
        unlimited = 1 << 62
        if quota is None:
            return unlimited, unlimited
        return (
            unlimited if quota.max_device_bytes is None else quota.max_device_bytes - device,
            unlimited if quota.max_host_bytes is None else quota.max_host_bytes - host,
        )

    def block(self, job: PendingJob) -> str | None:
        """The quota reason if starting the job would pass a ceiling of its owner's."""
        quota = self.quotas.get(job.owner)
        if quota is None:
            return None
        jobs, device, host = self.usage(job.owner)
        if quota.max_jobs is not None and jobs + 1 > quota.max_jobs:
            return f"quota: {jobs} of {quota.max_jobs} jobs running"
        for label, held, need, ceiling in (
            ("device", device, job.device_bytes * job.gpus, quota.max_device_bytes),
            ("host", host, job.host_bytes, quota.max_host_bytes),
        ):
            if ceiling is None or held + need <= ceiling:
                continue
            if need > ceiling:
                return (
                    f"quota: the job needs {gib_count(need)} {label} GiB, more than the "
                    f"owner's {gib_count(ceiling)}"
                )
            return (
                f"quota: {gib_count(held)} of {gib_count(ceiling)} {label} GiB reserved, "
                f"the job needs {gib_count(need)}"
            )
        return None
