"""Priority grants in Redis (contracts/grants.py), beside the job store's keys:

    <prefix>:grants                 hash: owner -> PriorityGrant JSON
    <prefix>:grant-jobs:<owner>     sorted set: the owner's jobs admitted above class 0 under
                                    a grant (by admission time), and reservations "r:<uuid>"

The quota is checked and a place taken in one Lua script (`reserve`), so two submissions at
once cannot both take the last place; the API then creates the job and `bind`s the job id to
the place, or `release`s it when the submission fails. Finished jobs leave the set the next
time it is counted. The agent reads `caps` each round: a job in the set is scheduled at
min(its priority, its owner's grant now), so a revoked grant stops it preempting at once;
jobs an admin submitted (or any caller with auth off) are not in it and keep their class.

    grants = GrantStore(store)
    token = await grants.reserve(grant)         # None: the quota is used up
    job = await store.create(...); await grants.bind("alice", token, job.id)
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable
from typing import cast

from wstrain.contracts.grants import PriorityGrant, effective_priority
from wstrain.contracts.jobs import TERMINAL_STATES
from wstrain.store.job_store import JobStore

# A reservation older than this belongs to a submission that died between its check and its
# create (an API killed mid-request); planning is done before reserving, so a live one
# holds its place for milliseconds.
RESERVATION_TTL_S = 60.0

# Count the owner's live entries, dropping finished jobs and stale reservations; then, if
# ARGV[2] >= 0 and the count is below it, add the reservation ARGV[3]. Returns {taken, count}.
# KEYS: the owner's set, the job hash prefix. ARGV: now, max_jobs (-1: count only), token,
# reservation TTL, then the terminal states.
_RESERVE_LUA = """
local now, cap, token, ttl = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4])
local terminal = {}
for i = 5, #ARGV do terminal[ARGV[i]] = true end
local entries = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
local live = 0
for i = 1, #entries, 2 do
  local m, score = entries[i], tonumber(entries[i + 1])
  local gone
  if string.sub(m, 1, 2) == 'r:' then
    gone = score < now - ttl
  else
    local state = redis.call('HGET', KEYS[2] .. m, 'state')
    gone = (not state) or terminal[state]
  end
  if gone then redis.call('ZREM', KEYS[1], m) else live = live + 1 end
end
if cap >= 0 and live < cap then
  redis.call('ZADD', KEYS[1], now, token)
  return {1, live}
end
return {0, live}
"""


class GrantStore:
    def __init__(self, store: JobStore) -> None:
        self.redis, self.keys = store.redis, store.keys
        self._reserve = self.redis.register_script(_RESERVE_LUA)

    @property
    def _grants_key(self) -> str:
        return f"{self.keys.prefix}:grants"

    def _jobs_key(self, owner: str) -> str:
        return f"{self.keys.prefix}:grant-jobs:{owner}"

    # ------------------------------------------------------------ grants

    async def put(self, grant: PriorityGrant) -> None:
        body = grant.model_copy(update={"class_jobs": 0}).model_dump_json()
        await self.redis.hset(self._grants_key, grant.owner, body)

    async def get(self, owner: str) -> PriorityGrant | None:
        raw = cast(str | None, await self.redis.hget(self._grants_key, owner))
        return None if raw is None else PriorityGrant.model_validate_json(raw)

    async def delete(self, owner: str) -> bool:
        """Revoke; the owner's jobs admitted under it drop to class 0 at the next round."""
        return bool(await self.redis.hdel(self._grants_key, owner))

    async def all(self) -> list[PriorityGrant]:
        raw = cast(dict[str, str], await self.redis.hgetall(self._grants_key))
        return [PriorityGrant.model_validate_json(raw[o]) for o in sorted(raw)]

    async def with_usage(self, grant: PriorityGrant) -> PriorityGrant:
        """The grant with `class_jobs`: its owner's unfinished jobs admitted above class 0."""
        return grant.model_copy(update={"class_jobs": await self.in_use(grant.owner)})

    # ------------------------------------------------------------ the quota

    async def in_use(self, owner: str) -> int:
        _, live = await self._run(owner, -1, "")
        return live

    async def reserve(self, grant: PriorityGrant) -> tuple[str | None, int]:
        """A place in the grant's quota: (its token, the count before it), or (None, the
        count) when max_jobs unfinished jobs of the owner's hold every place."""
        token = f"r:{uuid.uuid4().hex}"
        taken, live = await self._run(grant.owner, grant.max_jobs, token)
        return (token if taken else None), live

    async def bind(self, owner: str, token: str, job_id: str) -> None:
        """The place `token` now holds the job `job_id` (created or resumed under it)."""
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.zadd(self._jobs_key(owner), {job_id: time.time()})
            pipe.zrem(self._jobs_key(owner), token)
            await pipe.execute()

    async def release(self, owner: str, token: str) -> None:
        await self.redis.zrem(self._jobs_key(owner), token)

    async def _run(self, owner: str, cap: int, token: str) -> tuple[int, int]:
        args: list[str | float] = [time.time(), cap, token, RESERVATION_TTL_S]
        args += [s.value for s in TERMINAL_STATES]
        got = await self._reserve(keys=[self._jobs_key(owner), self.keys.job("")], args=args)
        taken, live = cast(list[int], got)
        return int(taken), int(live)

    # ------------------------------------------------------------ scheduling

    async def caps(self, jobs: Iterable[tuple[str, str, int]]) -> dict[str, int]:
        """For (job id, owner, priority) rows: the class each job admitted under a grant may
        use now, where it is below its own priority (one pipelined round trip)."""
        above = [(jid, owner, p) for jid, owner, p in jobs if p > 0]
        if not above:
            return {}
        owners = sorted({owner for _, owner, _ in above})
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.hmget(self._grants_key, owners)
            for jid, owner, _ in above:
                pipe.zscore(self._jobs_key(owner), jid)
            got = await pipe.execute()
        raw = cast(list[str | None], got[0])
        grants = {
            o: PriorityGrant.model_validate_json(g) for o, g in zip(owners, raw) if g is not None
        }
        out = {}
        for (jid, owner, priority), admitted in zip(above, got[1:]):
            if admitted is None:  # submitted by an admin (or with auth off): its own class
                continue
            now = effective_priority(priority, grants.get(owner))
            if now < priority:
                out[jid] = now
        return out
