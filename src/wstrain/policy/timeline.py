"""The queue forecast's bookings over time (policy/forecast.py): one node's timeline of
ledgers, an interval per span between predicted starts and ends, with the earliest start at
which a job fits for its whole run; and each owner's quota over time. Pure.

    line = Timeline(now_s, "node-1", node_state, running, ends)
    got = line.earliest(job, from_s, run_s)       # (start, slots) or None: never
    line.book(job, start_s, run_s, [slot.index for slot in slots])
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Mapping, Sequence

from wstrain.policy.gangs import gang_fit
from wstrain.policy.placement import Ledger, Slot
from wstrain.policy.state import NodeState, PendingJob, Quota, RunningJob


class Timeline:
    """One node's future: breakpoints `times` (the first is now) and, for each interval
    [times[i], times[i+1]) (the last one open-ended), the ledger of what it holds then."""

    def __init__(
        self,
        now_s: float,
        name: str,
        node: NodeState,
        running: Sequence[RunningJob],
        ends: Mapping[str, float | None],
    ) -> None:
        self.name, self.node = name, node
        end_of = {j.id: ends.get(j.id) for j in running}
        finite = sorted({max(now_s, e) for e in end_of.values() if e is not None})
        self.times = [now_s, *(t for t in finite if t > now_s)]
        self.ledgers = [
            Ledger.of(node, [j for j in running if (e := end_of[j.id]) is None or e > t])
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


class QuotaLine:
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
