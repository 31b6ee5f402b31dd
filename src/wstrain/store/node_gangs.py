"""Jobs on several nodes (JobSpec.nodes = M) in Redis: the gang of member agents that
assemble one, one join at a time, and what each member needs to start its worker.

Assembly. An agent whose policy round could place a queued multi-node job's per-node share
(`gpus` GPUs under the device budget, the host budget) joins the job's gang in one atomic
step (JOIN_LUA): it holds those resources from then on (agent/members.py counts them as
its own) and is appended to the member list, whose order is the node rank. The first member
also records its advertised address and a free port on its host: the job's MASTER_ADDR and
MASTER_PORT. At most ONE multi-node gang assembles in the cluster at a time: the first join
takes the assembly key (`{prefix}:gang-assembly`, the job id, expiring after the assembly
timeout), and no other job may join while it stands, so two gangs never hold partial sets
against each other (no deadlock). When the M-th member joins, the key is released and the
job is claimed for member 0, which plans it and starts node 0's worker; the others start
theirs once it runs. An assembly that does not complete before the key expires releases
every member's hold at once: a hold counts only while the key names its job (`held`), and
the next join starts the gang afresh.

The gang record (`{prefix}:gang:{id}`, JSON) belongs to one attempt of the job: a requeued
job (attempt + 1) assembles a new gang, possibly on other nodes.

    gangs = NodeGangs(store)
    joined = await gangs.join(job_id, Member(node, agent_id, "0"), nodes=2, timeout_s=60,
                              master_addr="127.0.0.1", master_port=free_port())
    gang = await gangs.get(job_id)    # members, master address and port, attempt
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import cast

from wstrain.store.job_store import JobStore

# KEYS: assembly key, gang record, job hash. ARGV: job id, member JSON, node name, nodes,
# assembly ms, master address, master port. Returns {status, members}: 0 refused (with why
# in the second element), 1 joined, 2 joined as the last member (the gang is whole).
JOIN_LUA = """
local assembly, gangkey, job = KEYS[1], KEYS[2], KEYS[3]
local id, member, node, nodes = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])
if redis.call('HGET', job, 'state') ~= 'queued' then return {0, 'not queued'} end
local cur = redis.call('GET', assembly)
if cur and cur ~= id then return {0, 'assembling ' .. cur} end
local attempt = redis.call('HGET', job, 'attempt')
local raw = redis.call('GET', gangkey)
local rec = nil
if cur and raw then
  rec = cjson.decode(raw)
  if tostring(rec['attempt']) ~= attempt then rec = nil end
end
if not rec then
  rec = {attempt = attempt, members = {}, master_addr = ARGV[6], master_port = ARGV[7]}
  redis.call('SET', assembly, id, 'PX', ARGV[5])
end
for _, m in ipairs(rec['members']) do
  if m['node'] == node then return {0, 'member'} end
end
table.insert(rec['members'], cjson.decode(member))
local n = #rec['members']
if n >= nodes then redis.call('DEL', assembly) end
redis.call('SET', gangkey, cjson.encode(rec))
if n >= nodes then return {2, n} end
return {1, n}
"""

# A member node's worker died (ARGV: attempt, "node: why", now): recorded on the job while
# that attempt is live, so node 0's agent stops its own worker and settles the attempt.
MEMBER_FAILED_LUA = """
local job, events = KEYS[1], KEYS[2]
if redis.call('HGET', job, 'attempt') ~= ARGV[1] then return 0 end
local state = redis.call('HGET', job, 'state')
if state ~= 'running' and state ~= 'planning' and state ~= 'cancelling' then return 0 end
if redis.call('HGET', job, 'member_failed') then return 0 end
redis.call('HSET', job, 'member_failed', ARGV[1] .. '|' .. ARGV[2])
redis.call('XADD', events, 'MAXLEN', '~', 10000, '*', 'ts', ARGV[3], 'kind', 'error',
           'message', 'member node worker failed: ' .. ARGV[2], 'data', '{}')
return 1
"""


@dataclass(frozen=True)
class Member:
    node: str
    agent_id: str
    gpus: str  # its GPUs on that node, as Job.gpu ("0,1"; "" on a CPU node)

    def to_json(self) -> str:
        return json.dumps({"node": self.node, "agent": self.agent_id, "gpus": self.gpus})


@dataclass(frozen=True)
class Gang:
    attempt: int
    members: tuple[Member, ...]  # in join order: the node rank
    master_addr: str
    master_port: int

    def rank_of(self, agent_id: str) -> int | None:
        for i, m in enumerate(self.members):
            if m.agent_id == agent_id:
                return i
        return None


@dataclass(frozen=True)
class Joined:
    status: int  # 0 refused, 1 joined, 2 joined and the gang is whole
    detail: str  # why refused, or the member count


class NodeGangs:
    def __init__(self, store: JobStore) -> None:
        self.store, self.redis, self.prefix = store, store.redis, store.keys.prefix
        self._join = self.redis.register_script(JOIN_LUA)
        self._member_failed = self.redis.register_script(MEMBER_FAILED_LUA)

    @property
    def assembly_key(self) -> str:
        return f"{self.prefix}:gang-assembly"

    def gang_key(self, job_id: str) -> str:
        return f"{self.prefix}:gang:{job_id}"

    async def join(
        self,
        job_id: str,
        member: Member,
        nodes: int,
        timeout_s: float,
        master_addr: str,
        master_port: int,
    ) -> Joined:
        """Join the gang of the queued job `job_id` (see the module docstring). The address
        and port count only when this member is the first."""
        status, detail = await self._join(
            keys=[self.assembly_key, self.gang_key(job_id), self.store.keys.job(job_id)],
            args=[
                job_id,
                member.to_json(),
                member.node,
                nodes,
                int(timeout_s * 1e3),
                master_addr,
                master_port,
            ],
        )
        return Joined(int(status), str(detail))

    async def assembling(self) -> str | None:
        """The job whose gang is assembling now, or None."""
        return cast(str | None, await self.redis.get(self.assembly_key))

    async def get(self, job_id: str) -> Gang | None:
        raw = cast(str | None, await self.redis.get(self.gang_key(job_id)))
        if raw is None:
            return None
        rec = json.loads(raw)
        members = tuple(Member(m["node"], m["agent"], m["gpus"]) for m in rec["members"])
        return Gang(int(rec["attempt"]), members, rec["master_addr"], int(rec["master_port"]))

    async def member_failed(self, job_id: str, attempt: int, why: str, now: float) -> bool:
        """Record that this attempt's worker on a member node died (once per attempt)."""
        keys = [self.store.keys.job(job_id), self.store.keys.events(job_id)]
        return bool(await self._member_failed(keys=keys, args=[attempt, why, now]))

    async def failure_of(self, job_id: str, attempt: int) -> str | None:
        """Why a member node's worker of this attempt died, or None."""
        raw = cast(str | None, await self.redis.hget(self.store.keys.job(job_id), "member_failed"))
        if not raw:
            return None
        at, _, why = raw.partition("|")
        return why if at == str(attempt) else None
