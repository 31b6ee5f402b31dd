"""How a worker's end settles its job, on a real Redis: a worker SIGTERM'd by its agent
before its own handler was installed (still importing torch) ends as the signal meant, a
time limit as `timeout` and an agent shutdown as a requeue, never as a crash to retry; a
worker that ran out of its budget fails the job at once."""

from __future__ import annotations

import asyncio
import signal
import uuid

import pytest

from tests.conftest import tiny_spec
from wstrain.agent.outcomes import Exit, settle_exit
from wstrain.contracts.hardware import DEFAULT_PROFILE
from wstrain.contracts.jobs import JobState, WorkerExit
from wstrain.contracts.model_dims import PRESETS
from wstrain.contracts.spec import JobSpec
from wstrain.planning.planner import make_plan
from wstrain.store import JobStore

AGENT = "agent-a"


def _exit(**flags: bool) -> Exit:
    return Exit(
        error=None,
        last_step=0,
        cancel_sent=flags.get("cancel_sent", False),
        shutting_down=flags.get("shutting_down", False),
        timed_out=flags.get("timed_out", False),
        preempted_by=None,
        retry_backoff_s=30.0,
    )


async def _settle(redis_url: str, code: int, ex: Exit) -> tuple[JobState, int]:
    """A running job leased to AGENT whose worker exited with `code`: its state and retries."""
    store = JobStore.from_url(redis_url, prefix=f"t{uuid.uuid4().hex[:8]}")
    spec = JobSpec.model_validate(tiny_spec("o", data={"kind": "synthetic"}, time_limit_s=60))
    job = await store.create(
        spec, "tester", make_plan(spec, PRESETS["micro-llama"], DEFAULT_PROFILE)
    )
    assert await store.claim(job.id, "n1", None, AGENT)
    await store.transition(job.id, JobState.running, "go", fence=AGENT)
    await settle_exit(store, await store.get(job.id), AGENT, code, ex)
    done = await store.get(job.id)
    await store.close()
    return done.state, done.retries


@pytest.mark.parametrize(
    ("code", "flags", "want"),
    [
        (-signal.SIGTERM, {"timed_out": True}, JobState.timeout),  # before its handler
        (int(WorkerExit.cancelled), {"timed_out": True}, JobState.timeout),  # at a checkpoint
        (-signal.SIGTERM, {"shutting_down": True}, JobState.queued),
        (-signal.SIGTERM, {"cancel_sent": True}, JobState.cancelled),
    ],
)
def test_a_sigterm_the_agent_sent_ends_as_it_meant(
    redis_url: str, code: int, flags: dict[str, bool], want: JobState
) -> None:
    state, retries = asyncio.run(_settle(redis_url, code, _exit(**flags)))
    assert (state, retries) == (want, 0)


def test_a_sigterm_nobody_sent_is_a_crash_to_retry(redis_url: str) -> None:
    state, retries = asyncio.run(_settle(redis_url, -signal.SIGTERM, _exit()))
    assert (state, retries) == (JobState.queued, 1)


def test_a_worker_out_of_its_budget_fails_at_once_not_retried(redis_url: str) -> None:
    state, retries = asyncio.run(_settle(redis_url, int(WorkerExit.out_of_memory), _exit()))
    assert (state, retries) == (JobState.failed, 0)
