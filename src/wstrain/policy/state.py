"""What the scheduling policy reads and what it returns: frozen values, no I/O.

The agent builds these from the store each decision round and hands them to
`policy.decide(now_s, pending, running, node, usage, config, dependencies, elsewhere)`:

    node = NodeState(gpus=(Gpu(0, 141 * GIB), Gpu(1, 141 * GIB)), host_bytes=2048 * GIB)
    pending = [PendingJob("0123456789ab", "ana", priority=0, submitted_s=t, device_bytes=...)]
    running = [RunningJob("ba9876543210", "ben", 0, gpu_index=1, device_bytes=..., ...)]

A CPU node has `gpus=()`: its one pseudo-device is host memory, so a job there needs its
device and host budgets together out of `host_bytes` (as the agent's `_free_bytes` does),
and its GPU index is None. A job on several GPUs (`gpus` > 1, a gang) has its device
budget on each: a running one names them all in `gang`, its first as `gpu_index`.

Every byte count is a whole number of bytes; `gib_text` renders them for reasons.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from wstrain.contracts.calibration import GIB

# Slurm's PriorityDecayHalfLife default: last week's GPU-hours count half as much as today's.
DEFAULT_HALF_LIFE_S = 7 * 86400.0
# a ranged job grows back at most every 30 min (budgets.py choose_growth)
DEFAULT_GROW_AFTER_S = 1800.0
DEFAULT_GROW_MIN_GAIN = 0.10  # ... and only for 10% more predicted tokens/s
DEFAULT_SHARE = 1.0  # an owner not named in PolicyConfig.shares: equal shares by default


def gib_text(n_bytes: float) -> str:
    """Bytes as GiB with one decimal, the unit of every reason ("20.0 GiB")."""
    return f"{n_bytes / GIB:.1f} GiB"


def gib_count(n_bytes: float) -> str:
    """Bytes as a bare GiB figure without a trailing .0 ("40", "12.5"), for quota reasons."""
    value = round(n_bytes / GIB, 1)
    return f"{value:.0f}" if value == math.floor(value) else f"{value:.1f}"


class WaitKind(str, enum.Enum):  # noqa: UP042 - the value is the reason's prefix
    """Why a pending job was not started this round; each reason text starts `<value>: `."""

    back_off = "back-off"  # its retry back-off has not passed
    dependency = "dependency"  # a job of its `after` has not succeeded
    quota = "quota"  # its owner's quota would be exceeded
    preemption = "preemption"  # lower-class jobs are being stopped to make room for it
    priority = "priority"  # it fits, but only where a job ahead of it is being given room
    resources = "resources"  # no GPU (or no host memory) has room for it now


@dataclass(frozen=True)
class Gpu:
    index: int
    total_bytes: int


@dataclass(frozen=True)
class NodeState:
    """One host: its GPUs (empty on a CPU node) and its host memory the jobs may reserve."""

    gpus: tuple[Gpu, ...]
    host_bytes: int
    disk_bytes: int = 0  # the spill directory's space for the disk tier (0: none)

    @property
    def cpu_only(self) -> bool:
        return not self.gpus


@dataclass(frozen=True)
class BudgetPoint:
    """One point of a ranged job's budget range and the tokens/s the planner predicts there."""

    device_bytes: int
    host_bytes: int
    tokens_per_s: float


@dataclass(frozen=True)
class PendingJob:
    """A queued job the policy may start. `submitted_s` orders jobs within an owner's equal
    factor (a requeued job keeps its first submission time, so it keeps its place)."""

    id: str
    owner: str
    priority: int  # the JobSpec's class, -100..100, higher first
    submitted_s: float
    device_bytes: int
    host_bytes: int
    exclusive: bool = False
    after: tuple[str, ...] = ()  # ids that must succeed first
    not_before_s: float | None = None  # retry back-off: not started before this time
    retries: int = 0  # automatic retries so far (the back-off reason names the next one)
    gpus: int = 1  # GPUs of one node it takes at once, all or none, device_bytes on each
    # a ranged budget's points from its min up (device_bytes, host_bytes are the min's): it
    # is placed at its min, then given what its GPU has left by predicted speed (budgets.py)
    points: tuple[BudgetPoint, ...] = ()
    disk_bytes: int = 0  # its disk budget: spill space it reserves on the node (the disk tier)

    def __post_init__(self) -> None:
        low = self.points[0] if self.points else None
        if low is not None and (low.device_bytes, low.host_bytes) != (
            self.device_bytes,
            self.host_bytes,
        ):
            raise ValueError(
                f"job {self.id}: a ranged job is placed at its min, so its budget "
                f"({self.device_bytes}, {self.host_bytes}) must be its first point's "
                f"({low.device_bytes}, {low.host_bytes})"
            )


