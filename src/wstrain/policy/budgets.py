"""Budgets inside ranges: which point of each ranged job's range the memory of one GPU (and
its host) buys, by the planner's predicted speed. Pure, like the rest of the policy.

A ranged job comes with a few points of its range, each a (device, host) budget and the
tokens/s the planner predicts there; its first point is its min, which is all it is promised.
Two decisions read them:

- `choose_points`: the jobs sharing a GPU get their mins, then the memory left goes where it
  buys the most weighted tokens/s (weights as fair share weighs owners) per share of what
  is left, one upgrade at a time. A job whose speed does not grow with memory keeps its min,
  so the memory stays free for the next job rather than idle inside one.
- `shrink_to_free`: before a running job is preempted to make room, ranged running jobs are
  moved down their ranges, the cheapest loss of weighted tokens/s per byte freed first; None
  when even every one at its min frees too little (then preemption decides).

- `choose_growth`: a running job below the top of its range, on a GPU with memory no one
  waits for, is stopped at a checkpoint and restarted higher in its range. A restart costs a
  job its steps since the checkpoint it writes on SIGTERM (one step), its re-plan and its
  warm-up (tens of seconds on a GPU), so growth is rate-limited: only in a quiet round (it
  started nothing, no pending job waits on resources, preemption or a hold, no GPU is
  held); only after `config.grow_after_s` (30 min) since the job last started, so a job
  shrunk for a burst of short jobs is not restarted as each one leaves; only by a point that
  buys `config.grow_min_gain` (10%) more predicted tokens/s within its GPU's free memory,
  the node's unreserved host memory and its owner's quota (the point a start would get
  there, by `choose_points`); one job a GPU a round, the largest weighted gain.

And one after a run: `above_floor`, what is left of a range once a job ran out of memory at
a point of it (its worker measured what would have held it): the points at or above that
floor, the lowest its new min; none when its max is under the floor.

Greedy by marginal gain is exact where the speed curve is concave in memory (it is: more
window buys less and less once the stream is hidden) and within one upgrade of the best
otherwise; the points are few (the planner is asked at ~5 per range), so it is cheap.

    a = RangedJob("a", 1.0, (BudgetPoint(12 * GIB, 24 * GIB, 900.0), BudgetPoint(...)))
    choose_points([a, b], free_device_bytes=40 * GIB, free_host_bytes=96 * GIB)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from wstrain.policy.gates import QuotaBook
from wstrain.policy.placement import Ledger
from wstrain.policy.state import BudgetPoint, PendingJob, PolicyConfig, RunningJob, gib_text

__all__ = [
    "BudgetPoint",
    "RangedJob",
    "Shrink",
    "above_floor",
    "budget_reason",
    "choose_growth",
    "choose_points",
    "choose_shrink",
    "current_point",
    "shrink_to_free",
]


@dataclass(frozen=True)
class RangedJob:
    """A job with a budget range: its points from min up, and its owner's weight."""

    id: str
    weight: float  # fair share's weight of its owner (1.0 when shares are equal)
    points: tuple[BudgetPoint, ...]  # ascending device bytes; points[0] is the min

    def __post_init__(self) -> None:
        if not self.points:
            raise ValueError(f"job {self.id}: a ranged job needs at least its min point")
        sizes = [p.device_bytes for p in self.points]
        if sizes != sorted(sizes):
            raise ValueError(f"job {self.id}: points must ascend by device bytes, got {sizes}")


# Speeds this close are one speed: two points whose plans are the same plan (a memory-flat
# job's) are predicted equal but for float rounding (1e-15 relative), and the larger point
# must not look faster by it.
SAME_SPEED = 1e-9


def _value(job: RangedJob, k: int) -> float:
    return job.weight * job.points[k].tokens_per_s


def _cost(extra_device: int, extra_host: int, room_device: int, room_host: int) -> float:
    """An upgrade's share of what is left to give: the scarcer resource counts more."""
    return extra_device / max(room_device, 1) + extra_host / max(room_host, 1)


