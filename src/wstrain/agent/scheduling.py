"""One scheduling round of an agent: read the queue's head, every placed job, the owners'
usage and the dependencies from the store; ask the pure policy (policy/) what to
start on this node's GPUs and what to preempt; claim the chosen jobs; write why the others
wait; charge this node's running jobs to their owners' fair-share usage. A job admitted
under a priority grant is decided at min(its class, its owner's grant now) (store/grants.py):
a revoked grant neither preempts nor shields from preemption from the next round on.

A job on several nodes is not claimed but joined (store/node_gangs.py): this agent holds its
share and becomes the next member of the job's gang; the last member to join claims the job
for member 0 (agent/members.py starts the workers).

Rounds of all agents are serialised by a lock in Redis (store/scheduling.py): the quota of an
owner whose jobs run on several nodes is checked against all of them at once.

    rounds = Rounds(store, node_name, agent_id, config)
    claimed = await rounds.run(node, running, elsewhere_placed)   # [(job_id, gpu, link share)]
"""

from __future__ import annotations

import logging
import socket
import time
from dataclasses import dataclass, field, replace

from wstrain.agent.members import Hold
from wstrain.contracts.jobs import JobState, gpu_indices, gpu_text
from wstrain.policy import (
    BudgetPoint,
    Decision,
    NodeState,
    PolicyConfig,
    RunningJob,
    Usage,
    WaitKind,
    decide,
    running_weight,
)
from wstrain.store import JobStore
from wstrain.store.grants import GrantStore
from wstrain.store.node_gangs import Member, NodeGangs
from wstrain.store.scheduling import PendingRow, SchedulingView

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
    joined: list[Hold] = field(default_factory=list)  # multi-node gangs this node joined
    # ranged running jobs stopped to restart lower in their ranges: id -> (the point they
    # are shrunk to, the job they make room for, as preempt words it)
    shrink: dict[str, tuple[BudgetPoint, str]] = field(default_factory=dict)
    # ranged running jobs to restart higher in their ranges, into room no one waits for
    grow: dict[str, BudgetPoint] = field(default_factory=dict)


@dataclass(frozen=True)
class GangSettings:
    """How this agent joins multi-node gangs (AgentSettings.advertise_addr, gang_assembly_s)."""

    advertise_addr: str = "127.0.0.1"
    assembly_s: float = 60.0


