"""The job store: every piece of job state, the queue, events and node heartbeats in Redis.

Used by the API (api/) and the scheduler agent; both are asyncio programs. State changes
run as Lua scripts so a transition is atomic: it checks the current state against
contracts.ALLOWED_TRANSITIONS, writes the new fields, moves the job between per-state sets
and the queue, and appends an event, or changes nothing. Two agents can therefore never
claim one job.

job_store.py holds the writes (create, transition, claim), the leases and the node
heartbeats; JobStore inherits its reads (get, list, events, counts) from JobReads in
job_reads.py.

    store = JobStore.from_url("redis://127.0.0.1:6379/0", "wstrain", retry_s=300)

Tested by tests/store/ (each test starts its own redis-server):

    .venv/bin/python -m pytest -q tests/store
"""

from __future__ import annotations

import builtins
import json
import time
import uuid
from dataclasses import dataclass
from typing import Any, cast

import redis.asyncio as aioredis
from redis.backoff import ExponentialBackoff

from wstrain.contracts.calibration import GIB
from wstrain.contracts.errors import Conflict, LeaseLost, NotFound
from wstrain.contracts.jobs import (
    ALLOWED_TRANSITIONS,
    Job,
    JobState,
    Keys,
    Node,
    gpu_text,
)
from wstrain.contracts.metrics import QUEUE_WAIT_BUCKETS_S
from wstrain.contracts.model_refs import model_label
from wstrain.contracts.plan import Plan
from wstrain.contracts.spec import JobSpec
from wstrain.policy import BudgetPoint
from wstrain.store import lua
from wstrain.store.cache import ParsedJobs
from wstrain.store.faults import StoreRetry
from wstrain.store.job_reads import JobReads

RETRY_CAP_S = 2.0  # the longest pause between two tries of a command
RETRY_BASE_S = 0.05  # the pause after a first failure is twice this

# Bump when the index layout changes; ensure_indexes rebuilds older stores once.
INDEX_VERSION = "2"


@dataclass(frozen=True)
class Lease:
    """An agent's hold on a live job: only `agent_id` may write its progress or move it, until
    `expires_at` (epoch s) unless renewed; the worker is identified by pid and start time
    (clock ticks since boot, /proc/PID/stat) so a recycled pid is never mistaken for it."""

    agent_id: str
    expires_at: float
    worker_pid: int | None
    worker_start: int | None


def budget_points(raw: str | None) -> tuple[BudgetPoint, ...]:
    """A job's stored range points ([[device GiB, host GiB, tokens/s], ...], min first)."""
    return tuple(
        BudgetPoint(int(device_gib * GIB), int(host_gib * GIB), float(tokens_per_s))
        for device_gib, host_gib, tokens_per_s in json.loads(raw or "[]")
    )


