"""Packing jobs onto a node's GPUs by their budgets: the round's ledger of what each GPU and
the host memory hold, best-fit placement, the GPUs held for jobs ahead, and the reason a
job does not fit.

Fit. A GPU g takes a job j when

    free(g) = total(g) − Σ device_bytes of the jobs on g  ≥  device_bytes(j)
    host_free = host_bytes(node) − Σ host_bytes of the jobs on the node  ≥  host_bytes(j)

and, for an exclusive job, nothing is on g; nothing is packed beside an exclusive job
(free(g) = 0 while one is there). Jobs being stopped still hold their bytes until they exit.

Best fit. Among the GPUs that take j, the one left with the least free memory,
free(g) − device_bytes(j), lowest index on a tie: big holes stay open for big jobs. The
start carries the link share, the jobs that will then share g's PCIe link (j included, jobs
being stopped not), by which the planner divides the link's bandwidth.

Holds. A job that cannot start yet may hold one GPU: for the preemption it triggered, for
the stopping jobs leaving it, or to drain it when it is the round's first job blocked on
resources (the GPU closest to taking it: the fewest jobs for an exclusive job, else the
most free memory). A hold binds the jobs of the same or a lower class considered after it:
none of them is placed on the held GPU, and they start only if

    host_free − Σ host_bytes of the held jobs  ≥  host_bytes(j)

A CPU node has one pseudo-device, its host memory: a job needs device_bytes + host_bytes
of it, and there is no separate host check; its link share is 1 (no PCIe link to share).

Gangs. A job on several GPUs (`gpus` > 1, policy/gangs.py) holds device_bytes on each of
them and its host_bytes once; on a CPU node's pseudo-device, gpus x device_bytes + host_bytes.

    ledger = Ledger.of(node, running)
    slot = ledger.best_fit(device_bytes, host_bytes, exclusive, job)  # None: holds aside
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from wstrain.policy.state import NodeState, PendingJob, RunningJob, gib_text


@dataclass(frozen=True)
class Hold:
    """A GPU (and host memory) kept for a job that cannot start yet. It binds every job of
    the same or a lower class considered after it was made (all of them, in the order);
    `drain`: kept while the GPU's jobs end, not for a preemption or a stopping job."""

    job_id: str
    priority: int
    slot_index: int | None
    host_bytes: int
    drain: bool = False
    owner: str = ""  # the job's owner: a wait reason names the job to its own owner only

    def binds(self, job: PendingJob | None) -> bool:
        return job is not None and job.id != self.job_id and job.priority <= self.priority


@dataclass
class Slot:
    """One GPU (index None: a CPU node's pseudo-device) as this round sees it."""

    index: int | None
    total_bytes: int
    used_bytes: int = 0
    occupants: int = 0  # every job on it, stopping ones included
    live: int = 0  # jobs on it that are not being stopped: they share its link
    exclusive: int = 0  # exclusive jobs on it (0 or 1 unless the node was overbooked)
    stopping_bytes: int = 0  # device bytes of its jobs being stopped
    stopping: int = 0
    running: list[RunningJob] = field(default_factory=list)  # before this round's starts
    hold: Hold | None = None

    @property
    def free_bytes(self) -> int:
        """What another job may still pack here: 0 beside an exclusive job."""
        return 0 if self.exclusive else max(0, self.total_bytes - self.used_bytes)

    def takes(self, device_bytes: int, exclusive: bool) -> bool:
        if exclusive:
            return self.occupants == 0 and self.total_bytes >= device_bytes
        return self.free_bytes >= device_bytes

    @property
    def name(self) -> str:
        return "the node" if self.index is None else f"GPU {self.index}"


