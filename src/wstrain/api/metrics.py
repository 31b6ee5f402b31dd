"""The API's /metrics: request latency and Redis reachability of this replica, and the
store-wide series (every job's info and state, jobs by state, the queue by owner and its wait
histogram, each owner's predicted wait from the queue forecast, node liveness), read from
Redis at scrape time so a restarted API loses nothing.

Store-wide series come from one replica only, the holder of a lease in Redis
(store/metrics_view.py), so two replicas behind one Prometheus never double-count a job; the
others export `wstrain_exporter_leader 0` and their own latency. Series that name owners or
jobs are served to an admin token only when tokens are set (docs/OPERATIONS.md, Security);
without one, the counts. The predicted wait replays the queue (api/forecast.py) at each such
scrape: up to ~1.7 s of CPU off the event loop for a head of 500 queued jobs. Names and HELP:
contracts/metrics.py. Per-job training series are the agents' (agent/exporter.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from redis.exceptions import RedisError

from wstrain.api.forecast import queue_forecast
from wstrain.contracts import metrics as m
from wstrain.contracts.jobs import JobState
from wstrain.policy import PolicyConfig
from wstrain.store import JobStore
from wstrain.store.metrics_view import JobRow, MetricsView, NodeLiveness, QueueWaits

log = logging.getLogger(__name__)

# A client may send any token as the method; only these become a label value, the rest
# `other`, so a hostile client cannot mint series.
HTTP_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


@dataclass(frozen=True)
class StoreSnapshot:
    counts: dict[JobState, int]
    depth: int
    rows: list[JobRow]  # empty unless the reader may see jobs
    waits: QueueWaits
    nodes: list[NodeLiveness]
    now_s: float
    # owner -> seconds until its last queued job is predicted to start (api/forecast.py)
    predicted_wait_s: dict[str, float] = field(default_factory=dict)


def _gauge(metric: m.Metric) -> GaugeMetricFamily:
    return GaugeMetricFamily(metric.name, metric.help, labels=list(metric.labels))


class _StoreCollector(Collector):
    def __init__(self, snap: StoreSnapshot, detailed: bool) -> None:
        self.snap, self.detailed = snap, detailed

    def collect(self) -> Iterator[Metric]:
        snap = self.snap
        jobs = _gauge(m.JOBS)
        for state, n in snap.counts.items():
            jobs.add_metric([state.value], n)
        yield jobs
        yield GaugeMetricFamily(m.QUEUE_DEPTH.name, m.QUEUE_DEPTH.help, value=snap.depth)
        queued = [r for r in snap.rows if r.state == JobState.queued.value]
        oldest = max((snap.now_s - r.queued_at for r in queued if r.queued_at), default=0.0)
        yield GaugeMetricFamily(m.QUEUE_OLDEST_WAIT.name, m.QUEUE_OLDEST_WAIT.help, value=oldest)
        yield HistogramMetricFamily(
            m.QUEUE_WAIT.name,
            m.QUEUE_WAIT.help,
            buckets=[(_le(le), n) for le, n in snap.waits.buckets],
            sum_value=snap.waits.sum_s,
        )
        live = [n for n in snap.nodes if n.up]
        yield GaugeMetricFamily(m.NODES.name, m.NODES.help, value=len(live))
        up, beat = _gauge(m.NODE_UP), _gauge(m.NODE_HEARTBEAT)
        for node in snap.nodes:
            up.add_metric([node.name], 1.0 if node.up else 0.0)
            if node.heartbeat_at is not None:
                beat.add_metric([node.name], node.heartbeat_at)
        yield up
        yield beat
        if self.detailed:
            yield from self._jobs(queued)

    def _jobs(self, queued: list[JobRow]) -> Iterator[Metric]:
        info, state = _gauge(m.JOB_INFO), _gauge(m.JOB_STATE)
        for r in self.snap.rows:
            info.add_metric([r.job, r.owner, r.name, r.model, r.runtime, r.gpu, r.node], 1.0)
            state.add_metric([r.job, r.state], 1.0)
        yield info
        yield state
        pending = _gauge(m.QUEUE_PENDING)
        by_owner: dict[str, int] = {}
        for r in queued:
            by_owner[r.owner] = by_owner.get(r.owner, 0) + 1
        for owner, n in sorted(by_owner.items()):
            pending.add_metric([owner], n)
        yield pending
        predicted = _gauge(m.QUEUE_PREDICTED_WAIT)
        for owner, wait_s in sorted(self.snap.predicted_wait_s.items()):
            predicted.add_metric([owner], wait_s)
        yield predicted


def _le(bound: float) -> str:
    return "+Inf" if bound == float("inf") else f"{bound:g}"


class ApiMetrics:
    def __init__(
        self,
        lease_s: float = 30.0,
        ended_window_s: float = 86400.0,
        max_jobs: int = 10000,
        policy: PolicyConfig | None = None,
    ) -> None:
        self.policy = policy or PolicyConfig()  # shares and quotas order the forecast
        self.replica = uuid.uuid4().hex[:12]
        self.lease_s, self.ended_window_s, self.max_jobs = lease_s, ended_window_s, max_jobs
        self.registry = CollectorRegistry()
        self.latency = Histogram(
            m.API_LATENCY.name,
            m.API_LATENCY.help,
            list(m.API_LATENCY.labels),
            registry=self.registry,
        )

    def observe(self, method: str, route: str, code: int, seconds: float) -> None:
        method = method if method in HTTP_METHODS else "other"
        self.latency.labels(method, route, str(code)).observe(seconds)

    async def _snapshot(self, view: MetricsView, detailed: bool) -> StoreSnapshot | None:
        """The store-wide figures, or None when another replica exports them."""
        if not await view.hold_exporter_lease(self.replica, self.lease_s):
            return None
        store = view.store
        rows = await view.job_rows(self.ended_window_s, self.max_jobs)
        now_s = time.time()
        predicted: dict[str, float] = {}
        if detailed and any(r.state == JobState.queued.value for r in rows):
            owner_of = {r.job: r.owner for r in rows}
            for job_id, got in (await queue_forecast(store, self.policy)).items():
                owner = owner_of.get(job_id)
                if owner is not None and got.start_s is not None:
                    wait_s = max(0.0, got.start_s - now_s)
                    predicted[owner] = max(predicted.get(owner, 0.0), wait_s)
        return StoreSnapshot(
            await store.counts_by_state(),
            await store.queue_depth(),
            rows if detailed else [r for r in rows if r.state == JobState.queued.value],
            await view.queue_waits(),
            await view.nodes(),
            now_s,
            predicted,
        )

    async def render(self, store: JobStore, detailed: bool) -> bytes:
        """The exposition text; `detailed` adds the series naming jobs and owners."""
        try:
            snap = await self._snapshot(MetricsView(store), detailed)
            redis_up = 1.0
        except RedisError as exc:  # /metrics still answers: that Redis is down is the news
            log.warning("/metrics without the store's series: Redis unavailable: %s", exc)
            snap, redis_up = None, 0.0
        # a long store-wide page (10,000 jobs: ~40 ms of formatting) is built off the loop
        return await asyncio.to_thread(self._text, snap, detailed, redis_up)

    def _text(self, snap: StoreSnapshot | None, detailed: bool, redis_up: float) -> bytes:
        registry = CollectorRegistry()
        replica = _ReplicaCollector(redis_up, snap is not None)
        registry.register(replica)
        if snap is not None:
            registry.register(_StoreCollector(snap, detailed))
        return generate_latest(self.registry) + generate_latest(registry)


class _ReplicaCollector(Collector):
    def __init__(self, redis_up: float, leader: bool) -> None:
        self.redis_up, self.leader = redis_up, leader

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(m.REDIS_UP.name, m.REDIS_UP.help, value=self.redis_up)
        yield GaugeMetricFamily(
            m.EXPORTER_LEADER.name, m.EXPORTER_LEADER.help, value=1.0 if self.leader else 0.0
        )