def choose_points(
    jobs: Sequence[RangedJob], free_device_bytes: int, free_host_bytes: int
) -> dict[str, BudgetPoint] | None:
    """Each job's point: mins first, then upgrades by weighted tokens/s gained per share of
    the room left, while one fits. None when the mins alone do not fit."""
    at = dict.fromkeys((j.id for j in jobs), 0)
    left_device = free_device_bytes - sum(j.points[0].device_bytes for j in jobs)
    left_host = free_host_bytes - sum(j.points[0].host_bytes for j in jobs)
    if left_device < 0 or left_host < 0:
        return None
    while True:
        best: tuple[float, RangedJob, int] | None = None
        for job in jobs:
            now = job.points[at[job.id]]
            for k in range(at[job.id] + 1, len(job.points)):
                extra_device = job.points[k].device_bytes - now.device_bytes
                extra_host = job.points[k].host_bytes - now.host_bytes
                gain = _value(job, k) - _value(job, at[job.id])
                flat = gain <= SAME_SPEED * _value(job, at[job.id])
                if flat or extra_device > left_device or extra_host > left_host:
                    continue
                ratio = gain / max(_cost(extra_device, extra_host, left_device, left_host), 1e-12)
                if best is None or ratio > best[0]:
                    best = (ratio, job, k)
        if best is None:
            return {j.id: j.points[at[j.id]] for j in jobs}
        _, job, k = best
        left_device -= job.points[k].device_bytes - job.points[at[job.id]].device_bytes
        left_host -= job.points[k].host_bytes - job.points[at[job.id]].host_bytes
        at[job.id] = k


@dataclass(frozen=True)
class Shrink:
    """A running job moved down its range: from its current point to `to`."""

    job_id: str
    to: BudgetPoint
    freed_device_bytes: int
    freed_host_bytes: int


def shrink_to_free(
    running: Sequence[tuple[RangedJob, int]], need_device_bytes: int, need_host_bytes: int
) -> list[Shrink] | None:
    """Moves of ranged running jobs, each given with the index of its current point, down
    their ranges until `need_*` bytes are freed, losing the least weighted tokens/s per byte
    freed first. [] when nothing is needed; None when every job at its min frees too little."""
    at = {job.id: k for job, k in running}
    start = dict(at)
    freed_device = freed_host = 0
    by_id = {job.id: job for job, _ in running}
    while freed_device < need_device_bytes or freed_host < need_host_bytes:
        best: tuple[float, RangedJob, int] | None = None
        for job in by_id.values():
            now = job.points[at[job.id]]
            for k in range(at[job.id]):
                dev = now.device_bytes - job.points[k].device_bytes
                host = now.host_bytes - job.points[k].host_bytes
                useful = min(dev, max(need_device_bytes - freed_device, 0)) + min(
                    host, max(need_host_bytes - freed_host, 0)
                )
                if useful <= 0:
                    continue
                loss = _value(job, at[job.id]) - _value(job, k)
                ratio = max(loss, 0.0) / useful
                if best is None or ratio < best[0]:
                    best = (ratio, job, k)
        if best is None:
            return None
        _, job, k = best
        now = job.points[at[job.id]]
        freed_device += now.device_bytes - job.points[k].device_bytes
        freed_host += now.host_bytes - job.points[k].host_bytes
        at[job.id] = k
    return [
        Shrink(
            jid,
            by_id[jid].points[k],
            by_id[jid].points[start[jid]].device_bytes - by_id[jid].points[k].device_bytes,
            by_id[jid].points[start[jid]].host_bytes - by_id[jid].points[k].host_bytes,
        )
        for jid, k in at.items()
        if k != start[jid]
    ]


def current_point(job: RunningJob) -> int | None:
    """The index of the point a running ranged job holds, None when it holds none of them."""
    for k, p in enumerate(job.points):
        if (p.device_bytes, p.host_bytes) == (job.device_bytes, job.host_bytes):
            return k
    return None


