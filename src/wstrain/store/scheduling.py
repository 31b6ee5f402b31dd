"""What the scheduling policy reads from and writes to Redis: the pending jobs at the head
of the queue, every placed job (for quotas and preemption), the states of dependencies,
each owner's decayed usage, the lock that makes one agent decide at a time, the claim of the
one job the policy chose, the reasons pending jobs wait, and each job's progress and step
time (for the queue forecast, GET /v1/queue).

The decision itself is pure (policy/); an agent holds the lock while it reads,
decides and claims, so two agents never both start jobs against one owner's quota.

    view = SchedulingView(store)
    if await view.acquire(agent_id, ttl_s=10):
        try: ...  # pending(), placed(), usage(), claim_one()
        finally: await view.release(agent_id)
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import cast

from wstrain.contracts.calibration import GIB
from wstrain.contracts.jobs import JobState, gpu_indices
from wstrain.contracts.spec import JobSpec
from wstrain.policy import BudgetPoint, PendingJob, RunningJob
from wstrain.store.job_store import JobStore, budget_points

_PENDING = (
    "owner", "priority", "queued_at", "created_at", "device_bytes", "host_bytes",
    "exclusive", "after", "not_before", "state", "name", "state_reason", "gpus", "nodes",
    "points", "disk_bytes",
)  # fmt: skip
_PLACED = (
    "owner", "priority", "device_bytes", "host_bytes", "node", "gpu", "started_at", "state",
    "gpus",
)  # fmt: skip
PLACED_STATES = (JobState.planning, JobState.running, JobState.cancelling)
_PROGRESS = ("step", "steps", "step_seconds", "plan", "exclusive")

# Take the lock if free or ours; release only ours (a holder past its TTL lost it).
_ACQUIRE_LUA = """
local cur = redis.call('GET', KEYS[1])
if cur == false or cur == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]) return 1
end
return 0
"""
_RELEASE_LUA = """
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
return 0
"""
# Usage decays as 2^(-dt / half-life) since its last update, then the new seconds are added;
# ARGV: now, half-life, then (owner, gpu-seconds) pairs. Stored as "usage|t" per owner.
_ADD_USAGE_LUA = """
local now, hl = tonumber(ARGV[1]), tonumber(ARGV[2])
for i = 3, #ARGV, 2 do
  local cur = redis.call('HGET', KEYS[1], ARGV[i])
  local u, t = 0, now
  if cur then
    local sep = string.find(cur, '|', 1, true)
    u, t = tonumber(string.sub(cur, 1, sep - 1)), tonumber(string.sub(cur, sep + 1))
  end
  u = u * math.pow(2, -math.max(0, now - t) / hl) + tonumber(ARGV[i + 1])
  redis.call('HSET', KEYS[1], ARGV[i], string.format('%.17g|%.17g', u, now))
end
return 0
"""
# Write why each queued job waits, only while it is still queued (ARGV: id, reason pairs).
_REASONS_LUA = """
for i = 1, #ARGV, 2 do
  local job = KEYS[1] .. ARGV[i]
  if redis.call('HGET', job, 'state') == 'queued'
     and redis.call('HGET', job, 'state_reason') ~= ARGV[i + 1] then
    redis.call('HSET', job, 'state_reason', ARGV[i + 1])
    redis.call('HINCRBY', job, 'rev', 1)  -- the API caches jobs by revision
  end
