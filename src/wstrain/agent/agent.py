"""The scheduler agent: one per GPU host. Profiles the host (agent/hardware.py), heartbeats
it into Redis, runs a scheduling round each heartbeat (agent/scheduling.py: the policy
packs jobs onto its GPUs by their budgets, preempts, explains every wait), plans what it
claimed, launches one worker per job and supervises it (agent/launch.py,
agent/supervisor.py, agent/outcomes.py); retries or fails the jobs of nodes that stopped
heartbeating. It takes part in jobs on several nodes as a member of their gangs
(agent/members.py).

Each job it claims is leased to this agent (its id, renewed with every heartbeat) and every
write about it is fenced by that lease. A restarted agent first stops the workers its
predecessor left (by pid and start time: SIGTERM, so they checkpoint) and requeues their
jobs to resume from that checkpoint; it never adopts them, since their report pipe died
with the old agent, and it claims nothing before they are gone.

Redis away (a restart) or refusing writes (a full disk under it: MISCONF, OOM, READONLY;
store/faults.py) stops no part of it: each store command is retried with back-off
for WSTRAIN_REDIS_RETRY_S (300 s), logged once when the refusals start and once when they
end, while its workers train on; only past that does the agent exit, to be restarted.

    wstrain-agent        # settings from WSTRAIN_* env vars (AgentSettings)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
import time
import uuid

from wstrain.agent.capacity import (
    free_device_bytes,
    free_host_bytes,
    node_state,
    running_jobs,
)
from wstrain.agent.exporter import (
    EXIT_CONFIG,
    AgentExporter,
    MetricsPortBusy,
    NodeGauges,
)
from wstrain.agent.gpus import GpuCollector
from wstrain.agent.hardware import host_memory, measure_node, spill_space
from wstrain.agent.launch import Launcher
from wstrain.agent.members import Members
from wstrain.agent.outcomes import Resize
from wstrain.agent.processes import is_running, start_ticks
from wstrain.agent.recovery import LIVE, fail_orphan, take_back
from wstrain.agent.scheduling import GangSettings, Rounds
from wstrain.agent.settings import AgentSettings
from wstrain.agent.stops import forward_cancel, preempt
from wstrain.agent.supervisor import WorkerHandle, lose_lease
from wstrain.agent.zygote import WorkerZygote
from wstrain.contracts.calibration import GIB
from wstrain.contracts.hardware import Device
from wstrain.contracts.jobs import GPUInfo, Job, Node, gpu_text
from wstrain.store import JobStore

log = logging.getLogger(__name__)


class NodeNameTaken(SystemExit):
    """Another live agent heartbeats under this node name: two agents of one name would
    each think the other's jobs orphaned. Exits the agent with the reason."""

    def __init__(self, name: str, other: Node) -> None:
        super().__init__(
            f"wstrain-agent: node name {name!r} is held by a live agent (pid {other.agent_pid}, "
            f"heartbeat {time.time() - other.heartbeat_at:.1f} s ago); give this agent "
            "another WSTRAIN_NODE_NAME, or stop the other one"
        )


