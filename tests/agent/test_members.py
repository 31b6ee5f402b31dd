"""A member node's shares of multi-node jobs (agent/members.py) as fair share
charges them: every node charges the GPUs it trains on, so a 2-node job costs its owner
both nodes' GPUs, not node 0's alone; a gang still assembling trains nothing and is not
charged; a member worker already stopped is not either. A gang completed while a member
reads it keeps that member's share (the race that stalled a 2-node job in planning).

    pytest tests/agent/test_members.py
"""

from __future__ import annotations

import asyncio
import sys
import uuid

import pytest

from wstrain.agent.members import Hold, Members, MemberWorker
from wstrain.contracts.calibration import GIB
from wstrain.policy import Gpu, NodeState, RunningJob
from wstrain.policy.fairshare import charge
from wstrain.store import JobStore

NODE = NodeState((Gpu(0, 141 * GIB), Gpu(1, 141 * GIB)), 512 * GIB)


def _hold(job_id: str, since_s: float) -> Hold:
    return Hold(job_id, "ana", 0, 20 * GIB, 64 * GIB, (0, 1), 2, False, since_s)


async def _case(redis_url: str) -> tuple[float, float, list[RunningJob]]:
    store = JobStore.from_url(redis_url, prefix=f"t{uuid.uuid4().hex[:8]}")

    async def unused(*_: object) -> None:
        raise AssertionError("nothing is spawned here")

    members = Members(store, "nb", "agent-nb", unused, unused)  # type: ignore[arg-type]
    members.add([_hold("assembling", 0.0)])  # joined a gang that is not whole yet
    procs = [await asyncio.create_subprocess_exec(sys.executable, "-c", "") for _ in range(2)]
    trains = MemberWorker(_hold("trains", 0.0), 1, 1, procs[0], started_s=1000.0)
    ended = MemberWorker(_hold("ended", 0.0), 1, 1, procs[1], stopped=True)
    members.workers = {"trains": trains, "ended": ended}
    for p in procs:
        await p.wait()
    node0 = RunningJob("own", "ana", 0, 0, 20 * GIB, 64 * GIB, 1000.0)
    await store.redis.aclose()
    return (
        charge({}, [node0], NODE, 1000.0, 4600.0)["ana"].gpu_s,
        charge({}, [node0, *members.training()], NODE, 1000.0, 4600.0)["ana"].gpu_s,
        members.training(),
    )


def test_a_member_charges_the_gpus_it_trains_on_from_its_workers_start(redis_url: str) -> None:
    alone, with_members, training = asyncio.run(_case(redis_url))
    assert [(r.id, r.started_s, r.gpus) for r in training] == [("trains", 1000.0, 2)]
    # an hour: node 0's job on one GPU at 20/141, the member's share on its two GPUs
    assert alone == pytest.approx(3600 * 20 / 141)
    assert with_members == pytest.approx(3 * 3600 * 20 / 141)


async def _completed_while_looking(redis_url: str) -> tuple[list[str], list[str]]:
    """Node b joined a 2-node gang; node a completes it between the two Redis reads b's
    agent makes of it (whichever it makes first). b must keep its share."""
    from wstrain.store.node_gangs import Member

    store = JobStore.from_url(redis_url, prefix=f"t{uuid.uuid4().hex[:8]}")

    async def unused(*_: object) -> None:
        raise AssertionError("nothing is spawned while the job is queued")

    b = Members(store, "nb", "agent-nb", unused, unused)  # type: ignore[arg-type]
    jid = "a1b2c3d4e5f6"
    await store.redis.hset(store.keys.job(jid), mapping={"state": "queued", "attempt": 1})
    await store.redis.hset(store.keys.job(jid), "nodes", 2)
    joined = await b.gangs.join(jid, Member("nb", "agent-nb", ""), 2, 20.0, "127.0.0.1", 1)
    assert joined.status == 1
    b.add([_hold(jid, 0.0)])
    reads: list[str] = []
    real_get, real_assembling = b.gangs.get, b.gangs.assembling

    async def complete_after_first_read() -> None:
        if len(reads) == 1:  # node a's join lands between b's two reads
            done = await b.gangs.join(jid, Member("na", "agent-na", ""), 2, 20.0, "", 0)
            assert done.status == 2

    async def get(job_id: str):  # type: ignore[no-untyped-def]
        reads.append("gang")
        out = await real_get(job_id)
        await complete_after_first_read()
        return out

    async def assembling() -> str | None:
        reads.append("assembly key")
        out = await real_assembling()
        await complete_after_first_read()
        return out

    b.gangs.get, b.gangs.assembling = get, assembling  # type: ignore[method-assign]
    await b._advance(b.holds[jid], {})
    kept = list(b.holds)
    await store.redis.aclose()
    return reads, kept


def test_a_gang_completed_while_a_member_looks_keeps_that_members_share(redis_url: str) -> None:
    reads, kept = asyncio.run(_completed_while_looking(redis_url))
    assert sorted(reads) == ["assembly key", "gang"]
    assert kept == ["a1b2c3d4e5f6"]  # not released as "did not assemble in time"