class Ledger:
    """What the node holds during one round: running jobs, then each job started or held in
    order. Mutable within `decide`, never outside it."""

    def __init__(self, node: NodeState) -> None:
        self.cpu_only = node.cpu_only
        self.host_total_bytes = node.host_bytes
        self.host_used_bytes = 0
        self.host_stopping_bytes = 0
        self.disk_total_bytes = node.disk_bytes
        self.disk_used_bytes = 0  # the disk budgets of the jobs here (stopping ones too)
        self.holds: list[Hold] = []
        if node.cpu_only:
            self.slots: dict[int | None, Slot] = {None: Slot(None, node.host_bytes)}
        else:
            self.slots = {g.index: Slot(g.index, g.total_bytes) for g in node.gpus}

    @classmethod
    def of(cls, node: NodeState, running: Iterable[RunningJob]) -> Ledger:
        ledger = cls(node)
        for job in running:
            ledger._add_running(job)
        return ledger

    def demand(self, job: PendingJob | RunningJob) -> tuple[int, int]:
        """(device bytes on each of its GPUs, host bytes) the job takes here: on a CPU node
        both come out of the one pool, the pseudo-device, a gang's device budget once per
        GPU it models."""
        if self.cpu_only:
            return job.device_bytes * job.gpus + job.host_bytes, 0
        return job.device_bytes, job.host_bytes

    def _add_running(self, job: RunningJob) -> None:
        dev, host = self.demand(job)
        self.host_used_bytes += host  # once, however many GPUs it runs on
        self.disk_used_bytes += job.disk_bytes
        if job.stopping:
            self.host_stopping_bytes += host
        for index in (None,) if self.cpu_only else job.gpu_indices:
            slot = self.slots.get(index)
            if slot is None:  # a GPU the agent no longer reports: its host bytes still count
                continue
            slot.used_bytes += dev
            slot.occupants += 1
            slot.exclusive += int(job.exclusive)
            slot.running.append(job)
            if job.stopping:
                slot.stopping += 1
                slot.stopping_bytes += dev
            else:
                slot.live += 1

    # ------------------------------------------------------------------ host memory

    @property
    def host_free_bytes(self) -> int:
        """Unreserved host memory, the physical truth (holds not deducted)."""
        if self.cpu_only:
            return 0
        return self.host_total_bytes - self.host_used_bytes

    def host_unheld_bytes(self, job: PendingJob | None) -> int:
        """Unreserved host memory less the host budgets set aside for holds binding `job`
        (None: no hold binds)."""
        return self.host_free_bytes - sum(h.host_bytes for h in self.holds if h.binds(job))

    def host_fits(self, host_bytes: int, job: PendingJob | None) -> bool:
        return self.cpu_only or self.host_unheld_bytes(job) >= host_bytes

    def disk_wait(self, job: PendingJob) -> str | None:
        """Why the job's disk budget does not fit the node's spill space now (None: it
        does). Spill space is packed like host memory: each job reserves its whole disk
        budget; nothing is preempted or shrunk for it."""
        if job.disk_bytes <= 0:
            return None
        if self.disk_total_bytes <= 0:
            return (
                f"resources: needs {gib_text(job.disk_bytes)} of spill space; this node has "
                "no spill directory (WSTRAIN_SPILL_DIR)"
            )
        free = self.disk_total_bytes - self.disk_used_bytes
        if job.disk_bytes > free:
            return (
                f"resources: needs {gib_text(job.disk_bytes)} of spill space, "
                f"{gib_text(max(0, free))} unreserved on the node"
            )
        return None

    def held_from(self, slot: Slot, job: PendingJob | None) -> bool:
        return slot.hold is not None and slot.hold.binds(job)

    # ------------------------------------------------------------------ placement

    def best_fit(
        self, device_bytes: int, host_bytes: int, exclusive: bool, job: PendingJob | None
    ) -> Slot | None:
        """The GPU that takes the job with the least free memory left, or None; the holds
        that bind `job` are honoured (None: the physical fit, holds aside)."""
        if not self.host_fits(host_bytes, job):
            return None
        fitting = [
            s
            for s in self.slots.values()
            if s.takes(device_bytes, exclusive) and not self.held_from(s, job)
        ]
        if not fitting:
            return None
        return min(fitting, key=lambda s: (s.free_bytes - device_bytes, s.index or 0))

    def place(self, job: PendingJob, *slots: Slot) -> int:
        """Book the job on `slots` (a gang's every GPU; its host bytes once); returns the
        link share of the first."""
        dev, host = self.demand(job)
        for slot in slots:
            slot.used_bytes += dev
            slot.occupants += 1
            slot.live += 1
            slot.exclusive += int(job.exclusive)
        self.host_used_bytes += host
        self.disk_used_bytes += job.disk_bytes
        return 1 if self.cpu_only else slots[0].live

    def hold(self, job: PendingJob, slot: Slot, drain: bool = False, host: bool = True) -> None:
        """Keep `slot` for the job (and its host budget, unless `host` is False: a gang's
        GPUs after the first, whose hold already sets it aside)."""
        host_bytes = self.demand(job)[1] if host else 0
        slot.hold = Hold(job.id, job.priority, slot.index, host_bytes, drain, job.owner)
        self.holds.append(slot.hold)

    def mark_stopping(self, victims: Iterable[RunningJob]) -> None:
        """Preempted this round: they still hold their bytes, but are no victims again."""
        ids = {v.id for v in victims}
        counted: set[str] = set()  # a gang is on several GPUs: its host bytes count once
        for slot in self.slots.values():
            for i, job in enumerate(slot.running):
                if job.id in ids and not job.stopping:
                    dev, host = self.demand(job)
                    slot.running[i] = replace(job, stopping=True)
                    slot.live -= 1
                    slot.stopping += 1
                    slot.stopping_bytes += dev
                    if job.id not in counted:
                        self.host_stopping_bytes += host
                        counted.add(job.id)

    def mark_shrinking(self, freed: Mapping[str, tuple[int, int]]) -> None:
        """Shrunk this round (id -> device, host bytes it gives back): each still holds its
        bytes until it restarts lower, and is shrunk or preempted no more."""
        for slot in self.slots.values():
            for i, job in enumerate(slot.running):
                if job.id in freed and not job.stopping:
                    slot.running[i] = replace(job, stopping=True)
                    slot.live -= 1
                    slot.stopping += 1
                    slot.stopping_bytes += freed[job.id][0]
                    self.host_stopping_bytes += freed[job.id][1]

    def after_stops(
        self, device_bytes: int, host_bytes: int, exclusive: bool, job: PendingJob
    ) -> Slot | None:
        """A GPU not held from the job that takes it once the jobs being stopped have left
        (their device bytes on it and their host bytes anywhere), best fit; else None."""
        later = self.host_unheld_bytes(job) + self.host_stopping_bytes
        if not self.cpu_only and later < host_bytes:
            return None
        fitting: list[tuple[int, Slot]] = []
        for s in self.slots.values():
            if self.held_from(s, job) or not s.stopping:
                continue
            stopping_exclusive = sum(1 for j in s.running if j.stopping and j.exclusive)
            if exclusive:
                ok = s.occupants == s.stopping and s.total_bytes >= device_bytes
            else:
                free = s.total_bytes - s.used_bytes + s.stopping_bytes
                ok = s.exclusive == stopping_exclusive and free >= device_bytes
            if ok:
                fitting.append((s.total_bytes - s.used_bytes + s.stopping_bytes, s))
        if not fitting:
            return None
        return min(fitting, key=lambda fs: (fs[0] - device_bytes, fs[1].index or 0))[1]

    # ------------------------------------------------------------------ blocked jobs

    def could_ever_fit(self, device_bytes: int, host_bytes: int) -> bool:
        """Whether the empty node would take the job: else no wait makes it start here."""
        biggest = max(s.total_bytes for s in self.slots.values())
        return biggest >= device_bytes and (self.cpu_only or self.host_total_bytes >= host_bytes)

    def drain_target(self, device_bytes: int, exclusive: bool) -> Slot | None:
        """The unheld GPU closest to taking a blocked job, to hold while it drains: for an
        exclusive job the one with the fewest jobs, else the one with the most free memory
        (then the fewest jobs, the lowest index)."""
        candidates = [
            s for s in self.slots.values() if s.hold is None and s.total_bytes >= device_bytes
        ]
        if not candidates:
            return None
        if exclusive:
            return min(candidates, key=lambda s: (s.occupants, -s.free_bytes, s.index or 0))
        return min(candidates, key=lambda s: (-s.free_bytes, s.occupants, s.index or 0))

    def resource_reason(self, device_bytes: int, host_bytes: int, exclusive: bool) -> str:
        """Why the job fits nowhere on the node as it stands (holds aside)."""
        slots = list(self.slots.values())
        biggest = max(s.total_bytes for s in slots)
        if self.cpu_only:
            free = max(0, self.host_total_bytes - slots[0].used_bytes)
            if device_bytes > biggest:
                return (
                    f"resources: needs {gib_text(device_bytes)} (device + host budgets), "
                    f"the node has {gib_text(biggest)}"
                )
            if exclusive and slots[0].occupants:
                return (
                    "resources: the node is not empty for an exclusive job "
                    f"({slots[0].occupants} jobs on it)"
                )
            return (
                f"resources: needs {gib_text(device_bytes)} (device + host budgets), "
                f"{gib_text(free)} unreserved on the node"
            )
        if device_bytes > biggest:
            return (
                f"resources: needs {gib_text(device_bytes)} of device memory, the largest GPU "
                f"has {gib_text(biggest)}"
            )
        if host_bytes > self.host_total_bytes:
            return (
                f"resources: needs {gib_text(host_bytes)} of host memory, the node has "
                f"{gib_text(self.host_total_bytes)}"
            )
        if not any(s.takes(device_bytes, exclusive) for s in slots):
            if exclusive:
                fewest = min(s.occupants for s in slots if s.total_bytes >= device_bytes)
                return (
                    f"resources: no GPU is empty for an exclusive job (the emptiest holds "
                    f"{fewest} job{'s' if fewest != 1 else ''})"
                )
            largest = max(s.free_bytes for s in slots)
            return (
                f"resources: no GPU has {gib_text(device_bytes)} free "
                f"(largest free {gib_text(largest)})"
            )
        return (
            f"resources: needs {gib_text(host_bytes)} of host memory, "
            f"{gib_text(max(0, self.host_free_bytes))} unreserved on the node"
        )

    def hold_blocking(
        self, device_bytes: int, host_bytes: int, exclusive: bool, job: PendingJob
    ) -> Hold | None:
        """The hold that keeps a job from a place it would physically fit: the first held
        GPU that takes it, else the first hold setting host memory aside. None when the job
        fits nowhere even without holds."""
        if self.best_fit(device_bytes, host_bytes, exclusive, None) is None:
            return None
        for hold in self.holds:
            if hold.binds(job) and self.slots[hold.slot_index].takes(device_bytes, exclusive):
                return hold
        if not self.host_fits(host_bytes, job):
            return next((h for h in self.holds if h.binds(job) and h.host_bytes > 0), None)
        return None
