"""This agent's part in jobs on several nodes (JobSpec.nodes > 1; store/node_gangs.py): the
shares it holds while a gang assembles, the workers it runs for gangs whose node 0 is
another agent, and how the members of one attempt stop together.

- A hold (this node joined a gang that is still assembling) counts as a running job in the
  node's policy rounds and CPU slots until the gang is whole (it then becomes a worker) or
  the assembly times out (released: the job waits again, holding nothing here).
- Node 0 (the first member) plans the job and starts its worker through the agent's usual
  path (launch.py `_start`, a lease and a supervised WorkerHandle); its result alone settles
  the job. Its worker gets NNODES, NODE_RANK=0, MASTER_ADDR, MASTER_PORT.
- Node i > 0 starts its worker once the job runs (node 0 wrote plan.json into the shared
  job dir), with NODE_RANK=i, logging to worker-node{i}.log. That worker reports nothing;
  exit 0 or 3 (the gang finished or stopped at a step together) settles nothing. Any other
  exit fails the attempt: recorded on the job (`member_failed`), node 0's agent kills its
  worker and retries the job per max_retries as for any dead worker.
- When the attempt ends (the job succeeded, failed, was requeued: its state or attempt
  changed) a member's worker still running is killed with its process group.

    members = Members(store, name, agent_id, spawn_member, start_leader)
    members.add(outcome.joined); await members.tick(agent.workers)   # every loop
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import cast

from wstrain.agent.outcomes import describe_exit
from wstrain.agent.processes import kill_group
from wstrain.agent.supervisor import WorkerHandle
from wstrain.agent.zygote import WorkerProcess
from wstrain.contracts.jobs import Job, JobState, WorkerExit
from wstrain.policy import RunningJob
from wstrain.store import JobStore
from wstrain.store.node_gangs import Gang, NodeGangs

log = logging.getLogger(__name__)

_LIVE = {JobState.planning.value, JobState.running.value, JobState.cancelling.value}


@dataclass(frozen=True)
class Hold:
    """This node's share of a multi-node job whose gang it joined."""

    job_id: str
    owner: str
    priority: int
    device_bytes: int  # on each of its GPUs
    host_bytes: int
    gpus: tuple[int, ...]  # the GPUs it holds here; () on a CPU node
    ranks: int  # the job's gpus: CPU slots it takes here
    exclusive: bool
    since_s: float  # unix s: when it joined

    def running(self) -> RunningJob:
        # stopping: never picked as a preemption victim (its other nodes' ranks could not
        # follow it to a checkpoint), while its memory still counts
        return RunningJob(
            self.job_id,
            self.owner,
            self.priority,
            self.gpus[0] if self.gpus else None,
            self.device_bytes,
            self.host_bytes,
            self.since_s,
            self.exclusive,
            stopping=True,
            gpus=self.ranks,
            gang=self.gpus if len(self.gpus) > 1 else (),
        )


@dataclass
class MemberWorker:
    """The worker of node `node_rank` > 0 of one attempt of a multi-node job."""

    hold: Hold
    attempt: int
    node_rank: int
    proc: WorkerProcess
    stopped: bool = False  # killed by this agent: the attempt had ended already
    task: asyncio.Task[None] | None = field(default=None, repr=False)
    started_s: float = field(default_factory=time.time)  # unix s: its spawn


def gang_env(gang: Gang, node_rank: int) -> dict[str, str]:
    """What a member's worker needs to find the others (worker/ranks.py NodeOf)."""
    return {
        "NNODES": str(len(gang.members)),
        "NODE_RANK": str(node_rank),
        "MASTER_ADDR": gang.master_addr,
        "MASTER_PORT": str(gang.master_port),
    }


SpawnMember = Callable[[Job, Hold, int, dict[str, str]], Awaitable[WorkerProcess]]
StartLeader = Callable[[str, tuple[int, ...], dict[str, str]], Awaitable[None]]


