"""The scheduler agent's /metrics: the training series of every worker on this host and the
node's capacity, free budgets and measured link ceilings (metric names as in DESIGN.md).

Workers report each step to their agent on stdout (scheduler/agent/supervisor.py feeds `job_step`
here), so Prometheus scrapes one port per host, never a port per job. A finished job's series
stay for `grace_s` (so the last samples are scraped), then are dropped, keeping the series
count bounded. Served from a thread by prometheus-client:

    exporter = AgentExporter(grace_s=120); exporter.serve("0.0.0.0", 9464)
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from wstrain.scheduler.contracts.jobs import Job, WorkerMessage

# (metric, help, WorkerMessage attribute)
_STEP_GAUGES = (
    ("wstrain_step_seconds", "Wall time of the job's last optimizer step.", "step_seconds"),
    ("wstrain_tokens_per_second", "Training tokens per second of the last step.", "tokens_per_s"),
    ("wstrain_mfu_ratio", "Model FLOPs utilisation of the last step (0..1).", "mfu"),
    ("wstrain_loss", "Training loss of the last step.", "loss"),
    ("wstrain_job_step", "Optimizer steps the job has completed.", "step"),
)
# Worker telemetry keys `name.label` -> (metric, help, label, counter?)
_LABELLED = {
    "stall_seconds_total": (
        "wstrain_stall_seconds",
        "Seconds the compute stream waited, by dependency.",
        "dependency",
        True,
    ),
    "transfer_bytes_total": (
        "wstrain_transfer_bytes",
        "Bytes copied between host and device.",
        "direction",
        True,
    ),
    "transfer_bandwidth": (
        "wstrain_transfer_bandwidth_bytes_per_second",
        "Achieved transfer bandwidth over the last step.",
        "direction",
        False,
    ),
    "device_memory": (
        "wstrain_device_memory_bytes",
        "Peak device memory of the worker "
        "(allocated, reserved; on a CPU node the process's peak RSS).",
        "kind",
        False,
    ),
}
_PLAIN = {
    "host_rss_bytes": "Resident set size of the worker process.",
    "host_pinned_bytes": "Page-locked host bytes of the worker's arena.",
    "host_arena_bytes": "Host bytes accounted in the worker's arena.",
}


@dataclass
class _JobSeries:
    device_budget_bytes: int
    host_budget_bytes: int
    predicted_step_seconds: float | None
    last: WorkerMessage | None = None
    eval_loss: float | None = None
    ended_at: float | None = None


@dataclass
class NodeGauges:
    """This node's capacity as the agent sees it at its last heartbeat."""

    name: str
    device_capacity_bytes: dict[str, int] = field(default_factory=dict)  # device -> bytes
    device_free_budget_bytes: dict[str, int] = field(default_factory=dict)
    host_capacity_bytes: int = 0
    host_free_budget_bytes: int = 0
    slots: int = 0
    running: int = 0
    ceilings_bytes_per_s: dict[str, float] = field(default_factory=dict)  # direction -> B/s