def choose_shrink(
    job: PendingJob, device_bytes: int, host_bytes: int, ledger: Ledger, config: PolicyConfig
) -> tuple[int | None, list[Shrink]] | None:
    """Room for `job` on one GPU by shrinking ranged running jobs of its class or below that
    are on that GPU alone, at the least loss of weighted tokens/s: (GPU index, moves), or
    None. Not on a CPU node (one pool: the agent would have to restart every job in it) and
    not for an exclusive job (shrunk jobs stay)."""
    if ledger.cpu_only or job.exclusive:
        return None
    host_later = ledger.host_unheld_bytes(job) + ledger.host_stopping_bytes
    need_host = max(0, host_bytes - host_later)
    best: tuple[float, int | None, list[Shrink]] | None = None
    for slot in ledger.slots.values():
        if ledger.held_from(slot, job) or slot.total_bytes < device_bytes or slot.exclusive:
            continue
        ranged = []
        for r in slot.running:
            k = current_point(r) if r.points and not r.stopping and r.gpus == 1 else None
            if k is not None and r.priority <= job.priority:
                ranged.append((RangedJob(r.id, config.share(r.owner), r.points), k))
        free = slot.total_bytes - slot.used_bytes + slot.stopping_bytes
        moves = shrink_to_free(ranged, device_bytes - free, need_host) if ranged else None
        if not moves:  # None: not enough; []: it fits already (after_stops took it)
            continue
        at = {rj.id: (rj, k) for rj, k in ranged}
        loss = sum(
            at[m.job_id][0].weight * (at[m.job_id][0].points[at[m.job_id][1]].tokens_per_s)
            - at[m.job_id][0].weight * m.to.tokens_per_s
            for m in moves
        )
        if best is None or (loss, slot.index or 0) < (best[0], best[1] or 0):
            best = (loss, slot.index, moves)
    return None if best is None else (best[1], best[2])


def budget_reason(job: RangedJob, point: BudgetPoint) -> str:
    """What a ranged job got and why, for its state reason."""
    low, high = job.points[0], job.points[-1]
    return (
        f"budget {gib_text(point.device_bytes)} device, {gib_text(point.host_bytes)} host "
        f"of its range {gib_text(low.device_bytes)}-{gib_text(high.device_bytes)}: "
        f"{point.tokens_per_s:,.0f} predicted tokens/s "
        f"({high.tokens_per_s:,.0f} at its max, {low.tokens_per_s:,.0f} at its min)"
    )


def above_floor(
    points: Sequence[BudgetPoint], device_bytes: int, host_bytes: int
) -> tuple[BudgetPoint, ...]:
    """The points of a range that hold a job which ran out of memory: device and host each
    at least the floor its worker measured (0: that budget did not run out), min first."""
    return tuple(p for p in points if p.device_bytes >= device_bytes and p.host_bytes >= host_bytes)


def choose_growth(
    now_s: float, ledger: Ledger, book: QuotaBook, config: PolicyConfig, quiet: bool
) -> dict[str, BudgetPoint]:
    """Running ranged jobs to restart higher in their ranges: id -> the point a start would
    give it now (choose_points over its own memory and what its GPU, the node's host and its
    owner's quota have free), where that buys `config.grow_min_gain` more predicted
    tokens/s; one a GPU, the largest weighted gain (see the module docstring for when).
    `quiet`: the round started nothing and left no job waiting for memory; `ledger`: the
    node after the round's holds."""
    if not quiet or ledger.holds or ledger.cpu_only:
        return {}
    host_free = ledger.host_free_bytes
    grow: dict[str, BudgetPoint] = {}
    for slot in ledger.slots.values():
        best: tuple[float, RunningJob, BudgetPoint] | None = None
        for r in slot.running:
            k = current_point(r) if r.points and r.gpus == 1 and not r.stopping else None
            if k is None or now_s - r.started_s < config.grow_after_s:
                continue
            room_device, room_host = book.room(r.owner)
            job = RangedJob(r.id, config.share(r.owner), r.points)
            device = r.device_bytes + min(slot.free_bytes, room_device)
            host = r.host_bytes + min(host_free, room_host)
            to = (choose_points([job], device, host) or {}).get(r.id)
            now = r.points[k]
            if to is None or to.tokens_per_s < (1 + config.grow_min_gain) * now.tokens_per_s:
                continue
            gain = job.weight * (to.tokens_per_s - now.tokens_per_s)
            if best is None or gain > best[0]:
                best = (gain, r, to)
        if best is not None:
            _, r, to = best
            grow[r.id] = to
            host_free -= to.host_bytes - r.host_bytes
    return grow
