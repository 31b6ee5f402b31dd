"""The API's /metrics: request latency by route, jobs by state, queue depth and registered
nodes, read from Redis at scrape time (so a restarted API loses nothing).

Per-job training series (loss, tokens/s, stalls, bandwidth, memory) are the agents' to
export: each agent serves them for the workers on its host (scheduler/agent/exporter.py).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from wstrain.scheduler.contracts.jobs import JobState
from wstrain.scheduler.store import JobStore


class _Snapshot(Collector):
    def __init__(self, counts: dict[JobState, int], depth: int, nodes: int) -> None:
        self.counts, self.depth, self.nodes = counts, depth, nodes

    def collect(self) -> Iterator[GaugeMetricFamily]:
        jobs = GaugeMetricFamily("wstrain_jobs", "Jobs by state.", labels=["state"])
        for state, n in self.counts.items():
            jobs.add_metric([state.value], n)
        yield jobs
        yield GaugeMetricFamily(
            "wstrain_queue_depth", "Jobs waiting in the queue.", value=self.depth
        )
        yield GaugeMetricFamily("wstrain_nodes", "Scheduler agents heartbeating.", value=self.nodes)


class ApiMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.latency = Histogram(
            "wstrain_api_request_duration_seconds",
            "API request latency by route.",
            ["method", "route", "code"],
            registry=self.registry,
        )

    def observe(self, method: str, route: str, code: int, seconds: float) -> None:
        self.latency.labels(method, route, str(code)).observe(seconds)

    async def render(self, store: JobStore) -> bytes:
        counts = await store.counts_by_state()
        registry = CollectorRegistry()
        registry.register(_Snapshot(counts, await store.queue_depth(), len(await store.nodes())))
        return generate_latest(self.registry) + generate_latest(registry)
