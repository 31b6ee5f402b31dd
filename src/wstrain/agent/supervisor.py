"""Supervision of one worker process: spawn it, turn its JSON-line reports into job-store
updates and events, SIGKILL it once it has reported nothing for its no-progress window
(hung: agent/hang.py), and map its exit to the job's final state. Stopping it early (cancel,
preemption, time limit) is agent/stops.py.
Every write is fenced by the agent's lease on the job: once another agent has taken the job
over (this one was presumed dead), writes change nothing and the worker is stopped.

Used by agent/agent.py and launch.py; one `WorkerHandle` per running job.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from wstrain.agent.exporter import AgentExporter
from wstrain.agent.hang import HangWindow
from wstrain.agent.outcomes import Exit, Resize, settle_exit
from wstrain.agent.processes import kill_group, session_pss_bytes
from wstrain.agent.zygote import WorkerProcess, WorkerZygote
from wstrain.contracts.access import DataAccess
from wstrain.contracts.errors import LeaseLost
from wstrain.contracts.jobs import Job, WorkerMessage, gpu_text
from wstrain.contracts.plan import Plan
from wstrain.policy import BudgetPoint
from wstrain.store import JobStore

log = logging.getLogger(__name__)

PSS_EVERY_S = 2.0  # a gang's memory read: the host-budget alert looks over minutes
HANG_CHECK_S = 1.0  # a hung worker is killed at most this long past its window


@dataclass
class WorkerHandle:
    job: Job
    proc: WorkerProcess  # forked by the zygote or exec'd
    device_bytes: int  # budgets reserved on this node while the worker lives (device: per GPU)
    host_bytes: int
    gpus: tuple[int, ...]  # every GPU it holds (a gang's all); () on a CPU pseudo-device
    exporter: AgentExporter
    fence: str  # the id of the agent whose lease on the job every write needs
    started: bool = False  # the worker reported `started`: its SIGTERM handler is in place
    cancel_sent: bool = False
    shutting_down: bool = False
    error: str | None = None
    needs_gib: dict[str, float] = field(default_factory=dict)  # out of memory: what would fit
    last_step: int = 0
    lease_lost: bool = False  # another agent holds the job now: write nothing more
    timed_out: bool = False  # stopped at its time limit: ends `timeout`
    preempted_by: str | None = None  # stopped for this job (its words): requeued, not failed
    # a ranged job's points, min first, its current one among them (a single-GPU job whose
    # budget is a range: the policy may shrink it rather than preempt it)
    points: tuple[BudgetPoint, ...] = ()
    resize: Resize | None = None  # stopped to restart elsewhere in its range
    retry_backoff_s: float = 30.0  # first retry's wait after a worker died; doubles
    started_s: float = field(default_factory=time.time)  # unix s: when the worker was spawned
    done: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None  # the agent's supervision of this worker
    pss_read_s: float = float("-inf")  # monotonic s of the last read of a gang's memory
    pss_bytes: int | None = None  # a gang's ranks' summed PSS at that read
    hang: HangWindow = field(default_factory=HangWindow)  # when silence means hung
    reported_s: float = field(default_factory=time.monotonic)  # monotonic s of its last report
    step_s: float | None = None  # its last reported step's wall time; None before the first
    hung: str | None = None  # SIGKILLed for reporting nothing: why (the job's cause)
    # called once when the worker reports `stopping` (agent/stops.py arms a preemption's
    # SIGKILL there: the step in flight has ended)
    on_stopping: Callable[[], None] | None = None
    spill_dir: Path | None = None  # its spill subdirectory: removed once the worker is gone

    @property
    def gang(self) -> bool:
        """Several ranks: the worker's child processes train beside it."""
        return self.job.spec.gpus > 1


def resumed_runtime(job_dir: Path) -> str | None:
    """The runtime of the checkpoint a new attempt of the job in `job_dir` resumes from: the
    last attempt's plan's, where that attempt left a checkpoint (worker/io/checkpoint.py's
    `latest` pointer); None for a first start."""
    plan = job_dir / "plan.json"
    if not (job_dir / "checkpoints" / "latest").exists() or not plan.exists():
        return None
    return Plan.model_validate_json(plan.read_text()).runtime


