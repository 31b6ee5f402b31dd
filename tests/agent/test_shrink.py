"""Shrink, do not evict, in the agent's rounds (agent/scheduling.py, agent/outcomes.py) on a
real Redis: a ranged job running at the top of its range on a modelled 40 GiB GPU is shrunk
when a job of a higher class arrives (stopped at a checkpoint as a preempted job is, its
requeue saying so), then both run: the newcomer first, the shrunk job lower in its range
on what is left; once the newcomer is gone it grows back to the top. A fixed-budget job in
its place is preempted.

    pytest tests/agent/test_shrink.py
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from tests.conftest import tiny_spec
from wstrain.agent.outcomes import Exit, Resize, settle_exit
from wstrain.agent.scheduling import Rounds
from wstrain.contracts.calibration import GIB
from wstrain.contracts.hardware import DEFAULT_PROFILE
from wstrain.contracts.jobs import JobState, WorkerExit
from wstrain.contracts.model_dims import PRESETS
from wstrain.contracts.plan import RangePoint
from wstrain.contracts.spec import JobSpec
from wstrain.planning.planner import make_plan
from wstrain.policy import Gpu, NodeState, PolicyConfig, RunningJob
from wstrain.store import JobStore

GPU = NodeState((Gpu(0, 40 * GIB),), 256 * GIB)  # one modelled 40 GiB GPU
# a concave speed curve over 10-40 GiB of device: more memory buys less and less
CURVE = {10: 1000.0, 20: 1600.0, 30: 1900.0, 40: 2000.0}


async def _job(store: JobStore, name: str, owner: str, device: Any, priority: int = 0) -> str:
    raw = tiny_spec(name, data={"kind": "synthetic"}, priority=priority)
    raw["budget"] = {"device_gib": device, "host_gib": 2}
    spec = JobSpec.model_validate(raw)
    plan = make_plan(spec, PRESETS["micro-llama"], DEFAULT_PROFILE)
    if spec.budget.ranged:  # the points the API would have planned, at a known curve
        plan.range_points = [
            RangePoint(device_gib=g, host_gib=2, tokens_per_s=t) for g, t in CURVE.items()
        ]
    return (await store.create(spec, owner, plan)).id


async def _running(store: JobStore, job_id: str) -> RunningJob:
    """The claimed job as the agent's ledger counts it (agent/capacity.py running_jobs)."""
    job = await store.get(job_id)
    budget = job.spec.budget
    return RunningJob(
        job_id,
        job.owner,
        job.spec.priority,
        0,
        budget.device_bytes,
        budget.host_bytes,
        0.0,
        points=await store.range_points(job_id),
    )


def _stopped(for_job: str, resize: Resize) -> Exit:
    """A worker that checkpointed and exited after the agent's SIGTERM."""
    return Exit(None, 7, False, False, False, for_job, 30.0, resize=resize)


def test_a_ranged_job_is_shrunk_for_a_higher_class_and_restarts_lower(redis_url: str) -> None:
    async def run() -> None:
        store = JobStore.from_url(redis_url, prefix=f"t{uuid.uuid4().hex[:8]}")
        rounds = Rounds(store, "n0", "agent-n0", PolicyConfig(), lease_s=30)
        ranged = await _job(store, "ranged", "ana", {"min": 10, "max": 40})
        out = await rounds.run(GPU, [], 1 << 16)
        assert [c.job_id for c in out.claimed] == [ranged]
        alone = await store.get(ranged)
        assert alone.spec.budget.device_gib == 40  # a whole GPU to itself: its max
        urgent = await _job(store, "urgent", "ben", 25, priority=10)
        out = await rounds.run(GPU, [await _running(store, ranged)], 1 << 16)
        assert out.preempt == {} and out.claimed == []
        point, for_job = out.shrink[ranged]
        assert point.device_bytes <= 15 * GIB  # at most what leaves the newcomer 25 GiB
        assert for_job == "another owner's job of priority 10"
        waiting = await store.get(urgent)
        assert waiting.state_reason is not None
        assert waiting.state_reason.startswith("preemption: shrinking 1 ranged job on GPU 0")
        # the worker checkpoints and exits: requeued, saying it was shrunk, not evicted
        stopped = _stopped(for_job, Resize(True, point))
        await settle_exit(store, alone, "agent-n0", WorkerExit.cancelled, stopped)
        requeued = await store.get(ranged)
        assert requeued.state == JobState.queued and requeued.retries == 0
        assert requeued.state_reason is not None
        assert requeued.state_reason.startswith(f"shrunk for {for_job}: restarts lower")
        out = await rounds.run(GPU, [], 1 << 16)
        assert {c.job_id for c in out.claimed} == {ranged, urgent}
        assert (await store.get(urgent)).spec.budget.device_gib == 25
        assert (await store.get(ranged)).spec.budget.device_gib == 10  # lower in its range
        # the newcomer has ended; 30 min after its restart the shrunk job grows back
        out = await rounds.run(GPU, [await _running(store, ranged)], 1 << 16)
        assert list(out.grow) == [ranged] and out.grow[ranged].device_bytes == 40 * GIB
        room = "the room free on GPU 0"  # the agent's words for it
        grown = _stopped(room, Resize(False, out.grow[ranged]))
        await settle_exit(store, await store.get(ranged), "agent-n0", WorkerExit.cancelled, grown)
        requeued = await store.get(ranged)
        assert requeued.state_reason == (
            f"grows into {room}: restarts higher in its range, at 40 GiB device, 2 GiB host"
        )
        out = await rounds.run(GPU, [], 1 << 16)
        assert [c.job_id for c in out.claimed] == [ranged]
        assert (await store.get(ranged)).spec.budget.device_gib == 40
        await store.close()

    asyncio.run(run())


def test_a_fixed_budget_job_in_its_place_is_preempted(redis_url: str) -> None:
    async def run() -> None:
        store = JobStore.from_url(redis_url, prefix=f"t{uuid.uuid4().hex[:8]}")
        rounds = Rounds(store, "n0", "agent-n0", PolicyConfig(), lease_s=30)
        fixed = await _job(store, "fixed", "ana", 40)
        assert [c.job_id for c in (await rounds.run(GPU, [], 1 << 16)).claimed] == [fixed]
        await _job(store, "urgent", "ben", 25, priority=10)
        out = await rounds.run(GPU, [await _running(store, fixed)], 1 << 16)
        assert out.shrink == {} and list(out.preempt) == [fixed]
        await store.close()

    asyncio.run(run())
