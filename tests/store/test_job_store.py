"""The job store on a real Redis: the state machine is enforced atomically, and concurrent
claimers never take one job twice."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest

from tests.conftest import tiny_spec
from wstrain.contracts.errors import Conflict, LeaseLost, NotFound
from wstrain.contracts.hardware import DEFAULT_PROFILE
from wstrain.contracts.jobs import ALLOWED_TRANSITIONS, JobState
from wstrain.contracts.model_dims import PRESETS
from wstrain.contracts.spec import JobSpec
from wstrain.planning.planner import make_plan
from wstrain.store import JobStore


def _spec(name: str) -> JobSpec:
    return JobSpec.model_validate(tiny_spec(name, data={"kind": "synthetic"}))


async def _store(redis_url: str) -> JobStore:
    return JobStore.from_url(redis_url, prefix=f"t{uuid.uuid4().hex[:8]}")


async def _new_job(store: JobStore, name: str = "j") -> str:
    spec = _spec(name)
    plan = make_plan(spec, PRESETS["micro-llama"], DEFAULT_PROFILE)
    return (await store.create(spec, "tester", plan)).id


async def _force(store: JobStore, job_id: str, state: JobState) -> None:
    """Walk a fresh job along allowed edges to `state`."""
    path = {
        JobState.queued: [],
        JobState.planning: [JobState.planning],
        JobState.running: [JobState.planning, JobState.running],
        JobState.cancelling: [JobState.planning, JobState.running, JobState.cancelling],
        JobState.succeeded: [JobState.planning, JobState.running, JobState.succeeded],
        JobState.failed: [JobState.planning, JobState.failed],
        JobState.cancelled: [JobState.cancelled],
        JobState.timeout: [JobState.planning, JobState.running, JobState.timeout],
    }[state]
    for s in path:
        await store.transition(job_id, s, f"to {s.value}")


@pytest.mark.parametrize("src", list(JobState))
def test_every_edge_of_the_state_machine(redis_url: str, src: JobState) -> None:
    async def run() -> None:
        store = await _store(redis_url)
        for dst in JobState:
            job_id = await _new_job(store)
            await _force(store, job_id, src)
            if dst in ALLOWED_TRANSITIONS[src]:
                assert await store.transition(job_id, dst, "t") == src
                assert (await store.get(job_id)).state == dst
            else:
                with pytest.raises(Conflict):
                    await store.transition(job_id, dst, "t")
                assert (await store.get(job_id)).state == src  # nothing changed
        counts = await store.counts_by_state()
        assert sum(counts.values()) == len(JobState)
        with pytest.raises(NotFound):
            await store.transition("missing", JobState.planning, "t")
        await store.close()

    asyncio.run(run())


def test_terminal_succeeded_never_changes(redis_url: str) -> None:
    assert ALLOWED_TRANSITIONS[JobState.succeeded] == frozenset()


def test_concurrent_claims_take_each_job_once(redis_url: str) -> None:
    """Eight agents race to claim every job (as when their policies choose alike): each job
    goes to exactly one of them, and a claimed job is claimed no more."""

    async def run() -> None:
        store = await _store(redis_url)
        ids = [await _new_job(store, f"c{i}") for i in range(30)]
        claimers = [JobStore.from_url(redis_url, store.keys.prefix) for _ in range(8)]

        async def race(s: JobStore, node: str) -> list[str]:
            return [jid for jid in ids if await s.claim(jid, node, 0, f"agent-{node}")]

        results = await asyncio.gather(*(race(s, f"n{i}") for i, s in enumerate(claimers)))
        claimed = [j for r in results for j in r]
        assert sorted(claimed) == sorted(ids)  # every job once, none twice
        for i, got in enumerate(results):
            for jid in got:
                job = await store.get(jid)
                assert job.state == JobState.planning and job.node == f"n{i}"
                assert job.gpu == "0"
        assert await store.queue_depth() == 0
        cancelled = await _new_job(store, "gone")
        await store.transition(cancelled, JobState.cancelled, "c")
        assert not await store.claim(cancelled, "n0", None, "agent-n0")  # not queued
        waits = await store.redis.hgetall(store.keys.queue_wait)
        assert int(waits["count"]) == 30  # every claim counted in the wait histogram once
        for s in [*claimers, store]:
            await s.close()

    asyncio.run(run())


def test_listing_pages_come_from_the_owner_and_state_indexes(redis_url: str) -> None:
    """Newest first, each filter alone and both together, totals exact; the indexes follow
    every transition, including the claim's Lua script."""

    async def run() -> None:
        store = await _store(redis_url)
        ids = {}
        for i, owner in enumerate(["ann", "bob", "ann", "ann", "bob"]):
            spec = _spec(f"j{i}")
            plan = make_plan(spec, PRESETS["micro-llama"], DEFAULT_PROFILE)
            ids[i] = (await store.create(spec, owner, plan)).id
        await store.transition(ids[2], JobState.cancelled, "c")
        assert await store.claim(ids[0], "n0", None, "agent-0")
        jobs, total = await store.list(owner="ann", limit=2)
        assert total == 3 and [j.id for j in jobs] == [ids[3], ids[2]]
        jobs, total = await store.list(owner="ann", offset=2, limit=2)
        assert total == 3 and [j.id for j in jobs] == [ids[0]]
        jobs, total = await store.list(state=JobState.queued)
        assert total == 3 and [j.id for j in jobs] == [ids[4], ids[3], ids[1]]
        jobs, total = await store.list(state=JobState.queued, owner="ann")
        assert total == 1 and [j.id for j in jobs] == [ids[3]]
        jobs, total = await store.list(state=JobState.planning, owner="bob")
        assert total == 0 and jobs == []
        counts = await store.counts_by_state()
        assert counts[JobState.queued] == 3 and counts[JobState.planning] == 1
        assert counts[JobState.cancelled] == 1
        # no temporary intersection is left behind
        assert not [k async for k in store.redis.scan_iter(f"{store.keys.prefix}:tmp:*")]
        await store.close()

    asyncio.run(run())


