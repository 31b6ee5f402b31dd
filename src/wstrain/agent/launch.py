"""Planning and starting a job's worker on this node, and supervising it until it exits:
the node as a plan sees it (its profile, the job's share of a GPU and of the host link, the
layer times measured on its GPU), the plan (the one the job was admitted with where it was
made for this node as the agent sees it, else planned again: planning/planner.py
launch_plan) written into the job dir, the `running` transition fenced by the lease, the
spawn, the log shipping and the supervision task. A job that cannot be started fails with
why; one cancelled while it was planned is settled as cancelled.

`Launcher` is a mixin of `Agent` (agent.py), which holds the state it reads: the settings,
the store, the node's name, lease id, GPUs and profile, its workers and exporter. Members
(members.py) starts node 0 of a multi-node job through `_start_leader` and the worker of
node i > 0 through `_spawn_member`.

    class Agent(Launcher): ...    # await agent._start(job_id, gpus, link_share)

Tested through the agent: pytest tests/agent.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from pathlib import Path

from wstrain.agent.exporter import AgentExporter
from wstrain.agent.hardware import host_memory, layer_times
from wstrain.agent.logship import ship_worker_log
from wstrain.agent.members import Hold
from wstrain.agent.processes import start_ticks
from wstrain.agent.recovery import LIVE
from wstrain.agent.settings import AgentSettings
from wstrain.agent.stops import enforce_time_limit
from wstrain.agent.supervisor import WorkerHandle, pump, resumed_runtime, spawn
from wstrain.agent.zygote import WorkerProcess, WorkerZygote
from wstrain.contracts.access import DataAccess
from wstrain.contracts.errors import Conflict, LeaseLost, WstrainError
from wstrain.contracts.hardware import Device, LayerTimes, NodeProfile
from wstrain.contracts.jobs import GPUInfo, Job, JobState, gpu_text, job_dir
from wstrain.contracts.model_dims import ModelDims, resolve_dims
from wstrain.contracts.spec import JobSpec, TokenData
from wstrain.contracts.token_file import document_span
from wstrain.planning.planner import launch_plan
from wstrain.store import JobStore

log = logging.getLogger(__name__)


class Launcher:
    """Starts and supervises the workers of the jobs this node claimed (a mixin of Agent)."""

    # the Agent's state this mixin reads and writes (set in Agent.__init__ and _measure)
    settings: AgentSettings
    store: JobStore
    name: str
    agent_id: str
    workers: dict[str, WorkerHandle]
    device: Device
    gpus: list[GPUInfo]
    profile: dict[str, float]
    profile_key: str
    zygote: asyncio.Future[WorkerZygote] | None  # started with the first worker
    exporter: AgentExporter
    access: DataAccess

    def node_profile(self) -> NodeProfile:
        """The node as the planner sees it: its measured profile, its largest GPU (or the
        host memory on a CPU node)."""
        host_total, _ = host_memory()
        dev_total = max((g.total_bytes for g in self.gpus), default=host_total)
        return NodeProfile.from_profile(self.device, self.profile, dev_total, host_total)

    async def _layer_times(
        self, spec: JobSpec, dims: ModelDims, jdir: Path, gpu: int
    ) -> LayerTimes | None:
        if not self.gpus:
            return None
        return await layer_times(self.settings.state_dir, self.profile_key, spec, dims, jdir, gpu)

    async def _start_leader(self, job_id: str, gpus: tuple[int, ...], env: dict[str, str]) -> None:
        """Node 0 of a multi-node job: planned and supervised as any job of this node."""
        await self._start(job_id, gpus, 1, env)

    async def _spawn_member(
        self, job: Job, hold: Hold, node_rank: int, env: dict[str, str]
    ) -> WorkerProcess:
        """The worker of node `node_rank` > 0 of a multi-node job (agent/members.py)."""
        jdir = job_dir(self.settings.state_dir, job.id).resolve()
        return await self._spawn(job, jdir, hold.gpus, env, f"worker-node{node_rank}.log")

    async def _spawn(
        self,
        job: Job,
        jdir: Path,
        gpus: tuple[int, ...],
        env: dict[str, str],
        log_name: str = "worker.log",
    ) -> WorkerProcess:
        cuda = gpus if self.gpus else None  # a CPU node's modelled devices are host memory
        return await spawn(
            job,
            jdir,
            self.settings.worker_threads,
            cuda,
            {**os.environ, **env},
            self.access,
            measured_peak_flops=self.profile.get("matmul_flops") if cuda is not None else None,
            cpu_peak_flops=self.settings.cpu_peak_flops,
            log_name=log_name,
            shm_dir=self.settings.shm_dir,
            zygote=await self._zygote(),
            spill_dir=self.settings.spill_dir,
        )

    async def _zygote(self) -> WorkerZygote | None:
        """The zygote that forks this node's workers, started with the first: it costs a
        worker's start (torch's import), so an agent that runs no job pays nothing. Once
        it has died, workers are exec'd (agent/zygote.py)."""
        if self.zygote is None and self.settings.worker_zygote:  # set before any await:
            self.zygote = asyncio.ensure_future(
                WorkerZygote.start(dict(os.environ), self.settings.worker_zygote_socket)
            )
        if self.zygote is None:
            return None
        try:
            return await self.zygote
        except OSError as exc:  # no fork server: exec each worker, as with it off
            log.error(
                "node %s: the worker zygote did not start (%s); exec'ing workers", self.name, exc
            )
            return None

    async def _start(
        self,
        job_id: str,
        gpus: tuple[int, ...],
        link_share: int,
        env: dict[str, str] | None = None,
    ) -> None:
        try:
            await self._plan_and_spawn(job_id, gpus, link_share, env or {})
        except LeaseLost:
            log.warning("job %s: taken over by another agent while starting", job_id)
        except Exception as exc:  # a full disk, a failed spawn: the job fails with why
            reason = f"starting the worker on {self.name} failed: {type(exc).__name__}: {exc}"
            log.exception("job %s: %s", job_id, reason)
            if (handle := self.workers.get(job_id)) is not None and handle.proc.returncode is None:
                handle.proc.send_signal(signal.SIGTERM)  # no worker trains a failed job
            with contextlib.suppress(Conflict):
                await self.store.transition(
                    job_id,
                    JobState.failed,
                    f"failed: {reason}",
                    sources=frozenset(LIVE),
                    fence=self.agent_id,
                    error=reason,
                )

    async def _plan_and_spawn(
        self, job_id: str, gpus: tuple[int, ...], link_share: int, env: dict[str, str]
    ) -> None:
        job = await self.store.get(job_id)
        jdir = job_dir(self.settings.state_dir, job_id).resolve()
        jdir.mkdir(parents=True, exist_ok=True)
        (jdir / "spec.json").write_text(job.spec.model_dump_json(indent=1))
        try:
            # config.json by descriptor under the roots: a model dir's config swapped for a
            # link into the state dir since submission fails the job here, unread (and the
            # layer timing below is handed these dims, never the model's path)
            dims = resolve_dims(job.spec.model, self.access)
            # a gang's ranks are alike: its first GPU's layer time and link share stand for all
            layer = await self._layer_times(job.spec, dims, jdir, gpus[0]) if gpus else None
            # packed beside other jobs, it plans with its share of the GPU and its link
            node = self.node_profile().with_layer(layer).shared_by(link_share)
            node = node.with_documents(await _document_span(job_id, job.spec, self.access))
            # the plan the job was admitted with where the API planned for this very node
            # (a CPU node's, with no layer to measure), else planned again for it
            plan = launch_plan(job.plan, job.spec, dims, node, resumed_runtime(jdir))
        except WstrainError as exc:
            await self.store.transition(
                job_id,
                JobState.failed,
                f"planning failed: {exc.message}",
                fence=self.agent_id,
                error=exc.message,
            )
            return
        (jdir / "plan.json").write_text(plan.model_dump_json(indent=1))
        try:
            await self.store.transition(
                job_id,
                JobState.running,
                f"running on {self.name}",
                sources=frozenset({JobState.planning}),
                fence=self.agent_id,
                plan=plan.model_dump(mode="json"),
                runtime=plan.runtime or "",
                state_reason=None,
                error=None,  # a retry's earlier cause is in its events; this attempt has none
            )
        except LeaseLost:
            raise
        except Conflict:  # cancelled while we planned
            await self.store.transition(
                job_id,
                JobState.cancelled,
                "cancelled before it started",
                sources=frozenset({JobState.cancelling}),
                fence=self.agent_id,
            )
            return
        proc = await self._spawn(job, jdir, gpus, env)
        ship_worker_log(self.store, job, jdir / "worker.log", proc)  # until the worker exits
        handle = WorkerHandle(
            job,
            proc,
            job.spec.budget.device_bytes,
            job.spec.budget.host_bytes,
            gpus,
            self.exporter,
            self.agent_id,
            retry_backoff_s=self.settings.retry_backoff_s,
            hang=self.settings.hang_window().for_plan(plan.predicted.step_seconds),
            # a ranged job on one GPU of one node may be shrunk rather than preempted; the
            # policy finds its current point among these by its reserved bytes
            points=await self.store.range_points(job_id)
            if job.spec.gpus == job.spec.nodes == 1
            else (),
            spill_dir=None if self.settings.spill_dir is None else self.settings.spill_dir / job_id,
        )
        self.exporter.job_started(job.model_copy(update={"plan": plan}))
        self.workers[job_id] = handle
        handle.task = asyncio.create_task(self._supervise(handle))  # held: tasks are weak refs
        # the worker is recorded by pid and start time: a restarted agent stops exactly it
        await self.store.report(
            job_id,
            self.agent_id,
            ("worker", f"worker pid {proc.pid} started on {self.name}", {"pid": proc.pid}),
            worker_pid=proc.pid,
            worker_start=start_ticks(proc.pid),
            gpu=gpu_text(gpus),
        )
        log.info("job %s: worker pid %d started (attempt %d)", job_id, proc.pid, job.attempt)

    async def _supervise(self, handle: WorkerHandle) -> None:
        limit = asyncio.create_task(
            enforce_time_limit(self.store, handle, self.settings.time_limit_grace_s)
        )
        try:
            await pump(self.store, handle)
        finally:
            limit.cancel()
            self.workers.pop(handle.job.id, None)


async def _document_span(job_id: str, spec: JobSpec, access: DataAccess) -> int:
    """The job's documents' attention span from its token file's index, read off the event
    loop (~1 s for a million documents); 0 (plan whole sequences' attention, the worst
    case) without document_mask, for text data, or when the index cannot be read. The index
    is read by descriptor through `access`: one swapped for a link out of the data roots or
    into the state dir since submission raises InvalidSpec, which fails the job at once."""
    if not (spec.document_mask and isinstance(spec.data, TokenData)):
        return 0
    try:
        return await asyncio.to_thread(document_span, spec.data.path, spec.seq_len, access=access)
    except OSError as exc:
        log.warning("job %s: the document index of %s: %s", job_id, spec.data.path, exc)
        return 0