def _encode(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    return str(value)


class JobStore(JobReads):
    def __init__(self, redis: aioredis.Redis, prefix: str = "wstrain") -> None:
        self.redis = redis
        self.keys = Keys(prefix)
        self._transition = redis.register_script(lua.TRANSITION_LUA)
        self._claim = redis.register_script(lua.CLAIM_LUA)
        self._hold_node = redis.register_script(lua.HOLD_NODE_LUA)
        self._report = redis.register_script(lua.REPORT_LUA)
        self._page_revs = redis.register_script(lua.PAGE_REVS_LUA)
        self._parsed = ParsedJobs()
        self._renew = redis.register_script(lua.RENEW_LUA)

    @classmethod
    def from_url(cls, url: str, prefix: str = "wstrain", retry_s: float = 0.0) -> JobStore:
        """A store on the Redis at `url`. A command that meets a connection error, a timeout,
        a Redis still loading its AOF or one refusing writes (a full disk: store/faults.py) is
        retried with exponential back-off for about `retry_s` seconds before the error is
        raised: the agent waits out a Redis restart or a full disk (its workers train on
        meanwhile), the API answers 503 after a short try."""
        # redis-py pauses base * 2**failures after failure 1, 2, ...: 0.1, 0.2, 0.4 ... s,
        # capped at 2 s. As many tries as fit in retry_s, at least one retry (a blip); counted
        # from 0 this took twice retry_s (an API request 3.1 s on a Redis that is down, not 1)
        backoff = ExponentialBackoff(cap=RETRY_CAP_S, base=RETRY_BASE_S)
        retries = 0
        waited = 0.0
        while retry_s > 0 and (retries == 0 or waited + backoff.compute(retries + 1) <= retry_s):
            retries += 1
            waited += backoff.compute(retries)
        retry = StoreRetry(backoff, retries, retry_s)
        client = aioredis.from_url(url, decode_responses=True, retry=retry)
        return cls(client, prefix)

    async def close(self) -> None:
        await self.redis.aclose()

    async def ensure_indexes(self) -> int:
        """Build the per-owner and per-state indexes of jobs stored before they existed (a
        Redis that held only the per-state sets); idempotent, and a no-op once built.
        Returns how many jobs it indexed."""
        version_key = f"{self.keys.prefix}:index-version"
        if await self.redis.get(version_key) == INDEX_VERSION:
            return 0
        ids = cast(builtins.list[str], await self.redis.zrange(self.keys.jobs, 0, -1))
        for start in range(0, len(ids), 500):
            batch = ids[start : start + 500]
            async with self.redis.pipeline(transaction=False) as pipe:
                for i in batch:
                    pipe.hmget(self.keys.job(i), ["owner", "state", "created_at"])
                rows = await pipe.execute()
            async with self.redis.pipeline(transaction=False) as pipe:
                for i, (owner, state, created) in zip(batch, rows):
                    if state is None:
                        continue
                    score = float(created or 0.0)
                    pipe.zadd(self.keys.by_owner(owner or "anonymous"), {i: score})
                    pipe.zadd(self.keys.by_state(state), {i: score})
                await pipe.execute()
        await self.redis.set(version_key, INDEX_VERSION)
        return len(ids)

    # ------------------------------------------------------------ jobs

    async def create(self, spec: JobSpec, owner: str, plan: Plan) -> Job:
        if spec.budget.ranged and plan.device_gib is not None and plan.host_gib is not None:
            # a ranged budget runs at the point it was planned at: its budget.chosen is what
            # the agent reserves and plans again at (device_bytes, host_bytes below)
            spec = spec.choosing(plan.device_gib, plan.host_gib)
        job_id = uuid.uuid4().hex[:12]
        now = time.time()
        # Higher priority first, then first come first served.
        queue_score = -spec.priority * 1e11 + now
        fields = {
            "id": job_id,
            "name": spec.name,
            "owner": owner,
            "state": JobState.queued.value,
            "attempt": 1,
            "rev": 1,
            "step": 0,
            "steps": spec.steps,
            "created_at": now,
            "updated_at": now,
            "spec": spec.model_dump_json(),
            "plan": plan.model_dump_json(),
            "device_bytes": spec.budget.device_bytes,
            "host_bytes": spec.budget.host_bytes,
            # spill space is reserved only by a plan that spills: a disk budget the host
            # made unnecessary must not wait for a node's spill directory
            "disk_bytes": spec.budget.disk_bytes if plan.predicted.peak_disk_bytes else 0,
            "queue_score": queue_score,
            "queued_at": now,  # the queue wait is measured from here (again on a requeue)
            "model": model_label(spec.model),
            "runtime": plan.runtime or "",
            # what the scheduling policy reads without parsing the spec
            # (store/scheduling.py)
            "priority": spec.priority,
            "exclusive": spec.exclusive,
            "gpus": spec.gpus,
            "nodes": spec.nodes,
            "after": list(spec.after),
            "group": spec.group or "",
            # a ranged budget's plannable points, min first: the policy queues the job at
            # its min and chooses its point at each start (store/scheduling.py)
            "points": [
                [p.device_gib, p.host_gib, p.tokens_per_s]
                for p in plan.range_points
                if p.tokens_per_s is not None
            ]
            if spec.budget.ranged
            else [],
        }
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(self.keys.job(job_id), mapping={k: _encode(v) for k, v in fields.items()})
            pipe.zadd(self.keys.jobs, {job_id: now})
            pipe.zadd(self.keys.queue, {job_id: queue_score})
            pipe.zadd(self.keys.by_state(JobState.queued.value), {job_id: now})
            pipe.zadd(self.keys.by_owner(owner), {job_id: now})
            pipe.xadd(
                self.keys.events(job_id),
                {
                    "ts": now,
                    "kind": "state",
                    "message": f"queued by {owner}",
                    "data": json.dumps({"state": "queued"}),
                },
            )
            await pipe.execute()
        return await self.get(job_id)

    async def transition(
        self,
        job_id: str,
        dst: JobState,
        message: str,
        sources: frozenset[JobState] | None = None,
        fence: str = "",
        **fields: Any,
    ) -> JobState:
        """Move a job to `dst` if the state machine allows it; returns the previous state.
        With `fence` (an agent id) only while that agent holds the job's lease. Raises
        NotFound, LeaseLost or Conflict (with the current state) and then changes nothing."""
        allowed = (
            sources
            if sources is not None
            else frozenset(s for s, dsts in ALLOWED_TRANSITIONS.items() if dst in dsts)
        )
        now = time.time()
        args: list[str] = [
            self.keys.prefix,
            job_id,
            dst.value,
            ",".join(s.value for s in allowed),
            str(now),
            "state",
            message,
            json.dumps({"state": dst.value}),
            fence,
        ]
        for k, v in fields.items():
            args += [k, _encode(v)]
        ok, cur = await self._transition(
            keys=[self.keys.job(job_id), self.keys.events(job_id), self.keys.queue], args=args
        )
        if not cur:
            raise NotFound(f"job {job_id!r} does not exist; list jobs with GET /v1/jobs")
        if ok == -1:
            raise LeaseLost(
                f"job {job_id} is leased by another agent now; {fence} may not move it",
                state=cur,
            )
        if not ok:
            raise Conflict(f"job {job_id} is {cur}; it cannot become {dst.value}", state=cur)
        return JobState(cur)

    async def claim(
        self,
        job_id: str,
        node: str,
        gpu: int | tuple[int, ...] | None,
        agent_id: str,
        lease_s: float = 30.0,
    ) -> bool:
        """Claim the queued job `job_id` for `node` (and `gpu`, or every GPU of a job on
        several, stored as Job.gpu "0,1"): it becomes `planning`, leased to `agent_id` for
        `lease_s`, in one step. False when it is no longer queued (another agent claimed it,
        or it was cancelled)."""
        now = time.time()
        gpus = (gpu,) if isinstance(gpu, int) else gpu or ()
        claimed = await self._claim(
            keys=[self.keys.job(job_id), self.keys.queue_wait, self.keys.events(job_id)],
            args=[
                self.keys.prefix,
                job_id,
                node,
                gpu_text(gpus),
                now,
                agent_id,
                now + lease_s,
                *QUEUE_WAIT_BUCKETS_S,
            ],
        )
        return bool(claimed)

    # ------------------------------------------------------------ leases

    async def range_points(self, job_id: str) -> tuple[BudgetPoint, ...]:
        """A ranged job's plannable points as stored, min first (none for a fixed budget)."""
        raw = cast(str | None, await self.redis.hget(self.keys.job(job_id), "points"))
        return budget_points(raw)

    async def report(
        self,
        job_id: str,
        fence: str,
        event: tuple[str, str, dict[str, Any]] | None = None,
        **fields: Any,
    ) -> None:
        """Write a live job's progress fields (step, loss, ...; never `state`) and an event
        (kind, message, data) as the agent `fence`, atomically; LeaseLost, writing nothing,
        once another agent holds the job's lease."""
        assert "state" not in fields, "state changes go through transition()"
        kind, message, data = event or ("", "", {})
        args: list[Any] = [fence, time.time(), kind, message, json.dumps(data)]
        for k, v in fields.items():
            args += [k, _encode(v)]
        written = await self._report(
            keys=[self.keys.job(job_id), self.keys.events(job_id)], args=args
        )
        if not written:
            raise LeaseLost(f"job {job_id} is leased by another agent now; {fence} lost it")

    async def renew(self, agent_id: str, job_ids: builtins.list[str], lease_s: float) -> set[str]:
        """Extend `agent_id`'s lease on `job_ids` by `lease_s`; the ids it no longer holds."""
        if not job_ids:
            return set()
        lost = await self._renew(
            keys=[self.keys.job(j) for j in job_ids],
            args=[agent_id, time.time() + lease_s, *job_ids],
        )
        return set(cast(builtins.list[str], lost))

    async def lease(self, job_id: str) -> Lease:
        """Who holds the job's lease, until when, and the worker it runs."""
        agent, expires, pid, start = cast(
            builtins.list[str | None],
            await self.redis.hmget(
                self.keys.job(job_id),
                ["lease_agent", "lease_expires_at", "worker_pid", "worker_start"],
            ),
        )
        return Lease(
            agent or "",
            float(expires or 0.0),
            int(pid) if pid else None,
            int(start) if start else None,
        )

    # ------------------------------------------------------------ nodes

    async def hold_node(self, node: Node, ttl_s: float, replacing: str = "") -> Node | None:
        """Heartbeat `node` for its agent: write it with a TTL unless another live agent
        holds the name (its record not yet expired, another agent_id than `replacing`, a
        holder known dead); then nothing is written and that agent's record is returned.
        Atomic (one Lua script)."""
        held = await self._hold_node(
            keys=[self.keys.node(node.name), self.keys.nodes],
            args=[node.model_dump_json(), node.agent_id, int(ttl_s * 1000), node.name, replacing],
        )
        return Node.model_validate_json(held) if held else None

    async def node(self, name: str) -> Node | None:
        """The live record of node `name`, None once its heartbeat expired."""
        raw = await self.redis.get(self.keys.node(name))
        return Node.model_validate_json(raw) if raw else None

    async def remove_node(self, name: str) -> None:
        await self.redis.delete(self.keys.node(name))
        await self.redis.srem(self.keys.nodes, name)

    async def nodes(self) -> builtins.list[Node]:
        names = sorted(cast(set[str], await self.redis.smembers(self.keys.nodes)))
        if not names:
            return []
        raws = await self.redis.mget([self.keys.node(n) for n in names])
        return [Node.model_validate_json(r) for r in raws if r]