def test_indexes_are_rebuilt_for_a_store_that_predates_them(redis_url: str) -> None:
    async def run() -> None:
        store = await _store(redis_url)
        first, second = await _new_job(store, "a"), await _new_job(store, "b")
        await store.transition(second, JobState.cancelled, "c")
        p = store.keys.prefix
        await store.redis.delete(
            f"{p}:index-version",
            store.keys.by_owner("tester"),
            *[store.keys.by_state(s.value) for s in JobState],
        )
        assert (await store.list(owner="tester"))[1] == 0
        assert await store.ensure_indexes() == 2
        jobs, total = await store.list(owner="tester")
        assert total == 2 and [j.id for j in jobs] == [second, first]
        assert [j.id for j in (await store.list(state=JobState.cancelled))[0]] == [second]
        assert await store.ensure_indexes() == 0  # built once
        await store.close()

    asyncio.run(run())


def test_a_lease_fences_every_agent_write(redis_url: str) -> None:
    """Only the agent holding a job's lease writes its progress or moves it; another agent's
    write changes nothing and raises LeaseLost; renewing reports the leases lost."""

    async def go() -> None:
        store = await _store(redis_url)
        job_id = await _new_job(store)
        assert await store.claim(job_id, "n1", None, "agent-a", lease_s=30)
        lease = await store.lease(job_id)
        assert lease.agent_id == "agent-a" and lease.expires_at > time.time() + 20
        await store.transition(job_id, JobState.running, "go", fence="agent-a")
        await store.report(job_id, "agent-a", ("progress", "step 3", {}), step=3, worker_pid=42)
        assert (await store.get(job_id)).step == 3

        # agent-b took the job over (as a restarted agent requeues and re-claims it)
        await store.redis.hset(store.keys.job(job_id), "lease_agent", "agent-b")
        events_before = len(await store.events(job_id, limit=1000))
        with pytest.raises(LeaseLost):
            await store.report(job_id, "agent-a", ("progress", "step 4", {}), step=4)
        with pytest.raises(LeaseLost):
            await store.transition(job_id, JobState.succeeded, "done", fence="agent-a")
        job = await store.get(job_id)
        assert (job.state, job.step) == (JobState.running, 3)
        assert len(await store.events(job_id, limit=1000)) == events_before
        assert await store.renew("agent-a", [job_id], 30) == {job_id}
        assert await store.renew("agent-b", [job_id], 30) == set()
        # the API's own transitions (cancel) are not fenced
        await store.transition(job_id, JobState.cancelling, "cancel")
        await store.close()

    asyncio.run(go())


def test_reads_follow_every_write_through_the_parsed_cache(redis_url: str) -> None:
    """Jobs parsed once are reused while their revision stands; every write (claim, report,
    transition) bumps it, so a read never answers a stale job."""

    async def go() -> None:
        store = await _store(redis_url)
        job_id = await _new_job(store)
        first = await store.get(job_id)
        assert (await store.get_json(job_id)) == ("tester", first.model_dump_json())
        assert await store.claim(job_id, "n1", None, "agent-a")
        assert '"state":"planning"' in (await store.get_json(job_id))[1]
        await store.transition(job_id, JobState.running, "go", fence="agent-a")
        await store.report(job_id, "agent-a", None, step=7, loss=1.5)
        got = await store.get(job_id)
        assert (got.state, got.step, got.loss) == (JobState.running, 7, 1.5)
        assert got.rev > first.rev and got.plan is not None
        (listed,), total = await store.list()
        assert total == 1 and listed.step == 7 and listed.plan is None
        (as_json,), _ = await store.list_json()
        assert as_json == listed.model_dump_json()
        await store.report(job_id, "agent-a", None, step=8)
        assert (await store.list())[0][0].step == 8
        assert '"step":8' in (await store.get_json(job_id))[1]
        await store.close()

    asyncio.run(go())
