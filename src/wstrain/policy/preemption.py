"""Preemption: which running jobs a higher-class pending job that cannot be placed stops to
make room for itself, on one GPU. The agent SIGTERMs the victims; they write a checkpoint
and go back to the queue (keeping their submission time), so they lose at most the work
since their last checkpoint.

Rule. A pending job j of class c may evict jobs of classes strictly below c, all on ONE GPU
g that no job ahead of j holds, and only when evicting them really makes j fit:

    total(g) − used(g) + stopping(g) + Σ device_bytes(victims)  ≥  device_bytes(j)
    host_unheld + host_stopping + Σ host_bytes(victims)          ≥  host_bytes(j)

where stopping(g) and host_stopping are the bytes of jobs already being stopped (they are
leaving; they are never picked twice). An exclusive job on g must be among the victims (or
already stopping) for anything to be packed there; an exclusive j needs every job on g gone,
so every job on g must be of a lower class, and none may have been started this round.

Choice. On each GPU, the fewest victims; among sets of that size, the first in the order
(class ascending, then start time descending: the lowest class, then the most recently
started, which has done the least work since its start). Across GPUs: fewest victims, then
the lower sorted (class, −start) list, then the lower index. Sets are searched size by size
in that order; a GPU whose search passes `PolicyConfig.max_victim_sets` tries settles for
the greedy set (lowest class first, the largest first within a class).

    eviction = choose_victims(job, device_bytes, host_bytes, ledger, config)
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from wstrain.policy.placement import Ledger, Slot
from wstrain.policy.state import PendingJob, PolicyConfig, RunningJob


@dataclass(frozen=True)
class Eviction:
    slot_index: int | None
    victims: tuple[RunningJob, ...]

    def key(self) -> tuple[int, tuple[tuple[int, float], ...], int]:
        ranks = tuple(sorted((v.priority, -v.started_s) for v in self.victims))
        return len(self.victims), ranks, self.slot_index or 0


def _preference(job: RunningJob) -> tuple[int, float, str]:
    return job.priority, -job.started_s, job.id


def _makes_room(
    victims: Sequence[RunningJob],
    slot: Slot,
    device_bytes: int,
    host_bytes: int,
    host_later_bytes: int,
    ledger: Ledger,
) -> bool:
    device_freed = host_freed = 0
    for v in victims:
        dev, host = ledger.demand(v)
        device_freed += dev
        host_freed += host
    live_exclusive = sum(1 for j in slot.running if j.exclusive and not j.stopping)
    started_exclusive = (
        slot.exclusive - live_exclusive - sum(1 for j in slot.running if j.exclusive and j.stopping)
    )
    if started_exclusive or live_exclusive > sum(1 for v in victims if v.exclusive):
        return False  # an exclusive job stays on the GPU
    free = slot.total_bytes - slot.used_bytes + slot.stopping_bytes + device_freed
    return free >= device_bytes and (ledger.cpu_only or host_later_bytes + host_freed >= host_bytes)


def _search(
    candidates: list[RunningJob],
    slot: Slot,
    device_bytes: int,
    host_bytes: int,
    host_later_bytes: int,
    ledger: Ledger,
    max_sets: int,
) -> tuple[RunningJob, ...] | None:
    if not _makes_room(candidates, slot, device_bytes, host_bytes, host_later_bytes, ledger):
        return None  # not even every candidate would do: no need to try the subsets
    # no set smaller than the fewest largest candidates covering the device deficit fits
    deficit = device_bytes - (slot.total_bytes - slot.used_bytes + slot.stopping_bytes)
    smallest, covered = 1, 0
    for n, dev in enumerate(sorted((ledger.demand(c)[0] for c in candidates), reverse=True)):
        covered += dev
        smallest = n + 1
        if covered >= deficit:
            break
    tries = 0
    for size in range(smallest, len(candidates) + 1):
        for combo in itertools.combinations(candidates, size):
            if _makes_room(combo, slot, device_bytes, host_bytes, host_later_bytes, ledger):
                return combo
            tries += 1
            if tries >= max_sets:
                return _greedy(candidates, slot, device_bytes, host_bytes, host_later_bytes, ledger)
    return None


def _greedy(
    candidates: list[RunningJob],
    slot: Slot,
    device_bytes: int,
    host_bytes: int,
    host_later_bytes: int,
    ledger: Ledger,
) -> tuple[RunningJob, ...] | None:
    chosen: list[RunningJob] = []
    for v in sorted(candidates, key=lambda j: (j.priority, -j.device_bytes, -j.started_s)):
        chosen.append(v)
        if _makes_room(chosen, slot, device_bytes, host_bytes, host_later_bytes, ledger):
            return tuple(chosen)
    return None


def choose_victims(
    job: PendingJob, device_bytes: int, host_bytes: int, ledger: Ledger, config: PolicyConfig
) -> Eviction | None:
    """The eviction that lets `job` fit with the fewest, lowest-class victims, or None when
    no set of lower-class jobs on one unheld GPU would make it fit."""
    host_later = ledger.host_unheld_bytes(job) + ledger.host_stopping_bytes
    best: Eviction | None = None
    for slot in ledger.slots.values():
        if ledger.held_from(slot, job) or slot.total_bytes < device_bytes:
            continue
        live = [j for j in slot.running if not j.stopping]
        candidates = sorted((j for j in live if j.priority < job.priority), key=_preference)
        if not candidates:
            continue
        if job.exclusive:
            # every job on the GPU goes: all must be of a lower class and none new this round
            if len(candidates) < len(live) or slot.live > len(live):
                continue
            found: tuple[RunningJob, ...] | None = tuple(candidates)
            if not _makes_room(candidates, slot, device_bytes, host_bytes, host_later, ledger):
                found = None
        else:
            found = _search(
                candidates,
                slot,
                device_bytes,
                host_bytes,
                host_later,
                ledger,
                config.max_victim_sets,
            )
        if found is None:
            continue
        eviction = Eviction(slot.index, found)
        if best is None or eviction.key() < best.key():
            best = eviction
    return best