class Agent(Launcher):
    def __init__(self, settings: AgentSettings, store: JobStore) -> None:
        self.settings, self.store = settings, store
        self.name = settings.node_name
        self.agent_id = uuid.uuid4().hex  # this process's hold on the node name
        self.workers: dict[str, WorkerHandle] = {}
        self.stopping = asyncio.Event()
        self.device: Device = "cpu"
        self.gpus: list[GPUInfo] = []
        self.profile: dict[str, float] = {}
        self.profile_key = ""
        self.exporter = AgentExporter()
        self.rounds = Rounds(
            store,
            self.name,
            self.agent_id,
            settings.policy_config(),
            settings.lease_s,
            GangSettings(settings.advertise_addr, settings.gang_assembly_s),
        )
        self.members = Members(
            store, self.name, self.agent_id, self._spawn_member, self._start_leader
        )
        self.exporter.registry.register(GpuCollector(self.name))  # empty on a CPU node
        self.access = settings.access()  # what its jobs may read
        self.fatal: NodeNameTaken | None = None  # why the heartbeat stopped the agent
        self.started = start_ticks(os.getpid())
        self.replacing = ""  # the id of a dead predecessor whose node record we may replace
        self.zygote: asyncio.Future[WorkerZygote] | None = None  # forks workers (launch.py)
        self.spill_bytes = 0  # the spill directory's space jobs' disk budgets reserve

    async def _measure(self) -> None:
        m = await measure_node(
            self.settings.state_dir, self.settings.profile_cache, self.settings.spill_dir
        )
        self.device, self.gpus, self.profile, self.profile_key = m.device, m.gpus, m.profile, m.key
        log.info(
            "node %s: %s, %d GPU(s), matmul %.3g TFLOP/s, H2D %.3g GB/s, D2H %.3g GB/s "
            "(profile %s%s)",
            self.name,
            self.device,
            len(self.gpus),
            self.profile["matmul_flops"] / 1e12,
            self.profile["h2d_bytes_per_s"] / 1e9,
            self.profile["d2h_bytes_per_s"] / 1e9,
            self.profile_key,
            ", cached" if m.cached else "",
        )

    # ------------------------------------------------------------ capacity

    @property
    def devices(self) -> list[GPUInfo]:
        """What jobs are packed onto: the GPUs, or on a CPU node the devices modelled by
        WSTRAIN_CPU_DEVICES (host memory carved into "GPUs": the packing, preemption and
        exclusive rules run on a CPU machine exactly as on a GPU one)."""
        if self.gpus:
            return self.gpus
        return [
            GPUInfo(index=i, name="modelled", total_bytes=int(gib * GIB), free_bytes=0)
            for i, gib in enumerate(self.settings.cpu_devices_gib)
        ]

    @property
    def slots(self) -> int:
        return len(self.gpus) if self.gpus else self.settings.cpu_slots

    def node(self) -> Node:
        host_total, host_free = host_memory()
        return Node(
            name=self.name,
            device=self.device,
            gpus=self.gpus,
            host_total_bytes=host_total,
            host_free_bytes=host_free,
            slots=self.slots,
            running=sorted(self.workers),
            profile=self.profile,
            heartbeat_at=time.time(),
            agent_id=self.agent_id,
            agent_pid=os.getpid(),
            host=socket.gethostname(),
            agent_start=self.started,
        )

    def node_gauges(self) -> NodeGauges:
        host_total, _ = host_memory()
        handles = self.workers.values()
        free = free_device_bytes(self.devices, host_total, handles)
        if self.devices:
            capacity = {f"cuda:{g.index}": g.total_bytes for g in self.devices}
        else:
            capacity = {"cpu": host_total}
        free_host = free_host_bytes(host_total, handles, bool(self.devices))
        ceilings = {
            d: self.profile[f"{d}_bytes_per_s"]
            for d in ("h2d", "d2h", "both")
            if f"{d}_bytes_per_s" in self.profile
        }
        return NodeGauges(
            self.name,
            capacity,
            free,
            host_total,
            free_host,
            self.slots,
            len(self.workers),
            ceilings,
        )

    # ------------------------------------------------------------ jobs

    async def _schedule(self) -> None:
        """A policy round (agent/scheduling.py): charge the running jobs' usage,
        start what the policy places here, preempt what it evicts."""
        host_total, _ = host_memory()
        node = node_state(self.devices, host_total, self.spill_bytes)
        running = running_jobs(self.workers.values())
        # every node charges the GPUs it trains on: node 0 its own, the others their shares
        await self.rounds.charge(node, running + self.members.training())
        running += self.members.running()  # shares of multi-node jobs node 0 does not run
        # a GPU node packs by memory alone; a CPU node runs at most cpu_slots ranks (cores)
        ranks = sum(h.job.spec.gpus for h in self.workers.values()) + self.members.ranks()
        max_starts = 1 << 16 if self.devices else max(0, self.slots - ranks)
        slots = 0 if self.devices else self.slots
        out = await self.rounds.run(node, running, max_starts, self.members.ids(), slots)
        self.members.add(out.joined)
        grace_s = self.settings.preempt_grace_s
        for victim, for_job in out.preempt.items():
            if (handle := self.workers.get(victim)) is not None:
                preempt(handle, for_job, grace_s)
        for victim, (point, for_job) in out.shrink.items():
            if (handle := self.workers.get(victim)) is not None:
                preempt(handle, for_job, grace_s, Resize(shrink=True, to=point))
        for job_id, point in out.grow.items():
            if (handle := self.workers.get(job_id)) is not None:
                free = f"the room free on GPU {gpu_text(handle.gpus)}"
                preempt(handle, free, grace_s, Resize(shrink=False, to=point))
        for c in out.claimed:
            log.info("job %s: claimed by %s on GPU %s", c.job_id, self.name, gpu_text(c.gpus))
            await self._start(c.job_id, c.gpus, c.link_share)

    async def _reap_orphans(self) -> None:
        """Settle live jobs no live agent holds: this node's from a previous agent process
        (stop its worker, requeue), and a dead node's once its lease has expired (fail)."""
        alive = {n.name for n in await self.store.nodes()}
        ours: list[Job] = []
        for state in LIVE:
            jobs, _ = await self.store.list(state=state, limit=10000)
            for job in jobs:
                if job.node == self.name and job.id not in {*self.workers, *self.members.ids()}:
                    ours.append(job)
                elif job.node and job.node != self.name and job.node not in alive:
                    await fail_orphan(self.store, job)
        # each worker left behind checkpoints at its own step boundary: wait for all at once
        grace_s = self.settings.shutdown_grace_s
        await asyncio.gather(
            *(take_back(self.store, job, self.name, self.agent_id, grace_s) for job in ours)
        )

    # ------------------------------------------------------------ main loop

    async def _refuse_if_taken(self) -> None:
        """Exit before touching the GPU or any job if a live agent holds this node name. A
        holder that ran on this host and whose process is gone (killed, crashed) is no
        obstacle: this agent replaces its record at once instead of waiting out the TTL."""
        other = await self.store.node(self.name)
        if other is None or not other.agent_id or other.agent_id == self.agent_id:
            return
        if other.host == socket.gethostname() and not is_running(
            other.agent_pid, other.agent_start
        ):
            log.warning(
                "node %s: its previous agent (pid %s) is gone; taking over its jobs",
                self.name,
                other.agent_pid,
            )
            self.replacing = other.agent_id
            return
        raise NodeNameTaken(self.name, other)

    async def _heartbeat(self) -> None:
        other = await self.store.hold_node(self.node(), self.settings.node_ttl_s, self.replacing)
        if other is not None:
            raise NodeNameTaken(self.name, other)
        lost = await self.store.renew(self.agent_id, list(self.workers), self.settings.lease_s)
        for job_id in lost:
            if (handle := self.workers.get(job_id)) is not None:
                lose_lease(handle)

    async def _heartbeat_loop(self) -> None:
        """Heartbeat the node and renew the leases every heartbeat_s, whatever the main loop
        is waiting on (a slow plan, a predecessor's worker writing its checkpoint)."""
        try:
            while not self.stopping.is_set():
                await self._heartbeat()
                self.exporter.set_node(self.node_gauges())
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stopping.wait(), self.settings.heartbeat_s)
        except NodeNameTaken as exc:  # our record expired and another agent took the name
            self.fatal = exc
            self.stopping.set()

    async def run(self) -> None:
        await self._refuse_if_taken()
        # /metrics before the profile: a busy port refuses the agent at once, not after the
        # profiling child's torch import and timing (3.5 CPU-s on 2 cores, 7 s under load)
        if self.settings.metrics_port:
            self.exporter.serve(self.settings.metrics_host, self.settings.metrics_port)
            log.info(
                "node %s: /metrics on %s:%d",
                self.name,
                self.settings.metrics_host,
                self.settings.metrics_port,
            )
        await self._measure()
        await self._heartbeat()
        beating = asyncio.create_task(self._heartbeat_loop())
        try:
            await self._reap_orphans()  # a predecessor's workers are gone before any claim
            if self.settings.spill_dir is not None:  # so is what they left on the spill disk
                self.spill_bytes = await spill_space(self.settings.spill_dir, self.profile)
            last_reap = time.monotonic()
            while not self.stopping.is_set():
                if not self.stopping.is_set():
                    await self._schedule()
                for handle in list(self.workers.values()):
                    await forward_cancel(self.store, handle)
                await self.members.tick(self.workers)
                if time.monotonic() - last_reap > self.settings.node_ttl_s:
                    await self._reap_orphans()
                    last_reap = time.monotonic()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stopping.wait(), self.settings.heartbeat_s / 4)
            await self._shutdown()
        finally:
            self.stopping.set()
            await beating
            zygote = self.zygote  # a pending one ends at EOF, when this process exits
            if zygote is not None and zygote.done() and not zygote.exception():
                await zygote.result().close()
        if self.fatal is not None:
            raise self.fatal

    async def _shutdown(self) -> None:
        """Give running jobs back: workers checkpoint, their jobs are requeued. A worker
        still writing its checkpoint after shutdown_grace_s is left to finish: the next agent
        on this node stops it and requeues its job."""
        for handle in self.workers.values():
            handle.shutting_down = True
            if handle.proc.returncode is None:
                handle.proc.send_signal(signal.SIGTERM)
        await self.members.shutdown(self.settings.shutdown_grace_s)
        waits = [h.done.wait() for h in self.workers.values()]
        if waits:
            try:
                await asyncio.wait_for(asyncio.gather(*waits), self.settings.shutdown_grace_s)
            except TimeoutError:
                log.warning(
                    "node %s: %d worker(s) still checkpointing after %.0f s; leaving them",
                    self.name,
                    sum(not h.done.is_set() for h in self.workers.values()),
                    self.settings.shutdown_grace_s,
                )
        held = await self.store.node(self.name)
        if held is not None and held.agent_id == self.agent_id:
            await self.store.remove_node(self.name)
        log.info("node %s: stopped", self.name)


async def _amain(settings: AgentSettings) -> None:
    store = JobStore.from_url(settings.redis_url, settings.key_prefix, settings.redis_retry_s)
    agent = Agent(settings, store)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, agent.stopping.set)
    try:
        await agent.run()
    finally:
        await store.close()


def main() -> None:
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    settings = AgentSettings()
    # GPU indices in PCI bus order, as NVML numbers them: the profile, every worker's
    # CUDA_VISIBLE_DEVICES and the GPU series (agent/gpus.py) then name the same device
    os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    log.info(
        "agent %s: redis %s, state dir %s, %.0f GiB host",
        settings.node_name,
        settings.redis_url,
        settings.state_dir,
        host_memory()[0] / GIB,
    )
    try:
        asyncio.run(_amain(settings))
    except MetricsPortBusy as exc:  # one line, and an exit code serve does not restart
        print(exc.code, file=sys.stderr)
        raise SystemExit(EXIT_CONFIG) from None


if __name__ == "__main__":
    main()