class AgentExporter(Collector):
    def __init__(self, grace_s: float) -> None:
        self.grace_s = grace_s
        self._lock = threading.Lock()
        self._jobs: dict[str, _JobSeries] = {}
        self._node = NodeGauges(name="")
        self.registry = CollectorRegistry()
        self.registry.register(self)

    # -------------------------------------------------- fed by the agent (event-loop thread)

    def job_started(self, job: Job) -> None:
        predicted = job.plan.predicted.step_seconds if job.plan is not None else None
        with self._lock:
            self._jobs[job.id] = _JobSeries(
                job.spec.budget.device_bytes, job.spec.budget.host_bytes, predicted
            )

    def job_step(self, job_id: str, msg: WorkerMessage) -> None:
        with self._lock:
            if job_id in self._jobs:
                self._jobs[job_id].last = msg

    def job_eval(self, job_id: str, loss: float) -> None:
        with self._lock:
            if job_id in self._jobs:
                self._jobs[job_id].eval_loss = loss

    def job_ended(self, job_id: str) -> None:
        with self._lock:
            if job_id in self._jobs:
                self._jobs[job_id].ended_at = time.monotonic()

    def set_node(self, gauges: NodeGauges) -> None:
        with self._lock:
            self._node = gauges

    def serve(self, host: str, port: int) -> None:
        start_http_server(port, addr=host, registry=self.registry)

    # -------------------------------------------------- scraped (server thread)

    def _snapshot(self) -> tuple[dict[str, _JobSeries], NodeGauges]:
        now = time.monotonic()
        with self._lock:
            for jid in [
                j
                for j, s in self._jobs.items()
                if s.ended_at is not None and now - s.ended_at > self.grace_s
            ]:
                del self._jobs[jid]
            return dict(self._jobs), self._node

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        jobs, node = self._snapshot()
        yield from self._job_families(jobs)
        yield from self._node_families(node)

    def _job_families(
        self, jobs: dict[str, _JobSeries]
    ) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        for name, help_text, attr in _STEP_GAUGES:
            fam = GaugeMetricFamily(name, help_text, labels=["job"])
            for jid, s in jobs.items():
                value = getattr(s.last, attr, None)
                if value is not None:
                    fam.add_metric([jid], value)
            yield fam
        held = GaugeMetricFamily(
            "wstrain_eval_loss", "Loss on the held-out split, last evaluation.", labels=["job"]
        )
        for jid, s in jobs.items():
            if s.eval_loss is not None:
                held.add_metric([jid], s.eval_loss)
        yield held
        pred = GaugeMetricFamily(
            "wstrain_plan_predicted_step_seconds", "Step time the plan predicted.", labels=["job"]
        )
        budget = GaugeMetricFamily(
            "wstrain_budget_bytes", "The job's hard memory budgets.", labels=["job", "memory"]
        )
        for jid, s in jobs.items():
            if s.predicted_step_seconds is not None:
                pred.add_metric([jid], s.predicted_step_seconds)
            budget.add_metric([jid, "device"], s.device_budget_bytes)
            budget.add_metric([jid, "host"], s.host_budget_bytes)
        yield pred
        yield budget
        yield from self._telemetry_families(jobs)

    def _telemetry_families(
        self, jobs: dict[str, _JobSeries]
    ) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        labelled: dict[str, GaugeMetricFamily | CounterMetricFamily] = {}
        for key, (name, help_text, label, counter) in _LABELLED.items():
            kind = CounterMetricFamily if counter else GaugeMetricFamily
            labelled[key] = kind(name, help_text, labels=["job", label])
        plain = {
            k: GaugeMetricFamily(f"wstrain_{k}", text, labels=["job"]) for k, text in _PLAIN.items()
        }
        for jid, s in jobs.items():
            for key, value in (s.last.metrics if s.last else {}).items():
                name, _, label = key.partition(".")
                if name in labelled and label:
                    labelled[name].add_metric([jid, label], value)
                elif name in plain:
                    plain[name].add_metric([jid], value)
        yield from labelled.values()
        yield from plain.values()

    def _node_families(self, node: NodeGauges) -> Iterator[GaugeMetricFamily]:
        cap = GaugeMetricFamily(
            "wstrain_device_capacity_bytes",
            "Memory of each device of this node (on a CPU node: host memory).",
            labels=["node", "device"],
        )
        free = GaugeMetricFamily(
            "wstrain_device_free_budget_bytes",
            "Device budget a new job could still get on each device.",
            labels=["node", "device"],
        )
        for dev, total in node.device_capacity_bytes.items():
            cap.add_metric([node.name, dev], total)
            free.add_metric([node.name, dev], node.device_free_budget_bytes.get(dev, 0))
        yield cap
        yield free
        for name, help_text, value in (
            ("wstrain_host_capacity_bytes", "Host memory of this node.", node.host_capacity_bytes),
            (
                "wstrain_host_free_budget_bytes",
                "Host budget not reserved by running jobs.",
                node.host_free_budget_bytes,
            ),
            ("wstrain_node_slots", "Jobs this node can run at once.", node.slots),
            ("wstrain_node_running_jobs", "Jobs running on this node.", node.running),
        ):
            fam = GaugeMetricFamily(name, help_text, labels=["node"])
            fam.add_metric([node.name], value)
            yield fam
        ceiling = GaugeMetricFamily(
            "wstrain_node_transfer_ceiling_bytes_per_second",
            "Measured host<->device copy ceiling of this node "
            "(h2d, d2h, both = each way while both run).",
            labels=["node", "direction"],
        )
        for direction, bps in node.ceilings_bytes_per_s.items():
            ceiling.add_metric([node.name, direction], bps)
        yield ceiling
