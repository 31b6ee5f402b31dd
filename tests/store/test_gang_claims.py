"""Jobs on several GPUs through a real Redis: the agent's round (agent/scheduling.py)
claims all of a gang's GPUs in one claim, stored as Job.gpu "0,1", or leaves it queued with
its reason and nothing claimed; placed gangs are read back with every GPU they hold.

    pytest tests/store/test_gang_claims.py
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from tests.conftest import tiny_spec
from wstrain.agent.scheduling import Rounds
from wstrain.contracts.calibration import GIB
from wstrain.contracts.hardware import DEFAULT_PROFILE
from wstrain.contracts.jobs import JobState, gpu_indices
from wstrain.contracts.model_dims import PRESETS
from wstrain.contracts.spec import JobSpec
from wstrain.planning.planner import make_plan
from wstrain.policy import Gpu, NodeState, PolicyConfig, RunningJob
from wstrain.store import JobStore
from wstrain.store.scheduling import SchedulingView

# modelled GPUs of 2.5 GiB: one 2 GiB rank each
THREE_GPUS = NodeState(tuple(Gpu(i, int(2.5 * GIB)) for i in range(3)), 64 * GIB)


async def _store(redis_url: str) -> JobStore:
    return JobStore.from_url(redis_url, prefix=f"t{uuid.uuid4().hex[:8]}")


async def _gang(store: JobStore, name: str, gpus: int = 2, **over: Any) -> str:
    raw = tiny_spec(name, data={"kind": "synthetic"}, gpus=gpus, **over)
    raw["budget"] = {"device_gib": 2, "host_gib": 2}
    spec = JobSpec.model_validate(raw)
    plan = make_plan(spec, PRESETS["micro-llama"], DEFAULT_PROFILE)
    assert plan.ranks == gpus
    return (await store.create(spec, "tester", plan)).id


def _rounds(store: JobStore, drain: bool = True) -> Rounds:
    return Rounds(store, "n0", "agent-n0", PolicyConfig(drain=drain), lease_s=30)


def test_a_claim_stores_every_gpu_of_a_gang(redis_url: str) -> None:
    async def run() -> None:
        store = await _store(redis_url)
        job_id = await _gang(store, "g")
        assert await store.claim(job_id, "n0", (2, 0), "agent-n0")
        job = await store.get(job_id)
        assert job.state == JobState.planning and job.gpu == "2,0"
        assert gpu_indices(job.gpu) == (2, 0)
        (row,) = await SchedulingView(store).placed()
        assert (row.gpu, row.gang, row.gpus) == (2, (2, 0), 2)
        await store.close()

    asyncio.run(run())


def test_two_gangs_of_two_on_three_gpus_one_runs_the_other_claims_nothing(
    redis_url: str,
) -> None:
    async def run() -> None:
        store = await _store(redis_url)
        first, second = await _gang(store, "first"), await _gang(store, "second")
        rounds = _rounds(store)
        out = await rounds.run(THREE_GPUS, [], 1 << 16)
        assert [(c.job_id, c.gpus) for c in out.claimed] == [(first, (0, 1))]
        assert (await store.get(first)).gpu == "0,1"
        waiting = await store.get(second)
        assert waiting.state == JobState.queued and waiting.gpu is None
        assert waiting.state_reason is not None and waiting.state_reason.startswith(
            "resources: needs 2 GPUs with 2.0 GiB free on one node; 1 has it (GPU 2)"
        )
        # the next round sees the first on both its GPUs (as the agent's ledger does)
        row = next(p for p in await SchedulingView(store).placed() if p.id == first)
        running = [
            RunningJob(
                first,
                row.owner,
                row.priority,
                row.gpu,
                row.device_bytes,
                row.host_bytes,
                row.started_at,
                gpus=row.gpus,
                gang=row.gang,
            )
        ]
        out = await rounds.run(THREE_GPUS, running, 1 << 16)
        assert out.claimed == []
        assert (await store.get(second)).state == JobState.queued
        await store.close()

    asyncio.run(run())


def test_with_one_gpu_free_a_gang_waits_and_holds_nothing(redis_url: str) -> None:
    async def run() -> None:
        store = await _store(redis_url)
        gang = await _gang(store, "g")
        two = NodeState((Gpu(0, int(2.5 * GIB)), Gpu(1, int(2.5 * GIB))), 64 * GIB)
        busy = RunningJob("0000000000aa", "ben", 0, 1, 2 * GIB, 2 * GIB, 0.0)
        out = await _rounds(store, drain=False).run(two, [busy], 1 << 16)
        assert out.claimed == [] and out.decision is not None and out.decision.held == {}
        job = await store.get(gang)
        assert job.state == JobState.queued and job.gpu is None
        assert job.state_reason == (
            "resources: needs 2 GPUs with 2.0 GiB free on one node; 1 has it (GPU 0)"
        )
        await store.close()

    asyncio.run(run())


def test_a_gang_on_a_pooled_cpu_node_needs_a_cpu_slot_per_rank(redis_url: str) -> None:
    async def run() -> None:
        store = await _store(redis_url)
        gang = await _gang(store, "g")
        pool = NodeState((), 64 * GIB)
        out = await _rounds(store).run(pool, [], 1)  # one free slot
        assert out.claimed == []
        job = await store.get(gang)
        assert job.state == JobState.queued
        assert (
            job.state_reason
            == "resources: needs 2 CPU slots, 1 free on the node (WSTRAIN_CPU_SLOTS)"
        )
        out = await _rounds(store).run(pool, [], 2)
        assert [(c.job_id, c.gpus) for c in out.claimed] == [(gang, ())]
        await store.close()

    asyncio.run(run())