end
return 0
"""


@dataclass(frozen=True)
class PendingRow:
    id: str
    owner: str
    priority: int
    queued_at: float
    device_bytes: int
    host_bytes: int
    exclusive: bool
    after: tuple[str, ...]
    not_before: float  # 0: none
    name: str = ""
    state_reason: str = ""
    gpus: int = 1  # GPUs of one node it needs at once (jobs stored before gangs: 1)
    nodes: int = 1  # nodes, each taking `gpus` GPUs (store/node_gangs.py)
    points: tuple[BudgetPoint, ...] = ()  # a ranged budget's, min first; queued at its min
    disk_bytes: int = 0  # its disk budget (records stored before the disk tier: none)

    def pending(self, priority: int | None = None) -> PendingJob:
        """The job as the scheduling policy reads it, at `priority` (a grant's cap) or its
        own class."""
        low = self.points[0] if self.points else None  # a requeued job held a higher point
        return PendingJob(
            self.id,
            self.owner,
            self.priority if priority is None else priority,
            self.queued_at,
            low.device_bytes if low else self.device_bytes,
            low.host_bytes if low else self.host_bytes,
            self.exclusive,
            self.after,
            self.not_before or None,
            gpus=self.gpus,
            points=self.points if self.gpus == 1 and self.nodes == 1 else (),
            disk_bytes=self.disk_bytes,
        )


@dataclass(frozen=True)
class PlacedRow:
    id: str
    owner: str
    priority: int
    device_bytes: int  # on each of its GPUs
    host_bytes: int
    node: str
    gpu: int | None  # its first GPU
    started_at: float
    state: str
    gpus: int = 1
    gang: tuple[int, ...] = ()  # every GPU of a job on several (Job.gpu "0,1")

    def running(self, exclusive: bool = False, stopping: bool = False) -> RunningJob:
        """The job as the scheduling policy reads it."""
        return RunningJob(
            self.id,
            self.owner,
            self.priority,
            self.gpu,
            self.device_bytes,
            self.host_bytes,
            self.started_at,
            exclusive,
            stopping=stopping,
            gpus=self.gpus,
            gang=self.gang,
        )


@dataclass(frozen=True)
class ProgressRow:
    """How far a job is and how long a step takes: what the queue forecast (policy/forecast.py)
    turns into remaining seconds."""

    id: str
    step: int
    steps: int
    step_s: float | None  # its last reported step's wall time (None before the first)
    predicted_step_s: float | None  # the plan's (None: no plan stored)
    exclusive: bool


def _predicted_step_s(plan: str | None) -> float | None:
    """Plan.predicted.step_seconds out of the stored plan's JSON, without validating the plan
    (a 32-layer plan is ~10 KB: 500 of them parse in ~20 ms as plain JSON)."""
    if not plan:
        return None
    try:
        value = json.loads(plan)["predicted"]["step_seconds"]
    except (ValueError, KeyError, TypeError):
        return None
    return float(value) if isinstance(value, int | float) else None


class SchedulingView:
    def __init__(self, store: JobStore) -> None:
        self.store, self.redis, self.keys = store, store.redis, store.keys
        self._acquire = self.redis.register_script(_ACQUIRE_LUA)
        self._release = self.redis.register_script(_RELEASE_LUA)
        self._add_usage = self.redis.register_script(_ADD_USAGE_LUA)
        self._reasons = self.redis.register_script(_REASONS_LUA)

    @property
    def _lock_key(self) -> str:
        return f"{self.keys.prefix}:scheduling-lock"

    @property
    def _usage_key(self) -> str:
        return f"{self.keys.prefix}:usage"

    async def acquire(self, agent_id: str, ttl_s: float) -> bool:
        return bool(await self._acquire(keys=[self._lock_key], args=[agent_id, int(ttl_s * 1e3)]))

    async def release(self, agent_id: str) -> None:
        await self._release(keys=[self._lock_key], args=[agent_id])

    async def pending(self, limit: int) -> list[PendingRow]:
        """The first `limit` jobs of the queue (by priority class, then submission)."""
        ids = cast(list[str], await self.redis.zrange(self.keys.queue, 0, limit - 1))
        raws = await self._fields(ids, _PENDING)
        return [
            PendingRow(
                jid,
                f["owner"] or "",
                int(f["priority"] or 0),
                float(f["queued_at"] or f["created_at"] or 0.0),
                int(f["device_bytes"] or 0),
                int(f["host_bytes"] or 0),
                f["exclusive"] == "True",
                tuple(json.loads(f["after"] or "[]")),
                float(f["not_before"] or 0.0),
                f["name"] or "",
                f["state_reason"] or "",
                int(f["gpus"] or 1),
                int(f["nodes"] or 1),
                budget_points(f["points"]),
                int(f["disk_bytes"] or 0),
            )
            for jid, f in zip(ids, raws)
            if f["state"] == JobState.queued.value
        ]

    async def placed(self) -> list[PlacedRow]:
        """Every job holding budgets somewhere: planning, running or cancelling."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for state in PLACED_STATES:
                pipe.zrange(self.keys.by_state(state.value), 0, -1)
            ids = [i for idx in cast(list[list[str]], await pipe.execute()) for i in idx]
        raws = await self._fields(ids, _PLACED)
        rows = []
        for jid, f in zip(ids, raws):
            if f["state"] not in {s.value for s in PLACED_STATES}:
                continue
            gpus = gpu_indices(f["gpu"])
            rows.append(
                PlacedRow(
                    jid,
                    f["owner"] or "",
                    int(f["priority"] or 0),
                    int(f["device_bytes"] or 0),
                    int(f["host_bytes"] or 0),
                    f["node"] or "",
                    gpus[0] if gpus else None,
                    float(f["started_at"] or 0.0),
                    f["state"] or "",
                    int(f["gpus"] or 1),
                    gpus if len(gpus) > 1 else (),
                )
            )
        return rows

    async def progress(self, ids: list[str]) -> dict[str, ProgressRow]:
        """Step, steps, step times and exclusivity of each job id that exists."""
        raws = await self._fields(ids, _PROGRESS)
        out = {}
        for jid, f in zip(ids, raws):
            if f["steps"] is None:
                continue
            measured = float(f["step_seconds"]) if f["step_seconds"] else None
            out[jid] = ProgressRow(
                jid,
                int(f["step"] or 0),
                int(f["steps"] or 0),
                measured if measured and measured > 0 else None,
                _predicted_step_s(f["plan"]),
                f["exclusive"] == "True",
            )
        return out

    async def states(self, ids: list[str]) -> dict[str, str]:
        """The state of each job id ('' for one that does not exist)."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for jid in ids:
                pipe.hget(self.keys.job(jid), "state")
            got = cast(list[str | None], await pipe.execute())
        return {jid: s or "" for jid, s in zip(ids, got)}

    async def usage(self, now: float, half_life_s: float) -> dict[str, float]:
        """Each owner's usage (GPU-seconds x reserved share), decayed to `now`."""
        raw = cast(dict[str, str], await self.redis.hgetall(self._usage_key))
        out = {}
        for owner, v in raw.items():
            u, _, t = v.partition("|")
            out[owner] = float(u) * 2.0 ** (-max(0.0, now - float(t)) / half_life_s)
        return out

    async def add_usage(self, now: float, half_life_s: float, used: dict[str, float]) -> None:
        if used:
            args: list[str | float] = [now, half_life_s]
            for owner, gpu_s in used.items():
                args += [owner, gpu_s]
            await self._add_usage(keys=[self._usage_key], args=args)

    async def claim_one(
        self,
        job_id: str,
        node: str,
        gpu: int | tuple[int, ...] | None,
        agent_id: str,
        lease_s: float,
    ) -> bool:
        return await self.store.claim(job_id, node, gpu, agent_id, lease_s)

    async def choose_budget(self, job_id: str, point: BudgetPoint, fence: str) -> None:
        """Run the ranged job `job_id`, claimed by the agent `fence`, at `point` of its range:
        its spec's budget.chosen (what the agent plans at and the worker enforces) and the
        bytes its node reserves for it (placed()), with a `budget` event saying so."""
        spec_raw, points_raw = cast(
            list[str | None], await self.redis.hmget(self.keys.job(job_id), ["spec", "points"])
        )
        for device_gib, host_gib, tokens_per_s in json.loads(points_raw or "[]"):
            if (int(device_gib * GIB), int(host_gib * GIB)) != (
                point.device_bytes,
                point.host_bytes,
            ):
                continue
            spec = JobSpec.model_validate_json(spec_raw or "").choosing(device_gib, host_gib)
            message = (
                f"budget {device_gib:g} GiB device, {host_gib:g} GiB host of its range: "
                f"{tokens_per_s:,.0f} predicted tokens/s"
            )
            data = {"device_gib": device_gib, "host_gib": host_gib, "tokens_per_s": tokens_per_s}
            await self.store.report(
                job_id,
                fence,
                ("budget", message, data),
                spec=spec.model_dump_json(),
                device_bytes=spec.budget.device_bytes,
                host_bytes=spec.budget.host_bytes,
            )
            return
        raise ValueError(f"job {job_id}: {point} is not one of its range's points")

    async def set_reasons(self, reasons: dict[str, str]) -> None:
        if reasons:
            args = [x for jid, why in reasons.items() for x in (jid, why)]
            await self._reasons(keys=[self.keys.job("")], args=args)

    async def _fields(self, ids: list[str], names: tuple[str, ...]) -> list[dict[str, str | None]]:
        async with self.redis.pipeline(transaction=False) as pipe:
            for jid in ids:
                pipe.hmget(self.keys.job(jid), list(names))
            raws = cast(list[list[str | None]], await pipe.execute())
        return [dict(zip(names, raw)) for raw in raws]