class Members:
    def __init__(
        self,
        store: JobStore,
        node: str,
        agent_id: str,
        spawn_member: SpawnMember,
        start_leader: StartLeader,
    ) -> None:
        self.store, self.gangs = store, NodeGangs(store)
        self.node, self.agent_id = node, agent_id
        self.spawn_member, self.start_leader = spawn_member, start_leader
        self.holds: dict[str, Hold] = {}
        self.workers: dict[str, MemberWorker] = {}
        self._failed_seen: set[tuple[str, int]] = set()  # node-0 workers already stopped

    def add(self, holds: list[Hold]) -> None:
        for hold in holds:
            self.holds[hold.job_id] = hold

    def ids(self) -> frozenset[str]:
        """Multi-node jobs this node holds a share of or runs a member worker for."""
        return frozenset(self.holds) | frozenset(self.workers)

    def running(self) -> list[RunningJob]:
        return [h.running() for h in self.holds.values()] + [
            w.hold.running() for w in self.workers.values()
        ]

    def training(self) -> list[RunningJob]:
        """This node's shares of multi-node jobs that train here, from their member worker's
        spawn: what fair share charges their owners beside node 0's own (a gang still
        assembling holds GPUs but trains nothing, and is not charged)."""
        return [
            replace(w.hold.running(), started_s=w.started_s)
            for w in self.workers.values()
            if not w.stopped
        ]

    def ranks(self) -> int:
        """CPU slots taken here: each hold's and member worker's ranks."""
        return sum(h.ranks for h in self.holds.values()) + sum(
            w.hold.ranks for w in self.workers.values()
        )

    async def _job(self, job_id: str) -> tuple[str, int, str]:
        state, attempt, lease = cast(
            list[str | None],
            await self.store.redis.hmget(
                self.store.keys.job(job_id), ["state", "attempt", "lease_agent"]
            ),
        )
        return state or "", int(attempt or 0), lease or ""

    async def tick(self, leaders: Mapping[str, WorkerHandle]) -> None:
        """Advance every hold, stop member workers whose attempt ended, and stop node-0
        workers (`leaders`: the agent's own) whose gang lost a member."""
        for hold in list(self.holds.values()):
            await self._advance(hold, leaders)
        for w in list(self.workers.values()):
            state, attempt, _ = await self._job(w.hold.job_id)
            if not w.stopped and (attempt != w.attempt or state not in _LIVE):
                log.info(
                    "job %s: attempt %d ended (%s, attempt %d); stopping node %d's worker",
                    w.hold.job_id,
                    w.attempt,
                    state,
                    attempt,
                    w.node_rank,
                )
                w.stopped = True
                kill_group(w.proc.pid)
        for jid, h in list(leaders.items()):
            if h.job.spec.nodes <= 1 or (jid, h.job.attempt) in self._failed_seen:
                continue
            why = await self.gangs.failure_of(jid, h.job.attempt)
            if why is not None and h.proc.returncode is None:
                self._failed_seen.add((jid, h.job.attempt))
                h.error = f"a member node's worker died: {why}"
                log.warning("job %s: %s; stopping node 0's worker", jid, h.error)
                kill_group(h.proc.pid)

    async def _advance(self, hold: Hold, leaders: Mapping[str, WorkerHandle]) -> None:
        jid = hold.job_id
        state, attempt, lease = await self._job(jid)
        # the assembly key before the gang: the join that completes a gang deletes the key in
        # the same script, so a gang read after the key is gone is whole unless the assembly
        # expired (read the other way round, a gang completed between the two reads looked
        # expired, and this node released its share of a gang node 0 then started)
        assembling = await self.gangs.assembling()
        gang = await self.gangs.get(jid)
        rank = gang.rank_of(self.agent_id) if gang and gang.attempt == attempt else None
        if rank is None or gang is None:
            self._release(hold, "its gang was assembled anew without this node")
            return
        whole = len(gang.members) >= (await self._nodes(jid))
        if state == JobState.queued.value:
            if not whole and assembling != jid:
                self._release(hold, "its gang did not assemble in time")
            return  # still assembling, or whole and about to be claimed
        if state not in _LIVE:
            self._release(hold, f"the job is {state}")
            return
        if rank == 0:
            if state == JobState.planning.value and lease == self.agent_id and jid not in leaders:
                del self.holds[jid]
                await self.start_leader(jid, hold.gpus, gang_env(gang, 0))
            return
        if state != JobState.running.value:
            return  # node 0 is planning; its plan.json is not written yet
        del self.holds[jid]
        job = await self.store.get(jid)
        proc = await self.spawn_member(job, hold, rank, gang_env(gang, rank))
        w = MemberWorker(hold, attempt, rank, proc)
        self.workers[jid] = w
        w.task = asyncio.create_task(self._watch(w))
        log.info(
            "job %s: node %d's worker pid %d started (attempt %d)", jid, rank, proc.pid, attempt
        )

    async def _nodes(self, job_id: str) -> int:
        raw = await self.store.redis.hget(self.store.keys.job(job_id), "nodes")
        return int(raw or 1)

    def _release(self, hold: Hold, why: str) -> None:
        self.holds.pop(hold.job_id, None)
        log.info("job %s: %s released its share: %s", hold.job_id, self.node, why)

    async def _watch(self, w: MemberWorker) -> None:
        code = await w.proc.wait()
        kill_group(w.proc.pid)  # ranks it started on this node
        self.workers.pop(w.hold.job_id, None)
        log.info("job %s: node %d's worker exited with %d", w.hold.job_id, w.node_rank, code)
        if w.stopped or code in (WorkerExit.succeeded, WorkerExit.cancelled):
            return
        why = f"node {w.node_rank} ({self.node}): {describe_exit(code)}"
        await self.gangs.member_failed(w.hold.job_id, w.attempt, why, time.time())

    async def shutdown(self, grace_s: float) -> None:
        """The agent stops: member workers cannot checkpoint (node 0 writes them), so they
        are stopped and their attempts fail over to a retry."""
        self.holds.clear()
        for w in list(self.workers.values()):
            if w.proc.returncode is None:
                w.proc.send_signal(signal.SIGKILL)
                why = f"node {w.node_rank} ({self.node}): its agent shut down"
                await self.gangs.member_failed(w.hold.job_id, w.attempt, why, time.time())
                w.stopped = True
        tasks = [w.task for w in self.workers.values() if w.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=grace_s)
