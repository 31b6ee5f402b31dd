"""The API's /metrics: request latency, jobs by state, queue depth, and the progress gauges
of live jobs read from Redis (names as in DESIGN.md).

Job gauges come from the job store at scrape time, so a restarted API loses nothing and
finished jobs drop out of the exposition by themselves (series stay bounded).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from scheduler.contracts import Job, JobState
from scheduler.store import JobStore

_LIVE = (JobState.planning, JobState.running, JobState.cancelling)

# (metric, help, Job attribute)
_JOB_GAUGES = (
    ("wstrain_step_seconds", "Wall time of the job's last optimizer step.", "step_seconds"),
    ("wstrain_tokens_per_second", "Training tokens per second of the last step.", "tokens_per_s"),
    ("wstrain_mfu_ratio", "Model FLOPs utilisation of the last step (0..1).", "mfu"),
    ("wstrain_loss", "Training loss of the last step.", "loss"),
)


class _Snapshot(Collector):
    def __init__(self, counts: dict[JobState, int], depth: int, live: list[Job]) -> None:
        self.counts, self.depth, self.live = counts, depth, live

    def collect(self) -> Iterator[GaugeMetricFamily]:
        jobs = GaugeMetricFamily("wstrain_jobs", "Jobs by state.", labels=["state"])
        for state, n in self.counts.items():
            jobs.add_metric([state.value], n)
        yield jobs
        yield GaugeMetricFamily("wstrain_queue_depth", "Jobs waiting in the queue.",
                                value=self.depth)
        for name, help_text, attr in _JOB_GAUGES:
            fam = GaugeMetricFamily(name, help_text, labels=["job"])
            for job in self.live:
                value = getattr(job, attr)
                if value is not None:
                    fam.add_metric([job.id], value)
            yield fam
        pred = GaugeMetricFamily("wstrain_plan_predicted_step_seconds",
                                 "Step time the plan predicted.", labels=["job"])
        budget = GaugeMetricFamily("wstrain_budget_bytes", "The job's hard memory budgets.",
                                   labels=["job", "memory"])
        for job in self.live:
            if job.plan is not None:
                pred.add_metric([job.id], job.plan.predicted.step_seconds)
            budget.add_metric([job.id, "device"], job.spec.budget.device_bytes)
            budget.add_metric([job.id, "host"], job.spec.budget.host_bytes)
        yield pred
        yield budget
        yield from self._telemetry()

    def _telemetry(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        """The runtime telemetry workers report (worker/stats.py Telemetry keys)."""
        stall = CounterMetricFamily("wstrain_stall_seconds", "Seconds the compute stream "
                                    "waited, by dependency.", labels=["job", "dependency"])
        moved = CounterMetricFamily("wstrain_transfer_bytes", "Bytes copied between host and "
                                    "device.", labels=["job", "direction"])
        bw = GaugeMetricFamily("wstrain_transfer_bandwidth_bytes_per_second",
                               "Achieved transfer bandwidth over the last step.",
                               labels=["job", "direction"])
        dev = GaugeMetricFamily("wstrain_device_memory_bytes", "Peak device memory of the "
                                "worker, allocated and reserved.", labels=["job", "kind"])
        host = {name: GaugeMetricFamily(f"wstrain_{name}", text, labels=["job"]) for name, text in (
            ("host_rss_bytes", "Resident set size of the worker process."),
            ("host_pinned_bytes", "Page-locked host bytes of the worker's arena."),
            ("host_arena_bytes", "Host bytes accounted in the worker's arena."))}
        by_prefix = {"stall_seconds_total": stall, "transfer_bytes_total": moved,
                     "transfer_bandwidth": bw, "device_memory": dev}
        for job in self.live:
            for key, value in job.telemetry.items():
                name, _, label = key.partition(".")
                if name in by_prefix and label:
                    by_prefix[name].add_metric([job.id, label], value)
                elif name in host:
                    host[name].add_metric([job.id], value)
        yield from by_prefix.values()
        yield from host.values()


class ApiMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.latency = Histogram("wstrain_api_request_duration_seconds",
                                 "API request latency by route.", ["method", "route", "code"],
                                 registry=self.registry)

    def observe(self, method: str, route: str, code: int, seconds: float) -> None:
        self.latency.labels(method, route, str(code)).observe(seconds)

    async def render(self, store: JobStore) -> bytes:
        counts = await store.counts_by_state()
        live: list[Job] = []
        for state in _LIVE:
            jobs, _ = await store.list(state=state, limit=1000)
            live += jobs
        registry = CollectorRegistry()
        registry.register(_Snapshot(counts, await store.queue_depth(), live))
        return generate_latest(self.registry) + generate_latest(registry)
