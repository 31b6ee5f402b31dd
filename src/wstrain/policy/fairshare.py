"""Fair share with decay: each owner's usage, Slurm's classic fair-share factor, and the
order in which pending jobs are considered.

Usage. A running job is charged, per second it runs, the share of its GPU it reserves:

    weight = device_bytes / gpu_total_bytes   (1 for an exclusive job: it holds the GPU)
    weight = (device_bytes + host_bytes) / host_bytes_of_node   on a CPU node

so a 20 GiB job on a 141 GiB H200 costs 0.142 GPU-seconds a second (on two GPUs, 0.284:
a gang is charged for each of its GPUs). An owner's usage decays exponentially with a
half-life H (default 7 days, Slurm's PriorityDecayHalfLife):

    usage(t) = usage(t0) · 2^(−(t − t0) / H) + new GPU-seconds charged at t

Factor. With U_o the owner's decayed usage, U = Σ U over all owners, S_o its share
(default 1) and S = Σ S over the owners in play (those with shares configured, usage,
pending or running jobs):

    F_o = 2^(−(U_o / U) / (S_o / S))        (F_o = 1 when U = 0)

An owner that used exactly its share gets F = 0.5; one that used nothing, 1; one that used
everything alone, 2^(−S/S_o). Pending jobs are considered by priority class (higher
first), then by their owner's factor (higher first), then by submission time (older first),
then by id, so the order is total and the same on every agent.

    usage = charge(usage, running, node, since_s=last_round_s, now_s=now_s)
    factors = fair_share_factors(usage, owners, config, now_s)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from wstrain.policy.state import (
    DEFAULT_HALF_LIFE_S,
    NodeState,
    PendingJob,
    PolicyConfig,
    RunningJob,
)


@dataclass(frozen=True)
class Usage:
    """An owner's decayed GPU-seconds as of `at_s`. Values only: `decayed` and `add` return
    new ones."""

    gpu_s: float = 0.0
    at_s: float = 0.0

    def decayed(self, now_s: float, half_life_s: float = DEFAULT_HALF_LIFE_S) -> Usage:
        """The usage seen from `now_s`: 2^(−Δt/H) of it. A clock that went back (another
        agent's clock ahead of ours) decays nothing rather than growing the usage."""
        if now_s <= self.at_s:
            return self
        return Usage(self.gpu_s * 2.0 ** (-(now_s - self.at_s) / half_life_s), now_s)

    def add(self, now_s: float, gpu_s: float, half_life_s: float = DEFAULT_HALF_LIFE_S) -> Usage:
        """Decay to `now_s`, then charge `gpu_s` GPU-seconds."""
        base = self.decayed(now_s, half_life_s)
        return Usage(base.gpu_s + gpu_s, base.at_s)


def job_weight(
    device_bytes: int, host_bytes: int, exclusive: bool, gpu_index: int | None, node: NodeState
) -> float:
    """GPU-seconds a job is charged per second: the share of its GPU it reserves (1 when
    exclusive), never more than 1; on a CPU node, its share of the host's memory."""
    if node.cpu_only or gpu_index is None:
        return min(1.0, (device_bytes + host_bytes) / max(1, node.host_bytes))
    if exclusive:
        return 1.0
    total = next((g.total_bytes for g in node.gpus if g.index == gpu_index), 0)
    return min(1.0, device_bytes / total) if total > 0 else 1.0


def running_weight(job: RunningJob, node: NodeState) -> float:
    """A job's charge per second: a gang's is the sum over its GPUs."""
    if node.cpu_only or job.gpu_index is None:  # the pool holds its budget once per GPU
        dev = job.device_bytes * job.gpus
        return job_weight(dev, job.host_bytes, job.exclusive, job.gpu_index, node)
    return sum(
        job_weight(job.device_bytes, job.host_bytes, job.exclusive, g, node)
        for g in job.gpu_indices
    )


def charge(
    usage: Mapping[str, Usage],
    running: Iterable[RunningJob],
    node: NodeState,
    since_s: float,
    now_s: float,
    half_life_s: float = DEFAULT_HALF_LIFE_S,
) -> dict[str, Usage]:
    """The usage after charging every running job for the part of (since_s, now_s] it ran:
    (now_s − max(since_s, started_s)) × its weight, added to its owner at `now_s`. Owners
    without running jobs are carried over unchanged (they decay when read)."""
    gained: dict[str, float] = {}
    for job in running:
        ran_s = max(0.0, now_s - max(since_s, job.started_s))
        gained[job.owner] = gained.get(job.owner, 0.0) + ran_s * running_weight(job, node)
    out = dict(usage)
    for owner, gpu_s in gained.items():
        out[owner] = out.get(owner, Usage(0.0, now_s)).add(now_s, gpu_s, half_life_s)
    return out


def owners_in_play(
    usage: Mapping[str, Usage],
    pending: Iterable[PendingJob],
    running: Iterable[RunningJob],
    config: PolicyConfig,
) -> list[str]:
    """The owners whose shares make up S: configured, with usage, or with jobs here."""
    names = set(config.shares) | set(usage)
    names.update(j.owner for j in pending)
    names.update(j.owner for j in running)
    return sorted(names)


def fair_share_factors(
    usage: Mapping[str, Usage], owners: Sequence[str], config: PolicyConfig, now_s: float
) -> dict[str, float]:
    """F_o = 2^(−(U_o/U)/(S_o/S)) for every owner of `owners` (1 each when U = 0)."""
    decayed = {
        o: usage[o].decayed(now_s, config.half_life_s).gpu_s if o in usage else 0.0 for o in owners
    }
    total_usage = sum(decayed.values())
    total_shares = sum(config.share(o) for o in owners)
    factors: dict[str, float] = {}
    for owner in owners:
        share = config.share(owner)
        if total_usage <= 0.0:
            factors[owner] = 1.0
        elif share <= 0.0:
            factors[owner] = 0.0  # no share: only what nobody with a share wants
        else:
            used = decayed[owner] / total_usage
            factors[owner] = 2.0 ** (-used / (share / total_shares))
    return factors


def order_key(job: PendingJob, factors: Mapping[str, float]) -> tuple[int, float, float, str]:
    """Priority class (desc), owner's factor (desc), submission (asc), id."""
    return (-job.priority, -factors.get(job.owner, 1.0), job.submitted_s, job.id)


def ordered(pending: Iterable[PendingJob], factors: Mapping[str, float]) -> list[PendingJob]:
    return sorted(pending, key=lambda j: order_key(j, factors))
