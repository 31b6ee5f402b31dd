"""The contracts every wstrain process shares besides the spec and the plan: JobState and
its transitions, Job, events, nodes, the worker's messages and exit codes, Redis key names.

This module imports only pydantic (and the standard library): the API service, the scheduler
agent and the worker all import it, and it must stay importable on a GPU host without
fastapi or redis. Nothing here performs I/O."""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    Field,
)

from wstrain.contracts.plan import Plan
from wstrain.contracts.spec import JobSpec


class JobState(str, enum.Enum):  # noqa: UP042 - StrEnum changes str(); stored as .value
    queued = "queued"
    planning = "planning"
    running = "running"
    cancelling = "cancelling"
    succeeded = "succeeded"
    failed = "failed"
    cancelled = "cancelled"
    timeout = "timeout"  # ran past its time_limit_s: stopped with a checkpoint, resumable


TERMINAL_STATES = frozenset(
    {JobState.succeeded, JobState.failed, JobState.cancelled, JobState.timeout}
)

# Every allowed edge of the job state machine. A terminal state changes only through an
# explicit resume (failed|cancelled -> queued), which starts a new attempt of the same job.
ALLOWED_TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    JobState.queued: frozenset({JobState.planning, JobState.cancelled}),
    # planning|running -> queued: the agent gave the job back (agent shut down), so another
    # attempt starts from the last checkpoint.
    JobState.planning: frozenset(
        {JobState.running, JobState.failed, JobState.cancelled, JobState.queued}
    ),
    JobState.running: frozenset(
        {
            JobState.succeeded,
            JobState.failed,
            JobState.cancelling,
            JobState.cancelled,
            JobState.queued,
            JobState.timeout,
        }
    ),
    JobState.cancelling: frozenset({JobState.cancelled, JobState.failed, JobState.succeeded}),
    JobState.succeeded: frozenset(),
    JobState.failed: frozenset({JobState.queued}),
    JobState.cancelled: frozenset({JobState.queued}),
    JobState.timeout: frozenset({JobState.queued}),
}


def can_transition(src: JobState, dst: JobState) -> bool:
    return dst in ALLOWED_TRANSITIONS[src]


# ---------------------------------------------------------------- jobs, events, nodes


class Job(BaseModel):
    id: str
    name: str
    owner: str
    state: JobState
    attempt: int
    rev: int = Field(default=0, description="bumped by every change to the job")
    step: int
    steps: int
    epoch: float | None = Field(default=None, description="epochs of the training data done")
    tokens_seen: int | None = Field(default=None, description="input tokens trained on")
    data_position: int | None = Field(
        default=None,
        description="sequences of the data order consumed (step x global_batch): the next "
        "step starts at this position of the order, epoch after epoch",
    )
    loss: float | None = None
    eval_loss: float | None = Field(default=None, description="held-out loss, last evaluation")
    tokens_per_s: float | None = None
    mfu: float | None = None
    step_seconds: float | None = None
    eta_s: float | None = None
    error: str | None = None
    state_reason: str | None = Field(
        default=None,
        description="why a queued job waits (quota, resources, dependency, back-off, "
        "priority), or why it was requeued",
    )
    retries: int = Field(default=0, description="automatic retries after a worker died")
    node: str | None = None
    gpu: str | None = Field(
        default=None,
        description="the GPU index on its node, once running; a job on several GPUs lists "
        'them all, comma-separated ("0,1")',
    )
    worker_pid: int | None = None
    last_checkpoint: str | None = None
    created_at: float
    updated_at: float
    plan: Plan | None = None
    spec: JobSpec
    telemetry: dict[str, float] = Field(
        default={},
        description="the worker's latest runtime telemetry: stall seconds by "
        "dependency, transfer bytes and bandwidth, host RSS/arena/pinned, device peaks",
    )


def gpu_text(indices: tuple[int, ...]) -> str:
    """Job.gpu as stored and shown: the GPU indices comma-separated ("0,1"; "" for none)."""
    return ",".join(str(i) for i in indices)


def gpu_indices(text: str | None) -> tuple[int, ...]:
    """The GPU indices of a Job.gpu string ("0,1" -> (0, 1); "" or None -> ())."""
    return tuple(int(part) for part in (text or "").split(",") if part.strip())


class JobList(BaseModel):
    jobs: list[Job] = Field(description="newest first; each without its plan (GET .../plan)")
    total: int
    offset: int
    limit: int


class Event(BaseModel):
    id: str
    ts: float
    kind: str
    message: str
    data: dict[str, Any] = {}


class GPUInfo(BaseModel):
    index: int
    name: str
    total_bytes: int
    free_bytes: int


