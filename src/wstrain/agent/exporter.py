"""The scheduler agent's /metrics: the live series of every job on this host (counters of
steps, tokens, model FLOPs, stall seconds and transfer bytes; levels of memory and loss; the
time of the worker's last report) and the node's capacity, free budgets and link ceilings.
Names, labels and HELP come from contracts/metrics.py.

Workers report to their agent on stdout (agent/supervisor.py feeds every message
here), so Prometheus scrapes one port per host, never a port per job. A job's series exist
from its worker's start (counters at 0, or at the resumed step) until the moment it ends;
then they are gone from the next scrape, so no panel shows the throughput of a finished job
and the series count stays bounded by the running jobs. Served from a thread by
prometheus-client, beside the GPU collector (agent/gpus.py):

    exporter = AgentExporter(); exporter.serve("0.0.0.0", 9464)
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from wstrain.contracts import metrics as m
from wstrain.contracts.jobs import Job, WorkerMessage

Family = GaugeMetricFamily | CounterMetricFamily

# sysexits.h EX_CONFIG: the agent exits so when a setting must change before it can run;
# `wstrain serve` (cli/serve.py) then stops instead of restarting it every 1..60 s
EXIT_CONFIG = 78


class MetricsPortBusy(SystemExit):
    """The agent's /metrics port cannot be bound (another agent, another exporter, a port
    under 1024 without the right): the agent exits with this one line and EXIT_CONFIG.
    Prometheus scrapes a fixed port, so the agent never wanders to another one."""

    def __init__(self, host: str, port: int, exc: OSError) -> None:
        super().__init__(
            f"wstrain-agent: cannot serve /metrics on {host}:{port}: {exc.strerror or exc}; "
            f"set WSTRAIN_METRICS_PORT (wstrain serve --metrics-port) to a free port, or to 0 "
            "to serve no /metrics"
        )


# telemetry key prefix (worker/runtime/stats.py) -> the labelled per-job metric it feeds
_LABELLED = {
    "stall_seconds_total": m.JOB_STALL,
    "transfer_bytes_total": m.JOB_TRANSFER,
    "device_memory_bytes": m.JOB_DEVICE_MEMORY,
}
_PLAIN = {
    "host_rss_bytes": m.JOB_HOST_RSS,
    "host_pinned_bytes": m.JOB_HOST_PINNED,
    "host_arena_bytes": m.JOB_HOST_ARENA,
}


def family(metric: m.Metric, labels: tuple[str, ...] | None = None) -> Family:
    """An empty family of `metric` (its catalogue name, HELP and labels)."""
    kind = CounterMetricFamily if metric.kind is m.Kind.counter else GaugeMetricFamily
    return kind(metric.family, metric.help, labels=list(labels or metric.labels))


@dataclass
class _Live:
    """One running job's last known figures; counters are the job's totals so far."""

    device_budget_bytes: int
    host_budget_bytes: int
    predicted_step_seconds: float | None
    last_progress_s: float  # unix time of the worker's last report (its spawn until then)
    steps: int = 0
    tokens: int = 0
    flops_per_token: float | None = None
    peak: tuple[float, str, str] | None = None  # FLOP/s, precision, source
    step_seconds: float | None = None
    loss: float | None = None
    eval_loss: float | None = None
    telemetry: dict[str, float] = field(default_factory=dict)
    # the worker reported `started`: its counters exist from then (a worker that fails
    # while it loads never trained, and a scrape in its short life must not say otherwise)
    started: bool = False


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
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: dict[str, _Live] = {}
        self._node = NodeGauges(name="")
        self.registry = CollectorRegistry()
        self.registry.register(self)

    # -------------------------------------------------- fed by the agent (event-loop thread)

    def job_started(self, job: Job) -> None:
        """The job's worker was spawned: its series start now, counters at its resumed step."""
        predicted = job.plan.predicted.step_seconds if job.plan is not None else None
        with self._lock:
            self._jobs[job.id] = _Live(
                job.spec.budget.device_bytes,
                job.spec.budget.host_bytes,
                predicted,
                time.time(),
                steps=job.step,
                tokens=job.tokens_seen or 0,
            )

    def job_message(self, job_id: str, msg: WorkerMessage) -> None:
        """Any report of the worker is progress; steps, evaluations and the start carry
        figures."""
        with self._lock:
            live = self._jobs.get(job_id)
            if live is None:
                return
            live.last_progress_s = time.time()
            if msg.kind == "started":
                live.started = True
                live.steps = msg.step if msg.step is not None else live.steps
                live.flops_per_token = msg.flops_per_token
                if msg.peak_flops is not None:
                    live.peak = (msg.peak_flops, msg.precision or "", msg.peak_source or "")
            elif msg.kind == "step":
                live.steps = msg.step if msg.step is not None else live.steps
                live.tokens = msg.tokens_seen if msg.tokens_seen is not None else live.tokens
                live.step_seconds = msg.step_seconds
                live.loss = msg.loss
                live.telemetry = dict(msg.metrics)
            elif msg.kind == "eval":
                live.eval_loss = msg.loss

    def job_ended(self, job_id: str) -> None:
        """The worker exited: the job's series leave with the next scrape."""
        with self._lock:
            self._jobs.pop(job_id, None)

    def set_node(self, gauges: NodeGauges) -> None:
        with self._lock:
            self._node = gauges

    def serve(self, host: str, port: int) -> None:
        try:
            start_http_server(port, addr=host, registry=self.registry)
        except OSError as exc:  # EADDRINUSE, EACCES (a port under 1024), EADDRNOTAVAIL
            raise MetricsPortBusy(host, port, exc) from None

    # -------------------------------------------------- scraped (server thread)

    def collect(self) -> Iterator[Family]:
        with self._lock:
            jobs = {jid: _copy(live) for jid, live in self._jobs.items()}
            node = self._node
        yield from _job_families(jobs)
        yield from _node_families(node)