class Rounds:
    def __init__(
        self,
        store: JobStore,
        node: str,
        agent_id: str,
        config: PolicyConfig,
        lease_s: float,
        gang: GangSettings | None = None,
    ) -> None:
        self.view = SchedulingView(store)
        self.gangs = NodeGangs(store)
        self.grants = GrantStore(store)
        self.gang = gang or GangSettings()
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

    async def run(
        self,
        node: NodeState,
        running: list[RunningJob],
        max_starts: int,
        joined: frozenset[str] = frozenset(),
        cpu_slots: int = 0,
    ) -> Outcome:
        """One round under the lock, starting jobs of at most `max_starts` ranks in all (a
        CPU node's free slots, of `cpu_slots` in all; a GPU node packs by memory alone);
        nothing when another agent is deciding. `joined`: multi-node jobs whose gang this
        node is in already (its holds are among `running`)."""
        if not await self.view.acquire(self.agent_id, LOCK_TTL_S):
            return Outcome([], {}, None)
        try:
            return await self._round(node, running, max_starts, joined, cpu_slots)
        finally:
            await self.view.release(self.agent_id)

    async def _join(self, row: PendingRow, gpus: tuple[int, ...], now: float) -> Hold | str:
        """Join the gang of the multi-node job `row`: this node's hold, or why it waits."""
        alive = len(await self.view.store.nodes())
        if alive < row.nodes:  # a gang could only hold its share and time out, again and again
            return (
                f"gang: needs {row.nodes} nodes, {alive} agent(s) heartbeat now; it joins no "
                "gang until enough nodes run an agent"
            )
        got = await self.gangs.join(
            row.id,
            Member(self.node, self.agent_id, gpu_text(gpus)),
            row.nodes,
            self.gang.assembly_s,
            self.gang.advertise_addr,
            free_port(),
        )
        if got.status == 0:
            if got.detail.startswith("assembling "):
                # the other job may be another owner's: its id is not this owner's to see
                return (
                    "gang: another multi-node job's gang of nodes is assembling; one "
                    "multi-node job assembles at a time, holding nothing meanwhile"
                )
            return ""
        if got.status == 2:  # the gang is whole: claimed for its node 0, which plans it
            gang = await self.gangs.get(row.id)
            if gang is not None:
                first = gang.members[0]
                await self.view.store.claim(
                    row.id, first.node, gpu_indices(first.gpus), first.agent_id, self.lease_s
                )
        log.info("job %s: %s joined its gang (%s of %d)", row.id, self.node, got.detail, row.nodes)
        return Hold(
            row.id,
            row.owner,
            row.priority,
            row.device_bytes,
            row.host_bytes,
            gpus,
            row.gpus,
            row.exclusive,
            now,
        )

    async def _round(
        self,
        node: NodeState,
        running: list[RunningJob],
        max_starts: int,
        joined: frozenset[str],
        cpu_slots: int,
    ) -> Outcome:
        now = time.time()
        rows = [r for r in await self.view.pending(QUEUE_HEAD) if r.id not in joined]
        if not rows and not any(j.points for j in running):  # nothing to start or grow
            return Outcome([], {}, None)
        placed = await self.view.placed()
        here = {j.id for j in running}
        elsewhere = [p.running() for p in placed if p.node != self.node and p.id not in here]
        deps = sorted({d for r in rows for d in r.after})
        states = {k: JobState(v) for k, v in (await self.view.states(deps)).items() if v}
        usage = {
            o: Usage(u, now)
            for o, u in (await self.view.usage(now, self.config.half_life_s)).items()
        }
        caps = await self.grants.caps(
            [(r.id, r.owner, r.priority) for r in rows]
            + [(j.id, j.owner, j.priority) for j in (*running, *elsewhere)]
        )
        running, elsewhere = _capped(running, caps), _capped(elsewhere, caps)
        pending = [r.pending(caps.get(r.id)) for r in rows]
        decision = decide(
            now, pending, running, node, usage, self.config, states, elsewhere=elsewhere
        )
        claimed, reasons, holds = [], dict(decision.reasons), []
        sizes = {r.id: r.gpus for r in rows}
        by_id = {r.id: r for r in rows}
        slots_left = max_starts  # a CPU node's free slots: a gang takes one per rank
        for start in decision.start:
            size = sizes.get(start.job_id, 1)
            if size > slots_left:
                reasons[start.job_id] = slots_reason(size, slots_left, cpu_slots)
                continue
            gpu = start.gpu_index
            gpus = decision.gangs.get(start.job_id) or (() if gpu is None else (gpu,))
            if (row := by_id.get(start.job_id)) is not None and row.nodes > 1:
                hold = await self._join(row, gpus, now)
                if isinstance(hold, Hold):
                    holds.append(hold)
                    slots_left -= size
                    reasons[row.id] = (
                        f"gang: {self.node} joined; waiting up to {self.gang.assembly_s:.0f} s "
                        f"for all {row.nodes} nodes (WSTRAIN_GANG_ASSEMBLY_S)"
                    )
                elif hold:
                    reasons[row.id] = hold
                continue
            ok = await self.view.claim_one(
                start.job_id, self.node, gpus, self.agent_id, self.lease_s
            )
            if ok and (point := decision.budgets.get(start.job_id)) is not None:
                # a ranged job runs at the point of its range the policy chose for it now
                await self.view.choose_budget(start.job_id, point, self.agent_id)
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
        owner_of = {j.id: j.owner for j in running}

        def room_for(victim: str) -> str:
            held = by_id.get(for_gpu.get(gpu_of.get(victim), ""))
            return preemptor_text(owner_of.get(victim, ""), held)

        preempt = {v: room_for(v) for v in decision.preempt}
        shrink = {v: (point, room_for(v)) for v, point in decision.shrink.items()}
        await self.view.set_reasons(reasons)
        return Outcome(claimed, preempt, decision, holds, shrink, dict(decision.grow))


def slots_reason(size: int, free: int, total: int) -> str:
    """Why a job the memory check would start waits on a CPU node: its ranks need more of
    the node's CPU slots than are free (a one-rank job behind busy slots, a gang)."""
    if size > 1:
        return f"resources: needs {size} CPU slots, {free} free on the node (WSTRAIN_CPU_SLOTS)"
    if total > 0:
        return f"resources: {total - free} of {total} CPU slots busy (WSTRAIN_CPU_SLOTS)"
    return "resources: every CPU slot of the node is busy (WSTRAIN_CPU_SLOTS)"


def preemptor_text(victim_owner: str, preemptor: PendingRow | None) -> str:
    """The job a preempted job makes room for, as the victim's owner reads it in its events:
    by id when it is the same owner's, else by priority only (another owner's job ids are
    not theirs to see)."""
    if preemptor is None:
        return "a higher-priority job"
    if preemptor.owner == victim_owner:
        return f"job {preemptor.id}"
    return f"another owner's job of priority {preemptor.priority}"


def free_port() -> int:
    """A free TCP port on this host: a multi-node job's MASTER_PORT when this node is its
    node 0 (bound on all interfaces: the other nodes connect to it)."""
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def _capped(jobs: list[RunningJob], caps: dict[str, int]) -> list[RunningJob]:
    return [replace(j, priority=caps[j.id]) if j.id in caps else j for j in jobs]
