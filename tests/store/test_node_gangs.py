"""Gangs of nodes through a real Redis (store/node_gangs.py and the agent's round,
agent/scheduling.py): members join a 2-node job one agent at a time (join order
= node rank, node 0's address and port kept); the last join claims the job for node 0; one
gang assembles at a time (a second multi-node job is refused while the first assembles,
holding nothing); an assembly past its timeout releases every hold and starts afresh; no
gang assembles with fewer live nodes than it needs; a member's failure is recorded once for
its attempt.

    pytest tests/store/test_node_gangs.py
"""

from __future__ import annotations

import asyncio
import time
import uuid

from tests.conftest import tiny_spec
from wstrain.agent.scheduling import GangSettings, Rounds
from wstrain.contracts.calibration import GIB
from wstrain.contracts.hardware import DEFAULT_PROFILE
from wstrain.contracts.jobs import JobState, Node
from wstrain.contracts.model_dims import PRESETS
from wstrain.contracts.spec import JobSpec
from wstrain.planning.planner import make_plan
from wstrain.policy import NodeState, PolicyConfig
from wstrain.store import JobStore
from wstrain.store.node_gangs import Member, NodeGangs

CPU_NODE = NodeState((), 64 * GIB)


async def _store(redis_url: str, nodes: tuple[str, ...] = ("na", "nb")) -> JobStore:
    """A store of its own prefix where `nodes` heartbeat (a gang of M joins only with M)."""
    store = JobStore.from_url(redis_url, prefix=f"t{uuid.uuid4().hex[:8]}")
    for name in nodes:
        node = Node(
            name=name,
            device="cpu",
            gpus=[],
            host_total_bytes=64 * GIB,
            host_free_bytes=64 * GIB,
            slots=1,
            running=[],
            profile={},
            heartbeat_at=time.time(),
        )
        assert await store.hold_node(node, ttl_s=600) is None
    return store


async def _job(store: JobStore, name: str, nodes: int = 2) -> str:
    spec = JobSpec.model_validate(tiny_spec(name, data={"kind": "synthetic"}, nodes=nodes))
    plan = make_plan(spec, PRESETS["micro-llama"], DEFAULT_PROFILE)
    return (await store.create(spec, "tester", plan)).id


def _rounds(store: JobStore, node: str, assembly_s: float = 30.0) -> Rounds:
    gang = GangSettings(f"addr-{node}", assembly_s)
    return Rounds(store, node, f"agent-{node}", PolicyConfig(), lease_s=30, gang=gang)


def test_members_join_one_at_a_time_and_the_last_claims_for_node_0(redis_url: str) -> None:
    async def run() -> None:
        store = await _store(redis_url)
        jid = await _job(store, "mn")
        a, b = _rounds(store, "na"), _rounds(store, "nb")
        out = await a.run(CPU_NODE, [], 1)
        assert [h.job_id for h in out.joined] == [jid] and not out.claimed
        job = await store.get(jid)
        assert job.state == JobState.queued and job.state_reason.startswith("gang: na joined")
        # the same node never joins twice (its agent passes what it holds)
        assert not (await a.run(CPU_NODE, [], 1, frozenset({jid}))).joined
        out = await b.run(CPU_NODE, [], 1)
        assert [h.job_id for h in out.joined] == [jid]
        job = await store.get(jid)
        assert job.state == JobState.planning and job.node == "na"
        gang = await NodeGangs(store).get(jid)
        assert gang is not None and [m.node for m in gang.members] == ["na", "nb"]
        assert gang.master_addr == "addr-na" and gang.attempt == 1
        assert gang.rank_of("agent-nb") == 1
        assert await NodeGangs(store).assembling() is None
        await store.close()

    asyncio.run(run())


def test_one_gang_assembles_at_a_time_and_a_timeout_starts_afresh(redis_url: str) -> None:
    async def run() -> None:
        store = await _store(redis_url)
        first = await _job(store, "mn-1")
        second = await _job(store, "mn-2")
        gangs = NodeGangs(store)
        a = _rounds(store, "na", assembly_s=0.3)
        out = await a.run(CPU_NODE, [], 2)  # room for both: joins only the first
        assert [h.job_id for h in out.joined] == [first]
        assert await gangs.assembling() == first
        got = await gangs.join(second, Member("nb", "agent-nb", ""), 2, 30, "x", 1)
        assert got.status == 0 and got.detail == f"assembling {first}"
        assert (await gangs.get(second)) is None  # nothing held for the second
        await asyncio.sleep(0.5)  # the first's assembly expires: its hold counts no more
        assert await gangs.assembling() is None
        b = _rounds(store, "nb", assembly_s=30)
        out = await b.run(CPU_NODE, [], 1)  # a fresh gang, nb its node 0
        assert [h.job_id for h in out.joined] == [first]
        gang = await gangs.get(first)
        assert gang is not None and [m.node for m in gang.members] == ["nb"]
        assert (await store.get(first)).state == JobState.queued
        await store.close()

    asyncio.run(run())


def test_a_member_failure_is_recorded_once_for_its_attempt(redis_url: str) -> None:
    async def run() -> None:
        store = await _store(redis_url)
        jid = await _job(store, "mn")
        gangs = NodeGangs(store)
        assert not await gangs.member_failed(jid, 1, "queued jobs have no members", time.time())
        assert await store.claim(jid, "na", (), "agent-na")
        assert await gangs.member_failed(jid, 1, "node 1 (nb): SIGKILL", time.time())
        assert not await gangs.member_failed(jid, 1, "again", time.time())
        assert await gangs.failure_of(jid, 1) == "node 1 (nb): SIGKILL"
        assert await gangs.failure_of(jid, 2) is None  # another attempt's
        await store.close()

    asyncio.run(run())


def test_no_gang_assembles_with_fewer_live_nodes_than_it_needs(redis_url: str) -> None:
    async def run() -> None:
        store = await _store(redis_url, nodes=("na",))
        jid = await _job(store, "mn")
        out = await _rounds(store, "na").run(CPU_NODE, [], 1)
        assert not out.joined and (await NodeGangs(store).get(jid)) is None
        job = await store.get(jid)
        assert job.state_reason == (
            "gang: needs 2 nodes, 1 agent(s) heartbeat now; it joins no gang until enough "
            "nodes run an agent"
        )
        await store.close()

    asyncio.run(run())
