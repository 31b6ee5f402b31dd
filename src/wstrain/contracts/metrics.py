"""Every Prometheus series wstrain exports: name, type, labels and HELP text, defined once.

The exporters (api/metrics.py for the store-wide series, agent/exporter.py
and agent/gpus.py for a host's jobs and devices), the dashboards
(dashboards/build.py), the alert rules (deploy/prometheus/rules.yml) and their tests all
name series through this table, so a rename is one edit here and a failing test elsewhere.

Conventions (Prometheus's): base units in the name (`_seconds`, `_bytes`, `_ratio`),
counters end in `_total` and start at 0, every label is bounded (a job id is bounded by the
store's retention: a job's series leave the moment it ends, its info series a day later).

    python -m wstrain.contracts.metrics      # the table: every series, its labels, HELP
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Kind(enum.StrEnum):
    counter = "counter"
    gauge = "gauge"
    histogram = "histogram"


class Source(enum.StrEnum):
    """Which process exports the series."""

    api = "api"  # the replica holding the exporter lease: store-wide, never double-counted
    api_replica = "api_replica"  # every API replica: its own requests and its Redis link
    agent = "agent"  # each host's agent: its jobs' live series and its devices


@dataclass(frozen=True)
class Metric:
    name: str  # as Prometheus stores it; counters with their `_total`
    kind: Kind
    source: Source
    labels: tuple[str, ...]
    help: str

    @property
    def family(self) -> str:
        """The name prometheus-client's families take (it appends `_total` to counters)."""
        return self.name.removesuffix("_total") if self.kind is Kind.counter else self.name


# Why a job's compute stream waited (worker/runtime: every runtime reports all five, 0 where
# a runtime never waits on one, so `rate()` has a series from the job's first scrape).
STALL_REASONS = ("weights", "gradients", "activations", "write_buffer", "optimizer")
TRANSFER_DIRECTIONS = ("h2d", "d2h")  # host to device, device to host
DEVICE_MEMORY_KINDS = ("allocated", "reserved")  # torch's peaks; on a CPU job: process_rss

_A, _S, _R = Source.api, Source.agent, Source.api_replica
_C, _G, _H = Kind.counter, Kind.gauge, Kind.histogram
_J = ("job",)

# ---------------------------------------------------------------- store-wide (API lease holder)
JOB_INFO = Metric(
    "wstrain_job_info",
    _G,
    _A,
    ("job", "owner", "name", "model", "runtime", "gpu", "node"),
    "1 for every job in the store (live, or ended in the last day): who owns it, what it "
    "trains and where (runtime, gpu and node are empty until it is planned and placed).",
)
JOB_STATE = Metric(
    "wstrain_job_state",
    _G,
    _A,
    ("job", "state"),
    "1 for each job in its current state (one series per job).",
)
JOBS = Metric("wstrain_jobs", _G, _A, ("state",), "Jobs in the store by state.")
QUEUE_DEPTH = Metric("wstrain_queue_depth", _G, _A, (), "Jobs waiting in the queue.")
QUEUE_PENDING = Metric(
    "wstrain_queue_pending_jobs", _G, _A, ("owner",), "Jobs waiting in the queue, by owner."
)
QUEUE_OLDEST_WAIT = Metric(
    "wstrain_queue_oldest_wait_seconds",
    _G,
    _A,
    (),
    "Seconds the longest-waiting queued job has waited since it was last queued (0: none).",
)
QUEUE_WAIT = Metric(
    "wstrain_queue_wait_seconds",
    _H,
    _A,
    (),
    "Seconds each claimed job waited in the queue, counted in Redis at the claim.",
)
QUEUE_PREDICTED_WAIT = Metric(
    "wstrain_queue_predicted_wait_seconds",
    _G,
    _A,
    ("owner",),
    "Seconds from now until the owner's last queued job is predicted to start (the queue "
    "forecast of GET /v1/queue; 0: all start now; owners with no prediction are absent).",
)
# Buckets of QUEUE_WAIT, seconds: a second to a day (a lab queue waits minutes to hours).
QUEUE_WAIT_BUCKETS_S = (1, 10, 60, 300, 900, 1800, 3600, 7200, 14400, 43200, 86400)
NODES = Metric("wstrain_nodes", _G, _A, (), "Scheduler agents heartbeating.")
NODE_UP = Metric(
    "wstrain_node_up",
    _G,
    _A,
    ("node",),
    "1 while the node's agent heartbeats, 0 once its heartbeat expired without a clean "
    "shutdown (the agent or its host is dead or cut off).",
)
NODE_HEARTBEAT = Metric(
    "wstrain_node_heartbeat_timestamp_seconds",
    _G,
    _A,
    ("node",),
    "Unix time of the agent's last heartbeat.",
)

