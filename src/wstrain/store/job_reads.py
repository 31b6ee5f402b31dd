"""Reading jobs back out of Redis: one job, a page of jobs by state and owner, a job's
events, the counts per state and the queue's depth, each decoded from the job's hash.

The API answers most of its reads from here; the agent reads single jobs. JobReads is a
mixin: JobStore (job_store.py) inherits it and registers the Lua script and the cache it
uses, so callers see one store.

    store = JobStore.from_url("redis://127.0.0.1:6379/0")
    job = await store.get(job_id)
    page, total = await store.list_json(state=JobState.running, owner="ada", limit=50)

Tested by tests/store/test_job_store.py (it starts its own redis-server):

    .venv/bin/python -m pytest -q tests/store/test_job_store.py
"""

from __future__ import annotations

import builtins
import json
import uuid
from typing import Any, cast

import redis.asyncio as aioredis
from redis.commands.core import AsyncScript

from wstrain.contracts.errors import NotFound
from wstrain.contracts.jobs import Event, Job, JobState, Keys
from wstrain.contracts.plan import Plan
from wstrain.contracts.spec import JobSpec
from wstrain.contracts.spec_fields import STORED
from wstrain.store.cache import Parsed, ParsedJobs

_OPTIONAL_FLOATS = ("epoch", "loss", "eval_loss", "tokens_per_s", "mfu", "step_seconds", "eta_s")
_OPTIONAL_STRS = ("error", "state_reason", "node", "gpu", "last_checkpoint")


class JobReads:
    """The read side of JobStore. Declares what it uses of the store; JobStore.__init__
    sets each of them."""

    redis: aioredis.Redis
    keys: Keys
    _parsed: ParsedJobs
    _page_revs: AsyncScript

    async def get(self, job_id: str) -> Job:
        raw = cast(dict[str, str], await self.redis.hgetall(self.keys.job(job_id)))
        if not raw:
            raise NotFound(f"job {job_id!r} does not exist; list jobs with GET /v1/jobs")
        return _job_from_hash(raw)

    async def get_json(self, job_id: str) -> tuple[str, str]:
        """The job's owner and its JSON (plan included), from the cache while its revision
        stands."""
        rev = await self.redis.hget(self.keys.job(job_id), "rev")
        if rev is not None and (hit := self._parsed.get(job_id, int(rev))) is not None:
            return hit.owner, hit.job_json
        parsed = self._parsed.put(await self.get(job_id))
        return parsed.owner, parsed.job_json

    async def list(
        self,
        state: JobState | None = None,
        owner: str | None = None,
        offset: int = 0,
        limit: int = 50,
    ) -> tuple[builtins.list[Job], int]:
        """A page of jobs, newest first, without their plans, and how many match. One filter
        reads its index's page alone (O(log n + page)); both intersect the two indexes inside
        Redis first."""
        page, total = await self._page(state, owner, offset, limit)
        return [Job.model_validate_json(p.listed_json) for p in page], total

    async def list_json(
        self,
        state: JobState | None = None,
        owner: str | None = None,
        offset: int = 0,
        limit: int = 50,
    ) -> tuple[builtins.list[str], int]:
        """The same page as `list`, each job as its JSON (what the API answers)."""
        page, total = await self._page(state, owner, offset, limit)
        return [p.listed_json for p in page], total

    async def _page(
        self, state: JobState | None, owner: str | None, offset: int, limit: int
    ) -> tuple[builtins.list[Parsed], int]:
        if state is not None and owner is not None:
            index = f"{self.keys.prefix}:tmp:{uuid.uuid4().hex}"
            async with self.redis.pipeline(transaction=True) as pipe:
                pipe.zinterstore(
                    index,
                    {self.keys.by_state(state.value): 0, self.keys.by_owner(owner): 1},
                    aggregate="SUM",
                )
                pipe.expire(index, 10)  # a crashed request leaves nothing for long
                await pipe.execute()
        elif state is not None:
            index = self.keys.by_state(state.value)
        elif owner is not None:
            index = self.keys.by_owner(owner)
        else:
            index = self.keys.jobs
        # ids, their revisions and the count in one round trip
        ids, revs, total = await self._page_revs(
            keys=[index], args=[f"{self.keys.prefix}:job:", offset, offset + limit - 1]
        )
        if state is not None and owner is not None:
            await self.redis.delete(index)
        page: dict[str, Parsed] = {}
        for i, r in zip(ids, revs):
            if r and (hit := self._parsed.get(i, int(r))) is not None:
                page[i] = hit
        missing = [i for i in ids if i not in page]
        async with self.redis.pipeline(transaction=False) as pipe:
            for i in missing:
                pipe.hgetall(self.keys.job(i))
            raws = await pipe.execute()
        for raw in raws:
            if raw:
                page[raw["id"]] = self._parsed.put(_job_from_hash(raw))
        # a page leaves each job's plan out (GET /v1/jobs/{id}/plan has it): it is 2/3 of a
        # listed job's bytes, and a list answers 2.3x faster without (bench/api_load.py)
        return [page[i] for i in ids if i in page], int(total)

    async def counts_by_state(self) -> dict[JobState, int]:
        async with self.redis.pipeline(transaction=False) as pipe:
            for s in JobState:
                pipe.zcard(self.keys.by_state(s.value))
            counts = await pipe.execute()
        return dict(zip(JobState, counts))

    async def queue_depth(self) -> int:
        return int(await self.redis.zcard(self.keys.queue))

    async def events(
        self, job_id: str, after: str | None = None, limit: int = 100
    ) -> builtins.list[Event]:
        start = f"({after}" if after else "-"
        rows = cast(
            builtins.list[tuple[str, dict[str, str]]],
            await self.redis.xrange(self.keys.events(job_id), min=start, max="+", count=limit),
        )
        return [
            Event(
                id=eid,
                ts=float(f["ts"]),
                kind=f["kind"],
                message=f["message"],
                data=json.loads(f.get("data") or "{}"),
            )
            for eid, f in rows
        ]


def _job_from_hash(raw: dict[str, str], with_plan: bool = True) -> Job:
    data: dict[str, Any] = {
        "id": raw["id"],
        "name": raw["name"],
        "owner": raw["owner"],
        "state": raw["state"],
        "attempt": int(raw["attempt"]),
        "rev": int(raw.get("rev") or 0),
        "step": int(raw.get("step") or 0),
        "steps": int(raw["steps"]),
        "created_at": float(raw["created_at"]),
        "updated_at": float(raw["updated_at"]),
        "spec": JobSpec.model_validate_json(raw["spec"], context={STORED: True}),
        "plan": Plan.model_validate_json(raw["plan"]) if with_plan and raw.get("plan") else None,
        "worker_pid": int(raw["worker_pid"]) if raw.get("worker_pid") else None,
        "tokens_seen": int(raw["tokens_seen"]) if raw.get("tokens_seen") else None,
        "data_position": int(raw["data_position"]) if raw.get("data_position") else None,
        "telemetry": json.loads(raw.get("telemetry") or "{}"),
        "retries": int(raw.get("retries") or 0),
    }
    for k in _OPTIONAL_FLOATS:
        data[k] = float(raw[k]) if raw.get(k) else None
    for k in _OPTIONAL_STRS:
        data[k] = raw.get(k) or None
    return Job.model_validate(data)
