"""Gangs: a job on several GPUs of one node (`gpus` > 1, data parallel) starts on all of
them in one step or waits holding none, so two gangs can never each keep part of what the
other needs (no partial claim, no deadlock).

Fit. A gang of N takes N distinct GPUs of the node, each of which takes one of its ranks
as placement.py's rule takes a job (device_bytes free, or empty for an exclusive gang; not
held from it), and the node's host memory takes its host_bytes once:

    |{g : free(g) ≥ device_bytes(j), g not held}| ≥ N    and    host_unheld ≥ host_bytes(j)

Best fit: the N GPUs left with the least free memory (lowest index on a tie), as for one
GPU. The start names the first of them, with its link share; Decision.gangs lists all N.

Waiting. A gang that does not fit waits on resources with what it lacks (`resources: needs
2 GPUs with 20.0 GiB free on one node; 1 has it (GPU 2)`), or behind a hold that keeps it
from a place it would fit (`priority: ...`). It preempts nothing: victims on one GPU cannot
make room on N. As the round's first job blocked on resources it may drain: it holds the N
GPUs closest to taking it (its host budget once), so backfill cannot keep them busy forever.
A CPU node without modelled GPUs pools its memory: a gang there is one job of gpus x
device_bytes + host_bytes (placement.py), and the agent counts its CPU slots.

    slots = gang_fit(ledger, job, dev, host, job)      # None: it waits
"""

from __future__ import annotations

from wstrain.policy.placement import Hold, Ledger, Slot
from wstrain.policy.state import PendingJob, gib_text


def gang_fit(
    ledger: Ledger, job: PendingJob, device_bytes: int, host_bytes: int, bound: PendingJob | None
) -> list[Slot] | None:
    """The job.gpus GPUs that take the gang now, best fit first, or None; the holds that
    bind `bound` are honoured (None: the physical fit, holds aside)."""
    if not ledger.host_fits(host_bytes, bound):
        return None
    fitting = [
        s
        for s in ledger.slots.values()
        if s.takes(device_bytes, job.exclusive) and not ledger.held_from(s, bound)
    ]
    if len(fitting) < job.gpus:
        return None
    fitting.sort(key=lambda s: (s.free_bytes - device_bytes, s.index or 0))
    return fitting[: job.gpus]


def could_ever_fit(ledger: Ledger, job: PendingJob, device_bytes: int, host_bytes: int) -> bool:
    """Whether the empty node would take the gang: enough GPUs as large as its budget."""
    large = sum(1 for s in ledger.slots.values() if s.total_bytes >= device_bytes)
    return large >= job.gpus and ledger.host_total_bytes >= host_bytes


def blocking_hold(
    ledger: Ledger, job: PendingJob, device_bytes: int, host_bytes: int
) -> Hold | None:
    """The hold that keeps the gang from GPUs it would physically fit on: the first held GPU
    that takes a rank of it, else the first hold setting host memory aside; None when it
    fits nowhere even without holds."""
    if gang_fit(ledger, job, device_bytes, host_bytes, None) is None:
        return None
    for hold in ledger.holds:
        slot = ledger.slots.get(hold.slot_index)
        if hold.binds(job) and slot is not None and slot.takes(device_bytes, job.exclusive):
            return hold
    return next((h for h in ledger.holds if h.binds(job) and h.host_bytes > 0), None)


def drain_targets(ledger: Ledger, job: PendingJob, device_bytes: int) -> list[Slot]:
    """The job.gpus unheld GPUs closest to taking the gang, to hold while they drain (as
    Ledger.drain_target orders them), or [] when fewer are left."""
    candidates = [
        s for s in ledger.slots.values() if s.hold is None and s.total_bytes >= device_bytes
    ]
    if len(candidates) < job.gpus:
        return []
    if job.exclusive:
        candidates.sort(key=lambda s: (s.occupants, -s.free_bytes, s.index or 0))
    else:
        candidates.sort(key=lambda s: (-s.free_bytes, s.occupants, s.index or 0))
    return candidates[: job.gpus]


def _names(slots: list[Slot]) -> str:
    return "GPU " + ", ".join(str(s.index) for s in slots)


def gang_reason(ledger: Ledger, job: PendingJob, device_bytes: int, host_bytes: int) -> str:
    """Why the gang fits nowhere on the node as it stands (holds aside)."""
    n, slots = job.gpus, list(ledger.slots.values())
    large = [s for s in slots if s.total_bytes >= device_bytes]
    if len(large) < n:
        return (
            f"resources: needs {n} GPUs with {gib_text(device_bytes)} each on one node; "
            f"this node has {len(large)}"
        )
    if host_bytes > ledger.host_total_bytes:
        return (
            f"resources: needs {gib_text(host_bytes)} of host memory, the node has "
            f"{gib_text(ledger.host_total_bytes)}"
        )
    taking = [s for s in slots if s.takes(device_bytes, job.exclusive)]
    if len(taking) < n:
        which = f" ({_names(taking)})" if taking else ""
        if job.exclusive:
            verb = "is" if len(taking) == 1 else "are"
            return (
                f"resources: needs {n} empty GPUs on one node for an exclusive job; "
                f"{len(taking)} {verb} empty{which}"
            )
        verb = "has" if len(taking) == 1 else "have"
        return (
            f"resources: needs {n} GPUs with {gib_text(device_bytes)} free on one node; "
            f"{len(taking)} {verb} it{which}"
        )
    return (
        f"resources: needs {gib_text(host_bytes)} of host memory, "
        f"{gib_text(max(0, ledger.host_free_bytes))} unreserved on the node"
    )