async def spawn(
    job: Job,
    job_dir: Path,
    threads: int,
    gpus: tuple[int, ...] | None,
    env: dict[str, str],
    access: DataAccess,
    measured_peak_flops: float | None = None,
    cpu_peak_flops: float | None = None,
    log_name: str = "worker.log",
    shm_dir: Path = Path("/dev/shm"),
    zygote: WorkerZygote | None = None,
    spill_dir: Path | None = None,
) -> WorkerProcess:
    """The worker of one attempt of `job`, in its own session, reading only what `access`
    allows (the data roots less the state dir, checked again on every file it opens).
    Its MFU divides by the chip table's peak; `measured_peak_flops` (the GPU profile's bf16
    GEMM rate) stands in on a chip the table does not know, `cpu_peak_flops` on CPU. It sees
    `gpus` (all of a gang's: it starts one rank per visible GPU, as its plan's `ranks` says;
    None on CPU). It logs to `log_name` in the job dir (a multi-node job's other nodes write
    their own beside node 0's: the job dir is shared). A gang's ranks share their working
    set's host state in `shm_dir` (a tmpfs); a spilling job its moments in its subdirectory
    of `spill_dir`. With a live `zygote` it is forked from it (agent/zygote.py), else exec'd."""
    env = dict(env)
    peaks = [
        *(["--measured-peak-flops", str(measured_peak_flops)] if measured_peak_flops else []),
        *(["--cpu-peak-flops", str(cpu_peak_flops)] if cpu_peak_flops else []),
    ]
    if gpus:
        env["CUDA_VISIBLE_DEVICES"] = gpu_text(gpus)
    # Segments that grow in place instead of fixed blocks: far less memory reserved but
    # unusable, so the device budget buys working set, not fragmentation.
    env.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    argv = [
        "--job-dir",
        str(job_dir),
        *peaks,
        "--threads",
        str(threads),
        "--data-roots",
        json.dumps([str(r) for r in access.roots]),
        "--state-dir",
        str(access.state_dir),
        "--shm-dir",
        str(shm_dir),
        *(["--spill-dir", str(spill_dir / job.id)] if spill_dir is not None else []),
    ]
    log_file = open(job_dir / log_name, "ab")  # noqa: SIM115 - the child owns it
    try:
        if zygote is not None:
            forked = await zygote.spawn(argv, env, os.getcwd(), log_file.fileno())
            if forked is not None:
                return forked
        return await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "wstrain.worker.main",
            *argv,
            stdout=asyncio.subprocess.PIPE,
            stderr=log_file,
            env=env,
            start_new_session=True,
        )  # a Ctrl-C to the agent must not kill workers mid-write
    finally:
        log_file.close()


async def _gang_memory(h: WorkerHandle, msg: WorkerMessage) -> None:
    """A gang's host RSS is its ranks' summed PSS (the worker measures its own process
    only, and each rank's RSS would count the shared training state again), read at most
    every PSS_EVERY_S: smaps_rollup walks each process's page tables."""
    now = time.monotonic()
    if now - h.pss_read_s >= PSS_EVERY_S:
        h.pss_read_s = now
        h.pss_bytes = await asyncio.to_thread(session_pss_bytes, h.proc.pid)
    if h.pss_bytes is not None:
        msg.metrics["host_rss_bytes"] = float(h.pss_bytes)


def heard(h: WorkerHandle, msg: WorkerMessage) -> None:
    """What any report tells the agent's own watch of the worker: it is alive (watch_hang),
    its last step's time, and with `stopping` that its step in flight has ended."""
    h.reported_s = time.monotonic()
    armed = h.on_stopping
    if msg.kind == "stopping" and armed is not None:
        h.on_stopping = None
        armed()
    if msg.kind == "step" and msg.step_seconds:
        h.step_s = msg.step_seconds


async def _handle_message(store: JobStore, h: WorkerHandle, msg: WorkerMessage) -> None:
    jid, fence = h.job.id, h.fence
    if h.gang and msg.kind == "step":
        await _gang_memory(h, msg)
    h.exporter.job_message(jid, msg)  # every report is progress for the no-progress alert
    heard(h, msg)
    if msg.kind == "step" and msg.step is not None:
        h.last_step = msg.step
        remaining = h.job.steps - msg.step
        eta = remaining * msg.step_seconds if msg.step_seconds else None
        await store.report(
            jid,
            fence,
            (
                "progress",
                f"step {msg.step}/{h.job.steps} loss {msg.loss:.4f}",
                # with the telemetry: the event log is what `wstrain report` plots
                msg.model_dump(exclude_none=True),
            ),
            step=msg.step,
            epoch=msg.epoch,
            tokens_seen=msg.tokens_seen,
            data_position=msg.data_position,
            loss=msg.loss,
            tokens_per_s=msg.tokens_per_s,
            mfu=msg.mfu,
            step_seconds=msg.step_seconds,
            eta_s=eta,
            telemetry=msg.metrics,
        )
    elif msg.kind == "eval" and msg.loss is not None:
        await store.report(
            jid,
            fence,
            (
                "eval",
                f"step {msg.step}: held-out loss {msg.loss:.4f}",
                {"step": msg.step, "loss": msg.loss},
            ),
            eval_loss=msg.loss,
        )
    elif msg.kind == "checkpoint":
        await store.report(
            jid,
            fence,
            (
                "checkpoint",
                f"checkpoint at step {msg.step}: {msg.path}",
                {"step": msg.step, "path": msg.path},
            ),
            last_checkpoint=msg.path,
        )
    elif msg.kind == "error":
        h.error, h.needs_gib = msg.message, msg.needs_gib
        data = {"needs_gib": msg.needs_gib} if msg.needs_gib else {}
        await store.report(jid, fence, ("error", msg.message or "worker error", data))
    elif msg.kind == "started":
        h.started = True
        # a resumed worker starts at its checkpoint's step, which may be behind the last
        # step reported before a crash
        # with what its MFU is measured against: `wstrain report` says so
        data = msg.model_dump(
            include={"step", "flops_per_token", "peak_flops", "peak_source", "precision"},
            exclude_none=True,
        )
        # this attempt's step time is unknown until its first step (a resize or a retry
        # elsewhere runs at another speed): the forecast falls back to the plan's
        await store.report(
            jid,
            fence,
            ("started", msg.message or "started", data),
            step=msg.step,
            step_seconds=None,
        )
    else:
        await store.report(jid, fence, (msg.kind, msg.message or msg.kind, {}))


