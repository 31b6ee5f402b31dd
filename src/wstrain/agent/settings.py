"""The scheduler agent's settings (env prefix WSTRAIN_), built once in agent.main().

WSTRAIN_NODE_NAME, _CPU_SLOTS, _WORKER_THREADS, _HEARTBEAT_S, _NODE_TTL_S, _LEASE_S,
_SHUTDOWN_GRACE_S, _PROFILE_CACHE, _METRICS_HOST, _METRICS_PORT, _REDIS_RETRY_S,
_CPU_PEAK_FLOPS, _ADVERTISE_ADDR, _GANG_ASSEMBLY_S, _HANG_STEP_FACTOR, _HANG_FLOOR_S,
_HANG_STARTUP_S; and the shared ones of
settings.py (docs/OPERATIONS.md lists them all)
"""

from __future__ import annotations

import socket
from pathlib import Path

from pydantic import Field, field_validator

from wstrain.agent.hang import HangWindow
from wstrain.settings import SharedSettings


class AgentSettings(SharedSettings):
    node_name: str = Field(default_factory=socket.gethostname)
    cpu_slots: int = Field(default=1, ge=1, description="concurrent jobs on a CPU-only node")
    worker_threads: int = Field(default=0, ge=0, description="torch threads per CPU worker")
    heartbeat_s: float = 1.0
    node_ttl_s: float = 10.0
    lease_s: float = Field(
        default=30.0,
        gt=0,
        le=3600,
        description="how long a job stays leased to this agent without a heartbeat; "
        "another agent takes over a dead node's jobs only after it",
    )
    shutdown_grace_s: float = 60.0
    worker_zygote: bool = Field(
        default=True,
        description="fork workers from one process that imported torch once (3-5 CPU-s "
        "less a start); false: exec each, as when the zygote has died",
    )
    worker_zygote_socket: str = Field(
        default="",
        description="with worker_zygote: the socket of a zygote server "
        "(`python -m wstrain.worker.zygote --listen PATH`) that forks this agent's zygote, "
        "a fork instead of a fresh interpreter's 3 CPU-s, for a host of several agents (the "
        "test suite); empty: the agent starts its own",
    )
    profile_cache: bool = Field(
        default=True,
        description="reuse the hardware profile "
        "measured for this GPU/driver/torch under state_dir/profiles",
    )
    metrics_host: str = "127.0.0.1"
    metrics_port: int = Field(
        default=9464,
        ge=0,
        le=65535,
        description="the agent's /metrics port (0: not served); one it cannot bind stops "
        "the agent with exit code 78, never a wander to another port (Prometheus scrapes a "
        "fixed one)",
    )
    cpu_devices_gib: list[float] = Field(
        default_factory=list,
        max_length=64,
        description="a CPU node's modelled GPUs (GiB each) that jobs are packed onto by "
        "their device budgets, for trying the scheduling policy without a GPU; empty: one "
        "pool of host memory and cpu_slots jobs",
    )

    @field_validator("cpu_devices_gib")
    @classmethod
    def _devices_bounded(cls, sizes: list[float]) -> list[float]:
        for i, gib in enumerate(sizes):
            if not 0 < gib <= 65536:
                raise ValueError(f"cpu_devices_gib[{i}] = {gib}: give a size in (0, 65536] GiB")
        return sizes

    retry_backoff_s: float = Field(
        default=30.0,
        ge=0,
        le=3600,
        description="wait before a died worker's job is retried; doubles each retry, "
        "at most 15 min",
    )
    time_limit_grace_s: float = Field(
        default=300.0,
        ge=0,
        le=86400,
        description="how long before a job's time limit its warning event comes",
    )
    preempt_grace_s: float = Field(
        default=120.0,
        ge=1,
        le=3600,
        description="how long a preempted worker gets to checkpoint and exit before SIGKILL, "
        "from its `stopping` report (its step in flight ended; agent/stops.py)",
    )
    redis_retry_s: float = Field(
        default=300.0,
        ge=0,
        le=86400,
        description="how long a Redis command is retried before the agent gives up (Redis "
        "unreachable, or refusing writes: a full disk, MISCONF); its workers train on meanwhile",
    )
    cpu_peak_flops: float | None = Field(
        default=None,
        ge=0,
        description="FLOP/s a CPU job's MFU divides by (this host's peak at the job's "
        "precision, from its vendor); unset or 0: CPU jobs report no MFU",
    )
    advertise_addr: str = Field(
        default="127.0.0.1",
        min_length=1,
        max_length=253,
        description="the address other nodes reach this host at: a multi-node job's "
        "MASTER_ADDR when this node is its node 0 (127.0.0.1: every member agent on this "
        "host, loopback)",
    )
    gang_assembly_s: float = Field(
        default=60.0,
        gt=0,
        le=3600,
        description="how long a multi-node job's members hold their share while the rest "
        "join; past it every hold is released and the job waits again",
    )
    # A worker that reports nothing (no step, evaluation or checkpoint) for its window is
    # hung (SIGSTOPped, deadlocked, wedged in a driver): SIGKILLed, no checkpoint (a frozen
    # process cannot write one), the job retried per max_retries. The window is
    # max(hang_step_factor x its last step's wall time, hang_floor_s) once it reported a step,
    # hang_startup_s plus hang_step_factor x the plan's predicted step before (model load,
    # data index, first compile, and the first step itself, which reports only when it
    # ends). 20x and 1800 s: twice the Prometheus alerts' 10x and 900 s
    # (deploy/prometheus/rules.yml), so a person is
    # warned first; 600 s: a 1 TB checkpoint (a 70B model with AdamW) written at 2 GB/s
    # takes ~500 s and reports only when it is done.
    hang_step_factor: float = Field(
        default=20.0,
        ge=2,
        le=10000,
        description="a worker silent for this many times its last step's wall time (at "
        "least hang_floor_s) is hung: SIGKILLed and its job retried",
    )
    hang_floor_s: float = Field(
        default=600.0,
        ge=1,
        le=86400,
        description="the shortest no-progress window once a step was reported: it must "
        "cover a checkpoint write or an evaluation, which report only when they end",
    )
    hang_startup_s: float = Field(
        default=1800.0,
        ge=1,
        le=86400,
        description="the no-progress window before a worker's first step report (at least "
        "hang_floor_s): loading the model and data, resuming a checkpoint, the first "
        "step's compile; hang_step_factor x the plan's predicted step is added for the first "
        "step itself",
    )
    shm_dir: Path = Field(
        default=Path("/dev/shm"),
        description="a tmpfs where the ranks of a working-set job on several GPUs of this "
        "node keep their one shared copy of the training state (its size bounds that state)",
    )

    spill_dir: Path | None = Field(
        default=None,
        description="the disk tier: a local NVMe directory where jobs with budget.disk_gib "
        "keep the AdamW moments their host budget cannot hold (one subdirectory a job); the "
        "agent measures its read and write rates into the node profile, so plans spill only "
        "on nodes that have one; unset: no job spills here",
    )

    def hang_window(self) -> HangWindow:
        """When a worker that reports nothing is hung (agent/hang.py)."""
        return HangWindow(self.hang_step_factor, self.hang_floor_s, self.hang_startup_s)