# ---------------------------------------------------------------- every API replica
EXPORTER_LEADER = Metric(
    "wstrain_exporter_leader",
    _G,
    _R,
    (),
    "1 on the API replica that exports the store-wide series now, 0 on the others.",
)
REDIS_UP = Metric(
    "wstrain_redis_up", _G, _R, (), "1 when this API replica's last Redis command succeeded."
)
API_LATENCY = Metric(
    "wstrain_api_request_duration_seconds",
    _H,
    _R,
    ("method", "route", "code"),
    "API request latency in seconds, by method (unknown methods: other), route template "
    "and status code.",
)

# ---------------------------------------------------------------- a host's live jobs (agent)
JOB_STEPS = Metric("wstrain_job_steps_total", _C, _S, _J, "Optimizer steps the job has done.")
JOB_TOKENS = Metric("wstrain_job_tokens_total", _C, _S, _J, "Tokens the job has trained on.")
JOB_MODEL_FLOPS = Metric(
    "wstrain_job_model_flops_total",
    _C,
    _S,
    _J,
    "Model FLOPs the job has done: tokens x (6 x active parameters + attention), the "
    "formula of MFU in docs/DESIGN.md.",
)
JOB_PEAK_FLOPS = Metric(
    "wstrain_job_peak_flops_per_second",
    _G,
    _S,
    ("job", "precision", "source"),
    "The dense peak FLOP/s the job's MFU is measured against, for its compute precision; "
    "source: the chip table's row, `measured` (a GEMM on an unknown chip) or `configured`. "
    "Absent on CPU unless the agent is given a peak.",
)
JOB_STALL = Metric(
    "wstrain_job_stall_seconds_total",
    _C,
    _S,
    ("job", "reason"),
    "Seconds the job's compute stream waited, by reason (weights, gradients, activations, "
    "write_buffer, optimizer).",
)
JOB_TRANSFER = Metric(
    "wstrain_job_transfer_bytes_total",
    _C,
    _S,
    ("job", "direction"),
    "Bytes the job copied between host and device (h2d, d2h).",
)
JOB_LAST_PROGRESS = Metric(
    "wstrain_job_last_progress_timestamp_seconds",
    _G,
    _S,
    _J,
    "Unix time of the job worker's last report (started, step, evaluation, checkpoint); "
    "the worker's start until it reports.",
)
JOB_STEP_SECONDS = Metric(
    "wstrain_job_step_seconds", _G, _S, _J, "Wall time of the job's last reported step, in seconds."
)
JOB_LOSS = Metric("wstrain_job_loss", _G, _S, _J, "Training loss of the last reported step.")
JOB_EVAL_LOSS = Metric(
    "wstrain_job_eval_loss", _G, _S, _J, "Loss on the held-out split, last evaluation."
)
JOB_HOST_RSS = Metric(
    "wstrain_job_host_rss_bytes", _G, _S, _J, "Resident set size of the job's worker, in bytes."
)
JOB_HOST_PINNED = Metric(
    "wstrain_job_host_pinned_bytes", _G, _S, _J, "Page-locked host bytes of the worker's arena."
)
JOB_HOST_ARENA = Metric(
    "wstrain_job_host_arena_bytes", _G, _S, _J, "Host bytes accounted in the worker's arena."
)
JOB_DEVICE_MEMORY = Metric(
    "wstrain_job_device_memory_bytes",
    _G,
    _S,
    ("job", "kind"),
    "Peak device memory of the worker, allocated and reserved by torch's allocator; on a "
    "CPU job (kind process_rss) the process's peak resident set.",
)
JOB_BUDGET = Metric(
    "wstrain_job_budget_bytes",
    _G,
    _S,
    ("job", "memory"),
    "The job's hard memory budgets (memory: device, host).",
)
JOB_PREDICTED_STEP = Metric(
    "wstrain_job_plan_predicted_step_seconds",
    _G,
    _S,
    _J,
    "Step time the job's plan predicted, in seconds.",
)