class Node(BaseModel):
    name: str
    device: Literal["cpu", "cuda"]
    gpus: list[GPUInfo]
    host_total_bytes: int
    host_free_bytes: int
    slots: int
    running: list[str]
    profile: dict[str, float]
    heartbeat_at: float
    # the agent process that holds this node name: a second agent with the same name is
    # refused while this one heartbeats
    agent_id: str = ""
    agent_pid: int | None = None
    # where that agent runs, and its start time (clock ticks since boot): an agent started
    # on the same host can tell that its predecessor under this name is dead, not just quiet
    host: str = ""
    agent_start: int | None = None


class PresetInfo(BaseModel):
    """One model preset, as `GET /v1/presets` lists it."""

    name: str
    architecture: str
    layers: int
    hidden_size: int
    intermediate_size: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab_size: int
    max_position_embeddings: int
    experts: int = Field(description="routed experts per layer (0: dense)")
    experts_per_token: int
    moe_intermediate_size: int
    params_total: int
    params_active: int = Field(
        description="parameters a token passes through (= total for dense models)"
    )
    training_state_bytes: dict[str, int] = Field(
        description="weights + gradients + AdamW moments (+ fp32 master in mixed), by precision"
    )


class PresetList(BaseModel):
    presets: list[PresetInfo]


class WorkerMessage(BaseModel):
    """One JSON line a worker writes on stdout for its agent. `stopping`: asked to stop
    (SIGTERM, or its agent gone), it has ended its step in flight and writes its checkpoint
    now; a preempted worker's SIGKILL deadline runs from here (agent/stops.py)."""

    kind: Literal["started", "step", "eval", "checkpoint", "stopping", "log", "error"]
    step: int | None = None
    epoch: float | None = None  # epochs of the training data done
    tokens_seen: int | None = None
    data_position: int | None = None  # sequences of the data order consumed
    loss: float | None = None
    tokens_per_s: float | None = None
    mfu: float | None = None
    step_seconds: float | None = None
    path: str | None = None
    message: str | None = None
    metrics: dict[str, float] = {}
    # on `started`: what the MFU is measured against (None on CPU unless the agent is given a
    # peak) and the model FLOPs per trained token (docs/DESIGN.md, MFU)
    flops_per_token: float | None = None
    peak_flops: float | None = None  # FLOP/s, dense, for `precision`
    peak_source: str | None = None  # a chip-table row, "measured" or "configured"
    precision: str | None = None  # the compute precision: bf16, fp32, tf32
    # on an `error` of exit 5: the smallest budgets (GiB, keyed "device_gib" or "host_gib")
    # that would have held what the job asked for when it ran out
    needs_gib: dict[str, float] = {}


class WorkerExit(int, enum.Enum):
    succeeded = 0
    failed = 1  # a crash: retried per the spec's max_retries
    cancelled = 3
    # the spec was refused before training (InvalidSpec: a path outside the data roots or
    # inside the state dir, a file that does not fit the model): another attempt would be
    # refused the same way, so the job fails at once
    refused = 4
    # the job ran out of a memory budget (CUDA out of memory inside its device budget, or
    # its host arena refused a tile past its host budget): the same plan would again, so the
    # job is not retried as is; its error names the budget that fits
    out_of_memory = 5


# ---------------------------------------------------------------- redis keys


class Keys:
    """Every Redis key wstrain uses, under one prefix so a shared Redis stays tidy."""

    def __init__(self, prefix: str = "wstrain") -> None:
        self.prefix = prefix

    def job(self, job_id: str) -> str:
        return f"{self.prefix}:job:{job_id}"

    def events(self, job_id: str) -> str:
        return f"{self.prefix}:events:{job_id}"

    @property
    def jobs(self) -> str:  # sorted set: id by created_at
        return f"{self.prefix}:jobs"

    @property
    def queue(self) -> str:  # sorted set: id by (-priority, created_at)
        return f"{self.prefix}:queue"

    def by_state(self, state: str) -> str:  # sorted set: ids in that state by created_at
        return f"{self.prefix}:by-state:{state}"

    def by_owner(self, owner: str) -> str:  # sorted set: the owner's ids by created_at
        return f"{self.prefix}:by-owner:{owner}"

    @property
    def nodes(self) -> str:  # set of node names
        return f"{self.prefix}:nodes"

    def node(self, name: str) -> str:  # string (Node JSON) with a TTL = heartbeat
        return f"{self.prefix}:node:{name}"

    @property
    def queue_wait(self) -> str:  # hash: the queue-wait histogram's buckets, count and sum
        return f"{self.prefix}:metrics:queue-wait"

    @property
    def exporter_lease(self) -> str:  # string: the API replica exporting store-wide series
        return f"{self.prefix}:metrics:exporter"


def job_dir(state_dir: str | Path, job_id: str) -> Path:
    return Path(state_dir) / "jobs" / job_id
