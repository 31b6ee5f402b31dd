"""One scheduling round of an agent: read the queue's head, every placed job, the owners'
usage and the dependencies from the store; ask the pure policy (scheduler/policy/) what to
start on this node's GPUs and what to preempt; claim the chosen jobs; write why the others
wait; charge this node's running jobs to their owners' fair-share usage.

Rounds of all agents are serialised by a lock in Redis (store/scheduling.py): the quota of an
owner whose jobs run on several nodes is checked against all of them at once.

    rounds = Rounds(store, node_name, agent_id, config)
    claimed = await rounds.run(node, running, elsewhere_placed)   # [(job_id, gpu, link share)]
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from wstrain.scheduler.contracts.jobs import JobState
from wstrain.scheduler.policy import (
    Decision,
    NodeState,
    PendingJob,
    PolicyConfig,
    RunningJob,
    Usage,
    WaitKind,
    decide,
    running_weight,
)
from wstrain.scheduler.store import JobStore
from wstrain.scheduler.store.scheduling import PlacedRow, SchedulingView

log = logging.getLogger(__name__)

# The head of the queue a round considers: a lab queue of thousands waits behind these 500
# (each round reads them in two pipelined round trips, ~5 ms on loopback).
QUEUE_HEAD = 500
LOCK_TTL_S = 10.0  # a round reads, decides and claims in well under a second


@dataclass(frozen=True)
class Claimed:
    job_id: str
    gpus: tuple[int, ...]  # its GPUs, all of a gang's; () on a CPU node's pseudo-device
    link_share: int  # jobs sharing its first GPU's PCIe link, this one included


@dataclass(frozen=True)
class Outcome:
    claimed: list[Claimed]
    preempt: dict[str, str]  # victim id -> the job it makes room for
    decision: Decision | None  # None: another agent held the lock


class Rounds:
    def __init__(
        self, store: JobStore, node: str, agent_id: str, config: PolicyConfig, lease_s: float
    ) -> None:
        self.view = SchedulingView(store)
        self.node, self.agent_id, self.config, self.lease_s = node, agent_id, config, lease_s
        self._charged_s = time.time()

    async def charge(self, node: NodeState, running: list[RunningJob]) -> None:
        """Add the GPU-seconds this node's jobs used since the last charge to their
        owners (weighted by the share of their GPU they reserve)."""
        now = time.time()
        elapsed_s, self._charged_s = max(0.0, now - self._charged_s), now
        used: dict[str, float] = {}
        for job in running:
            ran_s = min(elapsed_s, max(0.0, now - job.started_s))
            used[job.owner] = used.get(job.owner, 0.0) + ran_s * running_weight(job, node)
        await self.view.add_usage(now, self.config.half_life_s, used)

    async def run(self, node: NodeState, running: list[RunningJob], max_starts: int) -> Outcome:
        """One round under the lock, starting jobs of at most `max_starts` ranks in all (a
        CPU node's free slots; a GPU node packs by memory alone); nothing when another
        agent is deciding."""
        if not await self.view.acquire(self.agent_id, LOCK_TTL_S):
            return Outcome([], {}, None)
        try:
            return await self._round(node, running, max_starts)
        finally:
            await self.view.release(self.agent_id)

    async def _round(self, node: NodeState, running: list[RunningJob], max_starts: int) -> Outcome:
        now = time.time()
        rows = await self.view.pending(QUEUE_HEAD)
        if not rows:
            return Outcome([], {}, None)
        placed = await self.view.placed()
        here = {j.id for j in running}
        elsewhere = [_running(p) for p in placed if p.node != self.node and p.id not in here]
        deps = sorted({d for r in rows for d in r.after})
        states = {k: JobState(v) for k, v in (await self.view.states(deps)).items() if v}
        usage = {
            o: Usage(u, now)
            for o, u in (await self.view.usage(now, self.config.half_life_s)).items()
        }
        pending = [
            PendingJob(
                r.id,
                r.owner,
                r.priority,
                r.queued_at,
                r.device_bytes,
                r.host_bytes,
                r.exclusive,
                r.after,
                r.not_before or None,
                gpus=r.gpus,
            )
            for r in rows
        ]
        decision = decide(
            now, pending, running, node, usage, self.config, states, elsewhere=elsewhere
        )
        claimed, reasons = [], dict(decision.reasons)
        sizes = {r.id: r.gpus for r in rows}
        slots_left = max_starts  # a CPU node's free slots: a gang takes one per rank
        for start in decision.start:
            size = sizes.get(start.job_id, 1)
            if size > slots_left:
                if size > 1:
                    reasons[start.job_id] = (
                        f"resources: needs {size} CPU slots, {slots_left} free on the node "
                        "(WSTRAIN_CPU_SLOTS)"
                    )
                continue
            gpu = start.gpu_index
            gpus = decision.gangs.get(start.job_id) or (() if gpu is None else (gpu,))
            ok = await self.view.claim_one(
                start.job_id, self.node, gpus, self.agent_id, self.lease_s
            )
            if ok:
                claimed.append(Claimed(start.job_id, gpus, start.link_share))
                slots_left -= size
        # a preempted job makes room for the held job of its GPU
        for_gpu = {
            gpu: jid
            for jid, gpu in decision.held.items()
            if decision.kinds.get(jid) is WaitKind.preemption
        }
        gpu_of = {j.id: j.gpu_index for j in running}
        preempt = {v: for_gpu.get(gpu_of.get(v), "a higher-priority job") for v in decision.preempt}
        await self.view.set_reasons(reasons)
        return Outcome(claimed, preempt, decision)


def _running(p: PlacedRow) -> RunningJob:
    return RunningJob(
        p.id,
        p.owner,
        p.priority,
        p.gpu,
        p.device_bytes,
        p.host_bytes,
        p.started_at,
        gpus=p.gpus,
        gang=p.gang,
    )
