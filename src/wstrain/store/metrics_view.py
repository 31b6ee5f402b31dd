"""What the store-wide metrics read from Redis: one row per job worth exporting, the
queue-wait histogram the claim script counts, node liveness, and the lease that makes one
API replica the exporter of all of it (api/metrics.py renders it).

Bounded by construction: every live job (queued to cancelling) and the ended jobs updated in
the last `ended_window_s`, at most `max_rows` (newest first); a few fields per job through
one pipelined round trip, never the spec or plan JSON.

    view = MetricsView(store); rows = await view.job_rows(86400, 10000)
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import cast

from wstrain.contracts.jobs import TERMINAL_STATES, JobState
from wstrain.contracts.metrics import QUEUE_WAIT_BUCKETS_S
from wstrain.store.job_store import JobStore

_FIELDS = ("owner", "name", "state", "model", "runtime", "gpu", "node", "queued_at", "updated_at")

# Take the lease if free, extend it if ours: one replica exports, the others step aside until
# it stops renewing (it died, or Prometheus stopped scraping it) for the lease's length.
_LEASE_LUA = """
local cur = redis.call('GET', KEYS[1])
if cur == false or cur == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0
"""


@dataclass(frozen=True)
class JobRow:
    job: str
    owner: str
    name: str
    state: str
    model: str
    runtime: str
    gpu: str
    node: str
    queued_at: float  # unix s; 0 for a job stored before the field existed
    updated_at: float


@dataclass(frozen=True)
class QueueWaits:
    buckets: tuple[tuple[float, int], ...]  # (upper bound s, cumulative count), then +Inf
    count: int
    sum_s: float


@dataclass(frozen=True)
class NodeLiveness:
    name: str
    up: bool  # its heartbeat record is alive
    heartbeat_at: float | None  # unix s, while up


class MetricsView:
    def __init__(self, store: JobStore) -> None:
        self.store = store
        self.redis = store.redis
        self.keys = store.keys
        self._lease = self.redis.register_script(_LEASE_LUA)

    async def hold_exporter_lease(self, replica: str, ttl_s: float) -> bool:
        """True while `replica` is (or has just become) the one store-wide exporter."""
        held = await self._lease(keys=[self.keys.exporter_lease], args=[replica, int(ttl_s * 1e3)])
        return bool(held)

    async def job_rows(self, ended_window_s: float, max_rows: int) -> list[JobRow]:
        """Every live job and the jobs ended in the last `ended_window_s`, newest first."""
        live = [s for s in JobState if s not in TERMINAL_STATES]
        async with self.redis.pipeline(transaction=False) as pipe:
            for state in live:
                pipe.zrevrange(self.keys.by_state(state.value), 0, max_rows - 1)
            for state in TERMINAL_STATES:
                pipe.zrevrange(self.keys.by_state(state.value), 0, max_rows - 1)
            indexes = cast(list[list[str]], await pipe.execute())
        ids = [i for idx in indexes for i in idx]
        if not ids:
            return []
        async with self.redis.pipeline(transaction=False) as pipe:
            for jid in ids:
                pipe.hmget(self.keys.job(jid), list(_FIELDS))
            raws = cast(list[list[str | None]], await pipe.execute())
        horizon = time.time() - ended_window_s
        rows = []
        for jid, raw in zip(ids, raws):
            f = dict(zip(_FIELDS, raw))
            if f["state"] is None:  # deleted between the two round trips
                continue
            row = JobRow(
                jid,
                f["owner"] or "",
                f["name"] or "",
                f["state"],
                f["model"] or "",
                f["runtime"] or "",
                f["gpu"] or "",
                f["node"] or "",
                float(f["queued_at"] or 0.0),
                float(f["updated_at"] or 0.0),
            )
            if JobState(row.state) in TERMINAL_STATES and row.updated_at < horizon:
                continue
            rows.append(row)
        rows.sort(key=lambda r: r.updated_at, reverse=True)
        return rows[:max_rows]

    async def queue_waits(self) -> QueueWaits:
        raw = cast(dict[str, str], await self.redis.hgetall(self.keys.queue_wait))
        buckets = [(float(le), int(raw.get(str(le), 0))) for le in QUEUE_WAIT_BUCKETS_S]
        count = int(raw.get("count", 0))
        buckets.append((float("inf"), int(raw.get("+Inf", 0))))
        return QueueWaits(tuple(buckets), count, float(raw.get("sum", 0.0)))

    async def nodes(self) -> list[NodeLiveness]:
        """Every node name agents have held and not released cleanly: up with its last
        heartbeat while its record lives, down once the record expired."""
        names = sorted(cast(set[str], await self.redis.smembers(self.keys.nodes)))
        if not names:
            return []
        live = {n.name: n for n in await self.store.nodes()}
        return [
            NodeLiveness(n, n in live, live[n].heartbeat_at if n in live else None) for n in names
        ]