@dataclass(frozen=True)
class RunningJob:
    """A job holding its budgets on this node. `stopping`: it was sent SIGTERM (preempted
    or cancelled) and still holds its memory until its worker exits; it is never picked as a
    victim twice."""

    id: str
    owner: str
    priority: int
    gpu_index: int | None  # None on a CPU node
    device_bytes: int
    host_bytes: int
    started_s: float
    exclusive: bool = False
    stopping: bool = False
    gpus: int = 1  # GPUs it holds, device_bytes on each (on a CPU node: of the one pool)
    gang: tuple[int, ...] = ()  # with gpus > 1 on a GPU node: all its GPUs, gpu_index first
    # a ranged budget's points from its min up, its current one among them: a job that can
    # be shrunk (restarted lower in its range) rather than preempted (budgets.py)
    points: tuple[BudgetPoint, ...] = ()
    disk_bytes: int = 0  # the spill space its disk budget reserves

    @property
    def gpu_indices(self) -> tuple[int | None, ...]:
        """Every GPU whose memory it holds (None: a CPU node's pseudo-device)."""
        return self.gang or (self.gpu_index,)


@dataclass(frozen=True)
class Quota:
    """One owner's ceiling on what it holds at once; None: no ceiling on that figure."""

    max_jobs: int | None = None
    max_device_bytes: int | None = None
    max_host_bytes: int | None = None

    @classmethod
    def from_gib(
        cls,
        max_jobs: int | None = None,
        device_gib: float | None = None,
        host_gib: float | None = None,
    ) -> Quota:
        return cls(
            max_jobs,
            None if device_gib is None else int(device_gib * GIB),
            None if host_gib is None else int(host_gib * GIB),
        )


@dataclass(frozen=True)
class PolicyConfig:
    """The policy's knobs. `shares`: an owner absent from it has DEFAULT_SHARE; `quotas`: an
    owner absent from it has none. `drain`: the first job in the order that finds no room
    holds the GPU closest to taking it, so the jobs behind it cannot fill every hole that
    opens there (False: plain backfill, only preemption and stopping holds)."""

    half_life_s: float = DEFAULT_HALF_LIFE_S
    shares: Mapping[str, float] = field(default_factory=dict)
    quotas: Mapping[str, Quota] = field(default_factory=dict)
    drain: bool = True
    # combinations of victims tried per GPU before the search settles for the greedy choice:
    # 11 jobs of 12 GiB on a 141 GiB GPU need at most C(11, 5) = 462 tries per size
    max_victim_sets: int = 20_000
    # growing a ranged job back (budgets.py choose_growth): a restart costs a step, a re-plan and a
    # warm-up (tens of seconds on a GPU), so not before this long since its last start, and
    # only for this much more predicted tokens/s
    grow_after_s: float = DEFAULT_GROW_AFTER_S
    grow_min_gain: float = DEFAULT_GROW_MIN_GAIN

    def share(self, owner: str) -> float:
        return self.shares.get(owner, DEFAULT_SHARE)


class Start(NamedTuple):
    """Start this job on this GPU (None: the CPU node's pseudo-device); `link_share`: the
    jobs that will share that GPU's PCIe link, this one included (1 on a CPU node). A job
    on several GPUs names the first here; Decision.gangs has them all."""

    job_id: str
    gpu_index: int | None
    link_share: int


@dataclass(frozen=True)
class Decision:
    """One round's outcome.

    start: jobs to start now, in order. preempt: running jobs to SIGTERM (they checkpoint
    and requeue). reasons: every pending job not started, why (`kinds` says which rule).
    order: every pending job, in the order the policy considered them (`wstrain queue`).
    held: pending jobs given room ahead of later ones, with the GPU kept for them.
    unsatisfiable: pending jobs with a dependency that ended failed, cancelled, timed out or
    is unknown: they can never start as they are. factors: each owner's fair-share factor.
    gangs: every GPU of each job started on several (policy/gangs.py), its Start's first.
    budgets: each ranged job started, the point of its range it starts at (budgets.py).
    shrink: running ranged jobs to stop at a checkpoint and restart on their GPU lower in
    their range, each with the point to restart at, to make room instead of preempting.
    grow: running ranged jobs to stop at a checkpoint and restart higher in their range,
    each with the point it has room for, where no one waits for the memory (budgets.py
    choose_growth).
    """

    start: tuple[Start, ...]
    preempt: tuple[str, ...]
    reasons: Mapping[str, str]
    kinds: Mapping[str, WaitKind]
    order: tuple[str, ...]
    held: Mapping[str, int | None]
    unsatisfiable: tuple[str, ...]
    factors: Mapping[str, float]
    gangs: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    budgets: Mapping[str, BudgetPoint] = field(default_factory=dict)
    shrink: Mapping[str, BudgetPoint] = field(default_factory=dict)
    grow: Mapping[str, BudgetPoint] = field(default_factory=dict)
