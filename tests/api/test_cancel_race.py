"""Cancel while the agent moves the job: the route read the job as `planning`, and by the
time its transition lands the worker has made it `running`. The cancel must still land
(as `cancelling`), not answer 409 for a job that is cancellable. Real Redis; the agent's
move is a real store transition made between the route's read and its write."""

from __future__ import annotations

import asyncio

import pytest

from tests.store.test_job_store import _force, _new_job, _store
from wstrain.api.deps import Caller
from wstrain.api.routes.jobs import cancel
from wstrain.contracts.errors import Conflict
from wstrain.contracts.jobs import JobState
from wstrain.store import JobStore


@pytest.mark.parametrize(
    ("read_as", "now"),
    [
        (JobState.planning, JobState.running),  # the worker started
        (JobState.queued, JobState.running),  # claimed and started
        (JobState.running, JobState.queued),  # the agent gave it back
        (JobState.running, JobState.cancelling),  # another cancel landed first
    ],
)
def test_a_cancel_lands_when_the_state_moved_after_the_read(
    redis_url: str, read_as: JobState, now: JobState
) -> None:
    async def go() -> None:
        store = await _store(redis_url)
        jid = await _new_job(store, "race")
        await _force(store, jid, read_as)
        stale = await store.get(jid)
        if now in (JobState.queued, JobState.cancelling):
            await store.transition(jid, now, f"to {now.value}")
        else:
            await _force_from(store, jid, read_as, now)
        job = await cancel(stale, store, Caller("tester", admin=False))
        want = JobState.cancelled if now == JobState.queued else JobState.cancelling
        assert job.state == want, job
        assert (await store.get(jid)).state == want

    asyncio.run(go())


async def _force_from(store: JobStore, jid: str, src: JobState, dst: JobState) -> None:
    path = [JobState.queued, JobState.planning, JobState.running]
    for s in path[path.index(src) + 1 : path.index(dst) + 1]:
        await store.transition(jid, s, f"to {s.value}")


def test_a_finished_job_still_answers_409(redis_url: str) -> None:
    async def go() -> None:
        store = await _store(redis_url)
        jid = await _new_job(store, "done")
        await _force(store, jid, JobState.running)
        stale = await store.get(jid)
        await store.transition(jid, JobState.succeeded, "finished")
        with pytest.raises(Conflict, match="already succeeded"):
            await cancel(stale, store, Caller("tester", admin=False))

    asyncio.run(go())