# ---------------------------------------------------------------- a host (agent)
_N = ("node",)
_NG = ("node", "gpu")
DEVICE_CAPACITY = Metric(
    "wstrain_device_capacity_bytes",
    _G,
    _S,
    ("node", "device"),
    "Memory of each device of the node (on a CPU node: host memory).",
)
DEVICE_FREE_BUDGET = Metric(
    "wstrain_device_free_budget_bytes",
    _G,
    _S,
    ("node", "device"),
    "Device budget in bytes a new job could still get on each device.",
)
HOST_CAPACITY = Metric("wstrain_host_capacity_bytes", _G, _S, _N, "Host memory of the node.")
HOST_FREE_BUDGET = Metric(
    "wstrain_host_free_budget_bytes",
    _G,
    _S,
    _N,
    "Host budget in bytes not reserved by running jobs.",
)
NODE_SLOTS = Metric("wstrain_node_slots", _G, _S, _N, "Jobs the node can run at once.")
NODE_RUNNING = Metric("wstrain_node_running_jobs", _G, _S, _N, "Jobs running on the node.")
NODE_CEILING = Metric(
    "wstrain_node_transfer_ceiling_bytes_per_second",
    _G,
    _S,
    ("node", "direction"),
    "Measured host<->device copy ceiling of the node (h2d, d2h; both: each way while both run).",
)
GPU_INFO = Metric(
    "wstrain_gpu_info", _G, _S, ("node", "gpu", "name", "uuid"), "1 for each GPU NVML sees."
)
GPU_UTILIZATION = Metric(
    "wstrain_gpu_utilization_ratio",
    _G,
    _S,
    _NG,
    "Fraction of NVML's last sample period in which a kernel ran on the GPU (0..1).",
)
GPU_MEMORY_USED = Metric(
    "wstrain_gpu_memory_used_bytes", _G, _S, _NG, "GPU memory in use, all processes (NVML)."
)
GPU_MEMORY_TOTAL = Metric("wstrain_gpu_memory_total_bytes", _G, _S, _NG, "GPU memory (NVML).")
GPU_POWER = Metric("wstrain_gpu_power_watts", _G, _S, _NG, "GPU power draw in watts (NVML).")
GPU_TEMPERATURE = Metric(
    "wstrain_gpu_temperature_celsius", _G, _S, _NG, "GPU core temperature in degrees Celsius."
)
GPU_PCIE = Metric(
    "wstrain_gpu_pcie_throughput_bytes_per_second",
    _G,
    _S,
    ("node", "gpu", "direction"),
    "PCIe throughput NVML sampled over its last 20 ms (direction: tx = device to host, "
    "rx = host to device).",
)

ALL: tuple[Metric, ...] = tuple(v for v in tuple(globals().values()) if isinstance(v, Metric))
BY_NAME = {m.name: m for m in ALL}


def main() -> None:
    for m in ALL:
        labels = "{" + ",".join(m.labels) + "}" if m.labels else ""
        print(f"{m.name}{labels}  {m.kind.value}, {m.source.value}: {m.help}")


if __name__ == "__main__":
    main()