def lose_lease(h: WorkerHandle) -> None:
    """Another agent holds the job now: write nothing more, and stop the worker (it
    checkpoints and exits) so that one job never has two workers for long."""
    if h.lease_lost:
        return
    h.lease_lost = True
    log.warning(
        "job %s: another agent holds its lease now; stopping worker pid %d", h.job.id, h.proc.pid
    )
    if h.proc.returncode is None:
        h.proc.send_signal(signal.SIGTERM)


async def pump(store: JobStore, h: WorkerHandle) -> None:
    """Read the worker's reports until it exits, then settle the job's state."""
    assert h.proc.stdout is not None
    watch = asyncio.create_task(watch_hang(store, h))
    try:
        async for line in h.proc.stdout:
            if h.lease_lost:
                continue  # drain: a worker blocked on a full pipe would never exit
            try:
                msg = WorkerMessage.model_validate_json(line)
            except ValueError:
                log.warning("job %s: unparseable worker line %r", h.job.id, line[:200])
                continue
            try:
                await _handle_message(store, h, msg)
            except LeaseLost:
                lose_lease(h)
        code = await h.proc.wait()
        if h.hung is None:
            watch.cancel()
        await asyncio.wait([watch])  # a hung worker's event comes before its job is settled
    finally:
        watch.cancel()
    if h.gang:  # a rank the worker left behind would keep its GPU past the job
        kill_group(h.proc.pid)
    h.exporter.job_ended(h.job.id)
    if h.spill_dir is not None:  # a SIGKILLed worker leaves it; a next attempt refills it
        await asyncio.to_thread(shutil.rmtree, h.spill_dir, True)
    if not h.lease_lost:
        await settle(store, h, code)
    h.done.set()


async def settle(store: JobStore, h: WorkerHandle, code: int) -> None:
    """The job's state after its worker exited with `code` (agent/outcomes.py)."""
    await settle_exit(
        store,
        h.job,
        h.fence,
        code,
        Exit(
            error=h.hung or h.error,
            needs_gib=h.needs_gib,
            last_step=h.last_step,
            cancel_sent=h.cancel_sent,
            shutting_down=h.shutting_down,
            timed_out=h.timed_out,
            preempted_by=h.preempted_by,
            resize=h.resize,
            retry_backoff_s=h.retry_backoff_s,
        ),
    )


async def watch_hang(store: JobStore, h: WorkerHandle) -> None:
    """SIGKILL the worker once it has reported nothing for its window (h.hang): a frozen
    (SIGSTOPped), deadlocked or wedged process writes no checkpoint, so none is asked for.
    Its job's event says so, and it is retried per max_retries as a crash is (h.hung is the
    cause). A worker stopping for preemption or an agent shutdown is left to their own
    SIGKILL and grace; one stopping for a cancel or its time limit is still watched."""
    while h.proc.returncode is None and not h.lease_lost:
        if h.preempted_by or h.shutting_down:
            return
        window_s = h.hang.window_s(h.step_s)
        silent_s = time.monotonic() - h.reported_s
        if silent_s < window_s:
            # the window shrinks once the first step reports: look again within HANG_CHECK_S
            await asyncio.sleep(min(window_s - silent_s + 0.05, HANG_CHECK_S))
            continue
        h.hung = h.hang.describe(silent_s, h.step_s)
        log.warning("job %s: pid %d %s", h.job.id, h.proc.pid, h.hung)
        with contextlib.suppress(ProcessLookupError):
            h.proc.kill()  # a stopped process dies of SIGKILL without being continued
        if h.gang:  # its ranks as well: the worker leads their process group
            kill_group(h.proc.pid)
        data = {"silent_s": round(silent_s, 1), "window_s": h.hang.window_s(h.step_s)}
        with contextlib.suppress(LeaseLost):
            await store.report(h.job.id, h.fence, ("hung", h.hung, {**data, "pid": h.proc.pid}))
        return