def _copy(live: _Live) -> _Live:
    return _Live(**{**live.__dict__, "telemetry": dict(live.telemetry)})


def _job_families(jobs: dict[str, _Live]) -> Iterator[Family]:
    steps, tokens = family(m.JOB_STEPS), family(m.JOB_TOKENS)
    flops, peak = family(m.JOB_MODEL_FLOPS), family(m.JOB_PEAK_FLOPS)
    progress, step_s = family(m.JOB_LAST_PROGRESS), family(m.JOB_STEP_SECONDS)
    loss, eval_loss = family(m.JOB_LOSS), family(m.JOB_EVAL_LOSS)
    budget, predicted = family(m.JOB_BUDGET), family(m.JOB_PREDICTED_STEP)
    labelled = {key: family(metric) for key, metric in _LABELLED.items()}
    plain = {key: family(metric) for key, metric in _PLAIN.items()}
    for jid, s in jobs.items():
        if s.started:  # progress and budgets from the spawn, counters from the start
            steps.add_metric([jid], s.steps)
            tokens.add_metric([jid], s.tokens)
        if s.flops_per_token is not None:
            flops.add_metric([jid], s.tokens * s.flops_per_token)
        if s.peak is not None:
            peak.add_metric([jid, s.peak[1], s.peak[2]], s.peak[0])
        progress.add_metric([jid], s.last_progress_s)
        for fam, value in ((step_s, s.step_seconds), (loss, s.loss), (eval_loss, s.eval_loss)):
            if value is not None:
                fam.add_metric([jid], value)
        budget.add_metric([jid, "device"], s.device_budget_bytes)
        budget.add_metric([jid, "host"], s.host_budget_bytes)
        if s.predicted_step_seconds is not None:
            predicted.add_metric([jid], s.predicted_step_seconds)
        # 0 from the worker's start: rate() over a counter needs its first sample
        for reason in m.STALL_REASONS:
            s.telemetry.setdefault(f"stall_seconds_total.{reason}", 0.0)
        for direction in m.TRANSFER_DIRECTIONS:
            s.telemetry.setdefault(f"transfer_bytes_total.{direction}", 0.0)
        for key, value in s.telemetry.items():
            name, _, label = key.partition(".")
            if name in labelled and label:
                labelled[name].add_metric([jid, label], value)
            elif name in plain:
                plain[name].add_metric([jid], value)
    yield from (steps, tokens, flops, peak, progress, step_s, loss, eval_loss, budget, predicted)
    yield from labelled.values()
    yield from plain.values()


def _node_families(node: NodeGauges) -> Iterator[Family]:
    cap, free = family(m.DEVICE_CAPACITY), family(m.DEVICE_FREE_BUDGET)
    for dev, total in node.device_capacity_bytes.items():
        cap.add_metric([node.name, dev], total)
        free.add_metric([node.name, dev], node.device_free_budget_bytes.get(dev, 0))
    yield cap
    yield free
    for metric, value in (
        (m.HOST_CAPACITY, node.host_capacity_bytes),
        (m.HOST_FREE_BUDGET, node.host_free_budget_bytes),
        (m.NODE_SLOTS, node.slots),
        (m.NODE_RUNNING, node.running),
    ):
        fam = family(metric)
        fam.add_metric([node.name], value)
        yield fam
    ceiling = family(m.NODE_CEILING)
    for direction, bps in node.ceilings_bytes_per_s.items():
        ceiling.add_metric([node.name, direction], bps)
    yield ceiling
